package proxy_test

// Sentinel mode under faults a review checked and found handled (branch
// rev-sentinel): kept as regression tests.

import (
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// TestSentinelFrozenPrimaryFailover: the primary hangs (SIGSTOP: a host
// gone without closing its sockets) with a read, a blocked BLPOP and the
// local tier's tracking connection waiting on it. The Sentinels promote a
// replica; the proxy must follow promptly, fail what waited on the frozen
// server with "connection lost" (not after dead_timeout), and serve from
// the new primary.
func TestSentinelFrozenPrimaryFailover(t *testing.T) {
	g := redistest.StartSentinelGroup(t, redistest.SentinelOptions{})
	old := g.Nodes[0]
	p := proxytest.Start(t, old, func(c *config.Config) {
		sentinelConfig(g, g.SentinelAddrs())(c)
		c.LocalCache.Enabled = true
		c.LocalCache.AdmitMinReads = 0
	})
	redistest.Eventually(t, 10*time.Second, func() bool { return p.LocalTier().Live(0) }, "local tier never became live")
	c := p.Client(t)
	if err := c.Set(ctx, "k", "v1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	blocked := p.Client(t)
	blockErr := make(chan error, 1)
	go func() { blockErr <- blocked.BLPop(ctx, 0, "nothing").Err() }()
	time.Sleep(200 * time.Millisecond)

	old.Freeze(t)
	defer old.Thaw(t)
	frozenAt := time.Now()
	reader := p.Client(t, func(o *redis.Options) { o.ReadTimeout = 60 * time.Second })
	getErr := make(chan error, 1)
	go func() { getErr <- reader.Get(ctx, "k").Err() }()

	next := g.WaitNewPrimary(t, old, 30*time.Second)
	promotedAt := time.Now()
	redistest.Eventually(t, 5*time.Second, func() bool { return p.SentinelPrimary() == next.Addr() },
		"the proxy did not follow to %s", next.Addr())
	t.Logf("frozen at 0, promotion seen at %s, proxy switched by %s", promotedAt.Sub(frozenAt).Round(time.Millisecond), time.Since(frozenAt).Round(time.Millisecond))
	for name, ch := range map[string]chan error{"GET pending on the frozen primary": getErr, "BLPOP blocked on it": blockErr} {
		select {
		case err := <-ch:
			t.Logf("%s ended %s after the freeze: %v", name, time.Since(frozenAt).Round(time.Millisecond), err)
		case <-time.After(5 * time.Second):
			t.Errorf("%s still waiting %s after the freeze, 5s after the switch", name, time.Since(frozenAt).Round(time.Millisecond))
		}
	}
	redistest.Eventually(t, 5*time.Second, func() bool { return c.Set(ctx, "k", "v2", 0).Err() == nil }, "writes never worked on the new primary")
	for range 5 {
		if v, err := c.Get(ctx, "k").Result(); err != nil || v != "v2" {
			t.Fatalf("GET after the switch = %q, %v; want v2", v, err)
		}
	}
}

// TestSentinelAllDownAtStartThenBack: every Sentinel is down when the proxy starts, with the local tier on;
// it starts not ready, answers "upstream unavailable", and once a Sentinel
// is back it serves, the tier included, from the primary.
func TestSentinelAllDownAtStartThenBack(t *testing.T) {
	g := redistest.StartSentinelGroup(t, redistest.SentinelOptions{Replicas: 1, Sentinels: 1})
	g.Sentinels[0].Kill(t)
	p := proxytest.StartUnready(t, nil, func(c *config.Config) {
		sentinelConfig(g, g.SentinelAddrs())(c)
		c.LocalCache.Enabled = true
		c.LocalCache.AdmitMinReads = 0
	})
	c := p.Client(t)
	if err := c.Set(ctx, "k", "v", 0).Err(); err == nil || !strings.Contains(err.Error(), "unavailable") {
		t.Fatalf("SET with no Sentinel = %v, want upstream unavailable", err)
	}
	g.Sentinels[0].Restart(t)
	redistest.Eventually(t, 15*time.Second, p.Ready, "never ready once the Sentinel was back")
	redistest.Eventually(t, 5*time.Second, func() bool { return c.Set(ctx, "k", "v", 0).Err() == nil }, "writes never worked")
	if v, err := g.Nodes[0].Client(t).Get(ctx, "k").Result(); err != nil || v != "v" {
		t.Fatalf("the SET did not reach the primary: %q, %v", v, err)
	}
	redistest.Eventually(t, 10*time.Second, func() bool { return p.LocalTier().Live(0) }, "the tier never became live")
	if err := g.Nodes[0].Client(t).Set(ctx, "k", "direct", 0).Err(); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 3*time.Second, func() bool { v, _ := c.Get(ctx, "k").Result(); return v == "direct" }, "a direct write on the primary never showed through the tier")
}
