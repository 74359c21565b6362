package proxy_test

import (
	"context"
	"fmt"
	"strconv"
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

// holdReplication stops replica r applying its primary's stream (CLIENT
// PAUSE WRITE holds a replica's replication while it still serves reads)
// until the returned release is called; release lifts the pause and
// writes to primary once, because a paused replica applies what it
// buffered only when more of the stream arrives after the pause (seen
// with Redis 7.0).
func holdReplication(t *testing.T, r, primary *redistest.Server) (release func()) {
	t.Helper()
	ctx := context.Background()
	rc := r.Client(t)
	if err := rc.Do(ctx, "CLIENT", "PAUSE", "30000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	released := false
	release = func() {
		if released {
			return
		}
		released = true
		if err := rc.ClientUnpause(ctx).Err(); err != nil {
			t.Error(err)
		}
		if err := primary.Client(t).Incr(ctx, "nudge").Err(); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(release)
	return release
}

// ownRoute is a key of one route and that route's primary and replica.
type ownRoute struct {
	key              string
	primary, replica *redistest.Server
}

// ownRoutes is one key per route of r, named prefix + name.
func (r *routedReplicas) ownRoutes(name string) []ownRoute {
	return []ownRoute{{"a:" + name, r.def.primary, r.def.replicas[0]}, {"b:" + name, r.b.primary, r.b.replicas[0]}}
}

// heldSteps runs steps rounds, each: hold every route's replica, write
// each route's key (write, with the round's value) and read it back (get)
// while the replicas lack the writes, release the replicas, then read
// each key until its replica has served one of the reads. It counts the
// reads that did not return the last write (every read is checked).
//
// With floorOff (the read-your-writes floor off) the held phase reads
// until each held replica has served a read, which then is stale: the
// proxy still sends a writer's reads to the primary until its next poll
// of the offsets, so a fixed number of reads right after the write could
// all land there.
func heldSteps(t *testing.T, routes []ownRoute, steps int, floorOff bool, write func(key, val string), get func(key string) string) (stale int, firstStale string) {
	t.Helper()
	check := func(key, val string) {
		t.Helper()
		if v := get(key); v != val {
			if stale++; stale == 1 {
				firstStale = fmt.Sprintf("GET %s = %q after writing %q", key, v, val)
			}
		}
	}
	// readUntilReplica reads key until replica has served a read.
	readUntilReplica := func(step int, key, val string, replica *redistest.Server) {
		t.Helper()
		before := calls(t, replica, "get")
		redistest.Eventually(t, 20*time.Second, func() bool {
			check(key, val)
			return calls(t, replica, "get") > before
		}, "step %d: %s's replica never served a read", step, key)
	}
	for step := range steps {
		val := strconv.Itoa(step)
		var releases []func()
		for _, rt := range routes {
			releases = append(releases, holdReplication(t, rt.replica, rt.primary))
		}
		for _, rt := range routes {
			write(rt.key, val)
		}
		if floorOff {
			for _, rt := range routes {
				readUntilReplica(step, rt.key, val, rt.replica)
			}
		} else {
			// Several of the proxy's replica polls (20 ms apart) pass
			// while the replicas are held; how many does not matter to
			// the check, only to how much it sees.
			for until := time.Now().Add(100 * time.Millisecond); time.Now().Before(until); {
				for _, rt := range routes {
					check(rt.key, val)
				}
				time.Sleep(2 * time.Millisecond)
			}
		}
		for _, release := range releases {
			release()
		}
		if !floorOff {
			for _, rt := range routes {
				readUntilReplica(step, rt.key, val, rt.replica)
			}
		}
	}
	return stale, firstStale
}

// ownWriteSteps is heldSteps with one go-redis client through the proxy
// that SETs and GETs; it also returns the GETs the replicas served.
func (r *routedReplicas) ownWriteSteps(t *testing.T, steps int, floorOff bool) (stale int, firstStale string, onReplicas int) {
	t.Helper()
	resetStats(t, r.def.replicas[0], r.b.replicas[0])
	ctx := context.Background()
	c := r.p.Client(t, func(o *redis.Options) { o.PoolSize = 1 })
	stale, firstStale = heldSteps(t, r.ownRoutes("own"), steps, floorOff, func(key, val string) {
		if err := c.Set(ctx, key, val, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}, func(key string) string {
		v, err := c.Get(ctx, key).Result()
		if err != nil && err != redis.Nil {
			t.Fatalf("GET %s: %v", key, err)
		}
		return v
	})
	return stale, firstStale, calls(t, r.def.replicas[0], "get") + calls(t, r.b.replicas[0], "get")
}

// TestRouteReplicaReadYourWrites (issue 14): with routes, a client reads
// its own writes on every route while both upstreams' replicas are held
// behind them, and the replicas serve its reads again once they have the
// writes. The steps are driven by the test (replication held, then
// released), not by timers, so the replicas surely serve reads on any
// machine. With the read-your-writes floor off the same steps read stale
// values, so the check can fail.
func TestRouteReplicaReadYourWrites(t *testing.T) {
	r := startRoutedReplicas(t, 10*time.Second)
	stale, first, onReplicas := r.ownWriteSteps(t, 5, false)
	t.Logf("replicas served %d GETs", onReplicas)
	if stale != 0 {
		t.Fatalf("%d reads did not return the client's own last write; first: %s", stale, first)
	}
	if onReplicas < 10 {
		t.Fatalf("the replicas served %d reads, want at least one per route and step", onReplicas)
	}
	restore := proxy.SetTestNoReadYourWrites(true)
	defer restore()
	if stale, _, _ := r.ownWriteSteps(t, 2, true); stale == 0 {
		t.Fatal("without the read-your-writes floor no read was stale: the replicas were not read while held")
	}
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
