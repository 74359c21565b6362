//go:build linux

package proxy_test

import (
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/redistest"
)

// TestFiftyThousandClients opens 50,000 client connections (issue 10): all
// are answered, park, and are answered again from parked. Client and proxy
// share this process, so it needs 100,000 descriptors: the test raises
// RLIMIT_NOFILE (root may, up to fs.nr_open) or skips. It is opt-in
// (REDPROXY_MANY_CONNS=1, or a count), being the size of a load test.
func TestFiftyThousandClients(t *testing.T) {
	n := 50000
	switch v := os.Getenv("REDPROXY_MANY_CONNS"); v {
	case "":
		t.Skip("set REDPROXY_MANY_CONNS=1 (or a count) to open 50,000 connections")
	case "1":
	default:
		c, err := strconv.Atoi(v)
		if err != nil || c <= 0 {
			t.Fatalf("REDPROXY_MANY_CONNS=%q: want 1 or a count", v)
		}
		n = c
	}
	want := uint64(2*n + 4096)
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur < want {
		old := lim
		lim.Cur, lim.Max = want, max(lim.Max, want)
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			t.Skipf("cannot raise RLIMIT_NOFILE from %d/%d to %d (needs root or CAP_SYS_RESOURCE, and fs.nr_open >= %d): %v", old.Cur, old.Max, want, want, err)
		}
		t.Cleanup(func() { syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old) })
	}
	p := parkingProxy(t, func(c *config.Config) {
		c.Server.MaxClients = n + 100
		c.Server.IdleParkAfter = units.Duration{Duration: 200 * time.Millisecond}
	})
	conns := make([]net.Conn, n)
	defer func() {
		for _, nc := range conns {
			if nc != nil {
				nc.Close()
			}
		}
	}()
	// 5,000 connections per source address (127.0.0.1, .2, ...): one
	// address has only the ephemeral port range (28,232 here).
	const perSource = 5000
	dial := func(i int) (net.Conn, error) {
		d := net.Dialer{
			Timeout:   10 * time.Second,
			LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(1+i/perSource))},
			Control: func(_, _ string, rc syscall.RawConn) error {
				var serr error
				rc.Control(func(fd uintptr) {
					serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IP, 24 /* IP_BIND_ADDRESS_NO_PORT */, 1)
				})
				return serr
			},
		}
		return d.Dial("tcp", p.Addr)
	}
	ping := []byte("*1\r\n$4\r\nPING\r\n")
	pong := func(nc net.Conn, buf []byte) error {
		nc.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := nc.Write(ping); err != nil {
			return err
		}
		if _, err := io.ReadFull(nc, buf[:7]); err != nil {
			return err
		}
		if string(buf[:7]) != "+PONG\r\n" {
			return io.ErrUnexpectedEOF
		}
		return nil
	}
	// each runs f on every connection index, 64 at a time.
	each := func(what string, f func(i int, buf []byte) error) {
		t.Helper()
		var next, failed atomic.Int64
		var first atomic.Value
		var wg sync.WaitGroup
		start := time.Now()
		for range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				buf := make([]byte, 64)
				for {
					i := int(next.Add(1) - 1)
					if i >= n || failed.Load() > 0 {
						return
					}
					if err := f(i, buf); err != nil {
						if failed.Add(1) == 1 {
							first.Store(what + " " + strconv.Itoa(i) + ": " + err.Error())
						}
						return
					}
				}
			}()
		}
		wg.Wait()
		if failed.Load() > 0 {
			t.Fatalf("%s", first.Load())
		}
		t.Logf("%s: %d connections in %v", what, n, time.Since(start).Round(time.Millisecond))
	}
	each("open and PING", func(i int, buf []byte) error {
		nc, err := dial(i)
		if err != nil {
			return err
		}
		conns[i] = nc
		return pong(nc, buf)
	})
	redistest.Eventually(t, 2*time.Minute, func() bool { return p.ParkedClients() == n },
		"%d of %d connections parked", p.ParkedClients(), n)
	t.Logf("all %d parked; goroutines in the process (test clients included): %d", n, runtime.NumGoroutine())
	each("PING from parked", func(i int, buf []byte) error { return pong(conns[i], buf) })
	for i, nc := range conns {
		nc.Close()
		conns[i] = nil
	}
	redistest.Eventually(t, 2*time.Minute, func() bool { return p.Clients() == 0 }, "%d clients left after closing all", p.Clients())
	redistest.Eventually(t, time.Minute, func() bool { return p.ParkedClients() == 0 }, "%d still parked", p.ParkedClients())
}
