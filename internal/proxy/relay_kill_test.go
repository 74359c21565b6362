package proxy_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/proxytest"
)

// CLIENT KILL from a relayed client (CLIENT TRACKING: rueidis and
// redis-py's client-side caching track on every connection) is the
// proxy's own, as on a shared connection: it was refused there. Killing
// another client answers its count in order on the relay's stream; a
// client that kills itself gets the reply to what it sent before and to
// the kill, then the close, and nothing after the kill runs, as on Redis.
func TestRelayedClientKill(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	for _, proto := range []string{"2", "3"} {
		victim := dialRaw(t, p.Addr)
		vid := victim.do("CLIENT", "ID").(int64)
		old := dialRaw(t, p.Addr)
		old.do("PING")

		c := dialRaw(t, p.Addr)
		c.do("HELLO", proto)
		wantReplies(t, c, []string{"CLIENT", "TRACKING", "ON"}, []string{"SET", "rk:a", "1"},
			[]string{"CLIENT", "KILL", "ID", strconv.FormatInt(vid, 10)}, []string{"GET", "rk:a"},
			"OK", "OK", int64(1), "1")
		if out, closed := rfReadAll(victim.nc, 5*time.Second); !closed || out != "" {
			t.Fatalf("RESP%s: the killed client got %q, closed %v", proto, out, closed)
		}
		// The old form names the address and answers OK.
		wantReplies(t, c, []string{"CLIENT", "KILL", old.nc.LocalAddr().String()}, "OK")
		if out, closed := rfReadAll(old.nc, 5*time.Second); !closed || out != "" {
			t.Fatalf("RESP%s: the client killed by address got %q, closed %v", proto, out, closed)
		}
		wantReplies(t, c, []string{"CLIENT", "KILL", "ADDR", "127.0.0.1:1"}, int64(0))

		self := c.do("CLIENT", "ID").(int64)
		wantReplies(t, c, []string{"INCR", "rk:n"}, []string{"CLIENT", "KILL", "ID", strconv.FormatInt(self, 10), "SKIPME", "no"},
			[]string{"INCR", "rk:n"}, int64(1), int64(1))
		if out, closed := rfReadAll(c.nc, 5*time.Second); !closed || out != "" {
			t.Fatalf("RESP%s: the client that killed itself got %q after its replies, closed %v", proto, out, closed)
		}
		if n, err := p.Redis.Client(t).Get(ctx, "rk:n").Int(); err != nil || n != 1 {
			t.Fatalf("RESP%s: rk:n = %d, %v: the INCR after the kill ran", proto, n, err)
		}
		p.Redis.Client(t).Del(ctx, "rk:n")
	}
}

// A policy that denies CLIENT KILL holds on a relay too: the proxy's own
// handling there comes after the guard's refusal.
func TestRelayedClientKillDeniedByPolicy(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) {
		c.Policy = policy.Config{Commands: policy.CommandRules{Deny: []string{"client|kill"}}}
	})
	victim := dialRaw(t, p.Addr)
	vid := victim.do("CLIENT", "ID").(int64)
	c := dialRaw(t, p.Addr)
	c.do("HELLO", "3")
	wantReplies(t, c, []string{"CLIENT", "TRACKING", "ON"}, []string{"CLIENT", "KILL", "ID", strconv.FormatInt(vid, 10)},
		"OK", respError("ERR redproxy policy: CLIENT KILL is disabled"))
	wantReplies(t, victim, []string{"PING"}, "PONG")
}
