package proxy_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/proxy"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// routedReplicas is two replicated upstreams behind one proxy: [upstream]
// (def) and the named upstream "b", which keys "b:*" route to; each reads
// from its own replica.
type routedReplicas struct {
	def, b *replicated
	p      *proxytest.Proxy
}

func startRoutedReplicas(t *testing.T, maxLag time.Duration) *routedReplicas {
	t.Helper()
	return startRoutedReplicasPolled(t, maxLag, 20*time.Millisecond)
}

// startRoutedReplicasPolled is startRoutedReplicas with both upstreams'
// replica_poll_interval.
func startRoutedReplicasPolled(t *testing.T, maxLag, poll time.Duration) *routedReplicas {
	t.Helper()
	r := &routedReplicas{def: startReplicated(t, 1), b: startReplicated(t, 1)}
	replicaSettings := func(u *config.Upstream) {
		u.ReadFrom = config.ReadReplicaPreferred
		u.ReplicaPollInterval = units.Duration{Duration: poll}
		u.ReplyTimeout = units.Duration{Duration: 500 * time.Millisecond}
		u.DialTimeout = units.Duration{Duration: 500 * time.Millisecond}
		u.MaxReplicaLag = units.Duration{Duration: maxLag}
	}
	r.p = proxytest.Start(t, r.def.primary, func(c *config.Config) {
		replicaSettings(&c.Upstream)
		b := namedUpstream(r.b.primary.Addr())
		replicaSettings(&b)
		c.Upstreams = map[string]config.Upstream{"b": b}
		c.Routes = []config.Route{{Pattern: "b:*", Upstream: "b"}}
	})
	redistest.Eventually(t, 10*time.Second, func() bool {
		return r.p.UsableReplicasOf(config.DefaultUpstream) == 1 && r.p.UsableReplicasOf("b") == 1
	}, "the proxy never found both upstreams' replicas")
	return r
}

