package proxy_test

// CLIENT KILL USER of a user that does not exist: Redis refuses it ("No
// such user 'name'"), the proxy answered :0 as for a user with no client
// (found by review). The users that exist for the proxy are the names a
// client of it can have (the configured [[users]], or the upstream
// credential's user, "default" without one) and "default", which Redis
// always has.

import (
	"testing"

	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

func TestClientKillUnknownUser(t *testing.T) {
	direct := redistest.Start(t)
	p := proxytest.Start(t, nil, nil)
	compareWithRedis(t, direct.Addr(), p.Addr, [][]string{
		{"CLIENT", "KILL", "USER", "nobody"}, {"CLIENT", "KILL", "USER", "default"}, {"CLIENT", "KILL", "USER", "Default"},
		{"CLIENT", "KILL", "USER", "nobody", "ID", "0"}, {"CLIENT", "KILL", "ID", "0", "USER", "nobody"},
		{"CLIENT", "KILL", "USER", "no\r\nbody"},
	})
}

// With proxy users: a configured user exists (no client of it: :0), any
// other name is no user.
func TestClientKillUnknownUserWithProxyUsers(t *testing.T) {
	p := usersProxy(t, nil)
	nc := dialAddr(t, p.Addr)
	if got := rawDo(t, nc, "AUTH", "app", appPass); got != "+OK\r\n" {
		t.Fatalf("AUTH app: %q", got)
	}
	for _, c := range []struct{ user, want string }{
		{"ro", ":0\r\n"}, {"default", ":0\r\n"}, {"bob", "-ERR No such user 'bob'\r\n"},
	} {
		if got := rawDo(t, nc, "CLIENT", "KILL", "USER", c.user); got != c.want {
			t.Errorf("CLIENT KILL USER %s answered %q, want %q", c.user, got, c.want)
		}
	}
}

// A client type (or CLIENT SETINFO or HELLO option) named with a line
// break: Redis turns the break into spaces in its error, as every error it
// formats. The proxy put the client's text into its error as it came, so
// "a\r\n+OK" answered a second, forged reply the client had not asked for.
func TestClientUnknownTypeErrorKeepsOneReply(t *testing.T) {
	_, p, direct := newDirectPair(t)
	compareWithRedis(t, direct.Addr(), p.Addr, [][]string{
		{"CLIENT", "LIST", "TYPE", "a\r\n+OK"},
		{"CLIENT", "KILL", "TYPE", "a\r\n+OK"},
		{"CLIENT", "LIST", "TYPE", "x\ny"},
		{"CLIENT", "SETINFO", "a\r\n+OK", "v"},
		{"HELLO", "3", "a\r\n+OK"},
	})
}
