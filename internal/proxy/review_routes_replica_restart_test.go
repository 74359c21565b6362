package proxy_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/redistest"
)

// TestReviewReplicaRestartServesOldDataset: a replica that restarts
// (crash, deploy) comes back with an old dataset (its last RDB) and serves
// it while its full sync is pending (replica-serve-stale-data yes, Redis's
// default; master_link_status:down).
// The proxy's pools reconnect to it in the background at once, but its
// replica view (offset, link up) is the one of the last poll, taken before
// the restart, so until the next poll the client's reads go to a replica
// that has none of its acknowledged writes: GET of a key the same client
// SET (and had read back from that very replica) answers nil.
func TestReviewReplicaRestartServesOldDataset(t *testing.T) {
	stale, reads, first, served := restartedReplicaReads(t)
	if stale > 0 {
		t.Fatalf("%d of %d reads after the replica restarted did not see the client's acknowledged SET k v (first: %s); the restarted replica served %d GETs", stale, reads, first, served)
	}
}

func restartedReplicaReads(t *testing.T, replicaArgs ...string) (bad, reads int, first string, onReplica int) {
	t.Helper()
	g := &replicated{primary: redistest.Start(t, "--repl-diskless-sync-delay", "0")}
	g.replicas = append(g.replicas, redistest.Start(t, append([]string{"--replicaof", "127.0.0.1", strconv.Itoa(g.primary.Port())}, replicaArgs...)...))
	redistest.Eventually(t, 20*time.Second, func() bool {
		info, err := g.primary.Client(t).Info(context.Background(), "replication").Result()
		return err == nil && strings.Contains(info, "state=online")
	}, "replica never came online")
	ctx := context.Background()
	p := g.proxy(t, config.ReadReplicaPreferred, func(c *config.Config) {
		c.Upstream.ReplicaPollInterval = units.Duration{Duration: 2 * time.Second}
		c.Upstream.Connections = 1
		c.Upstream.MaxReplicaLag = units.Duration{Duration: 10 * time.Second}
		c.Upstream.ReconnectMin = units.Duration{Duration: 10 * time.Millisecond}
		c.Upstream.ReconnectMax = units.Duration{Duration: 50 * time.Millisecond}
	})
	redistest.Eventually(t, 10*time.Second, func() bool { return p.UsableReplicas() == 1 }, "replica never usable")
	c := p.Client(t, func(o *redis.Options) { o.PoolSize = 1; o.MaxRetries = -1 })
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// The client's own write is read back from the replica once a poll
	// saw the replica apply it.
	resetStats(t, g.replicas[0])
	redistest.Eventually(t, 10*time.Second, func() bool {
		if v, err := c.Get(ctx, "k").Result(); err != nil || v != "v" {
			t.Fatalf("GET k = %q, %v before the restart", v, err)
		}
		return calls(t, g.replicas[0], "get") > 0
	}, "the replica never served the client's read")
	// The replica restarts from the RDB of its first sync (taken before
	// the client's SET) and then needs a full sync: the primary's backlog
	// no longer covers its offset. That sync is held back a few seconds
	// (as a large dataset's would take): meanwhile the replica serves its
	// old dataset (replica-serve-stale-data yes, Redis's default).
	pc := g.primary.Client(t)
	if err := pc.ConfigSet(ctx, "repl-backlog-size", "16384").Err(); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if err := pc.Set(ctx, "filler", strings.Repeat("x", 32<<10+i), 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := pc.ConfigSet(ctx, "repl-diskless-sync-delay", "5").Err(); err != nil {
		t.Fatal(err)
	}
	// Restart right after a poll, so the stale view has its whole interval.
	before := p.ReplicaViewStarted()
	redistest.Eventually(t, 5*time.Second, func() bool { return p.ReplicaViewStarted().After(before) }, "no new poll")
	g.replicas[0].Restart(t)
	// The proxy's pool to the replica reconnects by itself (no read
	// failed: none was in flight).
	rc := g.replicas[0].Client(t)
	redistest.Eventually(t, time.Second, func() bool {
		info := rc.Info(ctx, "clients").Val()
		return strings.Contains(info, "connected_clients:") && !strings.Contains(info, "connected_clients:1\r")
	}, "the proxy never reconnected to the restarted replica")
	stale := 0
	for until := time.Now().Add(900 * time.Millisecond); time.Now().Before(until); {
		v, err := c.Get(ctx, "k").Result()
		reads++
		if v != "v" {
			if stale++; stale == 1 {
				first = "GET k = " + v + " err=" + errString(err)
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	return stale, reads, first, calls(t, g.replicas[0], "get")
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// TestReviewReplicaMasterDownReachesClient: a replica set to
// replica-serve-stale-data no answers reads -MASTERDOWN as soon as its
// link to the primary is down (here: it is pointed at a primary that does
// not answer, as a partition between the two would do). Until the next
// poll sees the link down, the proxy keeps sending reads there, and with
// read_from = "replica_preferred" hands the replica's -MASTERDOWN to the
// client as the GET's reply instead of asking the primary, which holds
// the value. README: "A replica that fails a read ... with
// replica_preferred the read goes to the primary"; cluster mode does
// treat -MASTERDOWN and -LOADING from a replica so (cluster/router.go).
func TestReviewReplicaMasterDownReachesClient(t *testing.T) {
	g := &replicated{primary: redistest.Start(t, "--repl-diskless-sync-delay", "0")}
	g.replicas = append(g.replicas, redistest.Start(t, "--replicaof", "127.0.0.1", strconv.Itoa(g.primary.Port()), "--replica-serve-stale-data", "no"))
	ctx := context.Background()
	redistest.Eventually(t, 20*time.Second, func() bool {
		info, err := g.primary.Client(t).Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "state=online")
	}, "replica never came online")
	p := g.proxy(t, config.ReadReplicaPreferred, func(c *config.Config) {
		c.Upstream.ReplicaPollInterval = units.Duration{Duration: 2 * time.Second}
		c.Upstream.MaxReplicaLag = units.Duration{Duration: 10 * time.Second}
	})
	redistest.Eventually(t, 10*time.Second, func() bool { return p.UsableReplicas() == 1 }, "replica never usable")
	c := p.Client(t, func(o *redis.Options) { o.PoolSize = 1; o.MaxRetries = -1 })
	if err := g.primary.Client(t).Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	resetStats(t, g.replicas[0])
	redistest.Eventually(t, 10*time.Second, func() bool {
		if v, err := c.Get(ctx, "k").Result(); err != nil || v != "v" {
			return false
		}
		return calls(t, g.replicas[0], "get") > 0
	}, "the replica never served a read")
	dead := redistest.FreePort(t)
	before := p.ReplicaViewStarted()
	redistest.Eventually(t, 5*time.Second, func() bool { return p.ReplicaViewStarted().After(before) }, "no new poll")
	if err := g.replicas[0].Client(t).SlaveOf(ctx, "127.0.0.1", strconv.Itoa(dead)).Err(); err != nil {
		t.Fatal(err)
	}
	bad, reads := 0, 0
	first := ""
	for until := time.Now().Add(500 * time.Millisecond); time.Now().Before(until); {
		v, err := c.Get(ctx, "k").Result()
		reads++
		if v != "v" {
			if bad++; bad == 1 {
				first = "GET k = " + v + " err=" + errString(err)
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	if bad > 0 {
		t.Fatalf("%d of %d GETs failed while the primary holds k (first: %s)", bad, reads, first)
	}
}
