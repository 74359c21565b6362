package sentinel

import (
	"errors"
	"strings"
	"testing"

	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/resp"
	"github.com/redproxy/redproxy/internal/upstream"
)

// TestParseRoleRealReplies: a candidate's role is read from its reply to
// HELLO (2 or 3; any user may send it) or to ROLE (@admin, @dangerous).
// The replies here are the real ones of a primary, its replica and a
// Sentinel (whose HELLO has mode "sentinel" and no role field on Redis
// 7.0): only the primary passes.
func TestParseRoleRealReplies(t *testing.T) {
	g := redistest.StartSentinelGroup(t, redistest.SentinelOptions{Replicas: 1, Sentinels: 1})
	for _, c := range []struct {
		name, addr string
		primary    bool
	}{
		{"primary", g.Nodes[0].Addr(), true},
		{"replica", g.Nodes[1].Addr(), false},
		{"sentinel", g.SentinelAddrs()[0], false},
	} {
		for _, cmd := range [][]string{{"HELLO", "2"}, {"HELLO", "3"}, {"ROLE"}} {
			r, err := upstream.RoundTrip(upstream.Options{Addr: c.addr}, resp.AppendCommandStrings(nil, cmd...))
			if err != nil {
				t.Fatalf("%s %s: %v", c.name, cmd, err)
			}
			w := New(Options{Role: func(string) ([]byte, error) { return r, nil }, Logger: quietLogger()})
			ok, err := w.isPrimary(c.addr)
			w.Close()
			if ok != c.primary || (err == nil) != c.primary {
				t.Errorf("%s, reply to %s %q: isPrimary = %v, %v; want %v", c.name, cmd, r, ok, err, c.primary)
			}
		}
	}
}

// TestRoleRefusedSaysWhy: a role check answered with an error (a user
// denied ROLE gets -NOPERM) is reported with Redis's text, not as "not a
// primary", so the log says what to fix.
func TestRoleRefusedSaysWhy(t *testing.T) {
	const noperm = "-NOPERM this user has no permissions to run the 'role' command\r\n"
	w := New(Options{Role: func(string) ([]byte, error) { return []byte(noperm), nil }, Logger: quietLogger()})
	defer w.Close()
	ok, err := w.isPrimary("x:1")
	if ok || !errors.Is(err, errRoleRefused) || !strings.Contains(err.Error(), "NOPERM this user has no permissions") {
		t.Fatalf("isPrimary with %q = %v, %v; want errRoleRefused quoting Redis", noperm, ok, err)
	}
}
