package proxy_test

import (
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// TestRedisIdleTimeoutClosingUpstreamConnections: a production Redis often
// has `timeout` set, and closes the proxy's connections that idle past it:
// the shared ones and the dedicated ones kept for reuse (found idle in a
// soak). The next commands, shared, blocking and transactions, must find
// a live connection, not a closed one.
func TestRedisIdleTimeoutClosingUpstreamConnections(t *testing.T) {
	rs := redistest.Start(t, "--timeout", "1")
	p := proxytest.Start(t, rs, nil)
	c := p.Client(t)
	direct := rs.Client(t)
	var ids []map[string]bool
	for round := range 3 {
		if err := c.Set(ctx, "k", round, 0).Err(); err != nil {
			t.Fatalf("round %d SET: %v", round, err)
		}
		if err := c.BLPop(ctx, 50*time.Millisecond, "nolist").Err(); err != redis.Nil {
			t.Fatalf("round %d BLPOP: %v", round, err)
		}
		if _, err := c.TxPipelined(ctx, func(pp redis.Pipeliner) error { pp.Incr(ctx, "n"); return nil }); err != nil {
			t.Fatalf("round %d MULTI/EXEC: %v", round, err)
		}
		if got := c.Get(ctx, "n").Val(); got != string(rune('1'+round)) {
			t.Fatalf("round %d: n = %q", round, got)
		}
		ids = append(ids, proxyConnIDs(direct.ClientList(ctx).Val()))
		// Redis closes clients idle over 1 s in its cron (about every 100 ms).
		time.Sleep(2200 * time.Millisecond)
	}
	for i := 1; i < len(ids); i++ {
		for id := range ids[i] {
			if ids[i-1][id] {
				t.Fatalf("Redis kept connection %s through its idle timeout (rounds %d and %d): the test checked nothing", id, i-1, i)
			}
		}
	}
}

// proxyConnIDs are the ids, in a CLIENT LIST reply, of the proxy's
// connections (named redproxy...).
func proxyConnIDs(list string) map[string]bool {
	ids := map[string]bool{}
	for _, line := range strings.Split(list, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.Contains(line, " name=redproxy") {
			continue
		}
		ids[strings.TrimPrefix(f[0], "id=")] = true
	}
	return ids
}
