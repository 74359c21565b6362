package proxy_test

// Helpers for tests that send the same commands to Redis directly and
// through the proxy (in front of another, identical Redis) and compare the
// raw replies byte for byte.

import (
	"net"
	"testing"

	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// directPair is one connection to Redis directly and one through the
// proxy in front of another, identical Redis.
type directPair struct {
	direct, proxied net.Conn
}

func newDirectPair(t *testing.T) (*directPair, *proxytest.Proxy, *redistest.Server) {
	t.Helper()
	direct := redistest.Start(t)
	p := proxytest.Start(t, nil, nil)
	return &directPair{direct: dialAddr(t, direct.Addr()), proxied: dialAddr(t, p.Addr)}, p, direct
}

// do sends args on both connections and returns both raw replies.
func (c *directPair) do(t *testing.T, args ...string) (direct, proxied string) {
	t.Helper()
	return rawDo(t, c.direct, args...), rawDo(t, c.proxied, args...)
}

// replyHead is the start of a reply, for error messages.
func replyHead(s string) string {
	if len(s) > 60 {
		return s[:60]
	}
	return s
}

// compareWithRedis sends each command on a fresh pair of connections and
// reports every reply that differs.
func compareWithRedis(t *testing.T, directAddr, proxyAddr string, cmds [][]string) {
	t.Helper()
	for _, cmd := range cmds {
		d := rawDo(t, dialAddr(t, directAddr), cmd...)
		p := rawDo(t, dialAddr(t, proxyAddr), cmd...)
		if d != p {
			t.Errorf("%q:\nRedis: %q\nproxy: %q", cmd, d, p)
		}
	}
}
