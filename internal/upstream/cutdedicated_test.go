package upstream

import (
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/resp"
)

// pinnedInMulti returns a dedicated pipe of be with MULTI and SET key v
// queued on it (answered +OK and +QUEUED).
func pinnedInMulti(t *testing.T, be *Backend, key string) *Pipe {
	t.Helper()
	p, err := be.AcquirePipe(0, false)
	if err != nil {
		t.Fatal(err)
	}
	c := NewCall()
	c.Add(resp.AppendCommandStrings(nil, "MULTI"))
	c.Add(resp.AppendCommandStrings(nil, "SET", key, "committed-on-old"))
	if err := p.Send(c); err != nil {
		t.Fatal(err)
	}
	<-c.Done()
	if r, err := c.Reply(1); err != nil || string(r) != "+QUEUED\r\n" {
		t.Fatalf("SET in MULTI = %q, %v", r, err)
	}
	return p
}

// A dedicated connection to the old primary is dead the moment the cut
// returns: an EXEC its client sends right after must fail with
// ErrConnLost and never reach the old primary. The pipes used to be
// abandoned in goroutines of their own (go p.Abandon()), so until the
// scheduler ran them a Send was still queued and written: a transaction
// committed on a server the proxy knew was demoted. GOMAXPROCS(1) keeps
// those goroutines from running before the Send, as a loaded machine may.
func TestCutDedicatedRefusesSendsAtOnce(t *testing.T) {
	old := redistest.Start(t)
	opt := testOptions(old.Addr())
	opt.ReplyTimeout = 5 * time.Second
	be := NewBackend(opt)
	t.Cleanup(be.Close)
	p := pinnedInMulti(t, be, "k")

	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	be.CutDedicated()
	exec := NewCall()
	exec.Add(resp.AppendCommandStrings(nil, "EXEC"))
	err := p.Send(exec)
	runtime.GOMAXPROCS(2)
	if err == nil {
		<-exec.Done()
		r, rerr := exec.Reply(0)
		t.Errorf("EXEC on a cut dedicated connection was sent: reply %q, %v", r, rerr)
	} else if !errors.Is(err, ErrConnLost) {
		t.Errorf("EXEC on a cut dedicated connection: %v, want ErrConnLost", err)
	}
	time.Sleep(50 * time.Millisecond)
	if v := old.Client(t).Exists(t.Context(), "k").Val(); v != 0 {
		t.Fatalf("the transaction committed on the old server after the cut")
	}
}

// The same through Failover: once it returns, an EXEC of a client pinned
// to the old primary fails and commits on neither server.
func TestFailoverRefusesOldPinsAtOnce(t *testing.T) {
	old, next := redistest.Start(t), redistest.Start(t)
	opt := testOptions(old.Addr())
	opt.ReplyTimeout = 5 * time.Second
	be := NewBackend(opt)
	t.Cleanup(be.Close)
	p := pinnedInMulti(t, be, "k")
	opt.Addr = next.Addr()
	be.Failover(opt)
	exec := NewCall()
	exec.Add(resp.AppendCommandStrings(nil, "EXEC"))
	if err := p.Send(exec); !errors.Is(err, ErrConnLost) {
		if err == nil {
			<-exec.Done()
		}
		t.Errorf("EXEC after Failover: %v, want ErrConnLost", err)
	}
	time.Sleep(50 * time.Millisecond)
	for _, s := range []*redistest.Server{old, next} {
		if s.Client(t).Exists(t.Context(), "k").Val() != 0 {
			t.Fatalf("the transaction committed on %s after Failover", s.Addr())
		}
	}
}
