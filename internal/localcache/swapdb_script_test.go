package localcache_test

import (
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// A SWAPDB run by a script (EVAL, FCALL) through the proxy. The proxy
// flushes the tier for a forwarded SWAPDB command, and for a script raised
// only a fence, which waits for invalidations; Redis 7.0 sends none for
// SWAPDB, so the values cached from DB 0 before the script were served
// after its reply, until max_ttl (C1, C3; found by review). A script whose
// text mentions swapdb is now handled as a SWAPDB of every database: EVAL's
// text is in the command, a function library's is seen when it is loaded
// through the proxy (a library loaded elsewhere is a documented limit,
// scripts.go).
func TestSwapDBInScriptNotServedStale(t *testing.T) {
	for _, how := range []string{"eval", "evalsha", "eval-in-multi", "fcall"} {
		t.Run(how, func(t *testing.T) {
			p := startTier(t, nil)
			direct := p.Redis.Client(t)
			direct1 := p.Redis.ClientDB(t, 1)
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
			case "evalsha":
				sha, err := c.Do(ctx, "SCRIPT", "LOAD", "return redis.call('swapDB','0','1')").Text()
				if err != nil {
					t.Fatal(err)
				}
				if err := c.Do(ctx, "EVALSHA", sha, "0").Err(); err != nil {
					t.Fatalf("EVALSHA SWAPDB: %v", err)
				}
			case "eval-in-multi":
				// Longer than what a queued write keeps of its arguments
				// for EXEC (proxy's txWriteArgs).
				body := "-- " + strings.Repeat("x", 100) + "\nreturn redis.call('SWAPDB','0','1')"
				_, err := c.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
					pipe.Do(ctx, "EVAL", body, "0")
					return nil
				})
				if err != nil {
					t.Fatalf("MULTI EVAL SWAPDB EXEC: %v", err)
				}
			case "fcall":
				lib := "#!lua name=swaplib\nredis.register_function('swap', function(keys, args) return redis.call('SWAPDB', '0', '1') end)"
				if err := c.Do(ctx, "FUNCTION", "LOAD", lib).Err(); err != nil {
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
