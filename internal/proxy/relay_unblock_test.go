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

// CLIENT UNBLOCK of a relayed client (CLIENT TRACKING: rueidis and
// redis-py's client-side caching track on every connection, their blocking
// workers' included): its BLPOP runs on its relay's connection, unblocked
// through that connection's Redis id, learnt in its handshake. Before, the
// UNBLOCK answered 0 and left the worker blocked.
func TestRelayedClientUnblock(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	direct := p.Redis.Client(t)
	unblock := func(id int64, mode ...string) []string {
		return append([]string{"CLIENT", "UNBLOCK", strconv.FormatInt(id, 10)}, mode...)
	}
	errUnblocked := respError("UNBLOCKED client unblocked via CLIENT UNBLOCK")
	admin := dialRaw(t, p.Addr)
	for _, proto := range []string{"2", "3"} {
		for _, tc := range []struct {
			mode []string
			want any
		}{
			{nil, nil},
			{[]string{"TIMEOUT"}, nil},
			{[]string{"error"}, errUnblocked},
		} {
			blocked := dialRaw(t, p.Addr)
			blocked.do("HELLO", proto)
			wantReplies(t, blocked, []string{"CLIENT", "TRACKING", "ON"}, "OK")
			id := blocked.do("CLIENT", "ID").(int64)
			// Not blocked yet: Redis's 0.
			wantReplies(t, admin, unblock(id, tc.mode...), int64(0))
			blocked.send([]string{"BLPOP", "ub:q", "0"})
			redistest.Eventually(t, 5*time.Second, func() bool { return blockedClients(direct) == 1 }, "BLPOP never blocked")
			// In order among the admin's other commands.
			wantReplies(t, admin, []string{"SET", "ub:k", "1"}, unblock(id, tc.mode...), []string{"GET", "ub:k"}, "OK", int64(1), "1")
			if got, _ := blocked.readReply(); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("RESP%s, %v: BLPOP answered %#v, want %#v", proto, tc.mode, got, tc.want)
			}
			wantReplies(t, admin, unblock(id, tc.mode...), int64(0))
			// It goes on as before.
			wantReplies(t, blocked, []string{"LPUSH", "ub:q", "x"}, []string{"BLPOP", "ub:q", "0"}, int64(1), []any{"ub:q", "x"})
			blocked.nc.Close()
		}
	}
}

// A relayed client's own CLIENT UNBLOCK is refused: done when read, as its
// CLIENT KILL is, it would act before the commands it sent ahead of it
// had run (found by review: "LPUSH q job, CLIENT UNBLOCK worker" left the
// worker with a timeout and the job in the list); forwarded, the proxy id
// would name an unrelated Redis connection.
func TestRelayedClientUnblockIsRefused(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	refused := respError("ERR redproxy: CLIENT UNBLOCK is not supported")
	queueRefused := respError("ERR unknown command 'redproxy-refused', with args beginning with: 'redproxy: CLIENT UNBLOCK is not supported")
	c := dialRaw(t, p.Addr)
	wantReplies(t, c, []string{"CLIENT", "TRACKING", "ON"}, []string{"CLIENT", "UNBLOCK", "1"}, []string{"PING"}, "OK", refused, "PONG")
	wantReplies(t, c, []string{"MULTI"}, []string{"CLIENT", "UNBLOCK", "1"}, []string{"EXEC"}, "OK", queueRefused, respError("EXECABORT"))
	sub := dialRaw(t, p.Addr)
	wantReplies(t, sub, []string{"SUBSCRIBE", "ub:ch"}, []string{"CLIENT", "UNBLOCK", "1"},
		[]any{"subscribe", "ub:ch", int64(1)}, queueRefused)
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
