package localcache_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Review finding: a SWAPDB run by a script (EVAL, FCALL) through the proxy.
// The proxy flushes the tier for a forwarded SWAPDB command, and for a
// script raises a fence, which waits for invalidations; Redis 7.0 sends
// none for SWAPDB, so the values cached from DB 0 before the script are
// served after its reply, until max_ttl (C1, C3).
func TestReviewTierSwapDBInScriptServedStale(t *testing.T) {
	for _, how := range []string{"eval", "fcall"} {
		t.Run(how, func(t *testing.T) {
			p := startTier(t, nil)
			direct := p.Redis.Client(t)
			direct1 := redis.NewClient(&redis.Options{Addr: p.Redis.Addr(), DB: 1})
			t.Cleanup(func() { direct1.Close() })
			if err := direct.Set(ctx, "k", "db0-before", 0).Err(); err != nil {
				t.Fatal(err)
			}
			if err := direct1.Set(ctx, "k", "db1-before", 0).Err(); err != nil {
				t.Fatal(err)
			}
			c := p.Client(t, func(o *redis.Options) { o.PoolSize = 1 })
			if v := cacheIt(t, p, c, "k"); v != "db0-before" {
				t.Fatalf("GET k = %q", v)
			}
			switch how {
			case "eval":
				if err := c.Do(ctx, "EVAL", "return redis.call('SWAPDB','0','1')", "0").Err(); err != nil {
					t.Fatalf("EVAL SWAPDB: %v", err)
				}
			case "fcall":
				lib := "#!lua name=swaplib\nredis.register_function('swap', function(keys, args) return redis.call('SWAPDB', '0', '1') end)"
				if err := direct.Do(ctx, "FUNCTION", "LOAD", lib).Err(); err != nil {
					t.Fatal(err)
				}
				if err := c.Do(ctx, "FCALL", "swap", "0").Err(); err != nil {
					t.Fatalf("FCALL swap: %v", err)
				}
			}
			if v, _ := direct.Get(ctx, "k").Result(); v != "db1-before" {
				t.Fatalf("test broken: direct GET k after the swap = %q", v)
			}
			stale, reads := 0, 0
			var last string
			for until := time.Now().Add(5 * testS); time.Now().Before(until); time.Sleep(10 * time.Millisecond) {
				reads++
				if v := mustGet(t, c, "k"); v != "db1-before" {
					stale, last = stale+1, v
				}
			}
			if stale > 0 {
				t.Fatalf("%d of %d reads after the script's SWAPDB was acknowledged returned %q, want db1-before (tier hits %v)", stale, reads, last, hits(t, p))
			}
		})
	}
}
