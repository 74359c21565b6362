package proxy_test

import (
	"bufio"
	"io"
	"net"
	"strings"
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

// A refusal on a relay was sent as a script that makes Redis answer with
// its text; but in RESP2's subscribed mode and in MONITOR mode Redis does
// not run scripts, and answered with its own error ("only (P|S)SUBSCRIBE
// ... are allowed", "Replica can't interact with the keyspace"), hiding
// why the proxy refused (found by review, for routes; the guard's
// refusals had the same fault). There the refusal is now an unknown
// command quoting the text, which Redis refuses in any context.
func TestRelayRefusalSaysWhy(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	for _, start := range []string{"SUBSCRIBE ch\r\n", "MONITOR\r\n"} {
		nc := p.Dial(t)
		rd := bufio.NewReader(nc)
		nc.SetDeadline(time.Now().Add(5 * time.Second))
		nc.Write([]byte(start))
		first, err := rd.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(first, "*") { // SUBSCRIBE's reply: 3 elements, 5 more lines
			for range 5 {
				rd.ReadString('\n')
			}
		}
		nc.Write([]byte("KEYS *\r\n")) // refused by the default policy
		for {
			line, err := rd.ReadString('\n')
			if err != nil {
				t.Fatalf("%q then KEYS: %v", start, err)
			}
			if strings.HasPrefix(line, "+") && strings.Contains(line, "KEYS") {
				continue // MONITOR's own lines
			}
			if !strings.HasPrefix(line, "-") || !strings.Contains(line, "KEYS is disabled") {
				t.Fatalf("%q then KEYS: %q, want the policy's refusal", start, line)
			}
			break
		}
		nc.Close()
	}
}
