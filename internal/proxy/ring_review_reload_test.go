package proxy_test

import (
	"strconv"
	"testing"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// TestRingReviewReloadDefaultAddress: the ring hashes [upstream] under its
// address. A reload may change upstream.address (the routes unchanged);
// the proxy then keeps placing keys as before, but the same configuration
// started afresh places them by the new address: reload and restart
// disagree about where a key is.
func TestRingReviewReloadDefaultAddress(t *testing.T) {
	shards := []*redistest.Server{redistest.Start(t), redistest.Start(t), redistest.Start(t)}
	replacement := redistest.Start(t) // shard 0 moved to a new server
	mutate := func(c *config.Config) {
		c.Upstreams = map[string]config.Upstream{"s1": namedUpstream(shards[1].Addr()), "s2": namedUpstream(shards[2].Addr())}
		c.Routes = []config.Route{{Pattern: "*", Upstreams: []string{config.DefaultUpstream, "s1", "s2"}}}
	}
	p := proxytest.Start(t, shards[0], mutate)
	c := p.Client(t)
	const n = 150
	for i := range n {
		if err := c.Set(ctx, ringKey(i), strconv.Itoa(i), 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// Copy shard 0 to its replacement, as a move of the server would.
	keys := shards[0].Client(t).Keys(ctx, "*").Val()
	for _, k := range keys {
		replacement.Client(t).Set(ctx, k, shards[0].Client(t).Get(ctx, k).Val(), 0)
	}
	next := *p.Config()
	next.Upstream.Address = replacement.Addr()
	if _, err := p.Reload(&next); err != nil {
		t.Fatal(err)
	}
	missAfterReload := 0
	for i := range n {
		if c.Get(ctx, ringKey(i)).Val() != strconv.Itoa(i) {
			missAfterReload++
		}
	}
	// The same configuration, started afresh.
	fresh := proxytest.Start(t, replacement, mutate)
	fc := fresh.Client(t)
	missAfterRestart := 0
	for i := range n {
		if fc.Get(ctx, ringKey(i)).Val() != strconv.Itoa(i) {
			missAfterRestart++
		}
	}
	t.Logf("shard 0 held %d keys; missed after reload %d, after restart %d", len(keys), missAfterReload, missAfterRestart)
	if missAfterReload != missAfterRestart {
		t.Errorf("reload and restart with the same configuration place keys differently: %d of %d keys missed after the reload, %d after a restart", missAfterReload, n, missAfterRestart)
	}
}
