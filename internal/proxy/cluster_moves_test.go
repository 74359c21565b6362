package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/cluster"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/lintest"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/proxy"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/resp"
)

// nodeAt finds the cluster node listening at addr.
func nodeAt(t *testing.T, c *redistest.Cluster, addr string) *redistest.Server {
	t.Helper()
	for _, n := range c.Nodes {
		if n.Addr() == addr {
			return n
		}
	}
	t.Fatalf("no node at %s", addr)
	return nil
}

// TestClusterRedirects moves one slot by hand, step by step, so that the
// proxy meets ASK (keys already on the importing node) and then MOVED (the
// slot's new owner) and must hide both.
func TestClusterRedirects(t *testing.T) {
	c, p := startClusterProxy(t)
	rc := p.Client(t)
	ctx := context.Background()
	keys := make([]string, 20)
	for i := range keys {
		keys[i] = fmt.Sprintf("{mig}:%d", i)
		if err := rc.Set(ctx, keys[i], i, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	slot := cluster.Slot([]byte(keys[0]))
	src := nodeAt(t, c, p.Router().Map().Owner(slot))
	var dst *redistest.Server
	for _, n := range c.Primaries(t) {
		if n != src {
			dst = n
			break
		}
	}
	srcID, dstID := redistest.NodeID(t, src), redistest.NodeID(t, dst)
	sc, dc := src.Client(t), dst.Client(t)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(dc.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID).Err())
	must(sc.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID).Err())
	migrate := func(ks []string) {
		args := []any{"MIGRATE", "127.0.0.1", dst.Port(), "", 0, 5000, "KEYS"}
		for _, k := range ks {
			args = append(args, k)
		}
		must(sc.Do(ctx, args...).Err())
	}
	migrate(keys[:10])
	moved0, asked0, _ := p.Router().Stats()
	// Half the keys are on dst now: the proxy follows ASK for them.
	for i, k := range keys {
		if v, err := rc.Get(ctx, k).Int(); err != nil || v != i {
			t.Fatalf("GET %s during migration = %d, %v", k, v, err)
		}
	}
	// A new key of a migrating slot is created on the importing node.
	must(rc.Set(ctx, "{mig}:new", "n", 0).Err())
	if _, asked, _ := p.Router().Stats(); asked <= asked0 {
		t.Fatalf("no ASK was followed (asked %d -> %d)", asked0, asked)
	}
	migrate(keys[10:])
	for _, n := range c.Primaries(t) {
		must(n.Client(t).Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dstID).Err())
	}
	// The proxy's map still says src: it follows MOVED to dst.
	vals, err := rc.MGet(ctx, append(keys, "{mig}:new")...).Result()
	must(err)
	for i, v := range vals[:len(keys)] {
		if fmt.Sprint(v) != fmt.Sprint(i) {
			t.Fatalf("MGET after the move: %s = %v", keys[i], v)
		}
	}
	if vals[len(keys)] != "n" {
		t.Fatalf("the key created during migration reads %v", vals[len(keys)])
	}
	if moved, _, _ := p.Router().Stats(); moved <= moved0 {
		t.Fatalf("no MOVED was followed (moved %d -> %d)", moved0, moved)
	}
	redistest.Eventually(t, 5*time.Second, func() bool {
		return p.Router().Map().Owner(slot) == dst.Addr()
	}, "the proxy's map never learnt slot %d's new owner", slot)
	seen := map[string]float64{}
	mfs, err := p.Metrics.Registry.Gather()
	must(err)
	for _, mf := range mfs {
		if mf.GetName() == "redproxy_cluster_redirections_total" {
			for _, m := range mf.GetMetric() {
				seen[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	if seen["moved"] < 1 || seen["ask"] < 1 {
		t.Fatalf("redirection metrics %v, want moved and ask counted", seen)
	}
}

// loadResult is what a load run saw.
type loadResult struct {
	ops, errs atomic.Int64
	mu        sync.Mutex
	firstErrs []string
	lastErr   string
}

func (r *loadResult) fail(err error) {
	r.errs.Add(1)
	r.mu.Lock()
	if len(r.firstErrs) < 5 {
		r.firstErrs = append(r.firstErrs, err.Error())
	}
	r.lastErr = err.Error()
	r.mu.Unlock()
}

// runLoad has writers each own a few keys, write increasing values and
// read them back through the proxy until stop: a reader that is the only
// writer of its key must read what it last had acknowledged. It returns
// when every writer has stopped.
func runLoad(t *testing.T, rc *redis.Client, writers int, stop <-chan struct{}, res *loadResult) func() map[string]int {
	var wg sync.WaitGroup
	final := make([]map[string]int, writers)
	// A test that fails before it closes stop must not leave writers
	// spinning on a closed client for the rest of the package's tests.
	ended := make(chan struct{})
	t.Cleanup(func() {
		close(ended)
		wg.Wait()
	})
	for w := range writers {
		wg.Add(1)
		final[w] = map[string]int{}
		go func() {
			defer wg.Done()
			ctx := context.Background()
			acked := final[w]
			for n := 1; ; n++ {
				select {
				case <-stop:
					return
				case <-ended:
					return
				default:
				}
				k := fmt.Sprintf("load:%d:%d", w, n%50)
				if err := rc.Set(ctx, k, n, 0).Err(); err != nil {
					res.fail(fmt.Errorf("SET %s: %w", k, err))
					// Unknown outcome: the key is no longer checked.
					delete(acked, k)
					continue
				}
				acked[k] = n
				v, err := rc.Get(ctx, k).Int()
				res.ops.Add(2)
				if err != nil {
					res.fail(fmt.Errorf("GET %s: %w", k, err))
					continue
				}
				if v != n {
					res.fail(fmt.Errorf("GET %s = %d after %d was acknowledged", k, v, n))
				}
			}
		}()
	}
	return func() map[string]int {
		wg.Wait()
		all := map[string]int{}
		for _, m := range final {
			for k, v := range m {
				all[k] = v
			}
		}
		return all
	}
}

// TestClusterReshardUnderLoad moves 1000 slots with redis-cli --cluster
// reshard (MIGRATE, SETSLOT) while clients write and read through the
// proxy: no client sees MOVED or ASK, and every acknowledged value reads
// back.
func TestClusterReshardUnderLoad(t *testing.T) {
	c, p := startClusterProxy(t)
	rc := p.Client(t, func(o *redis.Options) { o.PoolSize = 16 })
	prims := c.Primaries(t)
	from, to := redistest.NodeID(t, prims[0]), redistest.NodeID(t, prims[1])
	stop := make(chan struct{})
	var res loadResult
	wait := runLoad(t, rc, 8, stop, &res)
	start := time.Now()
	err := redistest.Reshard(prims[0].Addr(), from, to, 1000)
	took := time.Since(start)
	close(stop)
	acked := wait()
	if err != nil {
		t.Fatalf("reshard: %v", err)
	}
	c.WaitHealthy(t)
	moved, asked, retried := p.Router().Stats()
	t.Logf("reshard of 1000 slots took %v; %d ops through the proxy, %d errors; router followed %d MOVED, %d ASK, %d retries",
		took, res.ops.Load(), res.errs.Load(), moved, asked, retried)
	if res.errs.Load() != 0 {
		t.Fatalf("%d client errors during resharding, first: %v", res.errs.Load(), res.firstErrs)
	}
	if moved+asked == 0 {
		t.Fatalf("the load never met a moving slot; the test proves nothing")
	}
	direct := c.ClusterClient(t)
	ctx := context.Background()
	for k, v := range acked {
		if got, err := direct.Get(ctx, k).Int(); err != nil || got != v {
			t.Fatalf("%s = %d, %v; %d was acknowledged last", k, got, err, v)
		}
	}
}

// TestClusterFailover promotes a replica with CLUSTER FAILOVER while
// clients write and read through the proxy.
func TestClusterFailover(t *testing.T) {
	c, p := startClusterProxy(t)
	rc := p.Client(t, func(o *redis.Options) { o.PoolSize = 16 })
	ctx := context.Background()
	stop := make(chan struct{})
	var res loadResult
	wait := runLoad(t, rc, 8, stop, &res)
	// Let the load reach every node first.
	redistest.Eventually(t, 5*time.Second, func() bool { return res.ops.Load() > 2000 }, "no load")
	replica := c.Replicas(t)[0]
	start := time.Now()
	// A manual failover that does not complete within Redis's own 5 s
	// (the primary must pause and the replica catch up, slow under -race
	// and load) is aborted, and the replica stays one: ask again then.
	var lastAsk time.Time
	redistest.Eventually(t, 30*time.Second, func() bool {
		r, err := replica.Client(t).Do(ctx, "ROLE").Slice()
		if err == nil && len(r) > 0 && r[0] == "master" {
			return true
		}
		if time.Since(lastAsk) > 6*time.Second {
			if err := replica.Client(t).Do(ctx, "CLUSTER", "FAILOVER").Err(); err != nil {
				t.Logf("CLUSTER FAILOVER: %v", err)
			}
			lastAsk = time.Now()
		}
		return false
	}, "the replica never became primary")
	promoted := time.Since(start)
	// The proxy's map follows; the load keeps running meanwhile.
	redistest.Eventually(t, 20*time.Second, func() bool {
		for _, a := range p.Router().Map().Primaries() {
			if a == replica.Addr() {
				return true
			}
		}
		return false
	}, "the proxy never learnt the new primary")
	learnt := time.Since(start)
	base := res.ops.Load()
	redistest.Eventually(t, 10*time.Second, func() bool { return res.ops.Load() > base+2000 }, "the load stalled after the failover")
	close(stop)
	acked := wait()
	moved, asked, retried := p.Router().Stats()
	t.Logf("failover: replica primary after %v, proxy map after %v; %d ops, %d errors; router followed %d MOVED, %d ASK, %d retries",
		promoted, learnt, res.ops.Load(), res.errs.Load(), moved, asked, retried)
	if res.errs.Load() != 0 {
		for _, e := range res.firstErrs {
			if strings.Contains(e, "MOVED") || strings.Contains(e, "ASK") {
				t.Fatalf("a client saw a redirection: %s", e)
			}
		}
		t.Fatalf("%d client errors during a coordinated failover, first: %v", res.errs.Load(), res.firstErrs)
	}
	c.WaitHealthy(t)
	direct := c.ClusterClient(t)
	for k, v := range acked {
		if got, err := direct.Get(ctx, k).Int(); err != nil || got != v {
			t.Fatalf("%s = %d, %v; %d was acknowledged last", k, got, err, v)
		}
	}
}

// TestClusterPolicyFixups: a TTL rule makes the proxy wrap a write and its
// EXPIRE fix-up in MULTI/EXEC of its own. In cluster mode the whole
// transaction must go to the key's node, even when the key's slot is not
// served by the first primary.
func TestClusterPolicyFixups(t *testing.T) {
	c, p := startClusterTTLProxy(t)
	rc := p.Client(t)
	direct := c.ClusterClient(t)
	ctx := context.Background()
	for i := range 30 {
		k := fmt.Sprintf("sess:%d", i)
		// HSET has no TTL option: the fix-up is an EXPIRE ... NX in a
		// MULTI/EXEC of the proxy's own.
		if n, err := rc.HSet(ctx, k, "f", "v").Result(); err != nil || n != 1 {
			t.Fatalf("HSET %s = %d, %v", k, n, err)
		}
		if ttl := direct.TTL(ctx, k).Val(); ttl <= 0 {
			t.Fatalf("%s has TTL %v; the policy's default was not applied", k, ttl)
		}
	}
	// Behind the proxy's back, the slot moves: the HSET queued in the
	// proxy's MULTI gets MOVED, EXEC aborts, and the transaction goes
	// again, whole, to the new owner.
	if err := rc.HSet(ctx, "sess:{t}a", "f", "v").Err(); err != nil {
		t.Fatal(err)
	}
	slot := cluster.Slot([]byte("sess:{t}a"))
	src := nodeAt(t, c, p.Router().Map().Owner(slot))
	var dst *redistest.Server
	for _, n := range c.Nodes {
		if n != src {
			dst = n
			break
		}
	}
	moveSlot(t, c, slot, src, dst)
	moved0, _, _ := p.Router().Stats()
	if n, err := rc.HSet(ctx, "sess:{t}b", "f", "v").Result(); err != nil || n != 1 {
		t.Fatalf("HSET after the slot moved = %d, %v", n, err)
	}
	if moved, _, _ := p.Router().Stats(); moved == moved0 {
		t.Fatal("the proxy met no MOVED; the test proves nothing")
	}
	if ttl := dst.Client(t).TTL(ctx, "sess:{t}b").Val(); ttl <= 0 {
		t.Fatalf("sess:{t}b has TTL %v on its new node", ttl)
	}
}

// moveSlot migrates slot and its keys from src to dst, as redis-cli
// --cluster reshard does, without the proxy knowing.
func moveSlot(t *testing.T, c *redistest.Cluster, slot int, src, dst *redistest.Server) {
	t.Helper()
	ctx := context.Background()
	sc, dc := src.Client(t), dst.Client(t)
	srcID, dstID := redistest.NodeID(t, src), redistest.NodeID(t, dst)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(dc.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID).Err())
	must(sc.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID).Err())
	keys, err := sc.ClusterGetKeysInSlot(ctx, slot, 1000).Result()
	must(err)
	if len(keys) > 0 {
		args := []any{"MIGRATE", "127.0.0.1", dst.Port(), "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		must(sc.Do(ctx, args...).Err())
	}
	for _, n := range c.Primaries(t) {
		must(n.Client(t).Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dstID).Err())
	}
}

// TestClusterSeedDown: the first seed does not answer; the proxy starts
// from the others and serves every slot.
func TestClusterSeedDown(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	dead := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	p := proxytest.Start(t, c.Nodes[0], func(cfg *config.Config) {
		cfg.Upstream.Mode = config.ModeCluster
		cfg.Upstream.Seeds = append([]string{dead}, c.Seeds()...)
	})
	rc := p.Client(t)
	ctx := context.Background()
	for i := range 100 {
		k := fmt.Sprintf("sd:%d", i)
		if err := rc.Set(ctx, k, i, 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", k, err)
		}
	}
	if n := rc.DBSize(ctx).Val(); n != 100 {
		t.Fatalf("DBSIZE = %d", n)
	}
}

// TestClusterPrimaryKilled kills a primary under load. Clients of its
// slots get errors (never MOVED or ASK) until its replica takes over,
// then the load runs clean again.
func TestClusterPrimaryKilled(t *testing.T) {
	c, p := startClusterProxy(t)
	rc := p.Client(t, func(o *redis.Options) { o.PoolSize = 16 })
	stop := make(chan struct{})
	var res loadResult
	wait := runLoad(t, rc, 8, stop, &res)
	redistest.Eventually(t, 5*time.Second, func() bool { return res.ops.Load() > 2000 }, "no load")
	victim := c.Primaries(t)[0]
	start := time.Now()
	victim.Kill(t)
	// Recovered: a run of 2000 operations with no error.
	var recovered time.Duration
	redistest.Eventually(t, 30*time.Second, func() bool {
		errs, ops := res.errs.Load(), res.ops.Load()
		time.Sleep(200 * time.Millisecond)
		for res.ops.Load() < ops+2000 {
			if res.errs.Load() != errs {
				return false
			}
			time.Sleep(10 * time.Millisecond)
		}
		if res.errs.Load() != errs {
			return false
		}
		recovered = time.Since(start)
		return true
	}, "the load never ran clean after the primary died: %v", lazyLastErr{&res})
	close(stop)
	wait()
	moved, asked, retried := p.Router().Stats()
	t.Logf("primary killed: load clean again within %v (includes a 2000-op clean run); %d ops, %d errors, first %v; router followed %d MOVED, %d ASK, %d retries",
		recovered, res.ops.Load(), res.errs.Load(), res.firstErrs, moved, asked, retried)
	for _, e := range res.firstErrs {
		if strings.Contains(e, "MOVED") || strings.Contains(e, " ASK ") {
			t.Fatalf("a client saw a redirection: %s", e)
		}
	}
}

// lazyLastErr prints the load's last error when a wait fails.
type lazyLastErr struct{ r *loadResult }

func (l lazyLastErr) String() string {
	l.r.mu.Lock()
	defer l.r.mu.Unlock()
	return fmt.Sprintf("%d errors, last %q, first %q", l.r.errs.Load(), l.r.lastErr, l.r.firstErrs)
}

// TestClusterReloadUpstreamRefused: the router cannot switch its per-node
// connections, so a reload that changes them is refused whole.
func TestClusterReloadUpstreamRefused(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	p := proxytest.Start(t, c.Nodes[0], func(cfg *config.Config) {
		cfg.Upstream.Mode = config.ModeCluster
		cfg.Upstream.Seeds = c.Seeds()
	})
	next := *p.Config()
	next.Upstream.Connections++
	if _, err := p.Reload(&next); !errors.Is(err, proxy.ErrRestartRequired) {
		t.Fatalf("Reload changing upstream.connections in cluster mode: %v", err)
	}
	// Seeds (restart-only in every mode) with another setting: each key
	// named once, seeds with its own reason (it was listed twice, found by
	// a probe).
	next = *p.Config()
	next.Upstream.Connections++
	next.Upstream.Seeds = append(slices.Clone(next.Upstream.Seeds), "127.0.0.1:1")
	_, err := p.Reload(&next)
	if !errors.Is(err, proxy.ErrRestartRequired) || strings.Count(err.Error(), "upstream.seeds") != 1 || !strings.Contains(err.Error(), "upstream.connections") {
		t.Fatalf("Reload changing seeds and connections in cluster mode: %v; want each named once", err)
	}
	next = *p.Config()
	next.Upstream.Seeds = append(slices.Clone(next.Upstream.Seeds), "127.0.0.1:1")
	if _, err := p.Reload(&next); !errors.Is(err, proxy.ErrRestartRequired) || strings.Count(err.Error(), "upstream") != 1 {
		t.Fatalf("Reload changing only seeds in cluster mode: %v; want upstream.seeds named once", err)
	}
	next = *p.Config()
	next.Upstream.MaxPinned++
	if _, err := p.Reload(&next); err != nil {
		t.Fatalf("Reload changing only max_pinned: %v", err)
	}
}

// TestClusterRepliesBeyondOutputLimit: in cluster mode too, a client whose
// replies outgrow its output limit is closed, and the proxy does not hold
// its 64 MB of replies meanwhile: each node's share is capped as well.
func TestClusterRepliesBeyondOutputLimit(t *testing.T) {
	const limit = 8 << 20
	c := redistest.StartCluster(t, 3, 0)
	p := proxytest.Start(t, c.Nodes[0], func(cfg *config.Config) {
		cfg.Upstream.Mode = config.ModeCluster
		cfg.Upstream.Seeds = c.Seeds()
		cfg.Server.ClientOutputLimit = limit
	})
	ctx := context.Background()
	if err := c.ClusterClient(t).Set(ctx, "big", strings.Repeat("b", 1<<20), 0).Err(); err != nil {
		t.Fatal(err)
	}
	rc := dialRaw(t, p.Addr)
	// Small replies first, so the proxy expects small ones and sends the
	// 64 GETs as one batch.
	for i := 0; i < 30; i++ {
		rc.send([]string{"GET", "small"}, []string{"GET", "small"})
		for range 2 {
			if v, _ := rc.readReply(); v != nil {
				t.Fatalf("GET small = %v", v)
			}
		}
	}
	mem := sampleMemory(t)
	cmds := make([][]string, 64)
	for i := range cmds {
		cmds[i] = []string{"GET", "big"}
	}
	rc.send(cmds...)
	redistest.Eventually(t, 10*time.Second, func() bool { return closedFor(p, metrics.CloseOutputLimit) == 1 },
		"the client was never closed for its output limit")
	_, heapGrowth := mem.finish()
	if !connClosed(rc.nc) {
		t.Fatal("the output limit was counted but the connection stayed open")
	}
	t.Logf("live Go heap +%d MB for a client limited to %d MB", heapGrowth>>20, limit>>20)
	if heapGrowth > 3*limit+32<<20 {
		t.Fatalf("live Go heap grew by %d MB for one client limited to %d MB", heapGrowth>>20, limit>>20)
	}
	// The node's shared connection goes on serving others.
	if v, err := p.Client(t).Get(ctx, "big").Result(); err != nil || len(v) != 1<<20 {
		t.Fatalf("GET big from another client: %d bytes, %v", len(v), err)
	}
}

// TestClusterReshardLinearizable: clients read, write, delete and
// increment shared keys through the proxy while redis-cli moves 1000 slots;
// the history, checked per key with porcupine against a sequential store,
// must be linearizable (a redirected command may neither run twice nor
// return a value from before an acknowledged write).
func TestClusterReshardLinearizable(t *testing.T) {
	c, p := startClusterProxy(t)
	prims := c.Primaries(t)
	from, to := redistest.NodeID(t, prims[0]), redistest.NodeID(t, prims[1])
	var workers []lintest.Worker
	for range 8 {
		workers = append(workers, lintest.Worker{C: p.Client(t, func(o *redis.Options) { o.PoolSize = 1 }), Every: 2 * time.Millisecond})
	}
	reshardErr := make(chan error, 1)
	go func() {
		time.Sleep(300 * time.Millisecond) // let the history start first
		reshardErr <- redistest.Reshard(prims[0].Addr(), from, to, 1000)
	}()
	// 256 keys: about 16 of them live in the slots that move.
	hist := lintest.RecordFor(t, workers, 256, 0, 6*time.Second)
	if err := <-reshardErr; err != nil {
		t.Fatalf("reshard: %v", err)
	}
	moved, asked, _ := p.Router().Stats()
	t.Logf("router followed %d MOVED, %d ASK", moved, asked)
	if moved+asked == 0 {
		t.Fatalf("no command met a moving slot; the check proves nothing")
	}
	if res := lintest.Check(t, hist); res != porcupine.Ok {
		t.Fatalf("history through the proxy during resharding is %v", res)
	}
}

// startClusterTTLProxy starts a 3-primary cluster and a proxy in front of
// it whose TTL rule makes it wrap writes of sess:* keys in MULTI/EXEC
// with an EXPIRE fix-up.
func startClusterTTLProxy(t *testing.T) (*redistest.Cluster, *proxytest.Proxy) {
	t.Helper()
	c := redistest.StartCluster(t, 3, 0)
	p := proxytest.Start(t, c.Nodes[0], func(cfg *config.Config) {
		cfg.Upstream.Mode = config.ModeCluster
		cfg.Upstream.Seeds = c.Seeds()
		cfg.Policy.TTL = []policy.TTLRule{{Pattern: "sess:*", Required: true, Default: policy.Duration{Duration: time.Hour}}}
	})
	return c, p
}

// TestClusterPolicyFixupsOfASplitMSET: an MSET over several slots is split
// by slot, and with a TTL rule its fix-ups follow each slot's part to its
// node. Wrapped in one MULTI of the proxy's own, it was refused CROSSSLOT
// as a whole and nothing was written, where the same MSET without the rule
// was split and written (found by a cluster probe).
func TestClusterPolicyFixupsOfASplitMSET(t *testing.T) {
	c, p := startClusterTTLProxy(t)
	nc := p.Dial(t)
	direct := c.ClusterClient(t)
	keys := []string{"sess:a", "sess:b", "sess:c", "plain:x", "sess:d"}
	slots := map[int]bool{}
	for _, k := range keys {
		slots[cluster.Slot([]byte(k))] = true
	}
	if len(slots) < 3 {
		t.Fatalf("keys %v fall in %d slots; the test needs them spread", keys, len(slots))
	}
	// One key had a TTL of its own: MSET clears it, and the fix-up gives
	// the rule's default again, as for a key written without one.
	if err := direct.Set(ctx, "sess:c", "old", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	args := []string{"MSET"}
	for i, k := range keys {
		args = append(args, k, fmt.Sprint("v", i))
	}
	// Pipelined with reads of the keys behind it, in one write.
	batch := resp.AppendCommandStrings(nil, args...)
	batch = resp.AppendCommandStrings(batch, "GET", "sess:a")
	batch = resp.AppendCommandStrings(batch, "MGET", "sess:d", "plain:x", "sess:b")
	if _, err := nc.Write(batch); err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"+OK\r\n", "$2\r\nv0\r\n", "*3\r\n$2\r\nv4\r\n$2\r\nv3\r\n$2\r\nv1\r\n"} {
		if got := rawRead(t, nc); got != want {
			t.Fatalf("reply %d = %q, want %q", i, got, want)
		}
	}
	for i, k := range keys {
		if v := direct.Get(ctx, k).Val(); v != fmt.Sprint("v", i) {
			t.Errorf("%s = %q on its node, want v%d", k, v, i)
		}
		ttl := direct.TTL(ctx, k).Val()
		switch {
		case strings.HasPrefix(k, "sess:") && (ttl <= time.Minute || ttl > time.Hour):
			t.Errorf("%s has TTL %v on its node, want the rule's hour", k, ttl)
		case !strings.HasPrefix(k, "sess:") && ttl != -1:
			t.Errorf("%s has TTL %v, want none (no rule)", k, ttl)
		}
	}
	if n := counterSum(t, p, "redproxy_policy_fixup_failures_total", "", ""); n != 0 {
		t.Errorf("%v fix-ups failed", n)
	}
}

// TestRoutesClusterUpstreamSplitMSETWithFixups: an MSET whose keys all
// route to one named upstream that is a cluster, over several of its
// slots, is split by slot with a TTL rule as without one. splitWrite first
// looked at the routes only, and wrapped it in one MULTI: CROSSSLOT,
// nothing written (found by review).
func TestRoutesClusterUpstreamSplitMSETWithFixups(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	def := redistest.Start(t)
	withRule := func(rule bool) *proxytest.Proxy {
		return proxytest.Start(t, def, func(c *config.Config) {
			routeBigToCluster(c, cl)
			if rule {
				c.Policy.TTL = []policy.TTLRule{{Pattern: "big:sess*", Required: true, Default: policy.Duration{Duration: time.Hour}}}
			}
		})
	}
	keys := []string{"big:sess1", "big:sess2", "big:sess3", "big:other"}
	slots := map[int]bool{}
	for _, k := range keys {
		slots[cluster.Slot([]byte(k))] = true
	}
	t.Logf("%d slots", len(slots))
	for _, rule := range []bool{false, true} {
		p := withRule(rule)
		nc := dialAddr(t, p.Addr)
		args := []string{"MSET"}
		for i, k := range keys {
			args = append(args, k, fmt.Sprint("v", i, rule))
		}
		rawSend(t, nc, args...)
		got := rawRead(t, nc)
		t.Logf("TTL rule %v: MSET -> %q", rule, got)
		if got != "+OK\r\n" {
			t.Errorf("TTL rule %v: MSET over the cluster route's slots: %q, want +OK", rule, got)
		}
		cc := cl.ClusterClient(t)
		for i, k := range keys {
			v := cc.Get(ctx, k).Val()
			ttl := cc.TTL(ctx, k).Val()
			t.Logf("  %s = %q ttl %v", k, v, ttl)
			if v != fmt.Sprint("v", i, rule) {
				t.Errorf("TTL rule %v: %s = %q", rule, k, v)
			}
			if rule && strings.HasPrefix(k, "big:sess") && ttl <= 0 {
				t.Errorf("%s has no TTL", k)
			}
		}
	}
}

// TestClusterSplitMSETPartRefusedRunsNoFixup: a split MSET whose part on
// one node is refused (OOM) runs none of that part's fix-ups: the key
// keeps its old value and no TTL, as with one slot, where the proxy's
// MULTI aborts. Sent unwrapped behind the part, the fix-up gave the old
// value the rule's TTL (found by review).
func TestClusterSplitMSETPartRefusedRunsNoFixup(t *testing.T) {
	c, p := startClusterTTLProxy(t)
	direct := c.ClusterClient(t)
	for _, split := range []bool{false, true} {
		keys := []string{"{a}sess:1", "{a}sess:2"}
		if split {
			keys = []string{"sess:a", "sess:b", "sess:c", "sess:d"}
		}
		victim := keys[0]
		if err := direct.Set(ctx, victim, "old", 0).Err(); err != nil {
			t.Fatal(err)
		}
		owner := nodeAt(t, c, p.Router().Map().Owner(cluster.Slot([]byte(victim))))
		oc := owner.Client(t)
		if err := oc.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
			t.Fatal(err)
		}
		nc := p.Dial(t)
		args := []string{"MSET"}
		for _, k := range keys {
			args = append(args, k, "new")
		}
		rawSend(t, nc, args...)
		got := rawRead(t, nc)
		oc.ConfigSet(ctx, "maxmemory", "0")
		v := direct.Get(ctx, victim).Val()
		ttl := direct.TTL(ctx, victim).Val()
		t.Logf("split %v: MSET -> %q; %s = %q, TTL %v", split, got, victim, v, ttl)
		if v == "old" && ttl > 0 {
			t.Errorf("split %v: the MSET failed on %s's node (%q), its value is the old one, and yet it was given the rule's TTL (%v)", split, victim, got, ttl)
		}
		direct.Del(ctx, victim)
	}
}

