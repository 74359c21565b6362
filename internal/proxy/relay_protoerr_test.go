package proxy_test

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/proxytest"
)

// A protocol error after a command that turns the client into a relay
// (SUBSCRIBE, MONITOR, CLIENT TRACKING ON) is answered as Redis answers it:
// every reply to what came before, then the error, then the close. The
// proxy closed the relay's upstream connection at once, so the SUBSCRIBE's
// own reply could be lost, and an error read later in the relay was never
// written. Each case is compared with the bytes Redis itself sends.
func TestRelayProtocolErrorAnsweredAsRedis(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	exchange := func(addr string, parts []string) string {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		var got []byte
		buf := make([]byte, 4096)
		for i, part := range parts {
			if _, err := nc.Write([]byte(part)); err != nil {
				t.Fatal(err)
			}
			if i == len(parts)-1 {
				break
			}
			// Read the earlier part's reply before sending the next, so
			// the error arrives in a later read of the relay.
			nc.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, err := nc.Read(buf)
			if err != nil {
				t.Fatalf("%q: %v", part, err)
			}
			got = append(got, buf[:n]...)
		}
		nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		rest, err := io.ReadAll(nc)
		if err != nil {
			t.Fatalf("%q: reading to the close: %v (got %q)", parts, err, append(got, rest...))
		}
		return string(append(got, rest...))
	}
	for _, parts := range [][]string{
		{"SUBSCRIBE ch\r\n*1\r\n$x\r\n"},
		{"SUBSCRIBE ch\r\nSUBSCRIBE ch2\r\n*1\r\n$x\r\n"},
		{"SUBSCRIBE ch\r\n", "*1\r\n$x\r\n"},
		{"SUBSCRIBE ch\r\n", "SUBSCRIBE ch2\r\n*1\r\n$x\r\n"},
		{"PSUBSCRIBE p*\r\n", "*2\r\n$4\r\nPING\r\n$-5\r\n"},
	} {
		for range 20 { // the lost reply was a race
			want := exchange(p.Redis.Addr(), parts)
			got := exchange(p.Addr, parts)
			if got != want {
				t.Fatalf("%q:\nproxy %q\nRedis %q", parts, got, want)
			}
		}
	}
}
