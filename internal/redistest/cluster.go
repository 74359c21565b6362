package redistest

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterReadyTimeout bounds how long a fresh cluster may take to agree on
// its slots; on loopback it takes about a second.
const clusterReadyTimeout = 20 * time.Second

// clusterCreateTimeout bounds redis-cli --cluster create.
const clusterCreateTimeout = 2 * time.Minute

// Cluster is a Redis Cluster of real redis-servers owned by a test: every
// node is a Server, so Kill, Freeze and Restart work on them as usual.
type Cluster struct {
	Nodes []*Server
}

// StartCluster starts primaries*(1+replicas) redis-servers with cluster
// support on free loopback ports, joins them with `redis-cli --cluster
// create`, and waits until every node reports cluster_state:ok with all
// 16384 slots assigned. extra are further redis-server arguments for every
// node. t.Cleanup kills the nodes.
func StartCluster(t testing.TB, primaries, replicas int, extra ...string) *Cluster {
	t.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatalf("redistest: redis-cli not found in PATH: %v", err)
	}
	n := primaries * (1 + replicas)
	c := &Cluster{Nodes: make([]*Server, n)}
	args := append([]string{
		"--cluster-enabled", "yes",
		// Relative to --dir, which is the server's own temp dir.
		"--cluster-config-file", "nodes.conf",
		// Short, so failover tests finish quickly; long enough that a
		// loaded 2-core machine does not fail nodes by accident.
		"--cluster-node-timeout", "2000",
		// Replicas sync at once instead of after the default 5 s wait for
		// more replicas: a replica that never synced cannot fail over.
		"--repl-diskless-sync-delay", "0",
	}, extra...)
	var wg sync.WaitGroup
	for i := range c.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.Nodes[i] = Start(t, args...)
		}()
	}
	wg.Wait()
	for _, s := range c.Nodes {
		if s == nil {
			t.FailNow() // Start already reported why
		}
	}
	create := []string{"--cluster", "create"}
	for _, s := range c.Nodes {
		create = append(create, s.Addr())
	}
	create = append(create, "--cluster-replicas", fmt.Sprint(replicas), "--cluster-yes")
	// Bounded: a create whose nodes never agree waits for the cluster to
	// join for ever, and the package's 20-minute timeout was the first
	// to end it (CI).
	ctx, cancel := context.WithTimeout(context.Background(), clusterCreateTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, cli, create...).CombinedOutput()
	if err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	c.WaitHealthy(t)
	return c
}

// StartTLSCluster is StartCluster (no replicas) with nodes that also
// listen on TLS (Server.TLSAddr, certs' server certificate, no client
// certificates required of clients) and talk to each other over TLS
// (tls-cluster yes): CLUSTER SHARDS then names each node's "tls-port"
// apart from its plaintext "port", which stays open for the test's own
// checks. The cluster bus always asks for a client certificate, whatever
// tls-auth-clients says, so the nodes present certs' client certificate
// there (the server one, for servers only, left the nodes unable to meet).
func StartTLSCluster(t testing.TB, certs *Certs, primaries int) *Cluster {
	t.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatalf("redistest: redis-cli not found in PATH: %v", err)
	}
	c := &Cluster{Nodes: make([]*Server, primaries)}
	args := []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000",
		"--tls-cluster", "yes", "--tls-replication", "yes",
		"--tls-client-cert-file", certs.ClientCert, "--tls-client-key-file", certs.ClientKey}
	for i := range c.Nodes {
		if c.Nodes[i] = StartTLS(t, certs, "no", args...); c.Nodes[i] == nil {
			t.FailNow()
		}
	}
	create := []string{"--tls", "--cacert", certs.CAFile, "--cluster", "create"}
	for _, s := range c.Nodes {
		create = append(create, s.TLSAddr())
	}
	create = append(create, "--cluster-replicas", "0", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), clusterReadyTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, cli, create...)
	cmd.WaitDelay = time.Second // redis-cli's output pipe must not hold the test
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("redistest: redis-cli --cluster create over TLS: %v\n%s", err, out)
	}
	c.WaitHealthy(t)
	return c
}

