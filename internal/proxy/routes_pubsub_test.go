package proxy_test

import (
	"fmt"
	"strings"
	"testing"
)

// Pub/sub with routes: what a client asks about channels, or subscribes
// to, must reach the upstream where those channels' messages are
// published ([[channel_route]]). startRouted sends jobs.* channels to
// "queue", the rest to [upstream].

// TestRoutesResp2RelayRefusalText: on a RESP2 subscribed connection the
// routes' refusal of another upstream's channel was sent as an EVAL,
// which Redis refuses in RESP2 subscribed mode with its own, unrelated
// error ("only (P|S)SUBSCRIBE / ... are allowed in this context"). It must
// say why, naming the upstreams.
func TestRoutesResp2RelayRefusalText(t *testing.T) {
	r := startRouted(t, nil)
	nc := r.p.Dial(t)
	fmt.Fprint(nc, "*2\r\n$9\r\nSUBSCRIBE\r\n$6\r\njobs.x\r\n")
	for range 6 {
		readLine(t, nc)
	}
	fmt.Fprint(nc, "*2\r\n$9\r\nSUBSCRIBE\r\n$4\r\nnews\r\n")
	got := readLine(t, nc)
	t.Logf("refusal: %q", got)
	if !strings.Contains(got, "redproxy") || !strings.Contains(got, "'default'") || !strings.Contains(got, "'queue'") {
		t.Fatalf("SUBSCRIBE news (default upstream) on a RESP2 connection subscribed on queue: %q; want the proxy's refusal naming the upstreams", got)
	}
	// The connection still serves its subscription.
	fmt.Fprint(nc, "*1\r\n$4\r\nPING\r\n")
	if l := readLine(t, nc); l != "*2\r\n" {
		t.Fatalf("PING after the refusal: %q", l)
	}
}
