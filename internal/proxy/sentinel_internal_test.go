package proxy

import (
	"log/slog"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/redistest"
)

// TestSentinelRoleCheckBoundedByReplyTimeout: the ROLE check of a
// candidate primary waits at most upstream.reply_timeout for its reply.
// The server here (redistest.FrozenAfterHandshake) completes the
// connection's handshake and never answers ROLE, as a server frozen just
// then does. The check used to wait dead_timeout (30 s by default),
// and Discover with it.
func TestSentinelRoleCheckBoundedByReplyTimeout(t *testing.T) {
	addr := redistest.FrozenAfterHandshake(t, "ROLE")
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
			t.Fatal("ROLE check of a frozen server succeeded")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ROLE check still waiting after 10 s with reply_timeout 500ms")
	}
}