// TestClusterSplitMSETTryAgainRunsNoFixup: during a slot migration, a
// split MSET's part with two keys of the migrating slot, one still on the
// source and one not, is answered TRYAGAIN; the fix-up of the key still on
// the source must not run there on its old value (it did, unwrapped;
// found by review).
func TestClusterSplitMSETTryAgainRunsNoFixup(t *testing.T) {
	c, p := startClusterTTLProxy(t)
	direct := c.ClusterClient(t)
	m := p.Router().Map()
	x, y := "sess:{t}x", "sess:{t}y"
	slot := cluster.Slot([]byte(x))
	src := nodeAt(t, c, m.Owner(slot))
	var dst *redistest.Server
	for _, n := range c.Nodes {
		if n != src {
			dst = n
			break
		}
	}
	other := ""
	for i := 0; ; i++ {
		k := fmt.Sprint("sess:o", i)
		if cluster.Slot([]byte(k)) != slot {
			other = k
			break
		}
	}
	if err := direct.Set(ctx, x, "old", 0).Err(); err != nil {
		t.Fatal(err)
	}
	srcID, dstID := redistest.NodeID(t, src), redistest.NodeID(t, dst)
	if err := dst.Client(t).Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID).Err(); err != nil {
		t.Fatal(err)
	}
	if err := src.Client(t).Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID).Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		src.Client(t).Do(ctx, "CLUSTER", "SETSLOT", slot, "STABLE")
		dst.Client(t).Do(ctx, "CLUSTER", "SETSLOT", slot, "STABLE")
	})
	nc := p.Dial(t)
	rawSend(t, nc, "MSET", x, "new", y, "new", other, "new")
	got := rawRead(t, nc)
	v := src.Client(t).Get(ctx, x).Val()
	ttl := src.Client(t).TTL(ctx, x).Val()
	t.Logf("MSET -> %q; %s = %q TTL %v on the source", got, x, v, ttl)
	if v == "old" && ttl > 0 {
		t.Errorf("the MSET's part was not applied (%q), and the old value of %s got the rule's TTL %v", got, x, ttl)
	}
}
