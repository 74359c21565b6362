package proxy_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// TestTierHitsKeepHotKeysRecentForLRU (found by review): the seeds run
// Redis as a cache under maxmemory with allkeys-lru ("evict least recently
// used: general cache"). With the local tier on, the hottest keys were
// answered from the proxy's memory and never touched Redis, so Redis's LRU
// clock saw them as the least recently used keys of all and evicted
// exactly them first. The tier now sends them back as TOUCH
// (localcache/touch.go). The same sequence with the tier off is the
// control.
func TestTierHitsKeepHotKeysRecentForLRU(t *testing.T) {
	for _, tier := range []bool{false, true} {
		name := "TierOff"
		if tier {
			name = "TierOn"
		}
		t.Run(name, func(t *testing.T) {
			rs := redistest.Start(t, "--maxmemory-policy", "allkeys-lru", "--maxmemory-samples", "64")
			p := proxytest.Start(t, rs, func(c *config.Config) {
				c.LocalCache.Enabled = tier
				// The shortest interval, so that the hot key's last touch is
				// far more recent than the other keys' one read even when a
				// loaded machine delays the heartbeat (CI once saw both idle
				// for 1 s with the default of 1 s and 1.5 s between them).
				c.LocalCache.TouchInterval = units.Duration{Duration: 100 * time.Millisecond}
			})
			direct := rs.Client(t)
			app := p.Client(t)
			val := strings.Repeat("x", 20000)
			const n = 30
			for i := range n {
				if err := direct.Set(ctx, fmt.Sprintf("cache:item:v1:%d", i), val, time.Hour).Err(); err != nil {
					t.Fatal(err)
				}
			}
			const hot = "cache:item:v1:0"
			// The application reads the hot key all the time, through the
			// proxy, for 4 s; every other key is read once, after 1 s.
			// Redis's LRU clock has a 1 s resolution, so with Redis seeing
			// every read (or its touch) the hot key is the most recently
			// used and the others about 3 s older; without, the hot key's
			// last access is its fill, before the others' read.
			start := time.Now()
			othersRead := false
			redistest.Eventually(t, 10*time.Second, func() bool {
				for range 50 {
					if v, err := app.Get(ctx, hot).Result(); err != nil || v != val {
						t.Fatalf("GET %s: %v", hot, err)
					}
				}
				if !othersRead && time.Since(start) > time.Second {
					othersRead = true
					for i := 1; i < n; i++ {
						app.Get(ctx, fmt.Sprintf("cache:item:v1:%d", i))
					}
				}
				return time.Since(start) > 4*time.Second
			}, "never done")
			idle := direct.ObjectIdleTime(ctx, hot).Val()
			otherIdle := direct.ObjectIdleTime(ctx, "cache:item:v1:1").Val()
			// Memory runs short: Redis must evict a few keys.
			used, err := direct.Info(ctx, "memory").Result()
			if err != nil {
				t.Fatal(err)
			}
			var mem int64
			for _, line := range strings.Split(used, "\r\n") {
				if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
					mem, _ = strconv.ParseInt(v, 10, 64)
				}
			}
			if err := direct.ConfigSet(ctx, "maxmemory", strconv.FormatInt(mem-50000, 10)).Err(); err != nil {
				t.Fatal(err)
			}
			direct.Set(ctx, "cache:trigger:v1", "x", time.Hour)
			if direct.Exists(ctx, hot).Val() == 0 {
				t.Fatalf("allkeys-lru evicted %s, the key the application reads most (Redis saw it idle for %v, the others for %v: "+
					"its reads were answered by the local tier and never reached Redis); the application now misses it", hot, idle, otherIdle)
			}
		})
	}
}
