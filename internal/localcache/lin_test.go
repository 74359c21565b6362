package localcache_test

import (
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/localcache"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// The linearizability checks record GET/SET/DEL/INCR histories on a few
// keys, with every key admitted to the tier, and check them with porcupine
// against a sequential key-value store.

var hashSeed = maphash.MakeSeed()

type kvIn struct {
	op  byte // 'g' GET, 's' SET, 'd' DEL, 'i' INCR
	key string
	val string
}

// kvOut is the result: the value read ("" for nil), the new INCR value, or
// DEL's count.
type kvOut struct {
	val string
	n   int64
}

var kvModel = porcupine.Model{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range h {
			k := op.Input.(kvIn).key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		var out [][]porcupine.Operation
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() any { return "" }, // "" is a missing key: SET never writes ""
	Hash: func(state any) uint64 { return maphash.String(hashSeed, state.(string)) },
	Step: func(state, input, output any) (bool, any) {
		s, in, out := state.(string), input.(kvIn), output.(kvOut)
		switch in.op {
		case 'g':
			return out.val == s, s
		case 's':
			return true, in.val
		case 'd':
			return (out.n == 1) == (s != ""), ""
		case 'i':
			n := int64(0)
			if s != "" {
				var err error
				if n, err = strconv.ParseInt(s, 10, 64); err != nil {
					return false, s
				}
			}
			return out.n == n+1, strconv.FormatInt(n+1, 10)
		}
		return false, s
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(kvIn), output.(kvOut)
		return fmt.Sprintf("%c %s %s -> %q %d", in.op, in.key, in.val, out.val, out.n)
	},
}

// worker is one client of a recorded history.
type worker struct {
	c *redis.Client
	// readShift moves a read's start back (C2: a read that starts at t may
	// return anything acknowledged after t − S).
	readShift  time.Duration
	writesOnly bool
	readsOnly  bool
	writePct   int // for clients that read and write: share of writes, in percent (default 40)
	// every paces the worker (one operation per tick), so a history spans
	// many S instead of being over before the bound means anything.
	every time.Duration
}

// record runs ops operations per worker on nkeys keys (for paced workers:
// as many as fit in dur) and returns the history. Any error fails the test:
// an operation with an unknown outcome would weaken the check.
func record(t *testing.T, workers []worker, nkeys, ops int) []porcupine.Operation {
	return recordFor(t, workers, nkeys, ops, 0)
}

func recordFor(t *testing.T, workers []worker, nkeys, ops int, dur time.Duration) []porcupine.Operation {
	t.Helper()
	base := time.Now()
	var mu sync.Mutex
	var hist []porcupine.Operation
	var wg sync.WaitGroup
	errs := make(chan error, len(workers))
	for id, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(id), 7))
			if w.writePct == 0 {
				w.writePct = 40
			}
			var tick <-chan time.Time
			if w.every > 0 {
				tk := time.NewTicker(w.every)
				defer tk.Stop()
				tick = tk.C
			}
			for seq := 0; ; seq++ {
				if dur > 0 && time.Since(base) >= dur || dur == 0 && seq == ops {
					return
				}
				if tick != nil {
					<-tick
				}
				in := kvIn{key: "lin:" + strconv.Itoa(r.IntN(nkeys))}
				x := r.IntN(100)
				switch {
				case w.readsOnly:
					in.op = 'g'
				case w.writesOnly && x < 50 || !w.writesOnly && x < w.writePct/2:
					// Unique, and far from each other so INCRs of one
					// never produce another: reads then name their write.
					in.op, in.val = 's', strconv.Itoa((id+1)*1_000_000_000+seq*1000)
				case w.writesOnly && x < 52 || !w.writesOnly && x < w.writePct*11/20:
					in.op = 'd'
				case w.writesOnly || x < w.writePct:
					in.op = 'i'
				default:
					in.op = 'g'
				}
				call := time.Since(base)
				var out kvOut
				var err error
				switch in.op {
				case 'g':
					out.val, err = w.c.Get(ctx, in.key).Result()
					if err == redis.Nil {
						err = nil
					}
				case 's':
					err = w.c.Set(ctx, in.key, in.val, 0).Err()
				case 'd':
					out.n, err = w.c.Del(ctx, in.key).Result()
				case 'i':
					out.n, err = w.c.Incr(ctx, in.key).Result()
				}
				ret := time.Since(base)
				if err != nil {
					errs <- fmt.Errorf("%c %s: %w", in.op, in.key, err)
					return
				}
				if in.op == 'g' {
					call -= w.readShift
				}
				mu.Lock()
				hist = append(hist, porcupine.Operation{ClientId: id, Input: in, Call: int64(call), Output: out, Return: int64(ret)})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return hist
}

func check(t *testing.T, hist []porcupine.Operation) porcupine.CheckResult {
	t.Helper()
	start := time.Now()
	res := porcupine.CheckOperationsTimeout(kvModel, hist, 20*time.Second)
	t.Logf("%d operations checked in %v: %v", len(hist), time.Since(start), res)
	return res
}

// onePROXY: 16 clients through one proxy, every write through it (C1).
func onePROXYHistory(t *testing.T, p *proxytest.Proxy) []porcupine.Operation {
	var workers []worker
	for range 16 {
		workers = append(workers, worker{c: p.Client(t, func(o *redis.Options) { o.PoolSize = 1 })})
	}
	return record(t, workers, 3, 250)
}

func TestLinearizableThroughOneProxy(t *testing.T) {
	p := startTier(t, nil)
	hist := onePROXYHistory(t, p)
	if res := check(t, hist); res != porcupine.Ok {
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
		if res := check(t, hist); res != porcupine.Ok {
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
func twoProxiesHistory(t *testing.T, rs *redistest.Server, p1, p2 *proxytest.Proxy) []porcupine.Operation {
	// Pacing keeps the number of operations overlapping a shifted read
	// small: checking a history is exponential in that number.
	var workers []worker
	one := func(o *redis.Options) { o.PoolSize = 1 }
	for range 3 {
		workers = append(workers, worker{c: p1.Client(t, one), readShift: linS, readsOnly: true, every: 4 * time.Millisecond})
		workers = append(workers, worker{c: p2.Client(t, one), readShift: linS, writePct: 10, every: 4 * time.Millisecond})
	}
	for range 2 {
		c := redis.NewClient(&redis.Options{Addr: rs.Addr(), PoolSize: 1, MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		workers = append(workers, worker{c: c, writesOnly: true, every: 4 * time.Millisecond})
	}
	return recordFor(t, workers, 8, 0, 1500*time.Millisecond)
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
	hist := twoProxiesHistory(t, rs, p1, p2)
	if res := check(t, hist); res != porcupine.Ok {
		t.Fatalf("history through two proxies and direct writers violates the S bound (%v)", res)
	}
	if h := hits(t, p1); h < 300 {
		t.Fatalf("only %v hits on the reading proxy: the history did not exercise the tier", h)
	}
}

// Without invalidations, writes from the other proxy and the direct
// writers are never seen by the first proxy's tier: the check must fail.
func TestStalenessCheckCatchesIgnoredInvalidations(t *testing.T) {
	withHooks(t, &localcache.TestHooks{IgnorePushes: true})
	rs := redistest.Start(t)
	p1, p2 := startLin(t, rs), startLin(t, rs)
	hist := twoProxiesHistory(t, rs, p1, p2)
	if res := check(t, hist); res == porcupine.Ok {
		t.Fatal("a tier ignoring invalidations passed the staleness check")
	}
}

// A server with a tiny tracking table evicts keys from it all the time and
// sends invalidations for them; the tier must stay correct.
func TestSmallTrackingTable(t *testing.T) {
	rs := redistest.Start(t, "--tracking-table-max-keys", "2")
	p1, p2 := startLin(t, rs), startLin(t, rs)
	hist := twoProxiesHistory(t, rs, p1, p2)
	if res := check(t, hist); res != porcupine.Ok {
		t.Fatalf("history with a 2-key tracking table violates the S bound (%v)", res)
	}
	if n := metric(t, p1.Metrics.Registry, "redproxy_localcache_invalidations_total"); n == 0 {
		t.Fatal("no invalidations seen")
	}
}
