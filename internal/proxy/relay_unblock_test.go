package proxy_test

import (
	"reflect"
	"strconv"
	"strings"
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

// The relay's id comes from HELLO's reply on a RESP3 connection and from
// CLIENT ID on a RESP2 one. An upstream user Redis does not let run CLIENT
// ID still relays over RESP2 (the id only serves UNBLOCK), an UNBLOCK of
// such a client answers 0 without reaching Redis with a made-up id, and
// each such dial leaves a NOPERM entry in Redis's ACL LOG; a RESP3 relay
// leaves none, and is unblocked.
func TestRelayWithoutClientIDPermission(t *testing.T) {
	rs := redistest.Start(t)
	direct := rs.Client(t)
	if err := direct.Do(ctx, "ACL", "SETUSER", "noid", "on", ">pw", "~*", "&*", "+@all", "-client|id").Err(); err != nil {
		t.Fatal(err)
	}
	p := proxytest.Start(t, rs, func(c *config.Config) {
		c.Upstream.Username, c.Upstream.Password = "noid", "pw"
	})
	admin := dialRaw(t, p.Addr)
	wantReplies(t, admin, []string{"AUTH", "noid", "pw"}, "OK")
	aclLog := func() int64 {
		entries, err := direct.Do(ctx, "ACL", "LOG").Slice()
		if err != nil {
			t.Fatal(err)
		}
		return int64(len(entries))
	}
	for _, tc := range []struct {
		proto   string
		unblock int64 // CLIENT UNBLOCK's answer
		logged  int64 // ACL LOG entries the relay's dial added
	}{{"2", 0, 1}, {"3", 1, 0}} {
		if err := direct.Do(ctx, "ACL", "LOG", "RESET").Err(); err != nil {
			t.Fatal(err)
		}
		blocked := dialRaw(t, p.Addr)
		wantReplies(t, blocked, []string{"HELLO", tc.proto, "AUTH", "noid", "pw"})
		blocked.readReply()
		wantReplies(t, blocked, []string{"CLIENT", "TRACKING", "ON"}, []string{"SET", "ub:k", "v"}, []string{"GET", "ub:k"}, "OK", "OK", "v")
		if n := aclLog(); n != tc.logged {
			t.Errorf("RESP%s: %d ACL LOG entries after the relay's dial, want %d", tc.proto, n, tc.logged)
		}
		id := blocked.do("CLIENT", "ID").(int64)
		blocked.send([]string{"BLPOP", "ub:q", "0"})
		redistest.Eventually(t, 5*time.Second, func() bool { return blockedClients(direct) == 1 }, "BLPOP never blocked")
		wantReplies(t, admin, []string{"CLIENT", "UNBLOCK", strconv.FormatInt(id, 10)}, tc.unblock)
		if tc.unblock == 0 {
			direct.RPush(ctx, "ub:q", "x")
			if got, _ := blocked.readReply(); !reflect.DeepEqual(got, []any{"ub:q", "x"}) {
				t.Fatalf("RESP%s: BLPOP answered %#v", tc.proto, got)
			}
		} else if got, _ := blocked.readReply(); got != nil {
			t.Fatalf("RESP%s: unblocked BLPOP answered %#v", tc.proto, got)
		}
		blocked.nc.Close()
	}
}

// A RESP2 relay dialled while a script runs gets -BUSY to the CLIENT ID in
// its handshake. It used to keep id 0 for its life, so CLIENT UNBLOCK of
// its client answered 0 and left it blocked (found by review); its id is
// now looked up in CLIENT LIST by the relay's address, once the script
// has ended. While it runs, the UNBLOCK gets Redis's -BUSY, as on Redis.
func TestRelayDialledDuringAScriptIsUnblocked(t *testing.T) {
	rs := redistest.Start(t, "--busy-reply-threshold", "50")
	direct := rs.Client(t)
	p := proxytest.Start(t, rs, nil)
	admin := dialRaw(t, p.Addr)
	wantReplies(t, admin, []string{"PING"}, "PONG")

	script := rs.Client(t)
	done := make(chan error, 1)
	go func() { done <- script.Eval(ctx, redistest.LoopScript, nil, 20000).Err() }()
	redistest.Eventually(t, 5*time.Second, func() bool {
		err := direct.Ping(ctx).Err()
		return err != nil && strings.HasPrefix(err.Error(), "BUSY")
	}, "the script never made Redis busy")
	blocked := dialRaw(t, p.Addr)
	id := blocked.do("CLIENT", "ID").(int64) // the proxy's answer, before the relay
	// The relay is dialled now; its CLIENT TRACKING ON meets the script.
	blocked.send([]string{"CLIENT", "TRACKING", "ON"})
	if got, _ := blocked.readReply(); !isBusy(got) {
		t.Fatalf("CLIENT TRACKING ON during the script answered %#v", got)
	}
	if got := admin.do("CLIENT", "UNBLOCK", strconv.FormatInt(id, 10)); !isBusy(got) {
		t.Fatalf("CLIENT UNBLOCK during the script answered %#v, want Redis's -BUSY", got)
	}
	if err := direct.Do(ctx, "SCRIPT", "KILL").Err(); err != nil {
		t.Fatal(err)
	}
	<-done
	wantReplies(t, blocked, []string{"CLIENT", "TRACKING", "ON"}, "OK")
	blocked.send([]string{"BLPOP", "ub:q", "0"})
	redistest.Eventually(t, 5*time.Second, func() bool { return blockedClients(direct) == 1 }, "BLPOP never blocked")
	wantReplies(t, admin, []string{"CLIENT", "UNBLOCK", strconv.FormatInt(id, 10)}, int64(1))
	if got, _ := blocked.readReply(); got != nil {
		t.Fatalf("unblocked BLPOP answered %#v", got)
	}
	wantReplies(t, admin, []string{"CLIENT", "UNBLOCK", strconv.FormatInt(id, 10)}, int64(0))
}

func isBusy(reply any) bool {
	e, ok := reply.(respError)
	return ok && strings.HasPrefix(string(e), "BUSY")
}
