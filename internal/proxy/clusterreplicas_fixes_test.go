package proxy_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/cluster"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/proxy"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// The cluster-mode twins of three standalone replica-read fixes, whose
// cluster paths (clusterreplicas.go, cluster/router.go) were reasoned
// about but not run: a lost replica connection
// (TestReviewReplicaRestartServesOldDataset), a replica answering
// -MASTERDOWN (TestReviewReplicaMasterDownReachesClient), and a write made
// on a relay (TestReviewRelayedWriteNotReadYourWritesNoRoutes).

// waitClusterPoll waits until every shard's replica view is from a poll
// started after now, so what follows has a whole poll interval before the
// proxy looks at the replicas again.
func waitClusterPoll(t *testing.T, p *proxytest.Proxy) {
	t.Helper()
	now := time.Now()
	redistest.Eventually(t, 10*time.Second, func() bool { return p.ClusterReplicaViewStarted().After(now) }, "no new poll of every shard")
}

// readsFor runs read back to back for d and counts the reads whose answer
// was not want; first describes the first of them.
func readsFor(d time.Duration, want string, read func() (string, error)) (bad, reads int, first string) {
	for until := time.Now().Add(d); time.Now().Before(until); {
		v, err := read()
		reads++
		if v != want || err != nil {
			if bad++; bad == 1 {
				first = strings.ReplaceAll(v, "\r\n", " ") + " err=" + errString(err)
			}
		}
	}
	return bad, reads, first
}

// readOnlyClient is a client of cluster node s whose connections are in
// READONLY mode, as the proxy's to a replica are: a replica answers their
// reads of its primary's slots instead of MOVED.
func readOnlyClient(t *testing.T, s *redistest.Server) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, OnConnect: func(ctx context.Context, cn *redis.Conn) error {
		return cn.ReadOnly(ctx).Err()
	}})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// rejectedCalls is INFO commandstats' count of cmd refused by s before it
// ran (-MASTERDOWN among them), which calls does not count.
func rejectedCalls(t *testing.T, s *redistest.Server, cmd string) int {
	t.Helper()
	return commandStat(t, s, cmd, "rejected_calls")
}

// TestClusterReplicaRestartServesOldDataset: the cluster twin of
// TestReviewReplicaRestartServesOldDataset. A shard's replica restarts
// and comes back with the RDB of its first sync, which lacks the client's
// acknowledged SET, serving it while its full sync is held back; the
// proxy's pool to it redials at once, and the shard's replica view is
// the poll's from before the restart. The lost connection must make the
// replica unusable (replicaSet.connLost, wired for cluster shards through
// replicaSet.sync) until a later poll finds it in sync: no GET of the
// client's key may answer the old dataset's nil.
func TestClusterReplicaRestartServesOldDataset(t *testing.T) {
	p, cl, replica := clusterShardBeforeRestart(t)
	ctx := context.Background()
	// Restart right after a poll, so the stale view has its whole interval.
	waitClusterPoll(t, p)
	replica.Restart(t)
	rc := restartedWithOldDataset(t, replica)
	// The proxy reconnects to it by itself (no read failed: none was in
	// flight): one connection is the test's, more are the proxy's.
	redistest.Eventually(t, 2*time.Second, func() bool {
		info := rc.Info(ctx, "clients").Val()
		return strings.Contains(info, "connected_clients:") && !strings.Contains(info, "connected_clients:1\r")
	}, "the proxy never reconnected to the restarted replica")
	stale, reads, first := readsFor(900*time.Millisecond, "v", func() (string, error) { return cl.Get(ctx, "k").Result() })
	if stale > 0 {
		t.Fatalf("%d of %d reads after the shard's replica restarted did not see the client's acknowledged SET k v (first: %s); the restarted replica served %d GETs",
			stale, reads, first, calls(t, replica, "get"))
	}
}

