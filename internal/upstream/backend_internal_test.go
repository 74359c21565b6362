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

// Closing a pipe ends a dial in progress, without waiting out the dial
// timeout: a failover's switch closes the old server's pipes, and every
// client waited on the dead server while one of them was still dialling
// a frozen one (found by review: 9.7 s with a 5 s dial_timeout).
func TestCloseEndsADialIntoASilentServer(t *testing.T) {
	const never = 10 * time.Minute // the dial timeout; the waits below are far shorter
	returns := func(t *testing.T, what string, f func()) {
		t.Helper()
		done := make(chan struct{})
		go func() {
			f()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s still waiting after 30 s on a dial whose timeout is %v", what, never)
		}
	}
	for _, tc := range []struct {
		name  string
		close func(*Pipe)
	}{{"Close", (*Pipe).Close}, {"Abandon", (*Pipe).Abandon}} {
		t.Run(tc.name, func(t *testing.T) {
			silent := startSilentUpstream(t)
			// RESP3: the handshake's HELLO waits for an answer (a RESP2
			// dial with nothing to set up sends no command).
			p := NewPipe(Options{Addr: silent.ln.Addr().String(), DialTimeout: never, RESP3: true,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			redistest.Eventually(t, 10*time.Second, func() bool { return silent.accepted.Load() >= 1 },
				"the pipe never dialled")
			returns(t, tc.name, func() { tc.close(p) })
		})
	}
	t.Run("Backend.Failover", func(t *testing.T) {
		// The Backend's pools first reach a Redis through a forwarder,
		// which then drops them and goes silent: they redial into it,
		// as into a frozen primary, and the failover, which abandons
		// them, must not wait.
		redis := redistest.Start(t)
		fw := startForwarder(t, redis.Addr())
		opt := testOptions(fw.ln.Addr().String())
		opt.DialTimeout = never
		opt.WantPrimary = true // both protocols' dials ask for the role, and wait (Sentinel mode)
		be := NewBackend(opt)
		t.Cleanup(func() {
			fw.close() // first: without the fix, Close too waits on the dial
			be.Close()
		})
		fw.silence()
		redistest.Eventually(t, 10*time.Second, func() bool { return fw.silent.Load() >= 2 },
			"the pools never redialled")
		other := redistest.Start(t)
		opt.Addr = other.Addr()
		opt.DialTimeout = 2 * time.Second
		returns(t, "the failover", func() { be.Failover(opt) })
		if reply, err := be.RoundTrip(false, true, []byte("*1\r\n$4\r\nPING\r\n")); err != nil || string(reply) != "+PONG\r\n" {
			t.Fatalf("PING after the failover: %q, %v", reply, err)
		}
	})
}

// forwarder passes connections on to a server until silence, which
// drops them all; from then on it accepts connections and never answers,
// counting them in silent.
type forwarder struct {
	ln     net.Listener
	quiet  atomic.Bool
	silent atomic.Int32
	mu     sync.Mutex
	conns  []net.Conn
}

func startForwarder(t *testing.T, to string) *forwarder {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &forwarder{ln: ln}
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			f.mu.Lock()
			f.conns = append(f.conns, nc)
			f.mu.Unlock()
			if f.quiet.Load() {
				f.silent.Add(1)
				continue
			}
			up, err := net.Dial("tcp", to)
			if err != nil {
				nc.Close()
				continue
			}
			f.mu.Lock()
			f.conns = append(f.conns, up)
			f.mu.Unlock()
			go io.Copy(up, nc)
			go io.Copy(nc, up)
		}
	}()
	t.Cleanup(f.close)
	return f
}

func (f *forwarder) close() {
	f.ln.Close()
	f.dropAll()
}

func (f *forwarder) silence() {
	f.quiet.Store(true)
	f.dropAll()
}

func (f *forwarder) dropAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, nc := range f.conns {
		nc.Close()
	}
	f.conns = nil
}

// An idle dedicated pipe whose connection Redis closed waits in the idle
// list until a client takes it (and drops it); meanwhile none of its
// goroutines may run on: its watchdog woke ten times a second for nothing
// (found by a soak probe: 20 such pipes after a Redis restart).
func TestDeadIdlePipeStopsItsGoroutines(t *testing.T) {
	rs := redistest.Start(t)
	be := NewBackend(testOptions(rs.Addr()))
	t.Cleanup(be.Close)
	p, err := be.AcquirePipe(0, false)
	if err != nil {
		t.Fatal(err)
	}
	be.ReleasePipe(p, 0, false, true) // clean: kept for reuse
	if err := rs.Client(t).Do(context.Background(), "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes").Err(); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan struct{})
	go func() { p.workers.Wait(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("a goroutine of the idle pipe whose connection ended still runs after 10 s")
	}
	// Taken next, it is dropped for a fresh one.
	q, err := be.AcquirePipe(0, false)
	if err != nil {
		t.Fatal(err)
	}
	if q == p || !q.Up() {
		t.Fatalf("AcquirePipe gave the dead pipe back (same %v, up %v)", q == p, q.Up())
	}
	be.ReleasePipe(q, 0, false, true)
}
