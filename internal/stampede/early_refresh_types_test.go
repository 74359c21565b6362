package stampede_test

import (
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/stampede"
)

// TestEarlyRefreshKeepsWrongType shows that early refresh (XFetch) hands
// an early miss only for a value: a GET of a list with a TTL is answered
// with Redis's -WRONGTYPE error, every time. What went wrong (found by
// review): read() in protection.go checked the GET reply only for nil and
// then let Early turn any other reply with a positive PTTL into nil, so the
// client was told the key was missing instead of the error; a cache-aside
// client would then recompute and SET it, overwriting the list. Redis never
// answers nil to a GET of an existing key of another type.
func TestEarlyRefreshKeepsWrongType(t *testing.T) {
	rs := redistest.Start(t)
	p := proxytest.Start(t, rs, func(c *config.Config) {
		// A huge beta makes the early miss all but certain once δ is known.
		c.Stampede.EarlyRefresh = []stampede.RefreshRule{{Pattern: "cache:*", Beta: 1e9}}
	})
	direct := rs.Client(t)
	c := p.Client(t, func(o *redis.Options) { o.PoolSize = 1 })
	// Teach the rule a recompute time δ: a miss, then a write of the key.
	if err := c.Get(ctx, "cache:l").Err(); err != redis.Nil {
		t.Fatalf("first GET: %v, want a miss", err)
	}
	time.Sleep(20 * time.Millisecond)
	if err := c.Set(ctx, "cache:l", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// The key becomes a list with a TTL, behind the proxy's back.
	if err := direct.Del(ctx, "cache:l").Err(); err != nil {
		t.Fatal(err)
	}
	if err := direct.RPush(ctx, "cache:l", "a", "b").Err(); err != nil {
		t.Fatal(err)
	}
	if err := direct.Expire(ctx, "cache:l", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	wantErr := direct.Get(ctx, "cache:l").Err()
	if wantErr == nil || !strings.HasPrefix(wantErr.Error(), "WRONGTYPE") {
		t.Fatalf("Redis answered GET of a list with %v, want WRONGTYPE", wantErr)
	}
	for i := range 5 {
		v, err := c.Get(ctx, "cache:l").Result()
		if err == nil || !strings.HasPrefix(err.Error(), "WRONGTYPE") {
			t.Fatalf("GET %d of a list through the proxy: %q, %v; Redis answers %v", i, v, err, wantErr)
		}
	}
}
