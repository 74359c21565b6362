package proxy_test

import (
	"fmt"
	"testing"

	"github.com/redproxy/redproxy/internal/proxytest"
)

// The CLIENT subcommands the proxy answers itself check their arguments
// as Redis does: it answered +OK to "CLIENT NO-EVICT maybe" and "CLIENT
// TRACKING maybe" (found by the differential test). Each reply must be
// Redis's own, byte for byte as the test client decodes it.
func TestClientModeArgumentsAsRedis(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	cmds := [][]string{
		{"CLIENT", "NO-EVICT", "maybe"},
		{"CLIENT", "NO-EVICT", "on"},
		{"CLIENT", "NO-EVICT", "OFF"},
		{"CLIENT", "TRACKING", "maybe"},
		{"CLIENT", "TRACKING", "maybe", "bogus"},
		{"CLIENT", "TRACKING", "off"},
		{"CLIENT", "TRACKING", "off", "bogus"},
		{"CLIENT", "TRACKING", "off", "BCAST"},
		{"CLIENT", "TRACKING", "off", "PREFIX", "a", "optin", "OPTOUT", "noloop"},
		{"CLIENT", "TRACKING", "off", "PREFIX"},
		{"CLIENT", "TRACKING", "off", "REDIRECT"},
	}
	viaProxy, direct := dialRaw(t, p.Addr), dialRaw(t, p.Redis.Addr())
	for _, cmd := range cmds {
		if got, want := fmt.Sprint(viaProxy.do(cmd...)), fmt.Sprint(direct.do(cmd...)); got != want {
			t.Errorf("%v: proxy %q, Redis %q", cmd, got, want)
		}
	}
}
