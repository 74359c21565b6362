package proxy

import (
	"bytes"
	"strings"
	"testing"
)

// The framer of a cluster relay replaces a MOVED or ASK from the relay's
// node, and only it, wherever the stream is cut, and notes that it did
// (the relay then asks whether it may leave: relayRedirect). Before, the
// node's MOVED to a SSUBSCRIBE the stale map sent there reached the
// client as it was.
func TestRelayFramerReplacesRedirect(t *testing.T) {
	stream := []byte("*3\r\n$8\r\nsmessage\r\n$1\r\nc\r\n$5\r\n-MOVE\r\n" +
		"-MOVED 12 127.0.0.1:7001\r\n-ERR unknown command 'x'\r\n-ASK 13 127.0.0.1:7001\r\n+OK\r\n")
	want := []byte("*3\r\n$8\r\nsmessage\r\n$1\r\nc\r\n$5\r\n-MOVE\r\n" +
		"-TRYAGAIN 12\r\n-ERR unknown command 'x'\r\n-TRYAGAIN 13\r\n+OK\r\n")
	redirect := func(reply []byte) ([]byte, bool) {
		for _, p := range []string{"-MOVED ", "-ASK "} {
			if rest, ok := strings.CutPrefix(string(reply), p); ok {
				return []byte("-TRYAGAIN " + strings.Fields(rest)[0] + "\r\n"), true
			}
		}
		return nil, false
	}
	for c := 0; c <= len(stream); c++ {
		f := relayFramer{redirect: redirect}
		out1, _, _, err1 := f.feed(stream[:c])
		got := append([]byte(nil), out1...)
		out2, _, _, err2 := f.feed(stream[c:])
		got = append(got, out2...)
		if err1 != nil || err2 != nil || !bytes.Equal(got, want) {
			t.Fatalf("cut %d: %v %v, passed %q", c, err1, err2, got)
		}
		if !f.redirected {
			t.Fatalf("cut %d: redirected not noted", c)
		}
	}
	// Without redirect (standalone, routes) errors pass as they came.
	var f relayFramer
	out, _, _, err := f.feed(stream)
	if err != nil || !bytes.Equal(out, stream) || f.redirected {
		t.Fatalf("no redirect: %v, passed %q", err, out)
	}
}
