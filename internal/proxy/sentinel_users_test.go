package proxy_test

import (
	"testing"
	"time"

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
