package proxy_test

// Differences from Redis found by the compatibility review of
// docs/COMPATIBILITY.md, each failing before its fix. Most run the same
// commands against a real redis-server directly and through the proxy and
// expect the proxy to answer as Redis does; CLIENT ID/INFO/LIST inside
// MULTI answer the proxy's own (TestClientIdentityInsideMulti).

import (
	"strings"
	"testing"

	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// CLIENT SETNAME queued inside MULTI names the connection when EXEC runs
// it, on Redis. Through the proxy it is queued on the pinned connection,
// but the proxy's own record of the client's name (which answers CLIENT
// GETNAME, CLIENT LIST and CLIENT INFO outside the transaction) is never
// updated: after EXEC, CLIENT GETNAME answers the name from before the
// transaction (null here), and the name set is lost.
func TestCompatReviewClientSetnameInsideMultiIsKept(t *testing.T) {
	rs := redistest.Start(t)
	p := proxytest.Start(t, rs, nil)

	run := func(addr string) (exec, getname string) {
		nc := dialAddr(t, addr)
		if got := rawDo(t, nc, "MULTI"); got != "+OK\r\n" {
			t.Fatalf("MULTI: %q", got)
		}
		if got := rawDo(t, nc, "CLIENT", "SETNAME", "inner"); got != "+QUEUED\r\n" {
			t.Fatalf("CLIENT SETNAME in MULTI: %q", got)
		}
		exec = rawDo(t, nc, "EXEC")
		getname = rawDo(t, nc, "CLIENT", "GETNAME")
		return exec, getname
	}
	rExec, rName := run(rs.Addr())
	pExec, pName := run(p.Addr)
	if rExec != pExec {
		t.Errorf("EXEC: redis %q, proxy %q", rExec, pExec)
	}
	if rName != "$5\r\ninner\r\n" {
		t.Fatalf("redis itself answered CLIENT GETNAME %q", rName)
	}
	if pName != rName {
		t.Errorf("CLIENT GETNAME after MULTI / CLIENT SETNAME inner / EXEC: redis %q, proxy %q", rName, pName)
	}
}

// A client's ID is the same for its connection's life on Redis, inside
// MULTI too. Through the proxy, CLIENT ID inside MULTI was queued on the
// pinned connection and EXEC answered that Redis connection's ID, which
// may be the proxy ID of some other client (so a CLIENT UNBLOCK or CLIENT
// KILL ID built from it reached the wrong client); CLIENT INFO described
// the proxy's upstream connection and CLIENT LIST listed every upstream
// connection of the proxy (found by review). They were then refused
// inside MULTI, which a client running them in a transaction, as it may
// on Redis, took for an error; now EXEC carries the proxy's own answers
// (queued as a script returning them, as on a relay), in RESP2 and
// RESP3, and never another connection's identity.
func TestClientIdentityInsideMulti(t *testing.T) {
	rs := redistest.Start(t)
	p := proxytest.Start(t, rs, nil)
	for _, proto := range []string{"2", "3"} {
		nc := dialAddr(t, p.Addr)
		rawDo(t, nc, "HELLO", proto)
		rawDo(t, nc, "CLIENT", "SETNAME", "tx-"+proto)
		id := strings.Trim(rawDo(t, nc, "CLIENT", "ID"), ":\r\n")
		rawDo(t, nc, "MULTI")
		for _, sub := range []string{"ID", "INFO", "LIST"} {
			if got := rawDo(t, nc, "CLIENT", sub); got != "+QUEUED\r\n" {
				t.Fatalf("RESP%s: CLIENT %s in MULTI: %q", proto, sub, got)
			}
		}
		rawDo(t, nc, "SET", "k", "v")
		exec := rawDo(t, nc, "EXEC")
		if !strings.HasPrefix(exec, "*4\r\n:"+id+"\r\n") || !strings.HasSuffix(exec, "+OK\r\n") {
			t.Fatalf("RESP%s: EXEC %q, want CLIENT ID's :%s first and SET's +OK last", proto, exec, id)
		}
		// INFO and LIST: this client as the proxy knows it, no upstream
		// connection of the proxy's.
		if n := strings.Count(exec, "\nid="+id+" ") + strings.Count(exec, "\rid="+id+" ") + strings.Count(exec, ":id="+id+" "); n != 2 || !strings.Contains(exec, " name=tx-"+proto+" ") || strings.Contains(exec, "name=redproxy") {
			t.Fatalf("RESP%s: EXEC's INFO and LIST: %q", proto, exec)
		}
		if proto == "3" && strings.Count(exec, "txt:id=") != 2 {
			t.Errorf("RESP3: INFO and LIST not verbatim strings: %q", exec)
		}
		if after := rawDo(t, nc, "CLIENT", "ID"); strings.Trim(after, ":\r\n") != id {
			t.Fatalf("CLIENT ID %s before the transaction, %q after", id, after)
		}
	}
	// CLIENT KILL and UNBLOCK stay refused: they would act at EXEC on
	// what the proxy knew when they were queued.
	nc := dialAddr(t, p.Addr)
	rawDo(t, nc, "MULTI")
	if got, want := rawDo(t, nc, "CLIENT", "KILL", "ID", "999"), "-ERR redproxy: 'CLIENT KILL' inside MULTI is not supported\r\n"; got != want {
		t.Fatalf("CLIENT KILL in MULTI: %q, want %q", got, want)
	}
	if got := rawDo(t, nc, "EXEC"); !strings.HasPrefix(got, "-EXECABORT") {
		t.Fatalf("EXEC after a refused CLIENT KILL: %q", got)
	}
}

// The same in a transaction the proxy holds (routes until EXEC, cluster
// mode until its first keyed command): CLIENT ID, INFO and LIST are held
// as the script returning the proxy's answer, and EXEC carries it.
func TestClientIdentityInsideHeldMulti(t *testing.T) {
	check := func(t *testing.T, addr string, cmds ...[]string) {
		nc := dialAddr(t, addr)
		id := strings.Trim(rawDo(t, nc, "CLIENT", "ID"), ":\r\n")
		rawDo(t, nc, "MULTI")
		for _, c := range cmds {
			if got := rawDo(t, nc, c...); got != "+QUEUED\r\n" {
				t.Fatalf("%v in MULTI: %q", c, got)
			}
		}
		exec := rawDo(t, nc, "EXEC")
		if !strings.HasPrefix(exec, "*3\r\n:"+id+"\r\n$") || !strings.Contains(exec, "\nid="+id+" ") || !strings.HasSuffix(exec, "+OK\r\n") {
			t.Fatalf("EXEC: %q, want CLIENT ID's :%s, its CLIENT INFO line, then SET's +OK", exec, id)
		}
	}
	t.Run("routes", func(t *testing.T) {
		r := startRouted(t, nil)
		check(t, r.p.Addr, []string{"CLIENT", "ID"}, []string{"CLIENT", "INFO"}, []string{"SET", "queue:id", "1"})
		if got := r.holds(t, "queue:id"); got != "queue" {
			t.Errorf("queue:id on %q", got)
		}
	})
	t.Run("cluster", func(t *testing.T) {
		_, p := startClusterProxy(t)
		check(t, p.Addr, []string{"CLIENT", "ID"}, []string{"CLIENT", "INFO"}, []string{"SET", "k", "1"})
	})
}

// WATCH inside MULTI: Redis (7.0.15, standalone or a cluster node) answers
// "-ERR WATCH inside MULTI is not allowed" and does NOT flag the
// transaction, so EXEC still runs it (the proxy's ordinary pinned path
// does the same). A transaction the proxy holds itself (with routes until
// EXEC, in cluster mode until the first keyed command) takes that error for
// a queue-time error and answers EXEC with -EXECABORT, discarding a
// transaction Redis would have run. (TestRoutesTxQueueTimeErrors asserts
// the abort, and COMPATIBILITY.md's routes table lists "WATCH inside MULTI
// (Redis's errors)" among the checks that fail the transaction.)
func TestCompatReviewWatchInsideHeldMultiDoesNotAbort(t *testing.T) {
	seq := [][]string{{"MULTI"}, {"WATCH", "queue:w"}, {"SET", "queue:a", "1"}, {"EXEC"}}
	run := func(addr string) []string {
		nc := dialAddr(t, addr)
		var out []string
		for _, c := range seq {
			out = append(out, rawDo(t, nc, c...))
		}
		return out
	}
	direct := redistest.Start(t)
	want := run(direct.Addr())
	if want[3] != "*1\r\n+OK\r\n" {
		t.Fatalf("redis itself answered EXEC %q", want[3])
	}

	t.Run("routes", func(t *testing.T) {
		r := startRouted(t, nil)
		got := run(r.p.Addr)
		for i := range seq {
			if got[i] != want[i] {
				t.Errorf("%v: redis %q, proxy with routes %q", seq[i], want[i], got[i])
			}
		}
	})
	t.Run("cluster", func(t *testing.T) {
		_, p := startClusterProxy(t)
		// A keyless transaction: the proxy holds it until EXEC.
		seq := [][]string{{"MULTI"}, {"WATCH", "x"}, {"PING"}, {"EXEC"}}
		nc := dialAddr(t, p.Addr)
		dn := dialAddr(t, direct.Addr())
		for _, c := range seq {
			w, g := rawDo(t, dn, c...), rawDo(t, nc, c...)
			if w != g {
				t.Errorf("%v: redis %q, proxy in cluster mode %q", c, w, g)
			}
		}
	})
}
