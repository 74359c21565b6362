package proxy_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/redistest"
)

// TestReplicaReadsOwnCredential (issue 14): a proxy user with an upstream
// credential of its own reads from the replica too, on connections with
// that credential: with read_from = "replica" its GETs run on the replica
// (none on the primary), under its Redis user there (CLIENT LIST), and a
// key that Redis user may not read is refused by the replica's ACL (ACL
// LOG names the user and key) as by the primary's; a key the proxy user
// may not touch is refused by the proxy before any server. Its writes go
// to the primary and it reads them back.
func TestReplicaReadsOwnCredential(t *testing.T) {
	g := startReplicated(t, 1)
	ctx := context.Background()
	// ACLs are not replicated: each server gets the user.
	for _, s := range []*redistest.Server{g.primary, g.replicas[0]} {
		if err := s.Client(t).Do(ctx, "ACL", "SETUSER", "redis-app", "on", ">redis-app-pw", "~app:*", "+@all").Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.primary.Client(t).Set(ctx, "app:k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := g.primary.Client(t).Set(ctx, "secret:k", "s", 0).Err(); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 5*time.Second, func() bool { return g.replicas[0].Client(t).Get(ctx, "secret:k").Val() == "s" }, "replica never synced")
	dir := t.TempDir()
	if err := writeFileT(dir+"/app", "redis-app-pw\n"); err != nil {
		t.Fatal(err)
	}
	p := g.proxy(t, config.ReadReplica, func(c *config.Config) {
		a := user("app", appPass, "+@all ~app:* ~secret:*") // Redis's ACL is the backstop for secret:*
		a.UpstreamUser, a.UpstreamPasswordFile = "redis-app", dir+"/app"
		c.Users = []auth.UserConfig{a}
	})
	resetStats(t, g.primary, g.replicas[0])
	for _, s := range []*redistest.Server{g.primary, g.replicas[0]} {
		if err := s.Client(t).Do(ctx, "ACL", "LOG", "RESET").Err(); err != nil {
			t.Fatal(err)
		}
	}
	app := loggedIn(t, p, "app", appPass)
	for range 20 {
		if v, err := app.Get(ctx, "app:k").Result(); err != nil || v != "v" {
			t.Fatalf("app's GET app:k = %q, %v", v, err)
		}
	}
	if n := calls(t, g.primary, "get"); n != 0 {
		t.Errorf("the primary ran %d of app's GETs; want 0 with read_from = replica", n)
	}
	if n := calls(t, g.replicas[0], "get"); n < 20 {
		t.Errorf("the replica ran %d GETs; want app's 20", n)
	}
	list, err := g.replicas[0].Client(t).ClientList(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, line := range strings.Split(list, "\n") {
		if strings.Contains(line, "user=redis-app ") && strings.Contains(line, "cmd=get") {
			found = true
		}
	}
	if !found {
		t.Errorf("no connection of redis-app that ran GET on the replica:\n%s", list)
	}

	// Redis's ACL on the replica refuses what redis-app may not read.
	if _, err := app.Get(ctx, "secret:k").Result(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("app's GET secret:k = %v; want NOPERM from the replica's ACL", err)
	}
	log, err := g.replicas[0].Client(t).Do(ctx, "ACL", "LOG").Slice()
	if err != nil {
		t.Fatal(err)
	}
	if s := fmt.Sprint(log); !strings.Contains(s, "redis-app") || !strings.Contains(s, "secret:k") {
		t.Errorf("the replica's ACL LOG does not show redis-app refused secret:k: %s", s)
	}
	// The proxy's own ACL still refuses first.
	if _, err := app.Get(ctx, "other:k").Result(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("app's GET other:k = %v; want the proxy's NOPERM", err)
	}

	// Writes go to the primary; the writer reads its own.
	if err := app.Set(ctx, "app:k", "v2", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if v, err := app.Get(ctx, "app:k").Result(); err != nil || v != "v2" {
		t.Fatalf("app's GET after its SET = %q, %v; want v2", v, err)
	}
	if n := calls(t, g.primary, "set"); n != 1 {
		t.Errorf("the primary ran %d SETs; want app's 1", n)
	}
}
