package localcache_test

import (
	"fmt"
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

// The local tier with routes to a named upstream that is a cluster: keys
// c:* route to [upstreams.cq], a cluster of 3 primaries, every other key
// to [upstream], a standalone server. The cluster's keys must keep the
// guarantees of cluster mode (localcache/cluster.go).

const clusterUpstream = "cq"

// startRoutedClusterTier starts def, the cluster and a proxy with the tier
// on, and waits until the tier is live for [upstream] and for every
// primary of the cluster.
func startRoutedClusterTier(t *testing.T, replicas int, staleness time.Duration, mutate ...func(*config.Config)) (*proxytest.Proxy, *redistest.Server, *redistest.Cluster) {
	t.Helper()
	def := redistest.Start(t)
	cl := redistest.StartCluster(t, 3, replicas)
	p := startTier(t, def, func(c *config.Config) {
		c.LocalCache.Staleness = units.Duration{Duration: staleness}
		u := routedUpstream("")
		u.Mode, u.Seeds = config.ModeCluster, cl.Seeds()
		c.Upstreams = map[string]config.Upstream{clusterUpstream: u}
		c.Routes = []config.Route{{Pattern: "c:*", Upstream: clusterUpstream}}
		for _, m := range mutate {
			m(c)
		}
	})
	r := p.UpstreamRouter(clusterUpstream)
	if r == nil {
		t.Fatal("no router for the cluster upstream")
	}
	redistest.Eventually(t, 10*time.Second, func() bool { return r.Map() != nil && len(r.Map().Primaries()) == 3 },
		"the cluster upstream's map never named 3 primaries")
	for _, n := range cl.Primaries(t) {
		p.LocalTier().ConnectUpstreamNode(clusterUpstream, n.Addr())
		redistest.Eventually(t, 10*time.Second, func() bool { return p.LocalTier().LiveUpstreamNode(clusterUpstream, n.Addr()) },
			"the tier never became live for node %s of the cluster upstream", n.Addr())
	}
	redistest.Eventually(t, 10*time.Second, func() bool {
		return p.LocalTier().LiveOwner(config.DefaultUpstream, 0) && p.LocalTier().LiveOwner(clusterUpstream, 0)
	}, "the tier never became live for both upstreams")
	return p, def, cl
}

// routedClusterKeys returns n c:* keys per primary of the cluster, by the
// address of the node that owns them now.
func routedClusterKeys(t *testing.T, cl *redistest.Cluster, prefix string, n int) map[string][]string {
	t.Helper()
	cc := cl.ClusterClient(t)
	byNode := map[string][]string{}
	for i := 0; len(byNode) < 3 || !allHave(byNode, n); i++ {
		k := fmt.Sprintf("c:%s:%d", prefix, i)
		node, err := cc.MasterForKey(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if a := node.Options().Addr; len(byNode[a]) < n {
			byNode[a] = append(byNode[a], k)
		}
		if i > 100000 {
			t.Fatal("could not find keys on every primary")
		}
	}
	return byNode
}

// TestRoutesClusterTierCoherent: keys of a cluster upstream and of the
// standalone default are served from the tier (hits, counted under their
// own upstream), each filled from its own upstream (the other holds
// another value for the same key); a write through the proxy is seen at
// once; a write straight to a key's owning node within S; and a lost
// tracking connection to one node is never served stale.
func TestRoutesClusterTierCoherent(t *testing.T) {
	p, def, cl := startRoutedClusterTier(t, 0, testS)
	reader, writer := p.Client(t), p.Client(t)
	defDirect := def.Client(t)
	byNode := routedClusterKeys(t, cl, "coh", 2)
	nodeClient := map[string]*redis.Client{}
	var keys []string
	for a, ks := range byNode {
		c := redis.NewClient(&redis.Options{Addr: a, MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		for _, k := range ks {
			nodeClient[k] = c
			keys = append(keys, k)
		}
	}
	nodeClient["d:1"] = defDirect
	keys = append(keys, "d:1")
	for _, k := range keys {
		if err := nodeClient[k].Set(ctx, k, "v1", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if k != "d:1" {
			// The same key on the default upstream: a fill from there
			// would show it.
			if err := defDirect.Set(ctx, k, "not-its-upstream", 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
		if v := cacheIt(t, p, reader, k); v != "v1" {
			t.Fatalf("GET %s = %q, want v1 from its route's upstream", k, v)
		}
	}
	reg := p.Metrics.Registry
	if h := metric(t, reg, "redproxy_localcache_hits_total", "upstream="+clusterUpstream); h < float64(len(keys)-1) {
		t.Fatalf("%v hits counted under the cluster upstream for %d of its keys served from the tier", h, len(keys)-1)
	}
	if h := metric(t, reg, "redproxy_localcache_hits_total", "upstream="+config.DefaultUpstream); h < 1 {
		t.Fatalf("%v hits counted under the default upstream", h)
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

	t.Run("WriteToTheOwningNode", func(t *testing.T) {
		for _, k := range keys {
			cacheIt(t, p, reader, k)
		}
		before := metric(t, reg, "redproxy_localcache_invalidations_total", "upstream="+clusterUpstream)
		for _, k := range keys {
			if err := nodeClient[k].Set(ctx, k, "v3", 0).Err(); err != nil {
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
		redistest.Eventually(t, 5*time.Second, func() bool {
			return metric(t, reg, "redproxy_localcache_invalidations_total", "upstream="+clusterUpstream)-before >= float64(len(keys)-1)
		}, "fewer invalidations under the cluster upstream than the %d of its keys written on their nodes", len(keys)-1)
	})

	t.Run("NodeConnectionLost", func(t *testing.T) {
		for _, k := range keys {
			cacheIt(t, p, reader, k)
		}
		var victim string
		for a := range byNode {
			victim = a
			break
		}
		k := byNode[victim][0]
		if n := killTierConns(t, nodeClient[k]); n == 0 {
			t.Fatal("no tracking connection on the node")
		}
		if err := nodeClient[k].Set(ctx, k, "v4", 0).Err(); err != nil {
			t.Fatal(err)
		}
		acked := time.Now()
		redistest.Eventually(t, 5*time.Second, func() bool {
			return metric(t, reg, "redproxy_localcache_flushes_total", "reason="+localcache.FlushDisconnect, "upstream="+clusterUpstream) > 0
		}, "the lost connection was never noticed (under the cluster upstream)")
		if v := mustGet(t, reader, k); v != "v4" {
			t.Fatalf("after the loss was noticed, GET %s = %q", k, v)
		}
		readsAfter(t, reader, k, "v4", acked.Add(testS), acked.Add(2*testS))
		redistest.Eventually(t, 10*time.Second, func() bool { return p.LocalTier().LiveUpstreamNode(clusterUpstream, victim) }, "never live again")
		if v := cacheIt(t, p, reader, k); v != "v4" {
			t.Fatalf("after reconnecting, GET %s = %q", k, v)
		}
	})
}

// TestRoutesClusterTierReshardLinearizable: clients read, write, delete and
// increment keys of the cluster upstream (and of the default) through the
// proxy while redis-cli moves 1000 slots between two of its primaries; the
// history must be linearizable, and the tier must have served hits.
func TestRoutesClusterTierReshardLinearizable(t *testing.T) {
	p, _, cl := startRoutedClusterTier(t, 0, testS)
	prims := cl.Primaries(t)
	from, to := redistest.NodeID(t, prims[0]), redistest.NodeID(t, prims[1])
	var workers []lintest.Worker
	one := func(o *redis.Options) { o.PoolSize = 1 }
	for range 6 {
		workers = append(workers, lintest.Worker{C: p.Client(t, one), Keys: "c:lin:", Every: 2 * time.Millisecond, WritePct: 20})
	}
	workers = append(workers, lintest.Worker{C: p.Client(t, one), Keys: "d:lin:", Every: 2 * time.Millisecond, WritePct: 20})
	reshardErr := make(chan error, 1)
	go func() {
		time.Sleep(300 * time.Millisecond) // let the history start first
		reshardErr <- redistest.Reshard(prims[0].Addr(), from, to, 1000)
	}()
	reg := p.Metrics.Registry
	hitsBefore := metric(t, reg, "redproxy_localcache_hits_total", "upstream="+clusterUpstream)
	hist := lintest.RecordFor(t, workers, 256, 0, 6*time.Second)
	if err := <-reshardErr; err != nil {
		t.Fatalf("reshard: %v", err)
	}
	moved, asked, _ := p.UpstreamRouter(clusterUpstream).Stats()
	h := metric(t, reg, "redproxy_localcache_hits_total", "upstream="+clusterUpstream) - hitsBefore
	t.Logf("router followed %d MOVED, %d ASK; the tier served %v hits of the cluster upstream", moved, asked, h)
	if moved+asked == 0 {
		t.Fatalf("no command met a moving slot; the check proves nothing")
	}
	if h < 100 {
		t.Fatalf("only %v hits of the cluster upstream: the history did not exercise the tier", h)
	}
	if res := lintest.Check(t, hist); res != porcupine.Ok {
		t.Fatalf("history through the proxy with the tier and a cluster upstream during resharding is %v", res)
	}
}

// TestRoutesClusterTierFailover: CLUSTER FAILOVER in the cluster upstream.
//
// First with no traffic: keys cached from a primary are written straight
// to its replica once promoted: the new primary sends no invalidation, so
// only the demoted primary's ROLE heartbeat tells the tier, which must not
// serve the old values later than S after the writes; the flush is counted
// under the cluster upstream.
//
// Then under load through the proxy, on another shard: the history stays
// linearizable.
func TestRoutesClusterTierFailover(t *testing.T) {
	p, _, cl := startRoutedClusterTier(t, 1, testS)
	reader := p.Client(t)
	replicas := cl.Replicas(t)
	replica := replicas[0]
	keys := routedClusterKeys(t, cl, "fo", 3)[primaryOf(t, replica)]
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
		return metric(t, p.Metrics.Registry, "redproxy_localcache_flushes_total", "reason="+localcache.FlushDemoted, "upstream="+clusterUpstream) > 0
	}, "the demoted primary was never noticed by the tier (under the cluster upstream)")
	// Hits resume from the new primary.
	if v := cacheIt(t, p, reader, keys[0]); v != "after" {
		t.Fatalf("GET %s from the tier after the failover = %q", keys[0], v)
	}

	cl.WaitHealthy(t)
	var workers []lintest.Worker
	for range 6 {
		workers = append(workers, lintest.Worker{C: p.Client(t, func(o *redis.Options) { o.PoolSize = 1 }), Keys: "c:fl:", Every: 2 * time.Millisecond, WritePct: 20})
	}
	failedOver := make(chan error, 1)
	go func() {
		time.Sleep(300 * time.Millisecond)
		failedOver <- failover(t, replicas[1])
	}()
	reg := p.Metrics.Registry
	hitsBefore := metric(t, reg, "redproxy_localcache_hits_total", "upstream="+clusterUpstream)
	hist := lintest.RecordFor(t, workers, 64, 0, 5*time.Second)
	if err := <-failedOver; err != nil {
		t.Fatal(err)
	}
	if h := metric(t, reg, "redproxy_localcache_hits_total", "upstream="+clusterUpstream) - hitsBefore; h < 100 {
		t.Fatalf("only %v hits of the cluster upstream: the history did not exercise the tier", h)
	}
	if res := lintest.Check(t, hist); res != porcupine.Ok {
		t.Fatalf("history through the proxy with the tier and a cluster upstream across a failover is %v", res)
	}
}

// TestRoutesClusterTierStaleIfError: a read of a cluster upstream's key the
// tier holds a stale_if_error value for, while the tier cannot serve it
// (its tracking connection to the key's node is lost and cannot be made
// again), is asked of the cluster through that upstream's router and
// answered with what the cluster holds, not with an error nor the stale
// value.
func TestRoutesClusterTierStaleIfError(t *testing.T) {
	p, _, cl := startRoutedClusterTier(t, 0, testS, func(c *config.Config) {
		c.LocalCache.StaleIfError = []localcache.StaleRule{{Pattern: "c:*", MaxAge: units.Duration{Duration: time.Minute}}}
	})
	reader := p.Client(t)
	var node, k string
	for a, ks := range routedClusterKeys(t, cl, "sie", 1) {
		node, k = a, ks[0]
		break
	}
	nc := redis.NewClient(&redis.Options{Addr: node, MaxRetries: -1})
	t.Cleanup(func() { nc.Close() })
	if err := nc.Set(ctx, k, "v1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	cacheIt(t, p, reader, k)
	// The node refuses CLIENT TRACKING from now on, so the tier's
	// connection to it, once killed, cannot come back (its handshake
	// fails) while the router's connections, already up, still read: the
	// tier holds k's value aside only, and cannot serve.
	if err := nc.Do(ctx, "ACL", "SETUSER", "default", "-client|tracking").Err(); err != nil {
		t.Fatal(err)
	}
	if n := killTierConns(t, nc); n == 0 {
		t.Fatal("no tracking connection on the node")
	}
	redistest.Eventually(t, 5*time.Second, func() bool {
		return metric(t, p.Metrics.Registry, "redproxy_localcache_flushes_total", "reason="+localcache.FlushDisconnect, "upstream="+clusterUpstream) > 0
	}, "the lost connection was never noticed")
	if err := nc.Set(ctx, k, "v2", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if v, err := reader.Get(ctx, k).Result(); err != nil || v != "v2" {
		t.Fatalf("GET %s while the tier holds a stale value = %q, %v; want v2 from the cluster", k, v, err)
	}
	if n := metric(t, p.Metrics.Registry, "redproxy_localcache_stale_serves_total"); n != 0 {
		t.Fatalf("%v stale serves although the cluster answered", n)
	}
}
