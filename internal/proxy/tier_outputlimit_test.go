package proxy_test

import (
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// A GET whose value is past client_output_limit fails its tier fill; the
// tier goes on filling and serving every other key, RESP2 as RESP3. The
// fill's over-limit reply came as nil, failed the RESP2 conversion and
// marked GET as having no RESP2 form: from then on no RESP2 GET of any
// key was served from the tier (found by a probe: 0 hits in 50 after one
// large GET, for good).
func TestTierKeepsServingAfterAGetPastTheOutputLimit(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) {
		c.LocalCache.Enabled = true
		c.LocalCache.AdmitMinReads = 0
		c.Server.ClientOutputLimit = units.MB
	})
	direct := p.Redis.Client(t)
	must(t, direct.Set(ctx, "huge:1", strings.Repeat("h", 2<<20), 0).Err())
	must(t, direct.Set(ctx, "rk:1", "small", 0).Err())
	big := p.Client(t, func(o *redis.Options) { o.Protocol = 2; o.MaxRetries = -1 })
	if err := big.Get(ctx, "huge:1").Err(); err == nil {
		t.Fatal("a 2 MB GET past a 1 MB client_output_limit was answered")
	}
	c := p.Client(t, func(o *redis.Options) { o.Protocol = 2 })
	before := metricSum(t, p, "redproxy_localcache_hits_total")
	redistest.Eventually(t, 5*time.Second, func() bool {
		if v, err := c.Get(ctx, "rk:1").Result(); err != nil || v != "small" {
			t.Fatalf("GET rk:1 = %q, %v", v, err)
		}
		return metricSum(t, p, "redproxy_localcache_hits_total") > before
	}, "no RESP2 GET was served from the tier after one GET past the output limit")
}