// Seeds are the addresses of every node.
func (c *Cluster) Seeds() []string {
	addrs := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		addrs[i] = s.Addr()
	}
	return addrs
}

// WaitHealthy waits until every node that answers says cluster_state:ok
// with all slots served, every node agrees on who owns the slots, and
// every replica's link to its primary is up (so it could take over).
func (c *Cluster) WaitHealthy(t testing.TB) {
	t.Helper()
	var last string
	Eventually(t, clusterReadyTimeout, func() bool {
		ok, why := c.healthy()
		last = why
		return ok
	}, "cluster not healthy: %v", lazyString(func() string { return last }))
}

// lazyString is formatted when printed, so a failure message can say what
// was seen last rather than what was known when the wait began.
type lazyString func() string

func (f lazyString) String() string { return f() }

func (c *Cluster) healthy() (bool, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var views []string
	for _, s := range c.Nodes {
		if s.Port() == 0 || !ping(s.Addr()) {
			continue
		}
		rc := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
		info, err := rc.ClusterInfo(ctx).Result()
		if err != nil {
			rc.Close()
			return false, fmt.Sprintf("%s: CLUSTER INFO: %v", s.Addr(), err)
		}
		if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_slots_ok:16384") {
			rc.Close()
			return false, fmt.Sprintf("%s: %s", s.Addr(), strings.ReplaceAll(info, "\r\n", " "))
		}
		repl, err := rc.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up") {
			rc.Close()
			return false, fmt.Sprintf("%s: replica not synced with its primary", s.Addr())
		}
		slots, err := rc.ClusterSlots(ctx).Result()
		rc.Close()
		if err != nil {
			return false, fmt.Sprintf("%s: CLUSTER SLOTS: %v", s.Addr(), err)
		}
		views = append(views, slotsView(slots))
	}
	for _, v := range views[1:] {
		if v != views[0] {
			return false, "nodes disagree on the slot owners"
		}
	}
	return len(views) > 0, ""
}

// slotsView is a canonical text of who owns which slots, to compare views.
func slotsView(slots []redis.ClusterSlot) string {
	lines := make([]string, 0, len(slots))
	for _, s := range slots {
		primary := ""
		if len(s.Nodes) > 0 {
			primary = s.Nodes[0].Addr
		}
		lines = append(lines, fmt.Sprintf("%05d-%05d %s", s.Start, s.End, primary))
	}
	// CLUSTER SLOTS lists ranges in no guaranteed order.
	sortStrings(lines)
	return strings.Join(lines, ";")
}

func sortStrings(a []string) {
	for i := 1; i < len(a); i++ {
		for j := i; j > 0 && a[j] < a[j-1]; j-- {
			a[j], a[j-1] = a[j-1], a[j]
		}
	}
}

// Primaries returns the nodes that are primaries right now, in the order of
// c.Nodes.
func (c *Cluster) Primaries(t testing.TB) []*Server {
	t.Helper()
	return c.withRole(t, "master")
}

// Replicas returns the nodes that are replicas right now.
func (c *Cluster) Replicas(t testing.TB) []*Server {
	t.Helper()
	return c.withRole(t, "slave")
}

func (c *Cluster) withRole(t testing.TB, role string) []*Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var out []*Server
	for _, s := range c.Nodes {
		if !ping(s.Addr()) {
			continue
		}
		rc := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
		r, err := rc.Do(ctx, "ROLE").Slice()
		rc.Close()
		if err != nil || len(r) == 0 {
			continue
		}
		if name, _ := r[0].(string); name == role {
			out = append(out, s)
		}
	}
	return out
}

