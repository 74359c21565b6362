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

// FrozenAfterHandshake listens on loopback and answers +OK to every
// command (so a connection's handshake, AUTH, HELLO or CLIENT SETNAME,
// succeeds) until one named freezeOn, to which it never answers: a
// server that froze right after accepting a connection. It is a fault
// injector for timeouts, not a stand-in for Redis. Closed when the test
// ends.
func FrozenAfterHandshake(t testing.TB, freezeOn string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, nc)
			mu.Unlock()
			wg.Go(func() { serveFrozen(nc, freezeOn) })
		}
	})
	return ln.Addr().String()
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
