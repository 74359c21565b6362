package proxy_test

import (
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// TestSentinelRoutesReadAfterSwitchNotJoinedToOldFetch: a GET of a key
// routed to a named Sentinel upstream is in flight to its primary, frozen;
// the group fails over; once the proxy follows, a second GET of the same
// key is answered by the new primary, not joined to the fetch sent to the
// old one (no stale value, no "connection lost" it never earned).
func TestSentinelRoutesReadAfterSwitchNotJoinedToOldFetch(t *testing.T) {
	g := redistest.StartSentinelGroup(t, redistest.SentinelOptions{Replicas: 1, Sentinels: 1})
	def := redistest.Start(t)
	p := proxytest.Start(t, def, func(c *config.Config) {
		u := namedUpstream("")
		u.Mode, u.Address = config.ModeSentinel, ""
		u.Sentinels, u.MasterName = g.SentinelAddrs(), g.Name
		c.Upstreams = map[string]config.Upstream{"s": u}
		c.Routes = []config.Route{{Pattern: "s:*", Upstream: "s"}}
	})
	old := g.Nodes[0]
	a := dialAddr(t, p.Addr)
	if got := rawDo(t, a, "SET", "s:k", "old"); got != "+OK\r\n" {
		t.Fatalf("SET = %q", got)
	}
	redistest.Eventually(t, 5*time.Second, func() bool { return g.Nodes[1].Client(t).Get(ctx, "s:k").Val() == "old" }, "replica never synced")
	old.Freeze(t)
	thawed := false
	t.Cleanup(func() {
		if !thawed {
			old.Thaw(t)
		}
	})
	rawSend(t, a, "GET", "s:k") // in flight to the frozen primary
	time.Sleep(200 * time.Millisecond)
	g.Failover(t)
	next := g.WaitNewPrimary(t, old, 30*time.Second)
	if err := next.Client(t).Set(ctx, "s:k", "new", 0).Err(); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 10*time.Second, func() bool { return p.SentinelPrimaryOf("s") == next.Addr() }, "the proxy never followed to %s", next.Addr())
	b := dialAddr(t, p.Addr)
	start := time.Now()
	if got := rawDo(t, b, "GET", "s:k"); got != "$3\r\nnew\r\n" {
		t.Fatalf("GET s:k after the switch = %q, want the new primary's \"new\"", got)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("GET s:k after the switch took %v: it waited on the old primary's fetch", d)
	}
	t.Logf("the GET in flight to the old primary got %q", rawRead(t, a))
	old.Thaw(t)
	thawed = true
}
