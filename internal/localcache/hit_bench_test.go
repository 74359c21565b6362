package localcache

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/resp"
	"github.com/redproxy/redproxy/internal/upstream"
)

// benchCache is a tier over a real Redis holding nkeys cached GETs.
func benchCache(b *testing.B, nkeys int) (*Cache, [][]byte, [][]byte) {
	rs := redistest.Start(b)
	cfg := DefaultConfig()
	cfg.Enabled = true
	cfg.AdmitMinReads = 0
	cfg.Staleness = units.Duration{Duration: time.Second}
	c, err := New(cfg, Options{Upstream: func(int) upstream.Options { return upstream.Options{Addr: rs.Addr()} }})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	c.Connect(0)
	redistest.Eventually(b, 5*time.Second, func() bool { return c.Live(0) }, "not live")
	direct, ctx := rs.Client(b), context.Background()
	get := commands.Builtin().Get("get")
	var raws, keys [][]byte
	for i := range nkeys {
		key := []byte("key:" + strconv.Itoa(i))
		direct.Set(ctx, string(key), "value-value-value", 0)
		raw := resp.AppendCommandNamed(nil, "GET", key)
		if _, err := c.Fill(0, false, get, raw, key); err != nil {
			b.Fatal(err)
		}
		if _, st := c.Get(0, false, raw, key); st != Hit {
			b.Fatalf("key %d not cached: %v", i, st)
		}
		raws, keys = append(raws, raw), append(keys, key)
	}
	return c, raws, keys
}

// BenchmarkHit measures the hit path: lookup, liveness check, LRU
// promotion under the shard lock. Run with -cpu 1,2 to see contention.
func BenchmarkHit(b *testing.B) {
	for _, n := range []int{1, 100} {
		b.Run("keys="+strconv.Itoa(n), func(b *testing.B) {
			c, raws, keys := benchCache(b, n)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					j := i % n
					if _, st := c.Get(0, false, raws[j], keys[j]); st != Hit {
						b.Errorf("miss: %v", st)
						return
					}
					i++
				}
			})
		})
	}
}
