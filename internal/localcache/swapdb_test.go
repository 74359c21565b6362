package localcache_test

import (
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/redistest"
)

// A SWAPDB through the proxy leaves no value of the other database in the
// tier once it is acknowledged, even when a fill ran between the proxy
// forwarding it and Redis running it. Redis 7.0 sends no invalidation for
// SWAPDB, so only the proxy can drop that fill: it used to be served
// until max_ttl (found by review; every read after the swap was stale).
// CLIENT PAUSE WRITE, sent to Redis directly, holds the SWAPDB while the
// fill (a read) runs: a window load opens too.
func TestSwapDBDropsFillsThatRanBeforeTheSwap(t *testing.T) {
	p := startTier(t, nil, func(c *config.Config) {
		c.Policy.Commands.Allow = append(c.Policy.Commands.Allow, "swapdb")
	})
	direct := p.Redis.Client(t)
	direct1 := p.Redis.ClientDB(t, 1)
	for _, e := range []error{direct.Set(ctx, "k", "db0-before", 0).Err(), direct1.Set(ctx, "k", "db1-before", 0).Err()} {
		if e != nil {
			t.Fatal(e)
		}
	}
	writer := p.Client(t, func(o *redis.Options) { o.PoolSize = 1 })
	reader := p.Client(t, func(o *redis.Options) { o.PoolSize = 1 })
	mustGet(t, writer, "other") // connected before the pause: no handshake behind SWAPDB
	mustGet(t, reader, "other")
	if err := direct.Do(ctx, "CLIENT", "PAUSE", "1000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	swapped := make(chan error, 1)
	go func() { swapped <- writer.Do(ctx, "SWAPDB", "0", "1").Err() }()
	// Wait until Redis holds the SWAPDB (the proxy flushed the tier as it
	// forwarded it), then fill k from DB 0 as it still is.
	redistest.Eventually(t, 5*time.Second, func() bool {
		info, err := direct.Info(ctx, "clients").Result()
		return err == nil && strings.Contains(info, "\r\nblocked_clients:1\r\n")
	}, "SWAPDB never reached Redis's pause")
	if v := mustGet(t, reader, "k"); v != "db0-before" {
		t.Fatalf("GET k before SWAPDB ran = %q, want db0-before", v)
	}
	if err := <-swapped; err != nil {
		t.Fatalf("SWAPDB: %v", err)
	}
	// From the acknowledgement on, every read sees the swap.
	stale, reads := 0, 0
	var last string
	for until := time.Now().Add(5 * testS); time.Now().Before(until); time.Sleep(10 * time.Millisecond) {
		for _, c := range []*redis.Client{writer, reader} {
			reads++
			if v := mustGet(t, c, "k"); v != "db1-before" {
				stale, last = stale+1, v
			}
		}
	}
	if stale > 0 {
		t.Fatalf("%d of %d reads after SWAPDB was acknowledged returned %q, want db1-before (tier hits %v)", stale, reads, last, hits(t, p))
	}
}
