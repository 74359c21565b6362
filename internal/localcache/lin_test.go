package localcache_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/lintest"
	"github.com/redproxy/redproxy/internal/localcache"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// The linearizability checks record GET/SET/DEL/INCR histories on a few
// keys, with every key admitted to the tier, and check them with porcupine
// against a sequential key-value store.

// onePROXY: 16 clients through one proxy, every write through it (C1).
func onePROXYHistory(t *testing.T, p *proxytest.Proxy) []porcupine.Operation {
	var workers []lintest.Worker
	for range 16 {
		workers = append(workers, lintest.Worker{C: p.Client(t, func(o *redis.Options) { o.PoolSize = 1 })})
	}
	return lintest.Record(t, workers, 3, 250)
}

func TestLinearizableThroughOneProxy(t *testing.T) {
	p := startTier(t, nil)
	hist := onePROXYHistory(t, p)
	if res := lintest.Check(t, hist); res != porcupine.Ok {
		t.Fatalf("history through one proxy is not linearizable (%v)", res)
	}
	if h := hits(t, p); h < 100 {
		t.Fatalf("only %v hits: the history did not exercise the tier", h)
	}
}

// With the generation check off and invalidations ignored, a fill that
// read a key before a write through the proxy is kept after it: the same
// check must then fail, or it could not catch anything.
func TestLinearizabilityCheckCatchesBrokenTier(t *testing.T) {
	withHooks(t, &localcache.TestHooks{SkipGenerationCheck: true, IgnorePushes: true})
	p := startTier(t, nil)
	for attempt := 1; ; attempt++ {
		hist := onePROXYHistory(t, p)
		if res := lintest.Check(t, hist); res != porcupine.Ok {
			return
		}
		if attempt == 3 {
			t.Fatal("a tier that keeps fills across writes passed the linearizability check 3 times")
		}
	}
}

// twoProxiesHistory: clients through two proxies and clients writing Redis
// directly; reads start S earlier than they really did (C2). Clients of
// the first proxy only read, so every value it serves that another writer
// replaced must have been invalidated for the check to pass.
// keys is the key prefix: a history's model starts from missing keys.
func twoProxiesHistory(t *testing.T, rs *redistest.Server, p1, p2 *proxytest.Proxy, keys string) []porcupine.Operation {
	// Pacing keeps the number of operations overlapping a shifted read
	// small: checking a history is exponential in that number.
	var workers []lintest.Worker
	one := func(o *redis.Options) { o.PoolSize = 1 }
	for range 3 {
		workers = append(workers, lintest.Worker{C: p1.Client(t, one), ReadShift: linS, ReadsOnly: true, Every: 4 * time.Millisecond, Keys: keys})
		workers = append(workers, lintest.Worker{C: p2.Client(t, one), ReadShift: linS, WritePct: 10, Every: 4 * time.Millisecond, Keys: keys})
	}
	for range 2 {
		c := redis.NewClient(&redis.Options{Addr: rs.Addr(), PoolSize: 1, MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		workers = append(workers, lintest.Worker{C: c, WritesOnly: true, Every: 4 * time.Millisecond, Keys: keys})
	}
	return lintest.RecordFor(t, workers, 8, 0, 1500*time.Millisecond)
}

// linS is the staleness bound of the two-proxy histories: short, so that a
// one-second history spans many of them.
const linS = 50 * time.Millisecond

func startLin(t *testing.T, rs *redistest.Server) *proxytest.Proxy {
	return startTier(t, rs, func(c *config.Config) { c.LocalCache.Staleness = units.Duration{Duration: linS} })
}

func TestStalenessBoundAcrossProxies(t *testing.T) {
	rs := redistest.Start(t)
	p1, p2 := startLin(t, rs), startLin(t, rs)
	// A history lasts a fixed time, so a loaded machine (CI runs test
	// processes side by side) gets fewer reads into it: another history is
	// recorded, and checked in turn, until the reading proxy's tier has
	// served enough of them (seen in CI: 179 hits in one).
	for attempt := 1; ; attempt++ {
		hist := twoProxiesHistory(t, rs, p1, p2, "lin"+strconv.Itoa(attempt)+":")
		if res := lintest.Check(t, hist); res != porcupine.Ok {
			t.Fatalf("history %d through two proxies and direct writers violates the S bound (%v)", attempt, res)
		}
		h := hits(t, p1)
		if h >= 300 {
			break
		}
		if attempt == 4 {
			t.Fatalf("only %v hits on the reading proxy in %d histories: they did not exercise the tier", h, attempt)
		}
	}
}

// Without invalidations, writes from the other proxy and the direct
// writers are never seen by the first proxy's tier: the check must fail.
func TestStalenessCheckCatchesIgnoredInvalidations(t *testing.T) {
	withHooks(t, &localcache.TestHooks{IgnorePushes: true})
	rs := redistest.Start(t)
	p1, p2 := startLin(t, rs), startLin(t, rs)
	hist := twoProxiesHistory(t, rs, p1, p2, "")
	if res := lintest.Check(t, hist); res == porcupine.Ok {
		t.Fatal("a tier ignoring invalidations passed the staleness check")
	}
}

// A server with a tiny tracking table evicts keys from it all the time and
// sends invalidations for them; the tier must stay correct.
func TestSmallTrackingTable(t *testing.T) {
	rs := redistest.Start(t, "--tracking-table-max-keys", "2")
	p1, p2 := startLin(t, rs), startLin(t, rs)
	hist := twoProxiesHistory(t, rs, p1, p2, "")
	if res := lintest.Check(t, hist); res != porcupine.Ok {
		t.Fatalf("history with a 2-key tracking table violates the S bound (%v)", res)
	}
	if n := metric(t, p1.Metrics.Registry, "redproxy_localcache_invalidations_total"); n == 0 {
		t.Fatal("no invalidations seen")
	}
}
