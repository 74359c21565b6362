package proxy_test

import (
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/localcache"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// TestReviewSentinelStaleIfErrorAfterKill: stale-if-error values of the
// killed primary are not served once the proxy is on the promoted replica.
func TestReviewSentinelStaleIfErrorAfterKill(t *testing.T) {
	g := redistest.StartSentinelGroup(t, redistest.SentinelOptions{Replicas: 2})
	old := g.Nodes[0]
	p := proxytest.Start(t, old, func(c *config.Config) {
		sentinelConfig(g, g.SentinelAddrs())(c)
		c.LocalCache.Enabled = true
		c.LocalCache.AdmitMinReads = 0
		c.LocalCache.WriteRatio = 1000
		c.LocalCache.MaxTTL = units.Duration{Duration: time.Minute}
		c.LocalCache.StaleIfError = []localcache.StaleRule{{Pattern: "*", MaxAge: units.Duration{Duration: time.Minute}}}
	})
	redistest.Eventually(t, 10*time.Second, func() bool { return p.LocalTier().Live(0) }, "tier")
	c := p.Client(t)
	if err := c.Set(ctx, "k", "old", 0).Err(); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		c.Get(ctx, "k")
	}
	old.Kill(t)
	next := g.WaitNewPrimary(t, old, 30*time.Second)
	redistest.Eventually(t, 5*time.Second, func() bool { return p.SentinelPrimary() == next.Addr() }, "proxy did not follow")
	if err := next.Client(t).Set(ctx, "k", "new", 0).Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	for range 10 {
		v, err := c.Get(ctx, "k").Result()
		if err == nil && v != "new" {
			t.Fatalf("GET k = %q after the switch and a write on the new primary, want new", v)
		}
	}
}
