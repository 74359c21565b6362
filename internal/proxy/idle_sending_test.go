package proxy_test

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// idle_timeout counts bytes of a request still coming as activity, as
// Redis's timeout does: a large value sent over a slow link takes longer
// than the timeout and is served (found by a probe: a 16 MB SET sent at
// 2 MB/s was cut at 5 s with idle_timeout 5s, where Redis with timeout 5
// answered +OK). The pieces here come five times as often as the timeout.
func TestIdleTimeoutSparesAClientStillSending(t *testing.T) {
	srv := redistest.Start(t)
	p := proxytest.Start(t, srv, func(c *config.Config) { c.Server.IdleTimeout.Duration = time.Second })
	nc := p.Dial(t)
	nc.SetDeadline(time.Now().Add(30 * time.Second))
	sendSlowly(t, nc)
	if got, _ := srv.Client(t).Get(ctx, "slow").Result(); len(got) != 16*64 {
		t.Fatalf("Redis holds %d bytes for the key, want %d", len(got), 16*64)
	}
	// Idle after it, the client is closed as before.
	waitEOF(t, nc, bufio.NewReader(nc))
	waitCloses(t, p, map[string]float64{metrics.CloseIdleTimeout: 1})
}

// The same for a tracking client, a relay, which is idle only when
// nothing moves either way (found by review: it was still cut).
func TestIdleTimeoutSparesATrackingClientStillSending(t *testing.T) {
	srv := redistest.Start(t)
	p := proxytest.Start(t, srv, func(c *config.Config) { c.Server.IdleTimeout.Duration = time.Second })
	nc := p.Dial(t)
	nc.SetDeadline(time.Now().Add(30 * time.Second))
	r := bufio.NewReader(nc)
	trackingOn(t, nc, r)
	sendSlowly(t, nc)
	waitEOF(t, nc, r)
	waitCloses(t, p, map[string]float64{metrics.CloseIdleTimeout: 1})
}

// sendSlowly sends a SET of a 1 KB value in 16 pieces 200 ms apart,
// 3.2 s in all, and wants its +OK.
func sendSlowly(t *testing.T, nc net.Conn) {
	t.Helper()
	const pieces, size = 16, 64
	value := strings.Repeat("v", pieces*size)
	req := fmt.Sprintf("*3\r\n$3\r\nSET\r\n$4\r\nslow\r\n$%d\r\n%s\r\n", len(value), value)
	head := len(req) - len(value) - 2
	if _, err := nc.Write([]byte(req[:head])); err != nil {
		t.Fatal(err)
	}
	for i := range pieces {
		time.Sleep(200 * time.Millisecond) // the slow link: 3.2 s in all
		end := head + (i+1)*size
		if i == pieces-1 {
			end = len(req)
		}
		if _, err := nc.Write([]byte(req[head+i*size : end])); err != nil {
			t.Fatalf("piece %d of the value: %v (closed as idle while sending?)", i, err)
		}
	}
	var line []byte
	for b := make([]byte, 1); len(line) < 5; {
		if _, err := nc.Read(b); err != nil {
			t.Fatalf("SET sent over 3.2 s with idle_timeout 1s: %q, then %v; want +OK", line, err)
		}
		line = append(line, b[0])
	}
	if string(line) != "+OK\r\n" {
		t.Fatalf("SET sent over 3.2 s with idle_timeout 1s: %q; want +OK", line)
	}
}

// trackingOn makes nc a RESP3 client with CLIENT TRACKING ON, a relay.
func trackingOn(t *testing.T, nc net.Conn, r *bufio.Reader) {
	t.Helper()
	if got := send(t, nc, r, "HELLO 3"); got != "%7" {
		t.Fatalf("HELLO 3: %q", got)
	}
	for line := ""; line != "*0\r\n"; { // the rest of HELLO's map, up to modules' empty array
		var err error
		if line, err = r.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	if got := send(t, nc, r, "CLIENT TRACKING ON"); got != "+OK" {
		t.Fatalf("CLIENT TRACKING ON: %q", got)
	}
}
