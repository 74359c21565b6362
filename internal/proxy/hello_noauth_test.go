package proxy_test

// HELLO before authenticating: the NOAUTH text differs between Redis
// versions; 7.0 names "HELLO AUTH <user> <pass>", 7.2 "HELLO <proto> AUTH
// <user> <pass>". The proxy always sent 7.2's, in front of a 7.0 server
// too, so clients and tests that match the text saw another one than Redis
// gives (found by review). It now sends the text of the upstream's
// version (Server.UpstreamVersion; 7.0's when unknown).

import (
	"context"
	"strings"
	"testing"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

func TestHelloNoAuthText(t *testing.T) {
	direct, behind := redistest.Start(t), redistest.Start(t)
	for _, rs := range []*redistest.Server{direct, behind} {
		if err := rs.Client(t).ConfigSet(context.Background(), "requirepass", "pw").Err(); err != nil {
			t.Fatal(err)
		}
	}
	p := proxytest.Start(t, behind, func(c *config.Config) { c.Upstream.Password = "pw" })
	compareWithRedis(t, direct.Addr(), p.Addr, [][]string{{"HELLO", "3"}, {"HELLO"}})

	// In front of a 7.2 or later Redis, its text.
	for _, v := range []string{"7.2.0", "7.4.1", "8.0.2"} {
		p.SetUpstreamVersion(v)
		if got := rawDo(t, dialAddr(t, p.Addr), "HELLO", "3"); !strings.Contains(got, " HELLO <proto> AUTH <user> <pass> ") {
			t.Errorf("HELLO before AUTH in front of Redis %s: %q, want 7.2's text", v, got)
		}
	}
	p.SetUpstreamVersion("7.0.15")
	if got := rawDo(t, dialAddr(t, p.Addr), "HELLO", "3"); !strings.Contains(got, " HELLO AUTH <user> <pass> ") {
		t.Errorf("HELLO before AUTH in front of Redis 7.0.15: %q, want 7.0's text", got)
	}
}
