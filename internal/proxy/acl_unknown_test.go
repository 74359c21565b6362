package proxy_test

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/proxy"
	"github.com/redproxy/redproxy/internal/redistest"
)

// A command the proxy's command table does not know was allowed by +@all
// without a look at the user's key patterns, its keys being unknown: with
// a table lacking GETDEL (the built-in table in front of a newer Redis, or
// a module's command), a user allowed only ~cache:* read and deleted
// "secret" (found by review). Such a command now needs every key.
func TestUnknownCommandNeedsEveryKey(t *testing.T) {
	rs := redistest.Start(t)
	var cmds []*commands.Command
	for _, c := range commands.Builtin().Commands() {
		if c.Name != "getdel" {
			cmds = append(cmds, c)
		}
	}
	cfg := config.Default()
	cfg.Server.Listen = "127.0.0.1:0"
	cfg.Server.Admin = ""
	cfg.Upstream.Address = rs.Addr()
	cfg.Upstream.Connections = 2
	cfg.Users = []auth.UserConfig{user("cacheonly", nsPass, "+@all ~cache:*"), user("everykey", nsPass, "+@all ~*")}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	srv, err := proxy.NewServer(proxy.Options{Config: cfg, Table: commands.NewTable(cmds), Logger: slog.New(slog.DiscardHandler), Metrics: metrics.New()})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.ServeListener(config.ListenerPlain, ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	redistest.Eventually(t, 5*time.Second, srv.Ready, "proxy never ready")

	direct := rs.Client(t)
	must(t, direct.Set(ctx, "secret", "S3CRET", 0).Err())
	must(t, direct.Set(ctx, "cache:x", "X", 0).Err())
	c := dialRaw(t, ln.Addr().String())
	if got := c.do("AUTH", "cacheonly", nsPass); got != "OK" {
		t.Fatalf("AUTH: %v", got)
	}
	for _, key := range []string{"secret", "cache:x"} {
		if got := c.do("GETDEL", key); got != respError("NOPERM No permissions to access a key") {
			t.Errorf("GETDEL %s, unknown to the table, as a user allowed only ~cache:*: %v", key, got)
		}
	}
	if n, _ := direct.Exists(ctx, "secret", "cache:x").Result(); n != 2 {
		t.Errorf("a key was deleted through the proxy by a command it could not check")
	}
	// A user allowed every key still runs it.
	if got := c.do("AUTH", "everykey", nsPass); got != "OK" {
		t.Fatalf("AUTH: %v", got)
	}
	if got := c.do("GETDEL", "secret"); got != "S3CRET" {
		t.Errorf("GETDEL secret as a user allowed every key: %v", got)
	}
}
