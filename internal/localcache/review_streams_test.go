package localcache_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/redistest"
)

// Review finding: Redis 7.0 sends no tracking invalidation when a stream's
// consumer groups change (XREADGROUP, XACK, XCLAIM, XGROUP CREATE/SETID/
// CREATECONSUMER/DELCONSUMER/DESTROY, XSETID), yet XINFO GROUPS and XINFO
// STREAM, whose replies show that state, are cached by the tier. After such
// a write the tier serves the old reply until max_ttl, long past S.
//
//   - direct: the write reaches Redis without the proxy (C2: S bound).
//   - proxy (control, passes): a plain XREADGROUP through the proxy; the
//     proxy names the key and drops it itself.
//   - script: the write goes through the proxy in a script that names the
//     stream in ARGV; the proxy raises a fence, but the fence only waits
//     for invalidations Redis never sends (C1/C3).

func xinfoGroups(t *testing.T, c *redis.Client) string {
	t.Helper()
	v, err := c.Do(ctx, "XINFO", "GROUPS", "s").Result()
	if err != nil {
		t.Fatalf("XINFO GROUPS: %v", err)
	}
	return fmt.Sprint(v)
}

func cacheXinfo(t *testing.T, c *redis.Client, hitsFn func() float64) string {
	t.Helper()
	var v string
	redistest.Eventually(t, 5*time.Second, func() bool {
		before := hitsFn()
		v = xinfoGroups(t, c)
		return hitsFn() > before
	}, "XINFO GROUPS s never became a hit")
	return v
}

func TestReviewTierStreamGroupChangeServedStale(t *testing.T) {
	// "proxy" is a control that passes: a plain XREADGROUP through the
	// proxy names its key, which the proxy drops itself.
	for _, how := range []string{"proxy", "direct", "script"} {
		t.Run(how, func(t *testing.T) {
			p := startTier(t, nil)
			direct := p.Redis.Client(t)
			if err := direct.Do(ctx, "XADD", "s", "1-1", "f", "v").Err(); err != nil {
				t.Fatal(err)
			}
			if err := direct.Do(ctx, "XGROUP", "CREATE", "s", "g", "0").Err(); err != nil {
				t.Fatal(err)
			}
			c := p.Client(t)
			before := cacheXinfo(t, c, func() float64 { return hits(t, p) })

			// Consume the entry: the group's pending count, consumers and
			// last-delivered-id change; the writer gets its reply.
			switch how {
			case "proxy":
				if err := c.Do(ctx, "XREADGROUP", "GROUP", "g", "c1", "COUNT", "1", "STREAMS", "s", ">").Err(); err != nil {
					t.Fatal(err)
				}
			case "direct":
				if err := direct.Do(ctx, "XREADGROUP", "GROUP", "g", "c1", "COUNT", "1", "STREAMS", "s", ">").Err(); err != nil {
					t.Fatal(err)
				}
			case "script":
				const script = "return redis.call('XREADGROUP','GROUP','g','c1','COUNT','1','STREAMS',ARGV[1],'>')"
				if err := c.Do(ctx, "EVAL", script, "0", "s").Err(); err != nil {
					t.Fatal(err)
				}
			}
			want := xinfoGroups(t, direct)
			if want == before {
				t.Fatalf("test broken: XREADGROUP changed nothing (%s)", want)
			}
			// Well past S (and past the fence, for the script).
			time.Sleep(5 * testS)
			stale, reads := 0, 0
			var last string
			for range 20 {
				reads++
				if got := xinfoGroups(t, c); got != want {
					stale, last = stale+1, got
				}
				time.Sleep(10 * time.Millisecond)
			}
			if stale > 0 {
				t.Fatalf("%d of %d reads of XINFO GROUPS s, %v after the write was acknowledged, returned the old reply\n got  %s\n want %s", stale, reads, 5*testS, last, want)
			}
		})
	}
}
