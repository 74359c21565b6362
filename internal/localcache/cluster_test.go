package localcache_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/cluster"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/lintest"
	"github.com/redproxy/redproxy/internal/localcache"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// The local tier in cluster mode (localcache/cluster.go): one tracking
// connection per node, entries served only through the connection of the
// slot's current owner.

// startClusterTier starts a cluster of 3 primaries with `replicas` replicas
// each and a proxy in cluster mode in front of it, with the tier on and
// admitting every key on its first read, and waits until the tier is live
// for every primary.
func startClusterTier(t *testing.T, replicas int, mutate ...func(*config.Config)) (*redistest.Cluster, *proxytest.Proxy) {
	t.Helper()
	c := redistest.StartCluster(t, 3, replicas)
	p := startTier(t, c.Nodes[0], append([]func(*config.Config){func(cfg *config.Config) {
		cfg.Upstream.Mode = config.ModeCluster
		cfg.Upstream.Seeds = c.Seeds()
	}}, mutate...)...)
	for _, n := range c.Primaries(t) {
		redistest.Eventually(t, 10*time.Second, func() bool { return p.LocalTier().LiveNode(n.Addr()) },
			"the tier never became live for node %s", n.Addr())
	}
	return c, p
}

// ownerOf is the node the proxy's map says serves key.
func ownerOf(p *proxytest.Proxy, key string) string {
	return p.Router().Map().Owner(cluster.Slot([]byte(key)))
}

// spreadKeys returns n keys per primary of the proxy's map, keyed by node.
func spreadKeys(t *testing.T, p *proxytest.Proxy, prefix string, n int) map[string][]string {
	t.Helper()
	byNode := map[string][]string{}
	want := len(p.Router().Map().Primaries())
	for i := 0; len(byNode) < want || !allHave(byNode, n); i++ {
		k := fmt.Sprintf("%s:%d", prefix, i)
		if a := ownerOf(p, k); len(byNode[a]) < n {
			byNode[a] = append(byNode[a], k)
		}
		if i > 100000 {
			t.Fatal("could not find keys on every primary")
		}
	}
	return byNode
}

func allHave(m map[string][]string, n int) bool {
	for _, ks := range m {
		if len(ks) < n {
			return false
		}
	}
	return true
}

