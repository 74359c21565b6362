package proxy_test

import (
	"fmt"
	"testing"

	"github.com/redproxy/redproxy/internal/proxytest"
)

// Redis refuses a command of the wrong arity before it runs it, so
// "RESET x", "DISCARD x" and "MULTI x" neither end nor start a transaction
// or a WATCH, while "EXEC x" aborts both (EXECABORT). The proxy took the
// first three by their names (found by the differential test): "RESET x"
// ended the client's MULTI, so what it sent next ran at once, outside it.
// Each step's reply is checked against Redis directly too, so the wanted
// replies are Redis's, and the proxy is run standalone, with routes and
// in cluster mode (where MULTI is held by the proxy).

type arityStep struct {
	cmd  []string
	want string // fmt.Sprint of the reply
	side bool   // sent on another connection, as another client's write
}

var arityScenarios = []struct {
	name  string
	steps []arityStep
	unset []string // keys nothing may have written
}{
	{"reset x in MULTI", []arityStep{
		{cmd: []string{"MULTI"}, want: "OK"},
		{cmd: []string{"SET", "{t}1", "v"}, want: "QUEUED"},
		{cmd: []string{"RESET", "x"}, want: "ERR wrong number of arguments for 'reset' command"},
		{cmd: []string{"SET", "{t}2", "v"}, want: "QUEUED"},
		{cmd: []string{"EXEC"}, want: "EXECABORT Transaction discarded because of previous errors."},
	}, []string{"{t}1", "{t}2"}},
	{"discard x in MULTI", []arityStep{
		{cmd: []string{"MULTI"}, want: "OK"},
		{cmd: []string{"SET", "{t}1", "v"}, want: "QUEUED"},
		{cmd: []string{"DISCARD", "x"}, want: "ERR wrong number of arguments for 'discard' command"},
		{cmd: []string{"SET", "{t}2", "v"}, want: "QUEUED"},
		{cmd: []string{"EXEC"}, want: "EXECABORT Transaction discarded because of previous errors."},
	}, []string{"{t}1", "{t}2"}},
	{"reset x under WATCH", []arityStep{
		{cmd: []string{"WATCH", "{t}w"}, want: "OK"},
		{cmd: []string{"RESET", "x"}, want: "ERR wrong number of arguments for 'reset' command"},
		{cmd: []string{"SET", "{t}w", "changed"}, want: "OK", side: true},
		{cmd: []string{"MULTI"}, want: "OK"},
		{cmd: []string{"SET", "{t}1", "v"}, want: "QUEUED"},
		{cmd: []string{"EXEC"}, want: "<nil>"}, // the WATCH held
	}, []string{"{t}1"}},
	{"multi x under WATCH", []arityStep{
		{cmd: []string{"WATCH", "{t}w"}, want: "OK"},
		{cmd: []string{"MULTI", "x"}, want: "ERR wrong number of arguments for 'multi' command"},
		// Not in a transaction: answered, not refused as inside MULTI.
		{cmd: []string{"CLIENT", "REPLY", "ON"}, want: "OK"},
		{cmd: []string{"GET", "{t}1"}, want: "<nil>"},
		{cmd: []string{"EXEC"}, want: "ERR EXEC without MULTI"},
	}, []string{"{t}1"}},
	{"exec x outside MULTI", []arityStep{
		{cmd: []string{"EXEC", "x"}, want: "EXECABORT Transaction discarded because of: wrong number of arguments for 'exec' command"},
	}, nil},
	{"exec x under WATCH", []arityStep{
		{cmd: []string{"WATCH", "{t}w"}, want: "OK"},
		{cmd: []string{"EXEC", "x"}, want: "EXECABORT Transaction discarded because of: wrong number of arguments for 'exec' command"},
		{cmd: []string{"SET", "{t}w", "changed"}, want: "OK", side: true},
		{cmd: []string{"MULTI"}, want: "OK"},
		{cmd: []string{"SET", "{t}1", "v"}, want: "QUEUED"},
		{cmd: []string{"EXEC"}, want: "[OK]"}, // the WATCH went with the EXEC
	}, nil},
	// A key of another slot (and, with routes, another upstream): Redis
	// Cluster checks arity before it looks at slots, so the refusal is
	// the arity error, not CROSSSLOT (nor the proxy's CROSSROUTE).
	{"wrong arity on another slot in MULTI", []arityStep{
		{cmd: []string{"MULTI"}, want: "OK"},
		{cmd: []string{"SET", "{t}1", "v"}, want: "QUEUED"},
		{cmd: []string{"SET", "queue:{u}2"}, want: "ERR wrong number of arguments for 'set' command"},
		{cmd: []string{"EXEC"}, want: "EXECABORT Transaction discarded because of previous errors."},
	}, []string{"{t}1", "queue:{u}2"}},
	{"wrong arity on another slot under WATCH", []arityStep{
		{cmd: []string{"WATCH", "{t}w"}, want: "OK"},
		{cmd: []string{"SET", "queue:{u}2"}, want: "ERR wrong number of arguments for 'set' command"},
		{cmd: []string{"MULTI"}, want: "OK"},
		{cmd: []string{"SET", "{t}1", "v"}, want: "QUEUED"},
		{cmd: []string{"EXEC"}, want: "[OK]"},
	}, []string{"queue:{u}2"}},
	{"exec x in MULTI", []arityStep{
		{cmd: []string{"MULTI"}, want: "OK"},
		{cmd: []string{"SET", "{t}1", "v"}, want: "QUEUED"},
		{cmd: []string{"EXEC", "x"}, want: "EXECABORT Transaction discarded because of: wrong number of arguments for 'exec' command"},
		{cmd: []string{"EXEC"}, want: "ERR EXEC without MULTI"},
	}, []string{"{t}1"}},
}

