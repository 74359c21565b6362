package localcache_test

import (
	"runtime"
	rtmetrics "runtime/metrics"
	"strconv"
	"sync"
	"testing"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
)

func liveHeap() int64 {
	s := []rtmetrics.Sample{{Name: "/gc/heap/live:bytes"}}
	rtmetrics.Read(s)
	return int64(s[0].Value.Uint64())
}

// max_bytes bounds everything the tier holds, with fixed charges per key
// and per entry for what is not the stored bytes. They were 160 and 96
// bytes, but a key with one tiny entry costs the proxy about 600: filled
// with small keys, the tier held twice max_bytes (16.1 MB of live heap for
// an 8 MB budget, found by review). The charges are now measured, and
// what emptying a full tier gives back stays near max_bytes.
func TestTierMemoryOfManySmallKeysStaysNearBudget(t *testing.T) {
	const budget = 8 * units.MB
	p := startTier(t, nil, func(c *config.Config) { c.LocalCache.MaxBytes = budget })
	direct := p.Redis.Client(t)
	const n = 40000
	for i := 0; i < n; i += 1000 {
		pipe := direct.Pipeline()
		for k := i; k < i+1000; k++ {
			pipe.Set(ctx, "rk:"+strconv.Itoa(k), "v", 0)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	heap0 := liveHeap()
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := p.Client(t)
			for k := w; k < n; k += 4 {
				if err := c.Get(ctx, "rk:"+strconv.Itoa(k)).Err(); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	runtime.GC()
	runtime.GC()
	full := liveHeap()
	charged := metric(t, p.Metrics.Registry, "redproxy_localcache_bytes")
	entries := metric(t, p.Metrics.Registry, "redproxy_localcache_entries")
	// What the tier holds is what emptying it gives back.
	if err := p.Client(t).FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if b := metric(t, p.Metrics.Registry, "redproxy_localcache_bytes"); b != 0 {
		t.Fatalf("after FLUSHALL the tier charges %v bytes", b)
	}
	runtime.GC()
	runtime.GC()
	grown := full - liveHeap()
	t.Logf("live heap: %+.1f MB over the start with the tier full, %.1f MB given back by emptying it", float64(full-heap0)/(1<<20), float64(grown)/(1<<20))
	t.Logf("%d small keys read: tier charges %.1f MB for %v entries (budget %d MB); proxy live heap +%.1f MB (%.0f bytes per entry)",
		n, charged/(1<<20), entries, int64(budget)>>20, float64(grown)/(1<<20), float64(grown)/max(entries, 1))
	if float64(grown) > 1.25*float64(budget) {
		t.Fatalf("the tier's real memory (+%.1f MB live heap) is %.1fx its %d MB max_bytes", float64(grown)/(1<<20), float64(grown)/float64(budget), int64(budget)>>20)
	}
}
