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
				routeBigToCluster(c, cl)
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

// A held transaction is sent at EXEC. When a reload moved its keys' route
// between MULTI and EXEC, EXEC wrote on the old upstream, and the client's
// next read, routed by the new routes, missed its own acknowledged write
// (found by review). Now the transaction goes where its keys live at EXEC;
// if they now live on two upstreams EXEC aborts, and under a WATCH on
// another upstream it answers as a failed WATCH does.
func TestRoutesReloadBetweenMultiAndExec(t *testing.T) {
	run := func(t *testing.T, watch string, queue []string, routes []config.Route) (any, error, *routed, *redis.Conn) {
		r := startRouted(t, nil)
		conn := r.p.Client(t, func(o *redis.Options) { o.PoolSize = 1 }).Conn()
		t.Cleanup(func() { conn.Close() })
		if watch != "" {
			if err := conn.Do(ctx, "WATCH", watch).Err(); err != nil {
				t.Fatal(err)
			}
		}
		if err := conn.Do(ctx, "MULTI").Err(); err != nil {
			t.Fatal(err)
		}
		for _, k := range queue {
			if err := conn.Do(ctx, "SET", k, "mine").Err(); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := r.p.Reload(reloaded(t, r.p, func(c *config.Config) { c.Routes = routes })); err != nil {
			t.Fatal(err)
		}
		res, err := conn.Do(ctx, "EXEC").Result()
		return res, err, r, conn
	}
	t.Run("moved", func(t *testing.T) {
		res, err, r, conn := run(t, "", []string{"queue:moved"}, []config.Route{{Pattern: "queue:*", Upstream: "cache"}})
		if err != nil {
			t.Fatalf("EXEC = %v, %v", res, err)
		}
		if v, _ := conn.Get(ctx, "queue:moved").Result(); v != "mine" {
			t.Fatalf("GET queue:moved after EXEC = %q (the key is on %s)", v, r.holds(t, "queue:moved"))
		}
		if where := r.holds(t, "queue:moved"); where != "cache" {
			t.Fatalf("queue:moved is on %q, want cache", where)
		}
	})
	t.Run("split", func(t *testing.T) {
		_, err, r, _ := run(t, "", []string{"queue:x", "queue:y"}, []config.Route{{Pattern: "queue:x*", Upstream: "cache"}, {Pattern: "queue:*", Upstream: "queue"}})
		if err == nil || !strings.HasPrefix(err.Error(), "EXECABORT") {
			t.Fatalf("EXEC of keys now on two upstreams = %v, want EXECABORT", err)
		}
		if where := r.holds(t, "queue:x") + r.holds(t, "queue:y"); where != "" {
			t.Fatalf("an aborted transaction wrote: %q", where)
		}
	})
	t.Run("watched", func(t *testing.T) {
		res, err, r, conn := run(t, "queue:w", []string{"queue:w"}, []config.Route{{Pattern: "queue:*", Upstream: "cache"}})
		if err != redis.Nil {
			t.Fatalf("EXEC under a WATCH whose keys moved = %v, %v; want the null of a failed WATCH", res, err)
		}
		if where := r.holds(t, "queue:w"); where != "" {
			t.Fatalf("a failed transaction wrote on %q", where)
		}
		// The WATCH is over, as after any EXEC: the connection is a plain one.
		if err := conn.Set(ctx, "plain:after", "1", 0).Err(); err != nil {
			t.Fatal(err)
		}
	})
}
