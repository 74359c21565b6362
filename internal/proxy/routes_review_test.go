package proxy_test

// Route defects found by a review, each reproduced against real servers.

import (
	"fmt"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// A cluster upstream has database 0 only. A client in database 3 got the
// error for a pipelined GET of a key routed there, but a GET sent alone
// (stampede protection's path, or the local tier's fill) read database
// 0's value: the wrong data, silently.
func TestRoutesClusterUpstreamOnlyInDatabase0(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	for _, tier := range []bool{false, true} {
		name := "tier off"
		if tier {
			name = "tier on"
		}
		t.Run(name, func(t *testing.T) {
			p := proxytest.Start(t, nil, func(c *config.Config) {
				u := namedUpstream("")
				u.Mode, u.Address, u.Seeds = config.ModeCluster, "", cl.Seeds()
				c.Upstreams = map[string]config.Upstream{"big": u}
				c.Routes = []config.Route{{Pattern: "big:*", Upstream: "big"}}
				c.LocalCache.Enabled = tier
				c.LocalCache.AdmitMinReads = 0
			})
			if err := p.Client(t).Set(ctx, "big:k", "db0-value", 0).Err(); err != nil {
				t.Fatal(err)
			}
			db3 := p.Client(t, func(o *redis.Options) { o.DB = 3 })
			for i := range 20 {
				v, err := db3.Get(ctx, "big:k").Result()
				if err == nil || v != "" {
					t.Fatalf("read %d in database 3 of a key on a cluster upstream = %q, %v; want the only-database-0 error", i, v, err)
				}
			}
		})
	}
}

// A PUBLISH sent under a WATCH went out on the WATCH's upstream, not its
// channel's: acknowledged (:0) and never heard by the channel's
// subscribers. It is now held to its channel's upstream as in MULTI:
// refused when that is another upstream than the WATCH's.
func TestRoutesPublishUnderWatch(t *testing.T) {
	r := startRouted(t, nil)
	sub := r.p.Client(t).Subscribe(ctx, "news")
	t.Cleanup(func() { sub.Close() })
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := r.c.Publish(ctx, "news", "a").Result(); err != nil || n != 1 {
		t.Fatalf("PUBLISH news = %d, %v", n, err)
	}
	for _, watched := range []string{"queue:k", "plain:k"} {
		err := r.p.Client(t).Watch(ctx, func(tx *redis.Tx) error {
			n, err := tx.Publish(ctx, "news", "b").Result()
			switch {
			case watched == "queue:k" && (err == nil || !strings.HasPrefix(err.Error(), "CROSSROUTE")):
				return fmt.Errorf("PUBLISH news under WATCH %s = %d, %v; want CROSSROUTE (news is on the default upstream)", watched, n, err)
			case watched == "plain:k" && (err != nil || n != 1):
				return fmt.Errorf("PUBLISH news under WATCH %s = %d, %v; want 1 subscriber", watched, n, err)
			}
			return nil
		}, watched)
		if err != nil {
			t.Fatal(err)
		}
	}
}

// SORT's BY and GET patterns name keys, which were read on the sorted
// key's upstream whatever their route said: GET obj_* answered nils for
// keys that exist on the default upstream (found by review). With routes
// they are refused; GET # and BY without a "*" name no key and still run.
// SWAPDB went to the default upstream only and left the keyspace half
// swapped; it cannot be atomic across upstreams, so it is refused.
func TestRoutesRefuseWhatCannotBeRouted(t *testing.T) {
	r := startRouted(t, nil)
	if err := r.c.RPush(ctx, "queue:ids", "2", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if err := r.c.MSet(ctx, "obj_1", "one", "obj_2", "two").Err(); err != nil {
		t.Fatal(err)
	}
	refused := func(what string, err error, prefix string) {
		t.Helper()
		if err == nil || !strings.HasPrefix(err.Error(), prefix) {
			t.Fatalf("%s: %v, want %s...", what, err, prefix)
		}
	}
	// A lone read whose keys are on two upstreams took stampede
	// protection's fetch, which sent it whole to the default upstream.
	_, err := r.c.SInter(ctx, "queue:s", "cache:s").Result()
	refused("SINTER queue:s cache:s", err, "CROSSROUTE")
	_, err = r.c.Sort(ctx, "queue:ids", &redis.Sort{Get: []string{"obj_*"}}).Result()
	refused("SORT GET obj_*", err, "CROSSROUTE")
	_, err = r.c.Do(ctx, "SORT_RO", "queue:ids", "BY", "obj_*").Result()
	refused("SORT_RO BY obj_*", err, "CROSSROUTE")
	if v, err := r.c.Sort(ctx, "queue:ids", &redis.Sort{By: "nosort", Get: []string{"#"}}).Result(); err != nil || fmt.Sprint(v) != "[2 1]" {
		t.Fatalf("SORT BY nosort GET # = %v, %v", v, err)
	}
	if v, err := r.c.Sort(ctx, "queue:ids", &redis.Sort{}).Result(); err != nil || fmt.Sprint(v) != "[1 2]" {
		t.Fatalf("SORT = %v, %v", v, err)
	}
	_, err = r.c.Do(ctx, "SWAPDB", "0", "1").Result()
	refused("SWAPDB", err, "ERR redproxy: SWAPDB")
	// In a transaction, the refusal aborts it as a queue-time error does.
	_, err = r.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Sort(ctx, "queue:ids", &redis.Sort{Get: []string{"obj_*"}})
		return nil
	})
	refused("SORT GET obj_* in MULTI", err, "EXECABORT")
	if v, _ := r.c.Get(ctx, "obj_1").Result(); v != "one" {
		t.Fatalf("obj_1 = %q", v)
	}
}
