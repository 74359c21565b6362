package proxy_test

import (
	"testing"

	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
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
	p := proxytest.StartWithTable(t, rs, commands.NewTable(cmds), func(cfg *config.Config) {
		cfg.Users = []auth.UserConfig{user("cacheonly", nsPass, "+@all ~cache:*"), user("everykey", nsPass, "+@all ~*")}
	})

	direct := rs.Client(t)
	must(t, direct.Set(ctx, "secret", "S3CRET", 0).Err())
	must(t, direct.Set(ctx, "cache:x", "X", 0).Err())
	c := dialRaw(t, p.Addr)
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
