package upstream

import (
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/resp"
)

// slowForwarder forwards to target, holding what the client sends for
// delay first: a slow network path, so a dial through it (its handshake)
// takes delay.
func slowForwarder(t *testing.T, target string, delay time.Duration) string {
	t.Helper()
	return redistest.Forward(t, target, func(wg *sync.WaitGroup, c, u net.Conn) {
		wg.Go(func() {
			time.Sleep(delay)
			io.Copy(u, c)
			u.Close()
		})
		wg.Go(func() {
			io.Copy(c, u)
			c.Close()
		})
	})
}

// failoverDuringDial starts a Backend on a (behind a forwarder that makes
// each dial take a second) and returns failover, which waits until a dial
// begun just before it is under way and fails the Backend over to b. (The
// second leaves 900 ms for a late timer on a loaded machine: with 300 ms a
// dial could finish before the failover, whose cut then failed the test.)
func failoverDuringDial(t *testing.T) (a, b *redistest.Server, be *Backend, failover func()) {
	a, b = redistest.Start(t), redistest.Start(t)
	opt := BackendOptions{Addr: slowForwarder(t, a.Addr(), time.Second), Connections: 1, Databases: 1, MaxPinned: 4, DialTimeout: 5 * time.Second,
		ReplyTimeout: 5 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	be = NewBackend(opt)
	t.Cleanup(be.Close)
	return a, b, be, func() {
		time.Sleep(100 * time.Millisecond) // the dial is under way
		opt.Addr = b.Addr()
		be.Failover(opt)
	}
}

// A dedicated connection whose dial spanned a failover was recorded
// under the old generation after the failover had cut those, so nothing
// cut it: a client's MULTI ran and was acknowledged on the old primary
// (found by review). Now a dial that spans a switch is dropped and made
// again to the new upstream.
func TestFailoverDuringDedicatedDial(t *testing.T) {
	a, b, be, failover := failoverDuringDial(t)

	type got struct {
		p   *Pipe
		err error
	}
	ch := make(chan got, 1)
	go func() {
		p, err := be.AcquirePipe(0, false) // e.g. a client's MULTI
		ch <- got{p, err}
	}()
	failover()
	r := <-ch
	if r.err != nil {
		t.Fatalf("AcquirePipe across a failover: %v; want a pipe to the new server", r.err)
	}
	c := NewCall()
	c.Add(resp.AppendCommandStrings(nil, "SET", "k", "written-after-failover"))
	if err := r.p.Send(c); err != nil {
		t.Fatal(err)
	}
	c.Wait()
	reply, err := c.Reply(0)
	if err != nil {
		t.Fatal(err)
	}
	va, _ := a.Client(t).Get(t.Context(), "k").Result()
	vb, _ := b.Client(t).Get(t.Context(), "k").Result()
	if va != "" || vb != "written-after-failover" {
		t.Fatalf("after Failover returned, a dedicated pipe acknowledged SET (%q): old has %q, new has %q; want it on the new server only", reply, va, vb)
	}
}

// The same for a relay (SUBSCRIBE, MONITOR, tracking): AcquireConn.
// The same for a relay's connection (SUBSCRIBE, MONITOR, tracking).
func TestFailoverDuringRelayDial(t *testing.T) {
	a, b, be, failover := failoverDuringDial(t)
	type got struct {
		nc  net.Conn
		err error
	}
	ch := make(chan got, 1)
	go func() {
		nc, err := be.AcquireConn(0, false, "")
		ch <- got{nc, err}
	}()
	failover()
	r := <-ch
	if r.err != nil {
		t.Fatalf("AcquireConn across a failover: %v; want a connection to the new server", r.err)
	}
	defer r.nc.Close()
	r.nc.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := r.nc.Write(resp.AppendCommandStrings(nil, "SET", "relayed", "x")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, err := r.nc.Read(buf)
	if err != nil || string(buf[:n]) != "+OK\r\n" {
		t.Fatalf("SET on the relay's connection: %q, %v", buf[:n], err)
	}
	va, _ := a.Client(t).Get(t.Context(), "relayed").Result()
	vb, _ := b.Client(t).Get(t.Context(), "relayed").Result()
	if va != "" || vb != "x" {
		t.Fatalf("after Failover returned, a relay's SET landed: old has %q, new has %q; want the new server only", va, vb)
	}
}
