package proxy_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/cluster"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/lintest"
	"github.com/redproxy/redproxy/internal/proxy"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// startClusterReplicaProxy starts a 3+3 cluster and a cluster-mode proxy
// reading from its replicas as readFrom says, and waits until the proxy
// can read all three replicas.
func startClusterReplicaProxy(t testing.TB, readFrom string, mutate func(*config.Config)) (*redistest.Cluster, *proxytest.Proxy) {
	t.Helper()
	c := redistest.StartCluster(t, 3, 1)
	p := proxytest.Start(t, c.Nodes[0], func(cfg *config.Config) {
		cfg.Upstream.Mode = config.ModeCluster
		cfg.Upstream.Seeds = c.Seeds()
		cfg.Upstream.ReadFrom = readFrom
		cfg.Upstream.ReplicaPollInterval = units.Duration{Duration: 20 * time.Millisecond}
		cfg.Upstream.ReplyTimeout = units.Duration{Duration: 500 * time.Millisecond}
		cfg.Upstream.DialTimeout = units.Duration{Duration: 500 * time.Millisecond}
		if mutate != nil {
			mutate(cfg)
		}
	})
	// 30 s, as seedCluster waits for Redis's own replication: a replica
	// still in its first sync is not usable, and under the race run's load
	// (CI, 2026-12-03) one took longer than 10 s.
	redistest.Eventually(t, 30*time.Second, func() bool { return p.UsableReplicas() == 3 },
		"the proxy never found the 3 replicas (usable: %v)", lazyInt(p.UsableReplicas))
	return c, p
}

type lazyInt func() int

func (f lazyInt) String() string { return strconv.Itoa(f()) }

