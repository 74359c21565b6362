package proxy_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// Right after a failover the proxy is on the promoted replica, while the
// other replica still follows the demoted primary until the Sentinels move
// it. Its offset counts the old primary's writes (other clients' still
// landing there), passed the new primary's read-your-writes floor, and a
// client's GET after its own acknowledged SET was answered there: nil
// (found by review, 4 of 4 runs). A replica now counts only while it
// follows the primary's replication history (master_replid).
func TestSentinelReplicaReadAfterFailoverSeesOwnWrite(t *testing.T) {
	g := redistest.StartSentinelGroup(t, redistest.SentinelOptions{Replicas: 2})
	old := g.Nodes[0]
	p := proxytest.Start(t, old, func(c *config.Config) {
		sentinelConfig(g, g.SentinelAddrs())(c)
		c.Upstream.ReadFrom = config.ReadReplicaPreferred
		c.Upstream.ReplicaPollInterval = units.Duration{Duration: 20 * time.Millisecond}
	})
	redistest.Eventually(t, 10*time.Second, func() bool { return p.UsableReplicas() == 2 }, "replicas never usable")
	failoverOwnWrites(t, g, p, "", p.SentinelPrimary)
}

// TestRouteSentinelReplicaReadAfterFailoverSeesOwnWrite: the same with
// the Sentinel group as a named upstream behind a route: each upstream's
// replica set follows its own failover.
func TestRouteSentinelReplicaReadAfterFailoverSeesOwnWrite(t *testing.T) {
	g := redistest.StartSentinelGroup(t, redistest.SentinelOptions{Replicas: 2})
	def := redistest.Start(t)
	p := proxytest.Start(t, def, func(c *config.Config) {
		u := namedUpstream("")
		u.Mode, u.Address = config.ModeSentinel, ""
		u.Sentinels, u.MasterName = g.SentinelAddrs(), g.Name
		u.DialTimeout = units.Duration{Duration: 500 * time.Millisecond}
		u.ReadFrom = config.ReadReplicaPreferred
		u.ReplicaPollInterval = units.Duration{Duration: 20 * time.Millisecond}
		c.Upstreams = map[string]config.Upstream{"s": u}
		c.Routes = []config.Route{{Pattern: "s:*", Upstream: "s"}}
	})
	redistest.Eventually(t, 10*time.Second, func() bool { return p.UsableReplicasOf("s") == 2 }, "the named upstream's replicas never usable")
	failoverOwnWrites(t, g, p, "s:", func() string { return "(named upstream)" })
}

// failoverOwnWrites runs clients through p that each SET a key of their
// own (prefix first) and GET it right back, while other clients write to
// g's primary directly, across a Sentinel failover; it fails the test if
// a GET missed its client's own SET and the new primary has that write.
func failoverOwnWrites(t *testing.T, g *redistest.SentinelGroup, p *proxytest.Proxy, prefix string, proxyPrimary func() string) {
	t.Helper()
	old := g.Nodes[0]
	stop := make(chan struct{})
	var wg sync.WaitGroup
	// Other clients of the old primary (another application instance,
	// another proxy that has not switched yet) keep writing to it
	// directly until it is demoted: its replication stream, which the
	// replicas not yet moved by the Sentinels still follow, runs ahead of
	// the new primary's.
	// untilStop runs body(0), body(1), ... on a goroutine until stop.
	untilStop := func(body func(i int)) {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				body(i)
			}
		})
	}
	blob := strings.Repeat("x", 64<<10)
	for w := range 2 {
		c := old.Client(t)
		untilStop(func(i int) {
			if c.Set(ctx, fmt.Sprintf("%sblob:%d:%d", prefix, w, i%50), blob, 0).Err() != nil {
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	type miss struct{ key, got, state string }
	direct := make([]*redis.Client, len(g.Nodes))
	for i, n := range g.Nodes {
		direct[i] = n.Client(t)
	}
	stateOf := func(key string) string {
		var b strings.Builder
		fmt.Fprintf(&b, "proxy primary=%s;", proxyPrimary())
		for i, n := range g.Nodes {
			role, _ := direct[i].Do(ctx, "ROLE").Slice()
			v, err := direct[i].Get(ctx, key).Result()
			desc := ""
			if len(role) > 2 && role[0] == "slave" {
				desc = fmt.Sprintf("replica of :%v", role[2])
			} else if len(role) > 0 {
				desc = fmt.Sprint(role[0])
			}
			fmt.Fprintf(&b, " %s(%s) has %s=%q %v;", n.Addr(), desc, key, v, err)
		}
		return b.String()
	}
	var mu sync.Mutex
	var misses []miss
	for r := range 4 {
		c := p.Client(t)
		untilStop(func(i int) {
			key := fmt.Sprintf("%sryw:%d:%d", prefix, r, i)
			if err := c.Set(ctx, key, "v", 0).Err(); err != nil {
				time.Sleep(5 * time.Millisecond)
				return
			}
			v, err := c.Get(ctx, key).Result()
			if err == redis.Nil || (err == nil && v != "v") {
				mu.Lock()
				misses = append(misses, miss{key, v, stateOf(key)})
				mu.Unlock()
			}
		})
	}
	time.Sleep(500 * time.Millisecond)
	g.Failover(t)
	next := g.WaitNewPrimary(t, old, 30*time.Second)
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()
	nc := next.Client(t)
	// The checks below mean something only if the proxy wrote to the new
	// primary after the failover and read from replicas at all.
	after := p.Client(t)
	redistest.Eventually(t, 10*time.Second, func() bool {
		return after.Set(ctx, prefix+"after", "v", 0).Err() == nil && nc.Get(ctx, prefix+"after").Val() == "v"
	}, "writes through the proxy never reached the new primary %s", next.Addr())
	onReplicas := 0
	for _, n := range g.Nodes[1:] {
		onReplicas += calls(t, n, "get")
	}
	if onReplicas == 0 {
		t.Fatal("the replicas served no GET: the test checked nothing about replica reads")
	}
	bad := 0
	var ex []string
	for _, m := range misses {
		// Only writes Redis kept count: one the old primary took and lost
		// is Redis's asynchronous replication, not the proxy.
		if v, err := nc.Get(ctx, m.key).Result(); err == nil && v == "v" {
			bad++
			if len(ex) < 5 {
				ex = append(ex, m.key+" at the miss: "+m.state)
			}
		}
	}
	t.Logf("%d GETs missed the client's own SET; %d of those writes are on the new primary %s; the first replicas served %d GETs", len(misses), bad, next.Addr(), onReplicas)
	if bad > 0 {
		t.Fatalf("%d acknowledged writes, kept by the new primary, were not seen by the same client's next GET (stale replica read), e.g. %v", bad, ex)
	}
}
