package localcache_test

import (
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/localcache"
)

// BenchmarkWriteModes compares the two ways of keeping writes through the
// proxy coherent, on a mix of 90% GET / 10% SET over 10 hot keys from 16
// clients: marking the written keys "in flight" until the reply (only
// those keys stop being served), or a fence after every write's reply (no
// key is served until a PING on the fill connection returns).
func BenchmarkWriteModes(b *testing.B) {
	for _, mode := range []struct {
		name  string
		fence bool
	}{{"inflight", false}, {"fence", true}} {
		b.Run(mode.name, func(b *testing.B) {
			withHooks(b, &localcache.TestHooks{FenceWrites: mode.fence})
			p := startTier(b, nil)
			c := p.Client(b, func(o *redis.Options) { o.PoolSize = 16 })
			for i := range 10 {
				c.Set(ctx, "hot:"+strconv.Itoa(i), "v", 0)
			}
			h0 := hits(b, p)
			b.SetParallelism(8)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				r := rand.New(rand.NewPCG(rand.Uint64(), 1))
				for pb.Next() {
					key := "hot:" + strconv.Itoa(r.IntN(10))
					var err error
					if r.IntN(10) == 0 {
						err = c.Set(ctx, key, "v", 0).Err()
					} else if err = c.Get(ctx, key).Err(); err == redis.Nil {
						err = nil
					}
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(100*(hits(b, p)-h0)/float64(b.N)/0.9, "hit%")
			b.ReportMetric(metric(b, p.Metrics.Registry, "redproxy_localcache_fences_total"), "fences")
		})
	}
}
