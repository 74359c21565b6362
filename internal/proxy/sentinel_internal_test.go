package proxy

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/redistest"
)

// TestSentinelRoleCheckBoundedByReplyTimeout: the role check of a
// candidate primary (HELLO) waits at most upstream.reply_timeout for its
// reply. The server here (redistest.FrozenAfterHandshake) completes the
// connection's handshake and never answers HELLO, as a server frozen just
// then does. The check used to wait dead_timeout (30 s by default),
// and Discover with it.
func TestSentinelRoleCheckBoundedByReplyTimeout(t *testing.T) {
	addr := redistest.FrozenAfterHandshake(t, "HELLO")
	cfg := config.Default()
	cfg.Upstream.DialTimeout = units.Duration{Duration: 500 * time.Millisecond}
	cfg.Upstream.ReplyTimeout = units.Duration{Duration: 500 * time.Millisecond}
	cfg.Upstream.DeadTimeout = units.Duration{Duration: 20 * time.Second}
	opt := sentinelOptions(cfg, slog.New(slog.DiscardHandler))
	done := make(chan error, 1)
	go func() {
		_, err := opt.Role(addr)
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("role check of a frozen server succeeded")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("role check still waiting after 10 s with reply_timeout 500ms")
	}
}

// TestSentinelRoleCheckFallsBackToROLE: the role check asks HELLO,
// which Redis runs for any user (the ACL does not apply to it); a server
// that does not know it (before Redis 6; here it is renamed away) is
// asked ROLE instead, and when both are refused the error quotes both of
// Redis's replies, for the log.
func TestSentinelRoleCheckFallsBackToROLE(t *testing.T) {
	noHello := redistest.Start(t, "--rename-command", "HELLO", "")
	neither := redistest.Start(t, "--rename-command", "HELLO", "", "--rename-command", "ROLE", "")
	role := func(addr string) ([]byte, error) {
		return sentinelOptions(config.Default(), slog.New(slog.DiscardHandler)).Role(addr)
	}
	if r, err := role(noHello.Addr()); err != nil || !strings.HasPrefix(string(r), "*3\r\n$6\r\nmaster\r\n") {
		t.Fatalf("role check of a server without HELLO = %q, %v; want ROLE's reply", r, err)
	}
	_, err := role(neither.Addr())
	if err == nil || !strings.Contains(err.Error(), "unknown command 'HELLO'") || !strings.Contains(err.Error(), "unknown command 'ROLE'") {
		t.Fatalf("role check of a server without HELLO or ROLE = %v; want both refusals quoted", err)
	}
}
