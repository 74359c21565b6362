package proxy_test

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/proxytest"
)

// TestClientHalfCloseBehindLastCommandClosed: a client that sends its
// last command and half-closes at once (shutdown(SHUT_WR), as nc -N does)
// gets its reply and then the end of the connection, as Redis closes it:
// where the session never parks (parking off; inside WATCH, which holds a
// pinned upstream connection) at once, and where it parks once parked. The reader took the command
// with a short read and then waited for readability, which the FIN, come
// with the command, did not raise again: such connections stayed open
// until idle_timeout (none by default; 4 of 5 with parking off).
func TestClientHalfCloseBehindLastCommandClosed(t *testing.T) {
	for _, tc := range []struct {
		name  string
		park  time.Duration
		watch bool
	}{
		{"parking off", 0, false},
		{"inside WATCH, parking on", 2 * time.Second, true},
		// A plain session waits as before; the sweeper parks it, and a
		// parked client that is gone is noticed.
		{"plain, parking on", 50 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := proxytest.Start(t, nil, func(c *config.Config) {
				c.Server.IdleParkAfter = units.Duration{Duration: tc.park}
			})
			open := 0
			const conns = 10
			for range conns {
				nc := dialAddr(t, p.Addr)
				if tc.watch {
					if got := rawDo(t, nc, "WATCH", "k"); got != "+OK\r\n" {
						t.Fatalf("WATCH: %q", got)
					}
				}
				// Past the reader's first reads, which start a fresh
				// read call each (and so read the FIN).
				for range 4 {
					if got := rawDo(t, nc, "PING"); got != "+PONG\r\n" {
						t.Fatalf("PING: %q", got)
					}
				}
				rawSend(t, nc, "ECHO", "last")
				if err := nc.(*net.TCPConn).CloseWrite(); err != nil {
					t.Fatal(err)
				}
				nc.SetReadDeadline(time.Now().Add(5 * time.Second))
				rest, err := io.ReadAll(nc)
				if string(rest) != "$4\r\nlast\r\n" {
					t.Fatalf("after the half-close: %q, %v", rest, err)
				}
				if err != nil {
					open++
				}
			}
			if open > 0 {
				t.Fatalf("%d of %d connections half-closed behind their last command were still open 5 s later", open, conns)
			}
		})
	}
}

// The same behind a pipeline longer than the read buffer, with the
// session nowhere near parking: the last short read after reads that
// filled the buffer left the FIN that came with its bytes unread, and the
// client waited for its session to park (2 s by default; here never) for
// the end (found by review: 1,200 commands or more).
func TestClientHalfCloseBehindLongPipelineClosed(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) {
		c.Server.IdleParkAfter = units.Duration{Duration: time.Hour}
	})
	const pings = 5000 // 70 KB, past the read buffer
	for round := range 3 {
		nc := dialAddr(t, p.Addr)
		for range 4 { // past the reader's first reads, as above
			if got := rawDo(t, nc, "PING"); got != "+PONG\r\n" {
				t.Fatalf("PING: %q", got)
			}
		}
		if _, err := nc.Write(bytes.Repeat([]byte("*1\r\n$4\r\nPING\r\n"), pings)); err != nil {
			t.Fatal(err)
		}
		if err := nc.(*net.TCPConn).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		rest, err := io.ReadAll(nc)
		if len(rest) != pings*len("+PONG\r\n") || err != nil {
			t.Fatalf("round %d: %d bytes of %d replies after the half-close, then %v (want the end within 5 s)", round, len(rest), pings, err)
		}
	}
}