// ClusterClient returns a cluster-aware go-redis client for checking what
// the cluster holds, bypassing the proxy; closed on cleanup.
func (c *Cluster) ClusterClient(t testing.TB) *redis.ClusterClient {
	t.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Seeds()})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// PromoteReplica makes replica its shard's primary with CLUSTER FAILOVER
// and waits, up to 30 s, until it reports itself one. A manual failover
// that does not complete within Redis's own 5 s (the primary must pause
// and the replica catch up, slow under -race and load) is aborted and the
// replica stays one, so it is asked again every 6 s.
func PromoteReplica(t testing.TB, replica *Server) error {
	t.Helper()
	rc := redis.NewClient(&redis.Options{Addr: replica.Addr(), MaxRetries: -1})
	defer rc.Close()
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	var lastAsk time.Time
	for time.Now().Before(deadline) {
		r, err := rc.Do(ctx, "ROLE").Slice()
		if err == nil && len(r) > 0 && r[0] == "master" {
			return nil
		}
		if time.Since(lastAsk) > 6*time.Second {
			if err := rc.Do(ctx, "CLUSTER", "FAILOVER").Err(); err != nil {
				t.Logf("CLUSTER FAILOVER on %s: %v", replica.Addr(), err)
			}
			lastAsk = time.Now()
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("the replica %s never became primary", replica.Addr())
}

// RemovePrimary takes primary victim out of the cluster as redis-cli
// --cluster del-node does once a node is empty: its slots (given, as the
// caller's map shows them; their keys are not moved) go to dst, then the
// victim is reset and every other node forgets it. dst takes the highest
// config epoch first, so that its claim on the slots wins over the
// victim's in gossip (redis-cli does the same).
func (c *Cluster) RemovePrimary(t testing.TB, victim, dst *Server, slots []int) {
	t.Helper()
	ctx := context.Background()
	if err := dst.Client(t).Do(ctx, "CLUSTER", "BUMPEPOCH").Err(); err != nil {
		t.Fatal(err)
	}
	dstID, victimID := NodeID(t, dst), NodeID(t, victim)
	order := []*Server{dst, victim}
	for _, n := range c.Primaries(t) {
		if n != dst && n != victim {
			order = append(order, n)
		}
	}
	for _, n := range order {
		pipe := n.Client(t).Pipeline()
		for _, s := range slots {
			pipe.Do(ctx, "CLUSTER", "SETSLOT", s, "NODE", dstID)
		}
		if _, err := pipe.Exec(ctx); err != nil && !(n == victim && strings.Contains(err.Error(), "only with masters")) {
			// (The victim may have lost its last slot to dst's claim
			// already, and become its replica.)
			t.Fatalf("SETSLOT on %s: %v", n.Addr(), err)
		}
	}
	c.WaitHealthy(t)
	if err := victim.Client(t).Do(ctx, "CLUSTER", "RESET", "HARD").Err(); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes {
		if n != victim {
			if err := n.Client(t).Do(ctx, "CLUSTER", "FORGET", victimID).Err(); err != nil {
				t.Fatalf("FORGET on %s: %v", n.Addr(), err)
			}
		}
	}
}

// NodeID is s's cluster node ID (CLUSTER MYID).
func NodeID(t testing.TB, s *Server) string {
	t.Helper()
	id, err := s.Client(t).Do(context.Background(), "CLUSTER", "MYID").Text()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// Reshard moves slots slots from node fromID to node toID with
// redis-cli --cluster reshard, asking the cluster through addr; the error
// carries the end of redis-cli's output. It does not use t, so it may run
// on a goroutine of the test's while the test records a history.
func Reshard(addr, fromID, toID string, slots int) error {
	out, err := exec.Command("redis-cli", "--cluster", "reshard", addr,
		"--cluster-from", fromID, "--cluster-to", toID, "--cluster-slots", fmt.Sprint(slots),
		"--cluster-yes", "--cluster-pipeline", "50").CombinedOutput()
	if err != nil {
		return fmt.Errorf("%w\n%s", err, out[max(0, len(out)-2000):])
	}
	return nil
}
