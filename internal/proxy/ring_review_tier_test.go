package proxy_test

import (
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/metrics"
)

// TestRingReviewTierNeverStale: with the local tier on, a client that
// reads a key after its own acknowledged SET (on any shard) must see that
// value or a later one, while other clients write too.
func TestRingReviewTierNeverStale(t *testing.T) {
	r := startRingRig(t, func(c *config.Config) { c.LocalCache.Enabled = true })
	keys := []string{r.keyOn("ts:", 0), r.keyOn("ts:", 1), r.keyOn("ts:", 2)}
	deadline := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	var mu sync.Mutex
	stale := 0
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := r.p.Client(t)
			for n := 0; time.Now().Before(deadline); n++ {
				k := keys[(n+w)%3]
				// Monotonic per key: INCR through the proxy.
				v, err := c.Incr(ctx, k).Result()
				if err != nil {
					t.Error(err)
					return
				}
				for range 25 {
					got, err := c.Get(ctx, k).Result()
					g, _ := strconv.ParseInt(got, 10, 64)
					if err != nil || g < v {
						mu.Lock()
						if stale++; stale <= 3 {
							t.Errorf("GET %s after INCR acknowledged %d: %q %v", k, v, got, err)
						}
						mu.Unlock()
					}
				}
				if n%5 == 0 {
					vals, err := c.MGet(ctx, keys...).Result()
					if err != nil || len(vals) != 3 {
						t.Error(vals, err)
					}
				}
			}
		}()
	}
	wg.Wait()
	hits, _, _ := metrics.CounterSum(r.p.Metrics.Registry, "redproxy_localcache_hits_total")
	t.Logf("local tier hits: %v", hits)
	if hits == 0 {
		t.Error("the tier served nothing: the test proves little")
	}
	if stale > 0 {
		t.Errorf("%d stale reads", stale)
	}
}
