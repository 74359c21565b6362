package proxy_test

import (
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/proxytest"
)

// Redis closes a connection whose first command is POST or Host: (its
// securityWarningCommand, "Possible SECURITY ATTACK detected"): that is how
// a web page a developer visits cannot drive a Redis on localhost with a
// cross-origin HTTP POST whose body holds Redis commands (a "simple"
// request, sent by the browser without a CORS preflight). The proxy on its
// default loopback address with no password is exactly such a target, and
// it answers each HTTP line with an unknown-command error and then runs
// the commands in the body.
func TestReviewHTTPPostCrossProtocolRunsCommands(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	nc := p.Dial(t)
	body := "SET xproto pwned\r\n"
	req := fmt.Sprintf("POST / HTTP/1.1\r\nHost: %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s", p.Addr, len(body), body)
	if _, err := nc.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	nc.SetReadDeadline(time.Now().Add(3 * time.Second))
	got, _ := io.ReadAll(nc) // Redis closes without a word
	rc := p.Redis.Client(t)
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) && rc.Exists(ctx, "xproto").Val() == 0 {
		time.Sleep(20 * time.Millisecond)
	}
	if v := rc.Get(ctx, "xproto").Val(); v != "" {
		t.Errorf("an HTTP POST to the proxy ran the Redis command in its body: xproto = %q (proxy answered %q); Redis closes the connection at POST", v, got)
	}
}
