package localcache_test

import (
	"strconv"
	"sync"
	"sync/atomic"
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

// The local tier with routes: [upstream] (def) serves every key but the
// q:* ones, which the route sends to [upstreams.q].

func routedUpstream(addr string) config.Upstream {
	u := config.Default().Upstream
	u.Address = addr
	u.Connections = 2
	u.ReconnectMin = units.Duration{Duration: 10 * time.Millisecond}
	u.ReconnectMax = units.Duration{Duration: 100 * time.Millisecond}
	return u
}

// startRoutedTier starts def, q and a proxy with the tier routing q:*
// to q, and waits until the tier is live for both upstreams.
func startRoutedTier(t *testing.T, staleness time.Duration) (p *proxytest.Proxy, def, q *redistest.Server) {
	t.Helper()
	def, q = redistest.Start(t), redistest.Start(t)
	p = startTier(t, def, func(c *config.Config) {
		c.LocalCache.Staleness = units.Duration{Duration: staleness}
		c.Upstreams = map[string]config.Upstream{"q": routedUpstream(q.Addr())}
		c.Routes = []config.Route{{Pattern: "q:*", Upstream: "q"}}
	})
	waitOwners(t, p)
	return p, def, q
}

func waitOwners(t *testing.T, p *proxytest.Proxy) {
	t.Helper()
	redistest.Eventually(t, 10*time.Second, func() bool {
		return p.LocalTier().LiveOwner(config.DefaultUpstream, 0) && p.LocalTier().LiveOwner("q", 0)
	}, "the tier never became live for both upstreams")
}

// TestRoutesTierCoherent: keys of both routes are cached, each filled
// from its own upstream (the other server holds another value for the
// same key, which a fill from there would show); a write through the
// proxy is seen at once, one made directly on a key's upstream within S;
// and when the tracking connection to one upstream is killed, nothing of
// that upstream is served stale.
func TestRoutesTierCoherent(t *testing.T) {
	p, def, q := startRoutedTier(t, testS)
	reader, writer := p.Client(t), p.Client(t)
	dDirect, qDirect := def.Client(t), q.Client(t)
	owner := map[string]*redis.Client{"d:1": dDirect, "d:2": dDirect, "q:1": qDirect, "q:2": qDirect}
	other := map[string]*redis.Client{"d:1": qDirect, "d:2": qDirect, "q:1": dDirect, "q:2": dDirect}
	keys := []string{"d:1", "d:2", "q:1", "q:2"}
	for _, k := range keys {
		if err := owner[k].Set(ctx, k, "v1", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if err := other[k].Set(ctx, k, "not-its-upstream", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if v := cacheIt(t, p, reader, k); v != "v1" {
			t.Fatalf("GET %s = %q, want v1 from its route's upstream", k, v)
		}
	}

	t.Run("WriteThroughProxy", func(t *testing.T) {
		for _, k := range keys {
			if err := writer.Set(ctx, k, "v2", 0).Err(); err != nil {
				t.Fatal(err)
			}
			if v := mustGet(t, reader, k); v != "v2" {
				t.Fatalf("GET %s right after a write through the proxy = %q, want v2", k, v)
			}
		}
	})

	t.Run("WriteToTheUpstream", func(t *testing.T) {
		for _, k := range keys {
			cacheIt(t, p, reader, k)
		}
		before := metric(t, p.Metrics.Registry, "redproxy_localcache_invalidations_total")
		for _, k := range keys {
			if err := owner[k].Set(ctx, k, "v3", 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
		acked := time.Now()
		time.Sleep(time.Until(acked.Add(testS))) // C2 allows S
		for _, k := range keys {
			if v := mustGet(t, reader, k); v != "v3" {
				t.Fatalf("GET %s more than S after a write on its upstream = %q, want v3", k, v)
			}
		}
		redistest.Eventually(t, 5*time.Second, func() bool {
			return metric(t, p.Metrics.Registry, "redproxy_localcache_invalidations_total")-before >= float64(len(keys))
		}, "fewer invalidations than the %d keys written on their upstreams", len(keys))
	})

	t.Run("UpstreamConnectionLost", func(t *testing.T) {
		for _, k := range keys {
			cacheIt(t, p, reader, k)
		}
		// Only q's tracking connection is killed.
		defFills := func() float64 {
			return metric(t, p.Metrics.Registry, "redproxy_localcache_fills_total", "upstream="+config.DefaultUpstream)
		}
		fillsBefore := defFills()
		if n := killTierConns(t, qDirect); n == 0 {
			t.Fatal("no tracking connection on q")
		}
		if err := qDirect.Set(ctx, "q:1", "v4", 0).Err(); err != nil {
			t.Fatal(err)
		}
		acked := time.Now()
		redistest.Eventually(t, 5*time.Second, func() bool {
			return metric(t, p.Metrics.Registry, "redproxy_localcache_flushes_total", "reason="+localcache.FlushDisconnect) > 0
		}, "the lost connection was never noticed")
		if v := mustGet(t, reader, "q:1"); v != "v4" {
			t.Fatalf("after the loss was noticed, GET q:1 = %q", v)
		}
		readsAfter(t, reader, "q:1", "v4", acked.Add(testS), acked.Add(2*testS))
		redistest.Eventually(t, 10*time.Second, func() bool { return p.LocalTier().LiveOwner("q", 0) }, "q never live again")
		// [upstream]'s keys were not read from q: their entries stay
		// (the loss and the reconnection of q's connection each dropped
		// every upstream's; found by a probe).
		for _, k := range []string{"d:1", "d:2"} {
			before := hits(t, p)
			if v := mustGet(t, reader, k); v != "v3" || hits(t, p) == before {
				t.Errorf("GET %s after q's connection was lost = %q, a hit: %v; want v3 from the tier", k, v, hits(t, p) > before)
			}
		}
		if n := defFills() - fillsBefore; n != 0 {
			t.Errorf("%v fills of [upstream]'s keys after q's connection was lost: its entries were dropped", n)
		}
		for _, k := range keys {
			want := "v3"
			if k == "q:1" {
				want = "v4"
			}
			if v := cacheIt(t, p, reader, k); v != want {
				t.Fatalf("after reconnecting, GET %s = %q, want %q", k, v, want)
			}
		}
	})
}

// TestRoutesTierReload: a reload that moves q:* to [upstream] is applied
// while readers run; no read issued after Reload returned is answered
// with the value cached from q (the old owner), the tier is flushed, and
// it then serves hits from the new owner. A reload that leaves the key
// routes alone does not flush.
func TestRoutesTierReload(t *testing.T) {
	p, def, q := startRoutedTier(t, testS)
	const nkeys = 4
	for i := range nkeys {
		k := "q:" + strconv.Itoa(i)
		if err := q.Client(t).Set(ctx, k, "old-owner", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if err := def.Client(t).Set(ctx, k, "new-owner", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if v := cacheIt(t, p, p.Client(t), k); v != "old-owner" {
			t.Fatalf("GET %s before the reload = %q", k, v)
		}
	}
	flushes := func() float64 {
		return metric(t, p.Metrics.Registry, "redproxy_localcache_flushes_total", "reason="+localcache.FlushRoutes)
	}

	same := reloadedTier(t, p, func(c *config.Config) { c.Server.MaxClients++ }) // not the routes
	if _, err := p.Reload(same); err != nil {
		t.Fatal(err)
	}
	if f := flushes(); f != 0 {
		t.Fatalf("a reload that kept the routes flushed the tier (%v)", f)
	}

	var switched atomic.Bool
	var reads, afterReads, bad atomic.Int64
	var firstBad atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 3 {
		c := p.Client(t, func(o *redis.Options) { o.PoolSize = 1 })
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				k := "q:" + strconv.Itoa((g+n)%nkeys)
				after := switched.Load()
				v, err := c.Get(ctx, k).Result()
				reads.Add(1)
				if after {
					afterReads.Add(1)
				}
				if err == nil && (v == "new-owner" || !after && v == "old-owner") {
					continue
				}
				if bad.Add(1) == 1 {
					firstBad.Store("GET " + k + " = " + strconv.Quote(v) + ", after the reload returned: " + strconv.FormatBool(after))
				}
			}
		}()
	}
	redistest.Eventually(t, 10*time.Second, func() bool { return reads.Load() >= 100 }, "readers stalled")
	next := reloadedTier(t, p, func(c *config.Config) {
		c.Routes = nil
		c.ChannelRoutes = []config.Route{{Pattern: "nothing.*", Upstream: "q"}} // still routed
	})
	if _, err := p.Reload(next); err != nil {
		t.Fatal(err)
	}
	switched.Store(true)
	base := afterReads.Load()
	redistest.Eventually(t, 10*time.Second, func() bool { return afterReads.Load() >= base+100 }, "readers stalled after the reload")
	close(stop)
	wg.Wait()
	if bad.Load() > 0 {
		t.Fatalf("%d bad reads; first: %v", bad.Load(), firstBad.Load())
	}
	if f := flushes(); f != 1 {
		t.Fatalf("%v route-change flushes, want 1", f)
	}
	waitOwners(t, p)
	if v := cacheIt(t, p, p.Client(t), "q:0"); v != "new-owner" {
		t.Fatalf("GET q:0 from the tier after the reload = %q", v)
	}
}

func reloadedTier(t *testing.T, p *proxytest.Proxy, mutate func(*config.Config)) *config.Config {
	t.Helper()
	next := *p.Config()
	next.Stampede = p.Config().Stampede.Clone()
	mutate(&next)
	if err := next.Validate(); err != nil {
		t.Fatal(err)
	}
	return &next
}

// TestRoutesTierLinearizable: readers through the proxy, writers through
// it and writers directly on each upstream, on keys of both routes; the
// history must be linearizable with reads moved S earlier (C2).
func TestRoutesTierLinearizable(t *testing.T) {
	p, def, q := startRoutedTier(t, linS)
	var workers []lintest.Worker
	one := func(o *redis.Options) { o.PoolSize = 1 }
	for _, prefix := range []string{"d:", "q:"} {
		for range 2 {
			workers = append(workers, lintest.Worker{C: p.Client(t, one), Keys: prefix, ReadShift: linS, ReadsOnly: true, Every: 4 * time.Millisecond})
		}
		workers = append(workers, lintest.Worker{C: p.Client(t, one), Keys: prefix, ReadShift: linS, WritePct: 10, Every: 4 * time.Millisecond})
		rs := def
		if prefix == "q:" {
			rs = q
		}
		c := redis.NewClient(&redis.Options{Addr: rs.Addr(), PoolSize: 1, MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		workers = append(workers, lintest.Worker{C: c, Keys: prefix, WritesOnly: true, Every: 8 * time.Millisecond})
	}
	hist := lintest.RecordFor(t, workers, 4, 0, 1500*time.Millisecond)
	if res := lintest.Check(t, hist); res != porcupine.Ok {
		t.Fatalf("history with routes and direct writers on both upstreams violates the S bound (%v)", res)
	}
	if h := hits(t, p); h < 100 {
		t.Fatalf("only %v hits: the history did not exercise the tier", h)
	}
}

// TestRoutesTierSentinelFailover: a named Sentinel upstream fails over;
// the tier drops what it read from the old primary and tracks the new one
// (C4), as for [upstream]. The old primary is then cut off and written
// directly: a tier still reading from it would serve that value.
func TestRoutesTierSentinelFailover(t *testing.T) {
	g := redistest.StartSentinelGroup(t, redistest.SentinelOptions{Replicas: 1, Sentinels: 1})
	def := redistest.Start(t)
	p := startTier(t, def, func(c *config.Config) {
		u := routedUpstream("")
		u.Mode, u.Address = config.ModeSentinel, ""
		u.Sentinels, u.MasterName = g.SentinelAddrs(), g.Name
		u.DialTimeout = units.Duration{Duration: 500 * time.Millisecond}
		c.Upstreams = map[string]config.Upstream{"q": u}
		c.Routes = []config.Route{{Pattern: "q:*", Upstream: "q"}}
	})
	waitOwners(t, p)
	c := p.Client(t)
	old := g.Nodes[0]
	if err := c.Set(ctx, "q:1", "old", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if v := cacheIt(t, p, c, "q:1"); v != "old" {
		t.Fatalf("GET q:1 before the failover = %q", v)
	}
	switches := func() float64 {
		return metric(t, p.Metrics.Registry, "redproxy_localcache_flushes_total", "reason="+localcache.FlushSwitch)
	}
	before := switches()
	// A key of [upstream], which does not fail over: its entry stays, and
	// nothing is flushed under [upstream] (the failover used to drop the
	// whole tier and redial every connection, whose reconnection flushed
	// it again, counted under default; found by a probe).
	if err := def.Client(t).Set(ctx, "d:1", "from-def", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if v := cacheIt(t, p, c, "d:1"); v != "from-def" {
		t.Fatalf("GET d:1 = %q", v)
	}
	defFlushes := func() float64 {
		return metric(t, p.Metrics.Registry, "redproxy_localcache_flushes_total", "upstream="+config.DefaultUpstream)
	}
	defFills := func() float64 {
		return metric(t, p.Metrics.Registry, "redproxy_localcache_fills_total", "upstream="+config.DefaultUpstream)
	}
	flushesBefore := defFlushes()

	g.Failover(t)
	next := g.WaitNewPrimary(t, old, 30*time.Second)
	redistest.Eventually(t, 10*time.Second, func() bool {
		if c.Set(ctx, "q:2", "b", 0).Err() != nil {
			return false
		}
		v, _ := next.Client(t).Get(ctx, "q:2").Result()
		return v == "b"
	}, "writes of the q route never reached the new primary %s", next.Addr())
	if err := next.Client(t).Set(ctx, "q:1", "new", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// The old primary, cut off from the group, gets a value of its own.
	oc := redistestClient(t, old)
	if err := oc.Do(ctx, "REPLICAOF", "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}
	if err := oc.Set(ctx, "q:1", "from-the-old-primary", 0).Err(); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 10*time.Second, func() bool {
		before := hits(t, p)
		v, err := c.Get(ctx, "q:1").Result()
		if err == nil && v != "new" {
			t.Fatalf("GET q:1 after the failover = %q, want the new primary's value", v)
		}
		return err == nil && hits(t, p) > before
	}, "the tier never served hits from the new primary")
	if switches() == before {
		t.Fatal("the tier was not switched to the new primary")
	}
	fillsBefore, hitsBefore := defFills(), hits(t, p)
	if v := mustGet(t, c, "d:1"); v != "from-def" {
		t.Fatalf("GET d:1 after the other upstream's failover = %q", v)
	}
	if hits(t, p) == hitsBefore || defFills() != fillsBefore {
		t.Error("d:1, of the upstream that did not fail over, was not served from the tier after the failover: it was dropped")
	}
	if n := defFlushes(); n != flushesBefore {
		t.Errorf("%v flushes counted under [upstream] during the q upstream's failover", n-flushesBefore)
	}
}

// TestRoutesTierStaleIfError: with one upstream down, a read of its key
// that has a stale_if_error rule is asked of that upstream (not of
// [upstream], which holds another value for the key) and answered with
// the stale value when that fails; keys of the other route keep working.
func TestRoutesTierStaleIfError(t *testing.T) {
	def, q := redistest.Start(t), redistest.Start(t)
	p := startTier(t, def, func(c *config.Config) {
		c.Upstreams = map[string]config.Upstream{"q": routedUpstream(q.Addr())}
		c.Routes = []config.Route{{Pattern: "q:*", Upstream: "q"}}
		c.LocalCache.StaleIfError = []localcache.StaleRule{{Pattern: "*", MaxAge: units.Duration{Duration: time.Minute}}}
	})
	waitOwners(t, p)
	c := p.Client(t)
	if err := q.Client(t).Set(ctx, "q:1", "from-q", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := def.Client(t).Set(ctx, "q:1", "not-its-upstream", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := def.Client(t).Set(ctx, "d:1", "from-def", 0).Err(); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{"q:1": "from-q", "d:1": "from-def"} {
		if v := cacheIt(t, p, c, k); v != want {
			t.Fatalf("GET %s = %q, want %q", k, v, want)
		}
	}
	q.Kill(t)
	redistest.Eventually(t, 5*time.Second, func() bool {
		return metric(t, p.Metrics.Registry, "redproxy_localcache_flushes_total", "reason="+localcache.FlushDisconnect) > 0
	}, "the loss was never noticed")
	before := metric(t, p.Metrics.Registry, "redproxy_localcache_stale_serves_total")
	if v := mustGet(t, c, "q:1"); v != "from-q" {
		t.Fatalf("q:1 with its upstream down = %q, want the stale value read from it", v)
	}
	if n := metric(t, p.Metrics.Registry, "redproxy_localcache_stale_serves_total"); n == before {
		t.Fatal("no stale serve counted: q:1 was not answered from the stale value")
	}
	if v := cacheIt(t, p, c, "d:1"); v != "from-def" {
		t.Fatalf("d:1 with the other upstream down = %q", v)
	}
}
