package proxy_test

// Mirror defects found by a review, each reproduced against real servers.

import (
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/mirror"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// A script's error reply is taken to mean "it may have written", so the
// script is mirrored; but some errors come before Redis runs any script.
// An EVAL the primary refused with -BUSY (another script running) ran on
// the mirror alone, and the two diverged.
func TestMirrorScriptRefusedByPrimaryIsNotMirrored(t *testing.T) {
	rs := redistest.Start(t, "--busy-reply-threshold", "100")
	ms := redistest.Start(t)
	p := proxytest.Start(t, rs, func(c *config.Config) {
		c.Upstreams = map[string]config.Upstream{"new": {Address: ms.Addr()}}
		c.Mirror = mirror.DefaultConfig()
		c.Mirror.Upstream = "new"
	})
	c := p.Client(t)
	direct := rs.Client(t)
	busy := make(chan error, 1)
	go func() {
		busy <- direct.Eval(ctx, `local t = redis.call('TIME')
while true do
  local n = redis.call('TIME')
  if (n[1]-t[1])*1000000 + (n[2]-t[2]) > 1500000 then break end
end
return 1`, nil).Err()
	}()
	// Until the busy script holds Redis, the EVAL runs (on both servers).
	redistest.Eventually(t, 5*time.Second, func() bool {
		err := c.Eval(ctx, "return redis.call('INCR', KEYS[1])", []string{"counter"}).Err()
		return err != nil && strings.HasPrefix(err.Error(), "BUSY")
	}, "EVAL was never answered BUSY")
	if err := <-busy; err != nil {
		t.Fatal(err)
	}
	waitMirrored(t, p)
	pv, _ := direct.Get(ctx, "counter").Result()
	mv, _ := ms.Client(t).Get(ctx, "counter").Result()
	if pv != mv {
		t.Fatalf("counter: primary %q, mirror %q: a script the primary refused (BUSY) ran on the mirror", pv, mv)
	}
}
