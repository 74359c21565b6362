package proxy_test

import (
	"testing"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// TestProxysOwnHiddenCommandIsNoPolicyFixup: the commands the proxy adds
// for its own bookkeeping on a pinned connection (a held MULTI in cluster
// mode, naming the connection after the client, DISCARD, UNWATCH) are
// hidden from the client like a policy fix-up, but one that fails is no
// fix-up failure. With the policy off, a held MULTI Redis refused was
// counted in redproxy_policy_fixup_failures_total and logged as "policy
// TTL fix-up failed" (found by a fault probe, there a held MULTI cut by a
// frozen cluster node; here an upstream user Redis denies MULTI).
func TestProxysOwnHiddenCommandIsNoPolicyFixup(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	for _, n := range c.Nodes {
		if err := n.Client(t).Do(ctx, "ACL", "SETUSER", "nomulti", "on", ">pw", "~*", "&*", "+@all", "-multi").Err(); err != nil {
			t.Fatal(err)
		}
	}
	p := proxytest.Start(t, nil, func(cfg *config.Config) {
		cfg.Upstream.Mode = config.ModeCluster
		cfg.Upstream.Seeds = c.Seeds()
		cfg.Upstream.Username, cfg.Upstream.Password = "nomulti", "pw"
		cfg.Policy.Mode = "off"
	})
	rc := dialRaw(t, p.Addr)
	wantReplies(t, rc, []string{"AUTH", "nomulti", "pw"}, "OK")
	if got := rc.do("MULTI"); got != "OK" { // held by the proxy until a key names the node
		t.Fatalf("MULTI = %v", got)
	}
	// Sent behind the refused MULTI, SET runs at once, as on Redis after a
	// refused MULTI; EXEC then fails.
	set := rc.do("SET", "k", "v")
	exec := rc.do("EXEC")
	t.Logf("SET = %#v, EXEC = %#v", set, exec)
	if _, ok := exec.(respError); !ok {
		t.Errorf("EXEC after a MULTI Redis refused: %#v, want an error", exec)
	}
	if n, _, err := metrics.CounterSum(p.Metrics.Registry, "redproxy_policy_fixup_failures_total"); err != nil || n != 0 {
		t.Errorf("redproxy_policy_fixup_failures_total = %v (%v) with the policy off, want 0", n, err)
	}
}