// TestClusterReplicaReconnectedDuringReadNotUsed: the other half of the
// lost-connection fix, a read picked before the loss: the shard's replica
// is picked for the client's GET (the view says it has the client's SET),
// then restarts with its old dataset and the proxy's connection to it is
// redialled, and only then is the GET sent, on the new connection. Its
// reply (nil) must not be used: the primary answers (standalone:
// readOnReplica's failedSince check; cluster: Reads.Reconnected).
func TestClusterReplicaReconnectedDuringReadNotUsed(t *testing.T) {
	p, cl, replica := clusterShardBeforeRestart(t)
	ctx := context.Background()
	dialsBefore, up, ok := p.ClusterReplicaConn(replica.Addr())
	if !ok || !up {
		t.Fatalf("the proxy has no connection to %s (known: %v, up: %v)", replica.Addr(), ok, up)
	}
	picked, goOn := make(chan struct{}), make(chan struct{})
	// The session's read is let go however the test ends, so the proxy
	// can shut down.
	letGo := sync.OnceFunc(func() { close(goOn) })
	defer letGo()
	var once sync.Once
	restore := proxy.SetTestClusterPicked(func(addr string) {
		if addr != replica.Addr() {
			return
		}
		once.Do(func() {
			close(picked)
			<-goOn // the session's read waits here, picked and unsent
		})
	})
	defer restore()
	type result struct {
		v   string
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := cl.Get(ctx, "k").Result()
		done <- result{v, err}
	}()
	select {
	case <-picked:
	case r := <-done:
		t.Fatalf("GET k = %q, %v without picking the replica", r.v, r.err)
	case <-time.After(10 * time.Second):
		t.Fatal("the replica was never picked for the GET")
	}
	replica.Restart(t)
	restartedWithOldDataset(t, replica)
	// The proxy's connection the GET goes on (its RESP2 pool's one,
	// Connections = 1, which the polls share) is redialled and up: until
	// then the GET would fail to send and go to the primary without
	// meeting the restarted replica.
	redistest.Eventually(t, 5*time.Second, func() bool {
		dials, up, _ := p.ClusterReplicaConn(replica.Addr())
		return dials > dialsBefore && up
	}, "the proxy never reconnected to the restarted replica")
	letGo()
	var r result
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the GET never finished")
	}
	if r.v != "v" || r.err != nil {
		t.Fatalf("GET k = %q, %v; want \"v\", the client's acknowledged SET (a read picked before the replica restarted was answered by its old dataset)", r.v, errString(r.err))
	}
	// The GET did reach the restarted replica (its first GET was the
	// test's own), so the primary's answer is the fix's doing.
	if n := calls(t, replica, "get"); n < 2 {
		t.Fatalf("the restarted replica ran %d GETs: the proxy's never reached it, so this test checked nothing", n)
	}
}

