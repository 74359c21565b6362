package proxy_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// TestPushFrameInsideExecReply: RESP3 lets Redis write a push frame in the
// middle of a reply; DEBUG PROTOCOL push queued in MULTI puts one inside
// EXEC's array, before the element it belongs to. The proxy counted the
// push as that element, so EXEC's reply ended one element early: the
// client read its PING's +PONG as EXEC's element, every later reply one
// behind, and the pipe dropped its connection as out of step (found by a
// probe). The bytes now match Redis's, also when the proxy cuts the
// results of its own TTL fix-ups out of EXEC's reply, and under WATCH.
func TestPushFrameInsideExecReply(t *testing.T) {
	p := proxytest.Start(t, redistest.Start(t, "--enable-debug-command", "yes"), func(c *config.Config) {
		c.Policy.Commands.Allow = append(c.Policy.Commands.Allow, "debug")
		c.Policy.TTL = []policy.TTLRule{{Pattern: "ttl:*", Required: true, Default: policy.Duration{Duration: time.Hour}}}
	})
	for _, tc := range []struct {
		name   string
		wire   string
		frames int // as the test's own framer counts them (the push is one)
	}{
		{"Alone", "HELLO 3\r\nMULTI\r\nDEBUG PROTOCOL push\r\nEXEC\r\nPING\r\n", 6},
		{"AfterARead", "HELLO 3\r\nMULTI\r\nGET k\r\nDEBUG PROTOCOL push\r\nEXEC\r\nPING\r\n", 7},
		{"UnderWatch", "HELLO 3\r\nWATCH k\r\nMULTI\r\nDEBUG PROTOCOL push\r\nEXEC\r\nPING\r\n", 7},
		// HMSET ttl:h gets a hidden EXPIRE whose result the proxy cuts.
		{"WithFixups", "HELLO 3\r\nMULTI\r\nHMSET ttl:h f 1\r\nDEBUG PROTOCOL push\r\nEXEC\r\nPING\r\n", 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := exchangeWithBoth(t, p, []byte(tc.wire), tc.frames)
			// HELLO's reply is the proxy's own.
			direct, proxied := bytes.Join(got[0][1:], nil), bytes.Join(got[1][1:], nil)
			if !bytes.Equal(direct, proxied) {
				t.Fatalf("after HELLO 3:\nRedis: %q\nproxy: %q", direct, proxied)
			}
			if !bytes.HasSuffix(proxied, []byte("+PONG\r\n")) {
				t.Fatalf("the last reply is not PING's: %q", proxied)
			}
		})
	}
}
