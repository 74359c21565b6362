package proxy_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/stampede"
)

// Stampede protection in cluster mode: reads are coalesced and misses held
// as in standalone mode, the fetch going to the node of the key's slot.
// Before, reads in cluster mode never reached it (a cache-aside stampede
// behind a cluster queried the database once per client, found by a
// probe), and the proxy only said so at start.
func TestClusterStampede(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	direct := c.ClusterClient(t)
	for _, tier := range []bool{false, true} {
		t.Run(fmt.Sprint("tier=", tier), func(t *testing.T) {
			p := proxytest.Start(t, c.Nodes[0], func(cfg *config.Config) {
				cfg.Upstream.Mode = config.ModeCluster
				cfg.Upstream.Seeds = c.Seeds()
				cfg.LocalCache.Enabled = tier
				cfg.Stampede.Hold = []stampede.HoldRule{{Pattern: "cache:*", Timeout: units.Duration{Duration: 5 * time.Second}}}
			})
			const clients = 40
			conns := pooledClients(t, p, clients)

			t.Run("MissHold", func(t *testing.T) {
				// Cold keys on every node (their slots spread over the
				// three primaries), one cache-aside stampede each.
				nodes := map[string]bool{}
				for k := range 9 {
					key := fmt.Sprintf("cache:tier%v:product:%d", tier, k)
					m, err := direct.MasterForKey(ctx, key)
					if err != nil {
						t.Fatal(err)
					}
					nodes[m.Options().Addr] = true
					// As in standalone mode (TestReviewMissHoldCacheAside100ClientsWithTier),
					// up to 3 may query.
					if n := cacheAsideStampede(conns, key); n > 3 {
						t.Fatalf("%d of %d cache-aside clients queried the database for the cold key %s, want 1 (held reads %v)",
							n, clients, key, metricSum(t, p, "redproxy_stampede_held_reads_total"))
					}
					if v, err := direct.Get(ctx, key).Result(); err != nil || v != `{"id":123}` {
						t.Fatalf("the filler's value of %s on the cluster: %q, %v", key, v, err)
					}
				}
				if len(nodes) < 2 {
					t.Fatalf("the keys landed on %d node(s); the test wants several", len(nodes))
				}
				if metricSum(t, p, "redproxy_stampede_held_reads_total") == 0 {
					t.Error("no read was held")
				}
			})

			t.Run("Coalesce", func(t *testing.T) {
				// With the key's node paused, the first GET's fetch is in
				// flight and every later one collects behind it: Redis
				// runs two GETs for the clients' forty, and each client
				// gets the value.
				key := fmt.Sprintf("plain:tier%v:hot", tier)
				if err := direct.Set(ctx, key, "v1", 0).Err(); err != nil {
					t.Fatal(err)
				}
				node, err := direct.MasterForKey(ctx, key)
				if err != nil {
					t.Fatal(err)
				}
				if err := node.ConfigResetStat(ctx).Err(); err != nil {
					t.Fatal(err)
				}
				if err := node.Do(ctx, "CLIENT", "PAUSE", "1500", "ALL").Err(); err != nil {
					t.Fatal(err)
				}
				var wg sync.WaitGroup
				errs := make(chan error, clients)
				for _, cl := range conns {
					wg.Add(1)
					go func() {
						defer wg.Done()
						if v, err := cl.Get(ctx, key).Result(); err != nil || v != "v1" {
							errs <- fmt.Errorf("GET %s = %q, %v", key, v, err)
						}
					}()
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Error(err)
				}
				gets := -1
				for _, n := range c.Nodes {
					if n.Addr() == node.Options().Addr {
						gets = commandStat(t, n, "get", "calls")
					}
				}
				if gets < 0 {
					t.Fatalf("no node of the cluster is at %s", node.Options().Addr)
				}
				// The tier's fills, if it admitted the key, come to
				// the node too; either way far fewer than one per client.
				if gets > clients/4 {
					t.Errorf("Redis ran %d GETs for %d concurrent clients' GETs of one key, want them coalesced (2)", gets, clients)
				}
			})
		})
	}
}
