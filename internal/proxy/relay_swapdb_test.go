package proxy_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// A SWAPDB sent by a relayed client whose replies the relay cannot count
// (here a RESP3 tracking client, as rueidis is, that sent CLIENT REPLY ON).
// The tier flushes both databases when the SWAPDB is forwarded, but the
// second flush that drops what a fill read between that flush and the swap
// (localcache.Writes.swapped, done by WriteDone) only runs when the relay
// releases the write: for an uncounted relay, when the relay ends. Redis
// sends no invalidation for SWAPDB and the fence raised before each chunk
// only waits for invalidations, so the DB 0 value a fill read just before
// the swap was served after the relayed client got its OK (found by
// review); the relay now also drops the held swaps' databases before each
// chunk (relayWrites.fenceHeld). The counted case is a control. CLIENT
// PAUSE WRITE, sent to Redis directly, holds the SWAPDB while the fill
// runs, as in localcache's TestSwapDBDropsFillsThatRanBeforeTheSwap.
func TestTierRelayedSwapDBLeavesNoPreSwapFill(t *testing.T) {
	swapDB := []string{"SWAPDB", "0", "1"}
	// A script that may run SWAPDB is handled as one of every database
	// (localcache/scripts.go).
	swapScript := []string{"EVAL", "redis.call('SWAPDB', '0', '1') return 1", "0"}
	for _, tc := range []struct {
		name  string
		start [][]string
		swap  []string
	}{
		{"counted", [][]string{{"HELLO", "3"}, {"CLIENT", "TRACKING", "ON"}}, swapDB},
		{"uncounted", [][]string{{"HELLO", "3"}, {"CLIENT", "TRACKING", "ON"}, {"CLIENT", "REPLY", "ON"}}, swapDB},
		{"counted-script", [][]string{{"HELLO", "3"}, {"CLIENT", "TRACKING", "ON"}}, swapScript},
		{"uncounted-script", [][]string{{"HELLO", "3"}, {"CLIENT", "TRACKING", "ON"}, {"CLIENT", "REPLY", "ON"}}, swapScript},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := proxytest.Start(t, nil, func(c *config.Config) {
				eagerTier(c, 200*time.Millisecond)
				c.Policy.Commands.Allow = append(c.Policy.Commands.Allow, "swapdb")
			})
			redistest.Eventually(t, 10*time.Second, func() bool { return p.LocalTier().Live(0) }, "local tier never became live")
			hits := func() float64 { return metricSum(t, p, "redproxy_localcache_hits_total") }
			direct := p.Redis.Client(t)
			direct1 := p.Redis.ClientDB(t, 1)
			if err := direct.Set(ctx, "k", "db0-before", 0).Err(); err != nil {
				t.Fatal(err)
			}
			if err := direct1.Set(ctx, "k", "db1-before", 0).Err(); err != nil {
				t.Fatal(err)
			}
			reader := p.Client(t, func(o *redis.Options) { o.PoolSize = 1 })
			reader.Get(ctx, "other") // connected before the pause

			w := dialRaw(t, p.Addr)
			for _, c := range tc.start {
				if v := w.readNonPushAfter(c...); v != "OK" && c[0] != "HELLO" {
					t.Fatalf("%v: %v", c, v)
				}
			}
			if err := direct.Do(ctx, "CLIENT", "PAUSE", "2000", "WRITE").Err(); err != nil {
				t.Fatal(err)
			}
			w.send(tc.swap)
			redistest.Eventually(t, 5*time.Second, func() bool {
				info, err := direct.Info(ctx, "clients").Result()
				return err == nil && strings.Contains(info, "\r\nblocked_clients:1\r\n")
			}, "SWAPDB never reached Redis's pause")
			// A fill of k from DB 0 as it still is, kept by the tier.
			waitTierHit(t, reader, hits, "k")
			if err := direct.Do(ctx, "CLIENT", "UNPAUSE").Err(); err != nil {
				t.Fatal(err)
			}
			if v := fmt.Sprint(w.readNonPush()); v != "OK" && v != "1" {
				t.Fatalf("SWAPDB: %v", v)
			}
			if v, _ := direct.Get(ctx, "k").Result(); v != "db1-before" {
				t.Fatalf("test broken: direct GET k after the swap = %q", v)
			}
			// The relayed client has its OK: every read from now on sees
			// the swap (the relay stays open).
			time.Sleep(50 * time.Millisecond)
			stale, reads := 0, 0
			var last string
			for until := time.Now().Add(time.Second); time.Now().Before(until); time.Sleep(10 * time.Millisecond) {
				reads++
				v, err := reader.Get(ctx, "k").Result()
				if err != nil {
					t.Fatal(err)
				}
				if v != "db1-before" {
					stale, last = stale+1, v
				}
			}
			if stale > 0 {
				t.Fatalf("%d of %d reads after the relayed SWAPDB was acknowledged returned %q, want db1-before (tier hits %v)", stale, reads, last, hits())
			}
		})
	}
}
