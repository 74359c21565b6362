package proxy_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

func rfSend(t *testing.T, nc net.Conn, args ...string) {
	t.Helper()
	s := fmt.Sprintf("*%d\r\n", len(args))
	for _, a := range args {
		s += fmt.Sprintf("$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := nc.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
}

// rfReadAll reads whatever arrives within d; closed reports EOF.
func rfReadAll(nc net.Conn, d time.Duration) (string, bool) {
	var sb strings.Builder
	buf := make([]byte, 4096)
	deadline := time.Now().Add(d)
	for {
		nc.SetReadDeadline(deadline)
		n, err := nc.Read(buf)
		sb.Write(buf[:n])
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				return sb.String(), false
			}
			return sb.String(), true
		}
	}
}

// rfRelayKilled: a relayed client (subscribed, or tracking on RESP3)
// whose relay connection on Redis is killed must be closed by the proxy,
// as Redis closes its own client: left open it would hear no message or
// invalidation again and never know.
func rfRelayKilled(t *testing.T, setup [][]string) {
	p := proxytest.Start(t, nil, nil)
	direct := p.Redis.Client(t)
	nc := p.Dial(t)
	for _, cmd := range setup {
		rfSend(t, nc, cmd...)
	}
	// Waited for, not read in a fixed window: a loaded CI run can take
	// longer than any window to answer the setup.
	redistest.Eventually(t, 10*time.Second, func() bool {
		return rfKillNamed(t, direct, " name=redproxy-relay ") > 0
	}, "no relay connection on Redis")
	if err := direct.Publish(context.Background(), "ch", "m1").Err(); err != nil {
		t.Fatal(err)
	}
	direct.Set(context.Background(), "k", "v2", 0)
	out, closed := rfReadAll(nc, 5*time.Second)
	if !closed {
		t.Fatalf("the client whose relay connection was killed is still open (got %q): it would wait for messages that never come", out)
	}
}

func TestReviewFaultsSubscriberRelayKilled(t *testing.T) {
	rfRelayKilled(t, [][]string{{"SUBSCRIBE", "ch"}})
}

func TestReviewFaultsTrackingRelayKilled(t *testing.T) {
	rfRelayKilled(t, [][]string{{"HELLO", "3"}, {"CLIENT", "TRACKING", "ON"}, {"GET", "k"}})
}