// TestClusterTierCoherent: keys cached from every primary are never served
// stale after a write through the proxy by another client (C1, C3), nor
// later than S after a write straight to their node (C2); a node's lost
// tracking connection flushes the tier (C4).
func TestClusterTierCoherent(t *testing.T) {
	c, p := startClusterTier(t, 0)
	reader, writer := p.Client(t), p.Client(t)
	direct := c.ClusterClient(t)
	byNode := spreadKeys(t, p, "ct", 3)
	var keys []string
	for _, ks := range byNode {
		keys = append(keys, ks...)
	}
	for _, k := range keys {
		if err := direct.Set(ctx, k, "v1", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if v := cacheIt(t, p, reader, k); v != "v1" {
			t.Fatalf("GET %s = %q, want v1", k, v)
		}
	}

	t.Run("WriteThroughProxy", func(t *testing.T) {
		for _, k := range keys {
			if err := writer.Set(ctx, k, "v2", 0).Err(); err != nil {
				t.Fatal(err)
			}
			// No wait: the write's reply came back, so the old value is
			// gone from the tier before any read that starts now.
			if v := mustGet(t, reader, k); v != "v2" {
				t.Fatalf("GET %s right after a write through the proxy = %q, want v2", k, v)
			}
		}
	})

	t.Run("WriteToTheNode", func(t *testing.T) {
		for _, k := range keys {
			cacheIt(t, p, reader, k)
		}
		before := metric(t, p.Metrics.Registry, "redproxy_localcache_invalidations_total")
		for _, k := range keys {
			if err := direct.Set(ctx, k, "v3", 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
		acked := time.Now()
		time.Sleep(time.Until(acked.Add(testS))) // C2 allows S
		for _, k := range keys {
			if v := mustGet(t, reader, k); v != "v3" {
				t.Fatalf("GET %s more than S after a write on its node = %q, want v3", k, v)
			}
		}
		// The reads above may have stepped aside to Redis; the count
		// catches up with the invalidations within a moment.
		redistest.Eventually(t, 5*time.Second, func() bool {
			return metric(t, p.Metrics.Registry, "redproxy_localcache_invalidations_total")-before >= float64(len(keys))
		}, "fewer invalidations than the %d keys written on their nodes", len(keys))
	})

	t.Run("NodeConnectionLost", func(t *testing.T) {
		for _, k := range keys {
			cacheIt(t, p, reader, k)
		}
		// Only one node's tracking connection is killed.
		var victim string
		for a := range byNode {
			victim = a
			break
		}
		vc := redis.NewClient(&redis.Options{Addr: victim, MaxRetries: -1})
		defer vc.Close()
		if n := killTierConns(t, vc); n == 0 {
			t.Fatal("no tracking connection on the node")
		}
		k := byNode[victim][0]
		if err := vc.Set(ctx, k, "v4", 0).Err(); err != nil {
			t.Fatal(err)
		}
		acked := time.Now()
		redistest.Eventually(t, 5*time.Second, func() bool {
			return metric(t, p.Metrics.Registry, "redproxy_localcache_flushes_total", "reason="+localcache.FlushDisconnect) > 0
		}, "the lost connection was never noticed")
		if v := mustGet(t, reader, k); v != "v4" {
			t.Fatalf("after the loss was noticed, GET %s = %q", k, v)
		}
		readsAfter(t, reader, k, "v4", acked.Add(testS), acked.Add(2*testS))
		redistest.Eventually(t, 10*time.Second, func() bool { return p.LocalTier().LiveNode(victim) }, "never live again")
		if v := cacheIt(t, p, reader, k); v != "v4" {
			t.Fatalf("after reconnecting, GET %s = %q", k, v)
		}
	})
}

// TestClusterTierReshardLinearizable: clients read, write, delete and
// increment keys through the proxy, with the tier on, while redis-cli
// moves 1000 slots between primaries; the history must be linearizable
// (C1 across slot moves), and the tier must have served hits meanwhile.
func TestClusterTierReshardLinearizable(t *testing.T) {
	c, p := startClusterTier(t, 0)
	prims := c.Primaries(t)
	from, to := redistest.NodeID(t, prims[0]), redistest.NodeID(t, prims[1])
	var workers []lintest.Worker
	for range 8 {
		workers = append(workers, lintest.Worker{C: p.Client(t, func(o *redis.Options) { o.PoolSize = 1 }), Every: 2 * time.Millisecond, WritePct: 20})
	}
	reshardErr := make(chan error, 1)
	go func() {
		time.Sleep(300 * time.Millisecond) // let the history start first
		reshardErr <- redistest.Reshard(prims[0].Addr(), from, to, 1000)
	}()
	hitsBefore := hits(t, p)
	// 256 keys: about 16 of them live in the slots that move.
	hist := lintest.RecordFor(t, workers, 256, 0, 6*time.Second)
	if err := <-reshardErr; err != nil {
		t.Fatalf("reshard: %v", err)
	}
	moved, asked, _ := p.Router().Stats()
	h := hits(t, p) - hitsBefore
	t.Logf("router followed %d MOVED, %d ASK; the tier served %v hits, %v invalidations",
		moved, asked, h, metric(t, p.Metrics.Registry, "redproxy_localcache_invalidations_total"))
	if moved+asked == 0 {
		t.Fatalf("no command met a moving slot; the check proves nothing")
	}
	if h < 100 {
		t.Fatalf("only %v hits: the history did not exercise the tier", h)
	}
	if res := lintest.Check(t, hist); res != porcupine.Ok {
		t.Fatalf("history through the proxy with the local tier during resharding is %v", res)
	}
}

// TestClusterTierFailover: CLUSTER FAILOVER on replicas with the tier on.
//
// First with no traffic: keys cached from a primary are written straight
// to its replica once that is promoted. The new primary never saw the
// tier's reads, so it sends no invalidation, and no read through the proxy
// makes the router meet a MOVED; only the demoted primary's heartbeat
// (ROLE) tells the tier, which must not serve the old values later than S
// after the writes (C2).
//
// Then under load through the proxy, on another shard: the history stays
// linearizable (C1 across a failover).
func TestClusterTierFailover(t *testing.T) {
	c, p := startClusterTier(t, 1)
	reader := p.Client(t)
	replicas := c.Replicas(t)

	t.Run("DirectWriteOnNewPrimary", func(t *testing.T) {
		replica := replicas[0]
		keys := spreadKeys(t, p, "fo", 4)[primaryOf(t, replica)]
		if len(keys) == 0 {
			t.Fatalf("no keys on the replica's primary")
		}
		for _, k := range keys {
			if err := reader.Set(ctx, k, "before", 0).Err(); err != nil {
				t.Fatal(err)
			}
			cacheIt(t, p, reader, k)
		}
		if err := failover(t, replica); err != nil {
			t.Fatal(err)
		}
		newPrimary := replica.Client(t)
		for _, k := range keys {
			if err := newPrimary.Set(ctx, k, "after", 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
		acked := time.Now()
		time.Sleep(time.Until(acked.Add(testS)))
		for _, k := range keys {
			if v := mustGet(t, reader, k); v != "after" {
				t.Fatalf("GET %s more than S after a write on the new primary = %q, want after", k, v)
			}
		}
		redistest.Eventually(t, 5*time.Second, func() bool {
			return metric(t, p.Metrics.Registry, "redproxy_localcache_flushes_total", "reason="+localcache.FlushDemoted) > 0
		}, "the demoted primary was never noticed by the tier")
	})

	t.Run("UnderLoad", func(t *testing.T) {
		c.WaitHealthy(t)
		replica := replicas[1]
		var workers []lintest.Worker
		for range 6 {
			workers = append(workers, lintest.Worker{C: p.Client(t, func(o *redis.Options) { o.PoolSize = 1 }), Every: 2 * time.Millisecond, WritePct: 20})
		}
		failedOver := make(chan error, 1)
		go func() {
			time.Sleep(300 * time.Millisecond)
			failedOver <- failover(t, replica)
		}()
		hitsBefore := hits(t, p)
		hist := lintest.RecordFor(t, workers, 64, 0, 5*time.Second)
		if err := <-failedOver; err != nil {
			t.Fatal(err)
		}
		if h := hits(t, p) - hitsBefore; h < 100 {
			t.Fatalf("only %v hits: the history did not exercise the tier", h)
		}
		if res := lintest.Check(t, hist); res != porcupine.Ok {
			t.Fatalf("history through the proxy with the local tier across a failover is %v", res)
		}
	})
}

// primaryOf is the address of replica's primary.
func primaryOf(t *testing.T, replica *redistest.Server) string {
	t.Helper()
	info, err := replica.Client(t).Info(ctx, "replication").Result()
	if err != nil {
		t.Fatal(err)
	}
	var host, port string
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "master_host:"); ok {
			host = v
		}
		if v, ok := strings.CutPrefix(line, "master_port:"); ok {
			port = v
		}
	}
	return host + ":" + port
}

// failover promotes replica with CLUSTER FAILOVER, asking again when Redis
// gave up on an attempt (a manual failover that does not finish within
// 5 s is aborted, which happens under -race on a loaded machine).
func failover(t *testing.T, replica *redistest.Server) error {
	return redistest.PromoteReplica(t, replica)
}

// TestClusterTierNeedsROLE: a node's heartbeat is ROLE, so an upstream user
// that may not run it leaves the tier unable to serve (never stale): reads
// go to Redis and return what was written.
func TestClusterTierNeedsROLE(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	for _, n := range c.Nodes {
		if err := n.Client(t).Do(ctx, "ACL", "SETUSER", "default", "-role").Err(); err != nil {
			t.Fatal(err)
		}
	}
	p := proxytest.Start(t, c.Nodes[0], func(cfg *config.Config) {
		cfg.LocalCache.Enabled = true
		cfg.LocalCache.AdmitMinReads = 0
		cfg.LocalCache.Staleness.Duration = testS
		cfg.Upstream.Mode = config.ModeCluster
		cfg.Upstream.Seeds = c.Seeds()
	})
	rc := p.Client(t)
	if err := rc.Set(ctx, "role:k", "v1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// Long enough for several heartbeats to have been refused.
	deadline := time.Now().Add(3 * testS)
	for time.Now().Before(deadline) {
		if v := mustGet(t, rc, "role:k"); v != "v1" {
			t.Fatalf("GET = %q", v)
		}
	}
	if err := c.ClusterClient(t).Set(ctx, "role:k", "v2", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if v := mustGet(t, rc, "role:k"); v != "v2" {
		t.Fatalf("GET after a write on the node = %q", v)
	}
	if h := hits(t, p); h != 0 {
		t.Fatalf("%v hits although no heartbeat could be answered", h)
	}
	if p.LocalTier().Live(0) {
		t.Fatal("the tier says it is live")
	}
}

// TestClusterTierDropsANodeThatLeft: a primary emptied of its slots and
// forgotten by the cluster (redis-cli --cluster del-node) loses the tier's
// tracking connection too, and its shutdown then flushes nothing nor makes
// the tier less than live. Before, the connection stayed: once the node
// was shut down the tier redialled it for as long as the proxy ran (a
// warning every few seconds), its loss flushed the whole tier, and Live
// stayed false (found by a cluster probe).
func TestClusterTierDropsANodeThatLeft(t *testing.T) {
	c, p := startClusterTier(t, 0)
	m := p.Router().Map()
	ps := m.Primaries()
	var victim, dst *redistest.Server
	for _, n := range c.Nodes {
		switch n.Addr() {
		case ps[2]:
			victim = n
		case ps[1]:
			dst = n
		}
	}
	reader := p.Client(t)
	byNode := spreadKeys(t, p, "left", 1)
	for _, ks := range byNode {
		if err := reader.Set(ctx, ks[0], "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
		cacheIt(t, p, reader, ks[0])
	}
	tierConns := func(s *redistest.Server) int {
		list, err := s.Client(t).ClientList(ctx).Result()
		if err != nil {
			return -1
		}
		return strings.Count(list, " name="+localcache.ConnName+" ")
	}
	if tierConns(victim) == 0 {
		t.Fatal("no tracking connection on the node before it leaves")
	}

	// Its slots go to dst (with the keys: none of the test's is left
	// there but the one cached), then every node forgets it.
	vc := victim.Client(t)
	for _, k := range byNode[victim.Addr()] {
		if err := vc.Del(ctx, k).Err(); err != nil {
			t.Fatal(err)
		}
	}
	var slots []int
	for s := range cluster.Slots {
		if m.Owner(s) == victim.Addr() {
			slots = append(slots, s)
		}
	}
	c.RemovePrimary(t, victim, dst, slots)
	redistest.Eventually(t, 15*time.Second, func() bool {
		p.Router().Refresh()
		return !slices.Contains(p.Router().Nodes(), victim.Addr()) && tierConns(victim) == 0
	}, "the tier keeps its tracking connection to a node that left the cluster (%d on it)", tierConns(victim))

	before := metric(t, p.Metrics.Registry, "redproxy_localcache_flushes_total", "reason="+localcache.FlushDisconnect)
	victim.Kill(t)
	redistest.Eventually(t, 10*time.Second, func() bool { return p.LocalTier().Live(0) },
		"the tier is not live after a node that had left the cluster was shut down")
	if n := metric(t, p.Metrics.Registry, "redproxy_localcache_flushes_total", "reason="+localcache.FlushDisconnect); n != before {
		t.Errorf("the departed node's shutdown flushed the tier: %v disconnect flushes, %v before", n, before)
	}
	// The keys of the remaining nodes are still served from the tier.
	for a, ks := range byNode {
		if a != victim.Addr() {
			if v := cacheIt(t, p, reader, ks[0]); v != "v" {
				t.Fatalf("GET %s = %q", ks[0], v)
			}
		}
	}
}