// clusterShardBeforeRestart starts a 3+3 cluster and a proxy reading
// replica_preferred with polls 2 s apart, has a client SET k v and read it
// back from k's replica, then makes that replica's next start need a
// full sync that k's primary holds back 5 s: a restarted replica then
// serves the RDB of its first sync, without k, meanwhile.
func clusterShardBeforeRestart(t *testing.T) (p *proxytest.Proxy, cl *redis.Client, replica *redistest.Server) {
	t.Helper()
	c, p := startClusterReplicaProxy(t, config.ReadReplicaPreferred, func(cfg *config.Config) {
		// Polls far apart, so a stale view would last long enough to be
		// seen; one connection per pool, redialled as fast as it can be.
		cfg.Upstream.ReplicaPollInterval = units.Duration{Duration: 2 * time.Second}
		cfg.Upstream.Connections = 1
		cfg.Upstream.MaxReplicaLag = units.Duration{Duration: 10 * time.Second}
		cfg.Upstream.ReconnectMin = units.Duration{Duration: 10 * time.Millisecond}
		cfg.Upstream.ReconnectMax = units.Duration{Duration: 50 * time.Millisecond}
	})
	ctx := context.Background()
	primary, replica := shardOf(t, c, "k")
	// RESP2, as the proxy's polls: the replica's reads and polls share
	// its one connection.
	cl = p.Client(t, func(o *redis.Options) { o.PoolSize = 1; o.MaxRetries = -1; o.Protocol = 2 })
	if err := cl.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// The client's own write is read back from the replica once a poll
	// saw the replica apply it.
	resetStats(t, replica)
	redistest.Eventually(t, 10*time.Second, func() bool {
		if v, err := cl.Get(ctx, "k").Result(); err != nil || v != "v" {
			t.Fatalf("GET k = %q, %v before the restart", v, err)
		}
		return calls(t, replica, "get") > 0
	}, "the replica never served the client's read")
	// The replica's RDB is from the cluster's creation (its first full
	// sync), before the SET. With the primary's backlog overrun it needs
	// a full sync again, held back 5 s as a large dataset's would be:
	// meanwhile it serves that old dataset (replica-serve-stale-data yes).
	pc := primary.Client(t)
	if err := pc.ConfigSet(ctx, "repl-backlog-size", "16384").Err(); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		// {k}: the slot of k, so the primary takes it.
		if err := pc.Set(ctx, "{k}filler", strings.Repeat("x", 32<<10+i), 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := pc.ConfigSet(ctx, "repl-diskless-sync-delay", "5").Err(); err != nil {
		t.Fatal(err)
	}
	return p, cl, replica
}

// restartedWithOldDataset checks that the restarted replica serves its
// old dataset to READONLY clients (else the test would check nothing) and
// returns the test's client of it.
func restartedWithOldDataset(t *testing.T, replica *redistest.Server) *redis.Client {
	t.Helper()
	rc := readOnlyClient(t, replica)
	if v, err := rc.Get(context.Background(), "k").Result(); err != redis.Nil {
		t.Fatalf("the restarted replica answers GET k = %q, %v; want nil (its old dataset), else this test checks nothing", v, err)
	}
	return rc
}

// TestClusterReplicaMasterDownFallsBack: the cluster twin of
// TestReviewReplicaMasterDownReachesClient. A shard's replica with
// replica-serve-stale-data no whose link to its primary goes down
// answers reads -MASTERDOWN; until the next poll sees the link down the
// proxy still picks it, and with replica_preferred the read must go to the
// primary (cluster/router.go, replicaFailed), which holds the value, not
// hand the -MASTERDOWN to the client.
func TestClusterReplicaMasterDownFallsBack(t *testing.T) {
	primary, replica, cl := cutOffClusterReplica(t, config.ReadReplicaPreferred)
	ctx := context.Background()
	resetStats(t, primary)
	bad, reads, first := readsFor(500*time.Millisecond, "v", func() (string, error) { return cl.Get(ctx, "k").Result() })
	if bad > 0 {
		t.Fatalf("%d of %d GETs failed while the shard's primary holds k (first: %s)", bad, reads, first)
	}
	if n := calls(t, primary, "get"); n == 0 {
		t.Fatal("the primary answered no GET: the reads never met the cut-off replica")
	}
	if n := rejectedCalls(t, replica, "get"); n == 0 {
		t.Fatal("the cut-off replica refused no GET: the poll saw it first, so this test checked nothing")
	}
}

// TestClusterReplicaOnlyMasterDownKeepsCode: with read_from = "replica"
// a read the replica answered -MASTERDOWN fails, and the client gets the
// replica's error as Redis sent it, as in standalone mode
// (docs/COMPATIBILITY.md, "Failures"): its error code is what a client
// decides on (retry later, another node), and the router used to answer
// "-ERR MASTERDOWN ..." instead.
func TestClusterReplicaOnlyMasterDownKeepsCode(t *testing.T) {
	primary, replica, cl := cutOffClusterReplica(t, config.ReadReplica)
	ctx := context.Background()
	resetStats(t, primary)
	// The first read meets the cut-off replica, which is then skipped
	// (no other replica: the later reads are refused).
	err := cl.Get(ctx, "k").Err()
	if err == nil || !strings.HasPrefix(err.Error(), "MASTERDOWN ") {
		t.Fatalf("GET k on the cut-off replica: %v; want the replica's -MASTERDOWN as Redis sent it", errString(err))
	}
	if n := rejectedCalls(t, replica, "get"); n != 1 {
		t.Fatalf("the replica refused %d GETs, want 1", n)
	}
	if n := calls(t, primary, "get"); n != 0 {
		t.Fatalf("the primary ran %d GETs with read_from = replica", n)
	}
}

// cutOffClusterReplica starts a 3+3 cluster and a proxy reading from
// replicas as readFrom says, polled 2 s apart; once a client's GET k was
// answered by k's replica, and right after a poll, it cuts that replica
// off its primary with replica-serve-stale-data no, so it answers reads
// -MASTERDOWN while the proxy's view still has it usable. It returns k's
// primary and replica, and the client (RESP2, one connection, no retry).
func cutOffClusterReplica(t *testing.T, readFrom string) (primary, replica *redistest.Server, cl *redis.Client) {
	t.Helper()
	c, p := startClusterReplicaProxy(t, readFrom, func(cfg *config.Config) {
		cfg.Upstream.ReplicaPollInterval = units.Duration{Duration: 2 * time.Second}
		cfg.Upstream.MaxReplicaLag = units.Duration{Duration: 10 * time.Second}
	})
	ctx := context.Background()
	if err := c.ClusterClient(t).Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	primary, replica = shardOf(t, c, "k")
	cl = p.Client(t, func(o *redis.Options) { o.PoolSize = 1; o.MaxRetries = -1; o.Protocol = 2 })
	resetStats(t, replica)
	redistest.Eventually(t, 10*time.Second, func() bool {
		v, err := cl.Get(ctx, "k").Result()
		return err == nil && v == "v" && calls(t, replica, "get") > 0
	}, "the replica never served a read")
	waitClusterPoll(t, p)
	// A partition between the replica and its primary, made on the
	// replica (REPLICAOF is refused in cluster mode): it stops serving
	// stale data, its link is dropped, and its reconnections are refused
	// by the primary (a user the primary does not have).
	rc := readOnlyClient(t, replica)
	for _, kv := range [][2]string{{"replica-serve-stale-data", "no"}, {"masteruser", "nosuch"}, {"masterauth", "nosuch"}} {
		if err := rc.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := rc.Do(ctx, "CLIENT", "KILL", "TYPE", "master").Err(); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, time.Second, func() bool {
		err := rc.Get(ctx, "k").Err()
		return err != nil && strings.HasPrefix(err.Error(), "MASTERDOWN")
	}, "the replica never answered MASTERDOWN")
	resetStats(t, replica)
	return primary, replica, cl
}

// TestClusterRelayedWriteReadYourWrites: the cluster twin of
// TestReviewRelayedWriteNotReadYourWritesNoRoutes. A RESP3 client
// subscribed (the relay runs on the primary of slot 0) writes a key of
// that node's slots, unsubscribes, and is handed back to the shared path:
// its GET of the key must not be served by the shard's replica, held back
// so that it lacks the write (relayWrites.end, replicaRelayWrote, which
// in cluster mode makes every shard's reads wait for a fresh poll).
func TestClusterRelayedWriteReadYourWrites(t *testing.T) {
	c, p := startClusterReplicaProxy(t, config.ReadReplicaPreferred, func(cfg *config.Config) {
		cfg.Upstream.MaxReplicaLag = units.Duration{Duration: 10 * time.Second}
	})
	ctx := context.Background()
	// A key of slot 0, on the node SUBSCRIBE relays to: a command on the
	// relay for a key another node serves is refused.
	key := cluster.KeyInSlot("rw", 0)
	primary, replica := shardOf(t, c, key)
	if owner := p.Router().Map().Owner(0); owner != primary.Addr() {
		t.Fatalf("slot 0 is %s's per the proxy, %s's per the cluster", owner, primary.Addr())
	}
	nc := p.Dial(t)
	roundTrip := rawRoundTrip(t, nc)
	roundTrip(1, []string{"HELLO", "3"})
	roundTrip(1, []string{"SET", key, "old"})
	before := calls(t, replica, "get")
	redistest.Eventually(t, 10*time.Second, func() bool {
		got := roundTrip(1, []string{"GET", key})[0]
		return strings.Contains(got, "old") && calls(t, replica, "get") > before
	}, "the replica never served this client")
	release := holdReplication(t, replica, primary)
	defer release()
	out := roundTrip(3, []string{"SUBSCRIBE", "news"}, []string{"SET", key, "new"}, []string{"UNSUBSCRIBE", "news"})
	if !strings.Contains(out[1], "OK") {
		t.Fatalf("SET on the relay: %q", out)
	}
	if v, _ := primary.Client(t).Get(ctx, key).Result(); v != "new" {
		t.Fatalf("primary has %s = %q", key, v)
	}
	before = calls(t, replica, "get")
	stale, reads, first := readsFor(300*time.Millisecond, "new", func() (string, error) {
		got := roundTrip(1, []string{"GET", key})[0]
		if strings.Contains(got, "new") {
			return "new", nil
		}
		return got, nil
	})
	if stale > 0 {
		t.Fatalf("%d of %d GET %s after the client's own acknowledged SET %s new (made while subscribed) answered otherwise (first: %s); the held replica served %d",
			stale, reads, key, key, first, calls(t, replica, "get")-before)
	}
}