func runArityScenarios(t *testing.T, addr string) {
	for _, sc := range arityScenarios {
		t.Run(sc.name, func(t *testing.T) {
			c, side := dialRaw(t, addr), dialRaw(t, addr)
			side.do("DEL", "{t}1", "{t}2", "{t}w", "queue:{u}2")
			for _, st := range sc.steps {
				conn := c
				if st.side {
					conn = side
				}
				if got := fmt.Sprint(conn.do(st.cmd...)); got != st.want {
					t.Errorf("%v = %s, want %s", st.cmd, got, st.want)
				}
			}
			for _, k := range sc.unset {
				if v := side.do("GET", k); v != nil {
					t.Errorf("%s = %v: a command of the refused transaction ran", k, v)
				}
			}
		})
	}
}

func TestWrongArityLeavesTransactionsAsRedisDoes(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	t.Run("redis", func(t *testing.T) { runArityScenarios(t, p.Redis.Addr()) })
	t.Run("proxy", func(t *testing.T) { runArityScenarios(t, p.Addr) })
	t.Run("routes", func(t *testing.T) { runArityScenarios(t, startRouted(t, nil).p.Addr) })
	t.Run("cluster", func(t *testing.T) {
		_, cp := startClusterProxy(t)
		runArityScenarios(t, cp.Addr)
	})
}

// The same once the proxy has aborted the transaction itself (its MULTI
// refused at max_pinned, or its connection lost): "DISCARD x" ended that
// state with +OK, and the commands after it ran outside the transaction
// (found by review).
func TestWrongArityInAnAbortedTransaction(t *testing.T) {
	p := proxytest.Start(t, nil, onePinned)
	holdPinned(t, p)
	c, side := dialRaw(t, p.Addr), dialRaw(t, p.Addr)
	side.do("DEL", "ab1", "ab2")
	wantReplies(t, c, []string{"MULTI"}, []string{"SET", "ab1", "v"}, []string{"DISCARD", "x"}, []string{"MULTI", "x"},
		[]string{"SET", "ab2", "v"}, []string{"EXEC"},
		"OK", respError("ERR redproxy: transaction aborted"), respError("ERR wrong number of arguments for 'discard' command"),
		respError("ERR wrong number of arguments for 'multi' command"), respError("ERR redproxy: transaction aborted"),
		respError("EXECABORT Transaction discarded because of previous errors."))
	for _, k := range []string{"ab1", "ab2"} {
		if v := side.do("GET", k); v != nil {
			t.Errorf("%s = %v: a command of the aborted transaction ran", k, v)
		}
	}
	// EXEC with arguments ends it, with Redis's words.
	wantReplies(t, c, []string{"MULTI"}, []string{"EXEC", "x"}, []string{"SET", "ab1", "v"},
		"OK", respError("EXECABORT Transaction discarded because of: wrong number of arguments for 'exec' command"), "OK")
}
