package upstream

import (
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/resp"
)

// A replica answers writes with -READONLY; the backend reports each such
// reply (Sentinel mode rechecks the primary on it) and nothing else.
func TestBackendReportsReadOnly(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.Start(t, "--replicaof", "127.0.0.1", strconv.Itoa(primary.Port()))
	var readOnly atomic.Int64
	opt := testOptions(replica.Addr())
	opt.OnReadOnly = func() { readOnly.Add(1) }
	be := NewBackend(opt)
	t.Cleanup(be.Close)
	c := NewCall()
	c.Add(resp.AppendCommandStrings(nil, "GET", "k"))
	c.Add(resp.AppendCommandStrings(nil, "SET", "k", "v"))
	c.Add(resp.AppendCommandStrings(nil, "GET", "k"))
	be.Pool(0, false).Do(c)
	if r, err := c.Reply(1); err != nil || string(r[:10]) != "-READONLY " {
		t.Fatalf("SET on a replica = %q, %v", r, err)
	}
	if n := readOnly.Load(); n != 1 {
		t.Fatalf("OnReadOnly ran %d times for one -READONLY reply", n)
	}
}

// Failover, unlike Switch, does not wait for the old server: a request
// pending there fails at once with ErrConnLost (it may have run; it is
// never resent), and requests from then on go to the new server.
func TestBackendFailoverFailsPendingWithConnLost(t *testing.T) {
	a, b := redistest.Start(t), redistest.Start(t)
	opt := testOptions(a.Addr())
	opt.ReplyTimeout = 5 * time.Second
	be := NewBackend(opt)
	t.Cleanup(be.Close)
	slow := NewCall()
	slow.Add(resp.AppendCommandStrings(nil, "EVAL", redistest.LoopScript, "0", "3000"))
	if err := be.Pool(0, false).Send(slow); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 5*time.Second, func() bool {
		s, _ := be.Pool(0, false).Stats()
		return s.Commands > 0
	}, "the script was never written")
	opt.Addr = b.Addr()
	be.Failover(opt)
	select {
	case <-slow.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("the request pending on the old server was not failed by the failover")
	}
	if !errors.Is(slow.Err(), ErrConnLost) {
		t.Fatalf("pending request ended with %v, want ErrConnLost", slow.Err())
	}
	c := NewCall()
	c.Add(resp.AppendCommandStrings(nil, "SET", "after", "1"))
	be.Pool(0, false).Do(c)
	if r, err := c.Reply(0); err != nil || string(r) != "+OK\r\n" {
		t.Fatalf("SET after the failover = %q, %v", r, err)
	}
	if v, err := b.Client(t).Get(t.Context(), "after").Result(); err != nil || v != "1" {
		t.Fatalf("the write after the failover is not on the new server: %q, %v", v, err)
	}
}

// Moves counts the switches to another server, which WAIT needs to know
// of (a write forwarded before one went to a server left since): every
// Failover (even to the same address: a Sentinel may name the same
// host:port for a restarted server), and a Switch to another address,
// but not a Switch that only changes options.
func TestBackendMoves(t *testing.T) {
	a, b := redistest.Start(t), redistest.Start(t)
	opt := testOptions(a.Addr())
	be := NewBackend(opt)
	t.Cleanup(be.Close)
	for _, step := range []struct {
		name string
		do   func()
		want uint32
	}{
		{"at start", func() {}, 0},
		{"Switch with new options", func() { opt.ReplyTimeout = time.Second; be.Switch(opt) }, 0},
		{"Switch to another address", func() { opt.Addr = b.Addr(); be.Switch(opt) }, 1},
		{"Failover", func() { opt.Addr = a.Addr(); be.Failover(opt) }, 2},
		{"Failover to the same address", func() { be.Failover(opt) }, 3},
	} {
		step.do()
		if got := be.Moves(); got != step.want {
			t.Errorf("Moves after %s = %d, want %d", step.name, got, step.want)
		}
	}
}
