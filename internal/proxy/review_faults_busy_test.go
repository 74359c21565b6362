package proxy_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

const rfBusyScript = "local t=redis.call('TIME'); local s=tonumber(t[1])*1000000+tonumber(t[2]); " +
	"while true do local n=redis.call('TIME'); if tonumber(n[1])*1000000+tonumber(n[2]) > s+ARGV[1] then break end end; return 'done'"

// A long script run through the proxy while other clients read and write
// (coalesced reads, tier on): the script's own reply is its result, every
// other command is answered (a value or -BUSY) and none waits much longer
// than the script.
func TestReviewFaultsBusyScriptWithCoalescedReads(t *testing.T) {
	for _, tier := range []bool{false, true} {
		t.Run("tier="+strconv.FormatBool(tier), func(t *testing.T) {
			rs := redistest.Start(t, "--busy-reply-threshold", "100")
			p := proxytest.Start(t, rs, func(c *config.Config) {
				c.Upstream.ReplyTimeout = units.Duration{Duration: 200 * time.Millisecond}
				// Above the script's 2.5 s: the probes' BUSY keeps a
				// connection alive past it, but on a starved machine (CI
				// beside other work) Redis, busy in the script, answered
				// none for 1 s and the EVAL's connection was closed.
				c.Upstream.DeadTimeout = units.Duration{Duration: 5 * time.Second}
				if tier {
					c.LocalCache.Enabled = true
					c.LocalCache.AdmitMinReads = 0
					c.LocalCache.WriteRatio = 1000
					c.LocalCache.Staleness = units.Duration{Duration: 200 * time.Millisecond}
				}
			})
			ctx := context.Background()
			direct := rs.Client(t)
			direct.Set(ctx, "hot", "v0", 0)
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var maxLat atomic.Int64
			var busy, vals, other atomic.Int64
			var errsMu sync.Mutex
			var errs []string
			for id := range 8 {
				c := p.Client(t, func(o *redis.Options) { o.PoolSize = 1; o.ReadTimeout = 30 * time.Second })
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						start := time.Now()
						var err error
						if id == 0 && i%5 == 0 {
							err = c.Set(ctx, "hot", "v"+strconv.Itoa(i), 0).Err()
						} else {
							_, err = c.Get(ctx, "hot").Result()
						}
						lat := time.Since(start)
						for {
							m := maxLat.Load()
							if int64(lat) <= m || maxLat.CompareAndSwap(m, int64(lat)) {
								break
							}
						}
						switch {
						case err == nil:
							vals.Add(1)
						case strings.HasPrefix(err.Error(), "BUSY"):
							busy.Add(1)
							time.Sleep(time.Millisecond)
						default:
							other.Add(1)
							errsMu.Lock()
							errs = append(errs, err.Error())
							errsMu.Unlock()
						}
					}
				}()
			}
			time.Sleep(100 * time.Millisecond)
			ec := p.Client(t, func(o *redis.Options) { o.ReadTimeout = 30 * time.Second })
			start := time.Now()
			res, err := ec.Eval(ctx, rfBusyScript, nil, 2500000).Result()
			took := time.Since(start)
			time.Sleep(200 * time.Millisecond)
			close(stop)
			wg.Wait()
			t.Logf("EVAL = %v, %v after %v; values %d, BUSY %d, other errors %d, longest wait %v", res, err, took, vals.Load(), busy.Load(), other.Load(), time.Duration(maxLat.Load()))
			if err != nil || res != "done" {
				t.Errorf("the script's client got %v, %v; Redis ran it to the end", res, err)
			}
			if len(errs) > 0 {
				t.Errorf("other errors: %v", errs[:min(5, len(errs))])
			}
			// A hang check, not a speed one: nothing should wait much
			// past the 2.5 s script (commands queued behind it on a
			// shared connection wait for it, as on Redis).
			if time.Duration(maxLat.Load()) > 10*time.Second {
				t.Errorf("a command waited %v for a 2.5s script", time.Duration(maxLat.Load()))
			}
		})
	}
}
