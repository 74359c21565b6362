package proxy_test

import (
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// A proxy user with an upstream credential of its own ([[users]]
// upstream_user) has pools of its own (users.go), which a failover left on
// the old primary: the user's writes were acknowledged there and lost, and
// once it was gone they failed for good (found by review). They follow now.
func TestSentinelUserCredentialFollowsFailover(t *testing.T) {
	g := redistest.StartSentinelGroup(t, redistest.SentinelOptions{})
	old := g.Nodes[0]
	dir := t.TempDir()
	// Redis's "default" user is nopass: any password is accepted, so no
	// ACL has to be set up on every node.
	if err := writeFileT(dir+"/pw", "anything\n"); err != nil {
		t.Fatal(err)
	}
	p := proxytest.Start(t, old, func(c *config.Config) {
		sentinelConfig(g, g.SentinelAddrs())(c)
		a := user("app", appPass, "+@all ~*")
		a.UpstreamUser, a.UpstreamPasswordFile = "default", dir+"/pw"
		c.Users = []auth.UserConfig{a}
	})
	app := loggedIn(t, p, "app", appPass)
	if err := app.Set(ctx, "before", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}

	g.Failover(t)
	next := g.WaitNewPrimary(t, old, 30*time.Second)
	redistest.Eventually(t, 2*time.Second, func() bool { return p.SentinelPrimary() == next.Addr() },
		"the proxy did not follow to %s", next.Addr())

	redistest.Eventually(t, 5*time.Second, func() bool { return app.Set(ctx, "after", "v", 0).Err() == nil },
		"a user with its own upstream credential cannot write after the failover to %s", next.Addr())
	if v, err := next.Client(t).Get(ctx, "after").Result(); err != nil || v != "v" {
		ov, oerr := old.Client(t).Get(ctx, "after").Result()
		t.Fatalf("acknowledged write is not on the new primary %s: %q, %v; on the old primary %s: %q, %v", next.Addr(), v, err, old.Addr(), ov, oerr)
	}
	// With the old primary gone, the user writes on.
	old.Kill(t)
	redistest.Eventually(t, 5*time.Second, func() bool { return app.Set(ctx, "after-kill", "v", 0).Err() == nil },
		"with the old primary gone, the user's SET still fails")
}

// TestSentinelUpstreamUserWithoutAdminCommands: an upstream Redis user
// denied @admin and @dangerous (a common hardened account) served the
// proxy in standalone mode, but in Sentinel mode the proxy never found a
// primary and stayed not ready, every client getting "upstream
// unavailable" (found by review): each candidate the Sentinels named was
// checked with ROLE, which such a user may not run, and the -NOPERM reply
// was reported as "not a primary". A Sentinel-aware client with the same
// user works (it only asks the Sentinels). The check asks HELLO now,
// whose reply has the role and which any user may send; the proxy is
// ready, writes reach the primary, and it follows a failover.
func TestSentinelUpstreamUserWithoutAdminCommands(t *testing.T) {
	g := redistest.StartSentinelGroup(t, redistest.SentinelOptions{Replicas: 1, Sentinels: 1})
	for _, n := range g.Nodes {
		if err := n.Client(t).Do(ctx, "ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all", "-@admin", "-@dangerous").Err(); err != nil {
			t.Fatal(err)
		}
	}
	old := g.Nodes[0]
	// The premise: this user may not run ROLE, and a Sentinel-aware
	// client with it works.
	ac := redis.NewClient(&redis.Options{Addr: old.Addr(), Username: "app", Password: "pw", MaxRetries: -1})
	defer ac.Close()
	if err := ac.Do(ctx, "ROLE").Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("ROLE as app = %v, want NOPERM", err)
	}
	fc := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: g.Name, SentinelAddrs: g.SentinelAddrs(), Username: "app", Password: "pw", MaxRetries: -1})
	defer fc.Close()
	if err := fc.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("go-redis failover client with user app: %v", err)
	}

	p := proxytest.StartUnready(t, nil, func(c *config.Config) {
		sentinelConfig(g, g.SentinelAddrs())(c)
		c.Upstream.Username, c.Upstream.Password = "app", "pw"
	})
	redistest.Eventually(t, 8*time.Second, p.Ready, "Sentinel mode with upstream user app (+@all -@admin -@dangerous) never ready; primary known = %q", p.SentinelPrimary())
	if got := p.SentinelPrimary(); got != old.Addr() {
		t.Fatalf("primary = %q, want %s", got, old.Addr())
	}
	c := p.Client(t, func(o *redis.Options) { o.Username, o.Password = "app", "pw" })
	if err := c.Set(ctx, "k", "through-proxy", 0).Err(); err != nil {
		t.Fatalf("SET through the proxy: %v", err)
	}
	if v, err := old.Client(t).Get(ctx, "k").Result(); err != nil || v != "through-proxy" {
		t.Fatalf("the SET did not reach the primary: %q, %v", v, err)
	}

	g.Failover(t)
	next := g.WaitNewPrimary(t, old, 30*time.Second)
	redistest.Eventually(t, 5*time.Second, func() bool { return p.SentinelPrimary() == next.Addr() },
		"the proxy did not follow to %s", next.Addr())
	redistest.Eventually(t, 5*time.Second, func() bool { return c.Set(ctx, "k", "after", 0).Err() == nil }, "writes never worked on the new primary")
	if v, err := next.Client(t).Get(ctx, "k").Result(); err != nil || v != "after" {
		t.Fatalf("the SET after the failover is not on the new primary %s: %q, %v", next.Addr(), v, err)
	}
}
