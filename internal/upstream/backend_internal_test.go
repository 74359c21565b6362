package upstream

import (
	"context"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/redistest"
)

// testOptions are a backend's options in these tests: one connection to
// addr per pool, database 0 only, a quiet log.
func testOptions(addr string) BackendOptions {
	return BackendOptions{Addr: addr, Connections: 1, Databases: 1, MaxPinned: 4, DialTimeout: 2 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// A switch swaps the generation, then empties the idle dedicated pipes. A
// pipe taken from the idle list between the two is from before the switch
// and talks to the old upstream: a transaction or blocking command begun
// after the reload must not run there. This runs the interleaving by
// doing the swap, Switch's first step, alone.
func TestIdlePipeFromBeforeSwitchIsNotReused(t *testing.T) {
	a, b := redistest.Start(t), redistest.Start(t)
	opt := testOptions(a.Addr())
	be := NewBackend(opt)
	t.Cleanup(be.Close)
	p, err := be.AcquirePipe(0, false)
	if err != nil {
		t.Fatal(err)
	}
	be.ReleasePipe(p, 0, false, true) // clean: kept for reuse
	opt.Addr = b.Addr()
	be.gen.Swap(newGen(opt))

	q, err := be.AcquirePipe(0, false)
	if err != nil {
		t.Fatal(err)
	}
	defer be.ReleasePipe(q, 0, false, false)
	c := NewCall()
	c.Add([]byte("*3\r\n$3\r\nSET\r\n$5\r\nwhere\r\n$1\r\nx\r\n"))
	if err := q.Send(c); err != nil {
		t.Fatal(err)
	}
	c.Wait()
	if r, err := c.Reply(0); err != nil || string(r) != "+OK\r\n" {
		t.Fatalf("SET: %q %v", r, err)
	}
	if n := a.Client(t).Exists(context.Background(), "where").Val(); n != 0 {
		t.Fatal("a dedicated pipe acquired after the switch wrote to the old upstream")
	}
}

// A kept dedicated connection that Redis closed a moment before it is
// lent again (CLIENT KILL, a restart; the pipe's reader not yet woken) is
// dropped and another dialled: lent, the client's WATCH or MULTI failed
// with "upstream connection lost" where a fresh connection would have
// served it (found by review; the race hit 2 WATCHes in 5 there). Each
// round closes the kept connection from Redis's side and at once asks
// for one.
func TestKeptPipeClosedByRedisIsNotLent(t *testing.T) {
	srv := redistest.Start(t)
	be := NewBackend(testOptions(srv.Addr()))
	t.Cleanup(be.Close)
	admin := srv.Client(t)
	failed := 0
	for range 50 {
		p, err := be.AcquirePipe(0, false)
		if err != nil {
			t.Fatal(err)
		}
		id, err := be.PipeID(p)
		if err != nil {
			t.Fatal(err)
		}
		be.ReleasePipe(p, 0, false, true) // clean: kept for reuse
		if err := admin.Do(context.Background(), "CLIENT", "KILL", "ID", id).Err(); err != nil {
			t.Fatal(err)
		}
		q, err := be.AcquirePipe(0, false)
		if err != nil {
			t.Fatal(err)
		}
		c := NewCall()
		c.Add([]byte("*1\r\n$4\r\nPING\r\n"))
		if err := q.Send(c); err == nil {
			c.Wait()
		} else {
			c.Fail(err)
		}
		if r, err := c.Reply(0); err != nil || string(r) != "+PONG\r\n" {
			failed++
			t.Logf("reply %q err %v", r, err)
		}
		be.ReleasePipe(q, 0, false, err == nil)
	}
	if failed > 0 {
		t.Fatalf("%d of 50 PINGs on a kept connection Redis had just closed failed", failed)
	}
}

// silentUpstream accepts connections and never answers: a server that
// is frozen or blackholed past the TCP handshake. It counts what it
// accepted; closing it drops every connection, failing their dials.
type silentUpstream struct {
	ln       net.Listener
	accepted atomic.Int32
	mu       sync.Mutex
	conns    []net.Conn
}

func startSilentUpstream(t *testing.T) *silentUpstream {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &silentUpstream{ln: ln}
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, nc)
			s.mu.Unlock()
			s.accepted.Add(1)
		}
	}()
	t.Cleanup(s.close)
	return s
}

func (s *silentUpstream) close() {
	s.ln.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, nc := range s.conns {
		nc.Close()
	}
	s.conns = nil
}

// A reload to an upstream that does not answer dials the new generation's
// pools together, and a database's first client meanwhile dials its own
// without waiting for them: one at a time, under the Backend's lock, held
// the reload for twice the dial timeout and every other first client
// behind it.
func TestSwitchToASilentUpstreamDialsPoolsTogether(t *testing.T) {
	srv := redistest.Start(t)
	opt := testOptions(srv.Addr())
	opt.Databases = 2
	be := NewBackend(opt)
	t.Cleanup(be.Close)

	silent := startSilentUpstream(t)
	opt.Addr = silent.ln.Addr().String()
	opt.DialTimeout = time.Minute // far beyond the waits below
	switched := make(chan struct{})
	go func() {
		be.Switch(opt)
		close(switched)
	}()
	redistest.Eventually(t, 10*time.Second, func() bool { return silent.accepted.Load() >= 2 },
		"the switch did not dial DB 0's two pools together")
	firstOfDB1 := make(chan *Pool, 1)
	go func() { firstOfDB1 <- be.Pool(1, false) }()
	redistest.Eventually(t, 10*time.Second, func() bool { return silent.accepted.Load() >= 3 },
		"DB 1's first client did not dial while the switch waited")
	select {
	case <-switched:
		t.Fatal("the switch returned before the new upstream's dials ended")
	default:
	}

	silent.close() // every dial fails now: both waits end
	<-switched
	<-firstOfDB1
}
