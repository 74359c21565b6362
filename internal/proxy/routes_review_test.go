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
