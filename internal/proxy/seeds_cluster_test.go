package proxy_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// TestSeedPatternsCluster runs the seed patterns (seeds_test.go) through the
// proxy in cluster mode, in front of a 3-primary cluster, with the local
// tier off and on. What changes against standalone, as on Redis Cluster
// itself:
//
//   - SlidingWindowLua: the script writes KEYS[1]..":seq", a key it is not
//     given, so the user id is a {hash tag} to keep both in one slot.
//   - TagInvalidation: the seed's MULTI writes a product key and its tag's
//     set, in two slots; Redis Cluster refuses such a transaction, and so
//     does the proxy (tagInvalidationCrossSlot).
//   - PubSubFanOut, CrossProcessInvalidation: as in standalone; the
//     proxy relays SUBSCRIBE to one node, and Redis Cluster broadcasts
//     PUBLISH to every node (cluster_relay.go).
func TestSeedPatternsCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	direct := c.ClusterClient(t)
	for _, tier := range []bool{false, true} {
		name := "TierOff"
		if tier {
			name = "TierOn"
		}
		t.Run(name, func(t *testing.T) {
			// Each run starts from an empty cluster: the patterns count.
			if err := direct.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
				return m.FlushAll(ctx).Err()
			}); err != nil {
				t.Fatal(err)
			}
			p := proxytest.Start(t, c.Nodes[0], func(cfg *config.Config) {
				cfg.Upstream.Mode = config.ModeCluster
				cfg.Upstream.Seeds = c.Seeds()
				if tier {
					cfg.LocalCache.Enabled = true
					cfg.LocalCache.AdmitMinReads = 0 // every key, on its first read
					cfg.LocalCache.Staleness = units.Duration{Duration: 200 * time.Millisecond}
				}
			})
			if tier {
				redistest.Eventually(t, 10*time.Second, func() bool { return p.LocalTier().Live(0) }, "the tier never became live")
			}
			e := &seedEnv{p: p, c: p.Client(t, func(o *redis.Options) { o.PoolSize = 8 }), direct: direct, cluster: true}
			e.runPatterns(t)
			if tier {
				// The patterns' own hits come from StampedeLock's 20
				// concurrent readers and depend on how they interleave
				// with the miss hold: 0 to 10 of them in 30 runs. A key
				// that cache-aside left alone is a hit on a re-read,
				// whatever the interleaving, once its node's tracking
				// connection is live.
				redistest.Eventually(t, 10*time.Second, func() bool {
					v, err := e.c.Get(ctx, "product:123").Result()
					if err != nil || v != `{"id":123,"name":"lamp","price":40}` {
						t.Fatalf("GET product:123 after the patterns: %q, %v", v, err)
					}
					return metricSum(t, p, "redproxy_localcache_hits_total") > 0
				}, "the tier served no hit in cluster mode")
			}
		})
	}
}

// tagInvalidationCrossSlot: the seed's tag transaction (SETEX product:N,
// SADD tag:category:C, EXPIRE tag) spans two slots. As on Redis Cluster,
// the proxy refuses it (CROSSSLOT at queue time, EXECABORT at EXEC) and
// writes nothing.
func (e *seedEnv) tagInvalidationCrossSlot(t *testing.T) {
	_, err := e.c.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.SetEx(ctx, "product:201", "{}", time.Hour)
		pipe.SAdd(ctx, "tag:category:9", "product:201")
		pipe.Expire(ctx, "tag:category:9", time.Hour)
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "CROSSSLOT") && !strings.Contains(err.Error(), "EXECABORT") {
		t.Fatalf("the cross-slot tag transaction: %v, want CROSSSLOT or EXECABORT", err)
	}
	for _, k := range []string{"product:201", "tag:category:9"} {
		if n, _ := e.direct.Exists(ctx, k).Result(); n != 0 {
			t.Fatalf("%s was written by a refused transaction", k)
		}
	}
}
