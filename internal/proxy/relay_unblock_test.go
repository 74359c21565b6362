package proxy_test

import (
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// CLIENT UNBLOCK where one side is relayed (CLIENT TRACKING: rueidis and
// redis-py's client-side caching track on every connection, their
// blocking workers included). A relayed client's UNBLOCK is the proxy's,
// answered in order by a script; a relayed client blocked on its relay's
// connection is unblocked through that connection's Redis id, learnt in
// its handshake. Before, the first was refused and the second answered 0
// and left the worker blocked.
func TestRelayedClientUnblock(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	direct := p.Redis.Client(t)
	unblock := func(id int64, mode ...string) []string {
		return append([]string{"CLIENT", "UNBLOCK", strconv.FormatInt(id, 10)}, mode...)
	}
	tracking := func(proto string) *rawConn {
		c := dialRaw(t, p.Addr)
		c.do("HELLO", proto)
		wantReplies(t, c, []string{"CLIENT", "TRACKING", "ON"}, "OK")
		return c
	}
	errUnblocked := respError("UNBLOCKED client unblocked via CLIENT UNBLOCK")
	for _, proto := range []string{"2", "3"} {
		for _, tc := range []struct {
			name                  string
			relayedAdmin, relayed bool
			mode                  []string
			want                  any
		}{
			{"relayed admin, shared target", true, false, nil, nil},
			{"relayed admin, shared target, ERROR", true, false, []string{"ERROR"}, errUnblocked},
			{"shared admin, relayed target", false, true, []string{"TIMEOUT"}, nil},
			{"shared admin, relayed target, ERROR", false, true, []string{"error"}, errUnblocked},
			{"relayed admin, relayed target", true, true, nil, nil},
		} {
			admin := dialRaw(t, p.Addr)
			if tc.relayedAdmin {
				admin = tracking(proto)
			}
			blocked := dialRaw(t, p.Addr)
			if tc.relayed {
				blocked = tracking(proto)
			}
			id := blocked.do("CLIENT", "ID").(int64)
			// Not blocked yet: 0, from Redis for a relayed target.
			wantReplies(t, admin, unblock(id, tc.mode...), int64(0))
			blocked.send([]string{"BLPOP", "ub:q", "0"})
			redistest.Eventually(t, 5*time.Second, func() bool { return blockedClients(direct) == 1 }, "%s: BLPOP never blocked", tc.name)
			// Answered in order among the admin's other commands.
			wantReplies(t, admin, []string{"SET", "ub:k", "1"}, unblock(id, tc.mode...), []string{"GET", "ub:k"}, "OK", int64(1), "1")
			if got, _ := blocked.readReply(); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("RESP%s, %s: BLPOP answered %#v, want %#v", proto, tc.name, got, tc.want)
			}
			wantReplies(t, admin, unblock(id, tc.mode...), int64(0))
			// Both go on as before.
			wantReplies(t, blocked, []string{"LPUSH", "ub:q", "x"}, []string{"BLPOP", "ub:q", "0"}, int64(1), []any{"ub:q", "x"})
			wantReplies(t, admin, []string{"PING"}, "PONG")
		}
		// A relayed admin's own id, unknown ids and bad arguments answer
		// as on Redis; too many arguments is Redis's own error.
		admin := tracking(proto)
		self := admin.do("CLIENT", "ID").(int64)
		wantReplies(t, admin, unblock(self), unblock(self+1000), unblock(1, "FOO"), []string{"CLIENT", "UNBLOCK", "x"},
			[]string{"CLIENT", "UNBLOCK", "1", "TIMEOUT", "x"},
			int64(0), int64(0), respError("ERR CLIENT UNBLOCK reason should be TIMEOUT or ERROR"),
			respError("ERR value is not an integer or out of range"), respError("ERR unknown subcommand or wrong number of arguments"))
	}
}

// A relayed client inside its MULTI, or in RESP2 subscribed mode, has no
// script to carry the proxy's answer: CLIENT UNBLOCK stays refused there,
// by a command Redis does not know, whose error names the reason.
func TestRelayedClientUnblockRefusedWhereNoScriptRuns(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	refused := respError("ERR unknown command 'redproxy-refused', with args beginning with: 'redproxy: CLIENT UNBLOCK is not supported")
	c := dialRaw(t, p.Addr)
	wantReplies(t, c, []string{"CLIENT", "TRACKING", "ON"}, []string{"MULTI"}, []string{"CLIENT", "UNBLOCK", "1"}, []string{"EXEC"},
		"OK", "OK", refused, respError("EXECABORT"))
	sub := dialRaw(t, p.Addr)
	wantReplies(t, sub, []string{"SUBSCRIBE", "ub:ch"}, []string{"CLIENT", "UNBLOCK", "1"},
		[]any{"subscribe", "ub:ch", int64(1)}, refused)
}

// The relay's handshake asks CLIENT ID; an upstream user Redis does not
// let run it still relays (the id only serves UNBLOCK), and an UNBLOCK of
// such a client answers 0 without reaching Redis with a made-up id.
func TestRelayWithoutClientIDPermission(t *testing.T) {
	rs := redistest.Start(t)
	if err := rs.Client(t).Do(ctx, "ACL", "SETUSER", "noid", "on", ">pw", "~*", "&*", "+@all", "-client|id").Err(); err != nil {
		t.Fatal(err)
	}
	p := proxytest.Start(t, rs, func(c *config.Config) {
		c.Upstream.Username, c.Upstream.Password = "noid", "pw"
	})
	blocked := dialRaw(t, p.Addr)
	wantReplies(t, blocked, []string{"AUTH", "noid", "pw"}, []string{"CLIENT", "TRACKING", "ON"}, []string{"SET", "ub:k", "v"}, []string{"GET", "ub:k"}, "OK", "OK", "OK", "v")
	id := blocked.do("CLIENT", "ID").(int64)
	blocked.send([]string{"BLPOP", "ub:q", "0"})
	redistest.Eventually(t, 5*time.Second, func() bool { return blockedClients(rs.Client(t)) == 1 }, "BLPOP never blocked")
	admin := dialRaw(t, p.Addr)
	wantReplies(t, admin, []string{"AUTH", "noid", "pw"}, []string{"CLIENT", "UNBLOCK", strconv.FormatInt(id, 10)}, "OK", int64(0))
	rs.Client(t).RPush(ctx, "ub:q", "x")
	if got, _ := blocked.readReply(); !reflect.DeepEqual(got, []any{"ub:q", "x"}) {
		t.Fatalf("BLPOP answered %#v", got)
	}
}
