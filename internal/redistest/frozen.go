package redistest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
)

// ServeLoopback listens on a loopback port and calls serve with every
// connection it accepts, on the accepting goroutine: serve starts the
// goroutines that handle it with wg, which the cleanup waits for after it
// has closed the listener and every accepted connection. A fault injector's
// plumbing (hung servers, forwarders that cut or delay), never a stand-in
// for Redis.
func ServeLoopback(t testing.TB, serve func(wg *sync.WaitGroup, c net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	closed := false
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		closed = true
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			if closed {
				mu.Unlock()
				c.Close()
				continue
			}
			conns = append(conns, c)
			mu.Unlock()
			serve(&wg, c)
		}
	})
	return ln.Addr().String()
}

// Forward listens on loopback and, for every connection c it accepts,
// dials target (u) and runs serve(wg, c, u), which forwards as it likes on
// goroutines started with wg and closes u once c is done; a failed dial
// closes c. The plumbing of fault injectors that cut, delay or trickle a
// real Redis's traffic (ServeLoopback's cleanup closes them).
func Forward(t testing.TB, target string, serve func(wg *sync.WaitGroup, c, u net.Conn)) string {
	t.Helper()
	return ServeLoopback(t, func(wg *sync.WaitGroup, c net.Conn) {
		u, err := net.Dial("tcp", target)
		if err != nil {
			c.Close()
			return
		}
		serve(wg, c, u)
	})
}

// FrozenAfterHandshake listens on loopback and answers +OK to every
// command (so a connection's handshake, AUTH, HELLO or CLIENT SETNAME,
// succeeds) until one named freezeOn, to which it never answers: a
// server that froze right after accepting a connection. It is a fault
// injector for timeouts, not a stand-in for Redis. Closed when the test
// ends.
func FrozenAfterHandshake(t testing.TB, freezeOn string) string {
	t.Helper()
	return ServeLoopback(t, func(wg *sync.WaitGroup, c net.Conn) {
		wg.Go(func() { serveFrozen(c, freezeOn) })
	})
}

func serveFrozen(nc net.Conn, freezeOn string) {
	defer nc.Close()
	br := bufio.NewReader(nc)
	for {
		// Each command is one RESP array of bulk strings.
		line, err := br.ReadString('\n')
		if err != nil {
			return
		}
		var n int
		if _, err := fmt.Sscanf(line, "*%d", &n); err != nil {
			return
		}
		var name string
		for i := range 2 * n {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			if i == 1 {
				name = strings.TrimSpace(line)
			}
		}
		if strings.EqualFold(name, freezeOn) {
			io.Copy(io.Discard, br) // frozen until the client hangs up
			return
		}
		nc.Write([]byte("+OK\r\n"))
	}
}