// seedCluster writes n keys k0..k(n-1) = v0.. through a cluster client and
// waits until every replica has them all.
func seedCluster(t testing.TB, c *redistest.Cluster, n int) {
	t.Helper()
	ctx := context.Background()
	cc := c.ClusterClient(t)
	for i := range n {
		if err := cc.Set(ctx, "k"+strconv.Itoa(i), "v"+strconv.Itoa(i), 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// Not the proxy's doing: Redis's own replication, which under a
	// loaded CI machine once took longer than 10 s (a replica's first
	// full sync), so the wait is generous and says what it saw.
	var held []int64
	redistest.Eventually(t, 30*time.Second, func() bool {
		held = held[:0]
		total := int64(0)
		for _, r := range c.Replicas(t) {
			k := r.Client(t).DBSize(ctx).Val()
			held = append(held, k)
			total += k
		}
		return total == int64(n)
	}, "the replicas never held all %d keys (they held %v)", n, &held)
}

// TestClusterReplicaReadsGoToReplicas (issue 14): in cluster mode with
// read_from = "replica", GETs (single, pipelined, and an MGET split over
// slots) run on the replicas only, never on a primary (INFO commandstats),
// each shard's on its own replica, while SETs run on the primaries.
func TestClusterReplicaReadsGoToReplicas(t *testing.T) {
	c, p := startClusterReplicaProxy(t, config.ReadReplica, nil)
	ctx := context.Background()
	const keys = 60
	seedCluster(t, c, keys)
	prims, reps := c.Primaries(t), c.Replicas(t)
	resetStats(t, c.Nodes...)

	reader := p.Client(t, func(o *redis.Options) { o.PoolSize = 1 })
	for i := range keys {
		k := strconv.Itoa(i)
		if v, err := reader.Get(ctx, "k"+k).Result(); err != nil || v != "v"+k {
			t.Fatalf("GET k%s = %q, %v", k, v, err)
		}
	}
	pipe := reader.Pipeline()
	gets := make([]*redis.StringCmd, 20)
	for i := range gets {
		gets[i] = pipe.Get(ctx, "k"+strconv.Itoa(i))
	}
	mget := pipe.MGet(ctx, "k1", "k2", "k3", "k4", "k5")
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatalf("pipelined reads: %v", err)
	}
	for i, g := range gets {
		if g.Val() != "v"+strconv.Itoa(i) {
			t.Fatalf("pipelined GET k%d = %q", i, g.Val())
		}
	}
	if got := fmt.Sprint(mget.Val()); got != "[v1 v2 v3 v4 v5]" {
		t.Fatalf("MGET = %s", got)
	}

	// Another client writes: its SETs run on the primaries.
	writer := p.Client(t, func(o *redis.Options) { o.PoolSize = 1 })
	const sets = 30
	for i := range sets {
		if err := writer.Set(ctx, "w"+strconv.Itoa(i), "x", 0).Err(); err != nil {
			t.Fatalf("SET: %v", err)
		}
	}

	primGets, primSets := 0, 0
	for _, s := range prims {
		primGets += calls(t, s, "get") + calls(t, s, "mget")
		primSets += calls(t, s, "set")
	}
	if primGets != 0 {
		t.Errorf("the primaries ran %d GET/MGETs; want 0 with read_from = replica", primGets)
	}
	if primSets != sets {
		t.Errorf("the primaries ran %d SETs; want %d", primSets, sets)
	}
	for _, r := range reps {
		if n := calls(t, r, "get"); n == 0 {
			t.Errorf("replica %s ran no GET: its shard's reads went elsewhere", r.Addr())
		}
	}
	// The writer reads its own writes: from the primaries until the
	// replicas have them, then anywhere; right in any case.
	for i := range sets {
		if v, err := writer.Get(ctx, "w"+strconv.Itoa(i)).Result(); err != nil || v != "x" {
			t.Fatalf("the writer's GET w%d = %q, %v", i, v, err)
		}
	}
}

// recordClusterOwnKeys runs clients through p, each reading and writing
// keys of its own (spread over the shards), while every replica's
// replication is held in bursts (CLIENT PAUSE WRITE); it returns the
// history and how many GETs the replicas served.
func recordClusterOwnKeys(t *testing.T, c *redistest.Cluster, p *proxytest.Proxy) ([]porcupine.Operation, int) {
	var workers []lintest.Worker
	for i := range 6 {
		workers = append(workers, lintest.Worker{
			C:    p.Client(t, func(o *redis.Options) { o.PoolSize = 1 }),
			Keys: fmt.Sprintf("own%d:", i), WritePct: 10, Every: 2 * time.Millisecond,
		})
	}
	reps := c.Replicas(t)
	resetStats(t, reps...)
	stop := make(chan struct{})
	var paused []interface{ Wait() }
	for _, r := range reps {
		paused = append(paused, pauseReplication(t, r, stop))
	}
	hist := lintest.RecordFor(t, workers, 3, 0, 2*time.Second)
	close(stop)
	for _, w := range paused {
		w.Wait()
	}
	onReplicas := 0
	for _, r := range reps {
		onReplicas += calls(t, r, "get")
	}
	return hist, onReplicas
}

// TestClusterReplicaReadYourWrites (issue 14): in cluster mode every
// client's own history is linearizable while the replicas lag behind by up
// to a few hundred milliseconds: after a client's write to a shard, its
// reads of that shard wait for the primary or a replica that has the
// write. The same run with the read-your-writes floor off is not
// linearizable (so the check can fail), and the replicas served reads.
func TestClusterReplicaReadYourWrites(t *testing.T) {
	c, p := startClusterReplicaProxy(t, config.ReadReplicaPreferred, func(cfg *config.Config) {
		cfg.Upstream.MaxReplicaLag = units.Duration{Duration: 10 * time.Second}
	})
	hist, onReplicas := recordClusterOwnKeys(t, c, p)
	if res := lintest.Check(t, hist); res != porcupine.Ok {
		t.Fatalf("a client's own history is not linearizable with reads from lagging cluster replicas: %v", res)
	}
	t.Logf("replicas served %d GETs", onReplicas)
	if onReplicas == 0 {
		t.Fatal("the replicas served no read; the test checked nothing about them")
	}

	restore := proxy.SetTestNoReadYourWrites(true)
	defer restore()
	hist, _ = recordClusterOwnKeys(t, c, p)
	if res := lintest.Check(t, hist); res == porcupine.Ok {
		t.Fatal("without the read-your-writes floor the history is still linearizable: the replicas never lagged enough for the check to mean anything")
	}
}

// shardOf is the replica of c whose primary owns key's slot, and that
// primary.
func shardOf(t *testing.T, c *redistest.Cluster, key string) (primary, replica *redistest.Server) {
	t.Helper()
	ctx := context.Background()
	m, err := c.ClusterClient(t).MasterForKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	addr := m.Options().Addr
	for _, s := range c.Nodes {
		if s.Addr() == addr {
			primary = s
		}
	}
	if primary == nil {
		t.Fatalf("no primary found for %s at %s", key, addr)
	}
	return primary, replicaOf(t, c, addr)
}

// TestClusterReplicaKilledFallsBack (issue 14): with replica_preferred, a
// shard's replica killed under read load costs the clients nothing: a
// read that was on it goes to its primary, later ones too, none fails.
func TestClusterReplicaKilledFallsBack(t *testing.T) {
	c, p := startClusterReplicaProxy(t, config.ReadReplicaPreferred, nil)
	seedCluster(t, c, 10)
	primary, replica := shardOf(t, c, "k1")
	resetStats(t, primary)
	l := startReads(t, p, 8, "k1", "v1")
	if n := calls(t, primary, "get"); n != 0 {
		t.Fatalf("before the kill the primary ran %d GETs, want 0", n)
	}
	replica.Kill(t)
	before := l.ok.Load()
	redistest.Eventually(t, 10*time.Second, func() bool { return calls(t, primary, "get") > 100 && l.ok.Load() > before+100 },
		"reads never moved to the primary")
	l.end()
	t.Logf("slowest read: %v (reply_timeout 500ms)", time.Duration(l.slowest.Load()))
	if n := l.failed.Load(); n != 0 {
		t.Errorf("%d reads failed after the replica was killed (first: %s); want none", n, *l.firstErr.Load())
	}
	if n := l.wrong.Load(); n != 0 {
		t.Errorf("%d reads returned a wrong value", n)
	}
	redistest.Eventually(t, 10*time.Second, func() bool { return p.UsableReplicas() == 2 }, "the killed replica still counts as usable")
}

// TestClusterReplicaStalledFallsBack (issue 14): a frozen replica
// (SIGSTOP: connected, silent) holds a read of its shard at most
// upstream.reply_timeout: reads keep completing, correct, while it stays
// frozen.
func TestClusterReplicaStalledFallsBack(t *testing.T) {
	c, p := startClusterReplicaProxy(t, config.ReadReplicaPreferred, nil)
	seedCluster(t, c, 10)
	primary, replica := shardOf(t, c, "k1")
	resetStats(t, primary)
	l := startReads(t, p, 4, "k1", "v1")
	replica.Freeze(t)
	before := l.ok.Load()
	redistest.Eventually(t, 10*time.Second, func() bool { return l.ok.Load() > before+200 }, "reads stopped while the replica was frozen")
	l.end()
	replica.Thaw(t)
	t.Logf("slowest read: %v (reply_timeout 500ms)", time.Duration(l.slowest.Load()))
	if n := l.failed.Load(); n != 0 {
		t.Errorf("%d reads failed while the replica was frozen (first: %s); want none", n, *l.firstErr.Load())
	}
	if n := l.wrong.Load(); n != 0 {
		t.Errorf("%d reads returned a wrong value", n)
	}
	if calls(t, primary, "get") == 0 {
		t.Error("the primary answered no read while its replica was frozen")
	}
}

// TestClusterReplicaFailover (issue 14): a replica promoted (CLUSTER
// FAILOVER) under read and write load: no read fails or is wrong, and once
// the proxy has the new map the old primary, now a replica, serves the
// shard's reads while the new primary takes its writes.
func TestClusterReplicaFailover(t *testing.T) {
	c, p := startClusterReplicaProxy(t, config.ReadReplicaPreferred, nil)
	ctx := context.Background()
	seedCluster(t, c, 10)
	oldPrimary, replica := shardOf(t, c, "k1")
	const readers = 4
	l := startReads(t, p, readers, "k1", "v1")
	if err := redistest.PromoteReplica(t, replica); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 20*time.Second, func() bool {
		role, err := oldPrimary.Client(t).Do(ctx, "ROLE").Slice()
		return err == nil && len(role) > 0 && role[0] == "slave"
	}, "the old primary never became a replica")
	c.WaitHealthy(t)
	p.Router().RefreshSoon()
	// UsableReplicas is 3 before the failover too, so it cannot say the
	// proxy has the new map (a CI run read 690 GETs from the new primary
	// after waiting on it alone). The old primary answering a GET can:
	// it runs one only on a READONLY connection, as a replica of the
	// shard in the proxy's new replica sets (the proxy's primary
	// connections get MOVED from it, which commandstats does not count).
	resetStats(t, oldPrimary)
	redistest.Eventually(t, 20*time.Second, func() bool { return calls(t, oldPrimary, "get") > 0 && p.UsableReplicas() == 3 },
		"the proxy never read from the shard's new replica")
	// Reads sent before the proxy swapped its sets may still be on their
	// way to the new primary; let the readers finish some more first.
	mark := l.ok.Load()
	redistest.Eventually(t, 10*time.Second, func() bool { return l.ok.Load() > mark+100 }, "reads stopped after the failover")
	// From here on the new primary may still run a read the proxy sent
	// it on purpose: one whose replica view went stale (a poll slower
	// than max_replica_lag) or whose replica failed, or a MOVED a replica
	// answered. (A race run in CI saw 2121 of them here, when this
	// wanted none; which of these sent them was not recorded then.) The proxy counts each; a read it sent to a replica that
	// landed on the new primary (a replica set left over from before the
	// failover) it does not, and that is what this window looks for.
	reads0 := replicaReadsByResult(t, p)
	moved0, _, _ := p.Router().Stats()
	resetStats(t, oldPrimary, replica)
	before := l.ok.Load()
	redistest.Eventually(t, 10*time.Second, func() bool { return l.ok.Load() > before+100 && calls(t, oldPrimary, "get") > 50 },
		"the old primary, now a replica, never served the shard's reads")
	l.end()
	reads1 := replicaReadsByResult(t, p)
	moved1, _, _ := p.Router().Stats()
	meant := int(reads1["primary"]-reads0["primary"]) + int(reads1["fallback"]-reads0["fallback"]) + int(moved1-moved0)
	// A read is counted when the proxy picks its node, before it is sent:
	// one a reader had in flight when reads0 was taken may run on the new
	// primary after the reset, which comes after. Each reader has at most
	// one (both CI runs of 1349757 saw exactly 4 over, with 4 readers,
	// when the reset came first); a leftover replica set sends hundreds.
	// (Reads picked between reads0 and the reset count for meant though
	// they may have run before the reset: a few more of slack.)
	if n := calls(t, replica, "get"); n > meant+readers {
		t.Errorf("the new primary ran %d GETs after the proxy saw the failover, %d more than the proxy sent to a primary (read results before %v, after %v; MOVED followed %d)",
			n, n-meant, reads0, reads1, moved1-moved0)
	} else {
		t.Logf("after the proxy saw the failover: the new primary ran %d GETs, all sent to it as a primary (read results before %v, after %v; MOVED followed %d)",
			n, reads0, reads1, moved1-moved0)
	}
	if n := l.failed.Load(); n != 0 {
		t.Errorf("%d reads failed across the failover (first: %s); want none", n, *l.firstErr.Load())
	}
	if n := l.wrong.Load(); n != 0 {
		t.Errorf("%d reads returned a wrong value", n)
	}
	// A write after the failover lands on the new primary, and the
	// writer reads it back.
	w := p.Client(t)
	if err := w.Set(ctx, "k1", "after", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if v, err := w.Get(ctx, "k1").Result(); err != nil || v != "after" {
		t.Fatalf("GET after SET across the failover = %q, %v", v, err)
	}
}

// BenchmarkClusterReplicaReadsPipeline16 is BenchmarkForwardPipeline16 in
// cluster mode with read_from = "replica": the GETs go to a replica, and
// allocs/op must stay 0 there too. The offsets are polled rarely, so
// the poller's allocations do not count as the reads'.
func BenchmarkClusterReplicaReadsPipeline16(b *testing.B) {
	c, p := startClusterReplicaProxy(b, config.ReadReplica, rarePolls)
	if err := c.ClusterClient(b).Set(context.Background(), "key:000000012345", strings.Repeat("v", 64), 0).Err(); err != nil {
		b.Fatal(err)
	}
	redistest.Eventually(b, 10*time.Second, func() bool {
		for _, r := range c.Replicas(b) {
			if r.Client(b).DBSize(context.Background()).Val() == 1 {
				return true
			}
		}
		return false
	}, "the key never reached a replica")
	benchForwardOn(b, p, 16)
}

// BenchmarkReplicaReadsPipeline16 is the same for a standalone primary
// with one replica.
func BenchmarkReplicaReadsPipeline16(b *testing.B) {
	g := startReplicated(b, 1)
	if err := g.primary.Client(b).Set(context.Background(), "key:000000012345", strings.Repeat("v", 64), 0).Err(); err != nil {
		b.Fatal(err)
	}
	redistest.Eventually(b, 10*time.Second, func() bool {
		return g.replicas[0].Client(b).DBSize(context.Background()).Val() == 1
	}, "the key never reached the replica")
	benchForwardOn(b, g.proxy(b, config.ReadReplica, rarePolls), 16)
}

func rarePolls(c *config.Config) {
	c.Upstream.ReplicaPollInterval = units.Duration{Duration: time.Second}
	c.Upstream.MaxReplicaLag = units.Duration{Duration: time.Hour}
}

// replicaReadsByResult is redproxy_replica_reads_total by its result
// label.
func replicaReadsByResult(t *testing.T, p *proxytest.Proxy) map[string]float64 {
	t.Helper()
	return metricBy(t, p, "redproxy_replica_reads_total", "result")
}

// TestClusterReplicaReadsDuringMigration: with replica_preferred, while a
// slot is MIGRATING a client reads back its own write that the importing
// node took (ASK) and its key already moved away. The old owner's replica
// knows nothing of the migration and answers both as missing, where its
// primary answers ASK (found by a probe: nil for as long as the slot
// stayed MIGRATING).
func TestClusterReplicaReadsDuringMigration(t *testing.T) {
	c, p := startClusterReplicaProxy(t, config.ReadReplicaPreferred, nil)
	ctx := context.Background()
	// One connection: read-your-writes is the client connection's.
	rc := p.Client(t, func(o *redis.Options) { o.PoolSize = 1 })
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	const moved, created = "{mig}:moved", "{mig}:created"
	slot := cluster.Slot([]byte(moved))
	src := nodeAt(t, c, p.Router().Map().Owner(slot))
	replica := replicaOf(t, c, src.Addr())
	// probe: a key of another slot of the same shard, whose reads show
	// when this client's reads of the shard are on its replica.
	probe := ""
	for i := 0; probe == ""; i++ {
		k := fmt.Sprintf("probe:%d", i)
		if s := cluster.Slot([]byte(k)); s != slot && p.Router().Map().Owner(s) == src.Addr() {
			probe = k
		}
	}
	must(rc.Set(ctx, moved, "before", 0).Err())
	must(rc.Set(ctx, probe, "p", 0).Err())
	rr := replica.Client(t).Conn()
	defer rr.Close()
	must(rr.ReadOnly(ctx).Err())
	redistest.Eventually(t, 10*time.Second, func() bool { return rr.Get(ctx, moved).Val() == "before" },
		"the replica never got %s", moved)

	var dst *redistest.Server
	for _, n := range c.Primaries(t) {
		if n != src {
			dst = n
			break
		}
	}
	must(dst.Client(t).Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", redistest.NodeID(t, src)).Err())
	must(src.Client(t).Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", redistest.NodeID(t, dst)).Err())
	must(src.Client(t).Do(ctx, "MIGRATE", "127.0.0.1", dst.Port(), "", 0, 5000, "KEYS", moved).Err())
	redistest.Eventually(t, 10*time.Second, func() bool { return rr.Exists(ctx, moved).Val() == 0 },
		"the replica never saw %s leave", moved)

	_, asked0, _ := p.Router().Stats()
	must(rc.Set(ctx, created, "during", 0).Err()) // taken by dst, after ASK
	if _, asked, _ := p.Router().Stats(); asked <= asked0 {
		t.Fatalf("the SET of a new key in a MIGRATING slot met no ASK (asked %d -> %d)", asked0, asked)
	}
	// Until this client's reads of the shard are on the replica again (the
	// SET went to src first, which holds them back until the next poll).
	redistest.Eventually(t, 10*time.Second, func() bool {
		before := calls(t, replica, "get")
		return rc.Get(ctx, probe).Val() == "p" && calls(t, replica, "get") > before
	}, "the client's reads of %s's shard never went to its replica", src.Addr())

	for k, want := range map[string]string{moved: "before", created: "during"} {
		if v, err := rc.Get(ctx, k).Result(); err != nil || v != want {
			t.Errorf("GET %s while its slot is MIGRATING = %q, %v; want %q", k, v, err, want)
		}
	}
	vals, err := rc.MGet(ctx, moved, created).Result()
	if err != nil || len(vals) != 2 || vals[0] != "before" || vals[1] != "during" {
		t.Errorf("MGET %s %s while their slot is MIGRATING = %v, %v", moved, created, vals, err)
	}
}