// seed writes n keys of each route on the primaries and waits for the
// replicas to have them.
func (r *routedReplicas) seed(t *testing.T, n int) {
	t.Helper()
	ctx := context.Background()
	for _, g := range []struct {
		prefix string
		rep    *replicated
	}{{"a:", r.def}, {"b:", r.b}} {
		pc := g.rep.primary.Client(t)
		for i := range n {
			if err := pc.Set(ctx, g.prefix+strconv.Itoa(i), g.prefix+"v"+strconv.Itoa(i), 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
		last := g.prefix + strconv.Itoa(n-1)
		redistest.Eventually(t, 10*time.Second, func() bool {
			return g.rep.replicas[0].Client(t).Get(ctx, last).Val() == g.prefix+"v"+strconv.Itoa(n-1)
		}, "replica of %s never caught up", g.prefix)
	}
}

// TestRouteReplicaReadsGoToOwnReplicas (issue 14): with routes, each
// upstream's reads go to its own replica: neither primary runs a GET,
// each replica runs some, and a pipeline mixing both routes' reads (and an
// MGET split over both) gets the right values.
func TestRouteReplicaReadsGoToOwnReplicas(t *testing.T) {
	r := startRoutedReplicas(t, 5*time.Second)
	r.seed(t, 20)
	resetStats(t, r.def.primary, r.b.primary, r.def.replicas[0], r.b.replicas[0])
	ctx := context.Background()
	c := r.p.Client(t, func(o *redis.Options) { o.PoolSize = 1 })
	for i := range 20 {
		for _, prefix := range []string{"a:", "b:"} {
			k := prefix + strconv.Itoa(i)
			if v, err := c.Get(ctx, k).Result(); err != nil || v != prefix+"v"+strconv.Itoa(i) {
				t.Fatalf("GET %s = %q, %v", k, v, err)
			}
		}
	}
	pipe := c.Pipeline()
	gets := make([]*redis.StringCmd, 0, 20)
	for i := range 10 {
		gets = append(gets, pipe.Get(ctx, "a:"+strconv.Itoa(i)), pipe.Get(ctx, "b:"+strconv.Itoa(i)))
	}
	mget := pipe.MGet(ctx, "a:1", "b:2")
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	for i, g := range gets {
		want := []string{"a:", "b:"}[i%2] + "v" + strconv.Itoa(i/2)
		if g.Val() != want {
			t.Errorf("pipelined %v = %q, want %q", g.Args(), g.Val(), want)
		}
	}
	if got := fmt.Sprint(mget.Val()); got != "[a:v1 b:v2]" {
		t.Errorf("MGET a:1 b:2 = %s", got)
	}
	for name, s := range map[string]*redistest.Server{"[upstream]'s primary": r.def.primary, "b's primary": r.b.primary} {
		if n := calls(t, s, "get") + calls(t, s, "mget"); n != 0 {
			t.Errorf("%s ran %d reads, want 0", name, n)
		}
	}
	if n := calls(t, r.def.replicas[0], "get"); n < 30 {
		t.Errorf("[upstream]'s replica ran %d GETs, want 30", n)
	}
	if n := calls(t, r.b.replicas[0], "get"); n < 30 {
		t.Errorf("b's replica ran %d GETs, want 30", n)
	}
}

// ownWritesLoop runs clients through p that each write a key of their own
// on both routes, then read it back a few times, while both replicas'
// replication is held in bursts; it counts the reads that did not return
// the client's last write, and the GETs the replicas served.
func (r *routedReplicas) ownWritesLoop(t *testing.T) (stale int64, onReplicas int) {
	t.Helper()
	resetStats(t, r.def.replicas[0], r.b.replicas[0])
	stop := make(chan struct{})
	pausedA := pauseReplication(t, r.def.replicas[0], stop)
	pausedB := pauseReplication(t, r.b.replicas[0], stop)
	// A replica paused while its primary's stream arrives applies what it
	// buffered only when more arrives after the pause (seen with Redis
	// 7.0): with the clients' writes all landing inside pauses, the
	// replicas stayed a write behind every client's floor for whole runs
	// and served no read. A write straight to each primary every 20 ms
	// keeps the stream moving; it raises no client's floor.
	nudged := nudgeReplication(t, stop, r.def.primary, r.b.primary)
	var bad atomic.Int64
	var firstBad atomic.Pointer[string]
	var wg sync.WaitGroup
	ctx := context.Background()
	deadline := time.Now().Add(2500 * time.Millisecond)
	for w := range 4 {
		c := r.p.Client(t, func(o *redis.Options) { o.PoolSize = 1 })
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; time.Now().Before(deadline); n++ {
				prefix := []string{"a:", "b:"}[n%2]
				key := fmt.Sprintf("%sown%d", prefix, w)
				val := strconv.Itoa(n)
				if err := c.Set(ctx, key, val, 0).Err(); err != nil {
					t.Error(err)
					return
				}
				// Read for longer than two replica polls (20 ms apart): the
				// first after the write gives the proxy the primary's
				// offset, a later one the replica's. A fixed five reads
				// (10 ms) ended before that on a fast machine, and the
				// replicas served no read. The replica applies the write
				// only in the 50 ms between its pauses (pauseReplication),
				// so the window covers one of those too: 60 ms did not,
				// under a full CI run's load, in any of three set-ups.
				for until := time.Now().Add(250 * time.Millisecond); time.Now().Before(until); {
					v, err := c.Get(ctx, key).Result()
					if err != nil {
						t.Error(err)
						return
					}
					if v != val {
						if bad.Add(1) == 1 {
							s := fmt.Sprintf("GET %s = %q after SET %s", key, v, val)
							firstBad.Store(&s)
						}
					}
					time.Sleep(2 * time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	pausedA.Wait()
	pausedB.Wait()
	nudged.Wait()
	if p := firstBad.Load(); p != nil {
		t.Logf("first stale read: %s", *p)
	}
	return bad.Load(), calls(t, r.def.replicas[0], "get") + calls(t, r.b.replicas[0], "get")
}

// TestRouteReplicaReadYourWrites (issue 14): with routes, each client
// reads its own writes on every route while both replicas lag behind by
// up to a few hundred milliseconds; the replicas still serve reads. With
// the read-your-writes floor off the same loop reads stale values, so the
// check can fail.
func TestRouteReplicaReadYourWrites(t *testing.T) {
	// On a loaded machine a round can pass with no replica caught up
	// enough to serve a read; run up to three, every read of each checked.
	// Some set-ups (seen on a fast machine, with the same build that
	// passed on a slower one) keep the proxy's view of the paused replicas
	// behind every client's floor for all three rounds; a fresh set-up, up
	// to three, is tried then. Stale reads fail the test in every one.
	var stale int64
	onReplicas := 0
	var r *routedReplicas
	for setup := 0; setup < 3 && onReplicas == 0; setup++ {
		r = startRoutedReplicas(t, 10*time.Second)
		for round := 0; round < 3 && onReplicas == 0; round++ {
			s, o := r.ownWritesLoop(t)
			stale, onReplicas = stale+s, onReplicas+o
		}
		t.Logf("set-up %d: replicas served %d GETs", setup, onReplicas)
	}
	if stale != 0 {
		t.Fatalf("%d reads did not return the client's own last write", stale)
	}
	if onReplicas == 0 {
		t.Fatal("the replicas served no read; the test checked nothing about them")
	}
	restore := proxy.SetTestNoReadYourWrites(true)
	defer restore()
	if stale, _ := r.ownWritesLoop(t); stale == 0 {
		t.Fatal("without the read-your-writes floor no read was stale: the replicas never lagged enough for the check to mean anything")
	}
}

// nudgeReplication writes a key of its own on each primary every 20 ms
// until stop is closed.
func nudgeReplication(t *testing.T, stop <-chan struct{}, primaries ...*redistest.Server) *sync.WaitGroup {
	var wg sync.WaitGroup
	for _, p := range primaries {
		c := p.Client(t)
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
				c.Set(context.Background(), "nudge", n, 0)
			}
		})
	}
	return &wg
}

// TestRouteReplicaKilledFallsBack (issue 14): one upstream's replica
// killed under read load sends that upstream's reads to its primary with
// no client error, and the other route's reads stay on their replica.
func TestRouteReplicaKilledFallsBack(t *testing.T) {
	r := startRoutedReplicas(t, 5*time.Second)
	r.seed(t, 1)
	resetStats(t, r.def.primary, r.b.primary)
	la := startReads(t, r.p, 4, "a:0", "a:v0")
	lb := startReads(t, r.p, 4, "b:0", "b:v0")
	r.b.replicas[0].Kill(t)
	before := lb.ok.Load()
	redistest.Eventually(t, 10*time.Second, func() bool { return calls(t, r.b.primary, "get") > 100 && lb.ok.Load() > before+100 },
		"b's reads never moved to its primary")
	beforeA := la.ok.Load()
	redistest.Eventually(t, 10*time.Second, func() bool { return la.ok.Load() > beforeA+100 }, "[upstream]'s reads stalled")
	la.end()
	lb.end()
	for name, l := range map[string]*readLoop{"a:0": la, "b:0": lb} {
		if n := l.failed.Load(); n != 0 {
			t.Errorf("%d reads of %s failed (first: %s); want none", n, name, *l.firstErr.Load())
		}
		if n := l.wrong.Load(); n != 0 {
			t.Errorf("%d reads of %s returned a wrong value", n, name)
		}
	}
	if n := calls(t, r.def.primary, "get"); n != 0 {
		t.Errorf("[upstream]'s primary ran %d GETs, want 0: the other route was affected", n)
	}
	if r.p.UsableReplicasOf("b") != 0 || r.p.UsableReplicasOf(config.DefaultUpstream) != 1 {
		t.Errorf("usable replicas: b %d (want 0), default %d (want 1)", r.p.UsableReplicasOf("b"), r.p.UsableReplicasOf(config.DefaultUpstream))
	}
}

// TestRouteReplicaReadsSentinelUpstream (issue 14): a named Sentinel
// upstream reads from the replicas its own Sentinels list; its primary
// runs none of the reads of a client that has not written, and a client's
// own write is read back at once.
func TestRouteReplicaReadsSentinelUpstream(t *testing.T) {
	g := redistest.StartSentinelGroup(t, redistest.SentinelOptions{Replicas: 1, Sentinels: 1})
	def := redistest.Start(t)
	ctx := context.Background()
	if err := g.Nodes[0].Client(t).Set(ctx, "s:k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	p := proxytest.Start(t, def, func(c *config.Config) {
		u := namedUpstream("")
		u.Mode, u.Address = config.ModeSentinel, ""
		u.Sentinels, u.MasterName = g.SentinelAddrs(), g.Name
		u.ReadFrom = config.ReadReplicaPreferred
		u.ReplicaPollInterval = units.Duration{Duration: 20 * time.Millisecond}
		c.Upstreams = map[string]config.Upstream{"s": u}
		c.Routes = []config.Route{{Pattern: "s:*", Upstream: "s"}}
	})
	redistest.Eventually(t, 10*time.Second, func() bool { return p.UsableReplicasOf("s") == 1 }, "the proxy never found the Sentinels' replica")
	redistest.Eventually(t, 5*time.Second, func() bool { return g.Nodes[1].Client(t).Get(ctx, "s:k").Val() == "v" }, "replica never synced")
	resetStats(t, g.Nodes...)
	c := p.Client(t, func(o *redis.Options) { o.PoolSize = 1 })
	for range 20 {
		if v, err := c.Get(ctx, "s:k").Result(); err != nil || v != "v" {
			t.Fatalf("GET s:k = %q, %v", v, err)
		}
	}
	if n := calls(t, g.Nodes[0], "get"); n != 0 {
		t.Errorf("the Sentinel upstream's primary ran %d GETs, want 0", n)
	}
	if n := calls(t, g.Nodes[1], "get"); n != 20 {
		t.Errorf("its replica ran %d GETs, want 20", n)
	}
	if p.UsableReplicasOf(config.DefaultUpstream) != 0 {
		t.Errorf("[upstream] (read_from primary) counts usable replicas")
	}
	if err := c.Set(ctx, "s:k", "w", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if v, err := c.Get(ctx, "s:k").Result(); err != nil || v != "w" {
		t.Fatalf("GET s:k right after SET s:k w = %q, %v", v, err)
	}
}

// TestRoutesBatchStateFollowsItsServer: the routed path's batch scratch
// is pooled for the whole process, so one that served a server with three
// upstreams may next serve one with two. It used to keep its three
// upstream slots, and the replica bookkeeping after a write then indexed
// the two-upstream server's tables out of range: the session panicked
// and the client lost its connection with no reply.
func TestRoutesBatchStateFollowsItsServer(t *testing.T) {
	three := startRouted(t, nil)
	two := startRoutedReplicas(t, 10*time.Second)
	wide := dialAddr(t, three.p.Addr)
	narrow := dialAddr(t, two.p.Addr)
	for n := range 200 {
		// A batch with a part on each of the three upstreams.
		if got := rawDo(t, wide, "MGET", "k", "queue:k", "cache:k"); got != "*3\r\n$-1\r\n$-1\r\n$-1\r\n" {
			t.Fatalf("MGET over three upstreams = %q", got)
		}
		val := strconv.Itoa(n)
		if got := rawDo(t, narrow, "SET", "b:k", val); got != "+OK\r\n" {
			t.Fatalf("round %d: SET through the two-upstream proxy = %q", n, got)
		}
	}
}
