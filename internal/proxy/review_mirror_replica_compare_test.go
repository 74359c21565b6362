package proxy_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/mirror"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// TestReviewMirrorComparesReplicaRepliesAsPrimarys: with read_from =
// "replica_preferred" and [mirror] compare on, a sampled read that a
// lagging replica answered is compared with the mirror's reply as if it
// were the primary's (README "Mirroring": "a sample of reads whose replies
// it compares with the primary's"). The primary and the mirror both hold
// the latest value, yet a mismatch is counted and reported by pattern: the
// migration check flags a divergence that does not exist.
func TestReviewMirrorComparesReplicaRepliesAsPrimarys(t *testing.T) {
	g := startReplicated(t, 1)
	ms := redistest.Start(t)
	p := proxytest.Start(t, g.primary, func(c *config.Config) {
		c.Upstream.ReadFrom = config.ReadReplicaPreferred
		c.Upstream.ReplicaPollInterval = units.Duration{Duration: 20 * time.Millisecond}
		c.Upstream.MaxReplicaLag = units.Duration{Duration: 10 * time.Second}
		c.Upstreams = map[string]config.Upstream{"new": {Address: ms.Addr()}}
		c.Mirror = mirror.DefaultConfig()
		c.Mirror.Upstream = "new"
		c.Mirror.ReadsSample = 1
		c.Mirror.Compare = true
	})
	redistest.Eventually(t, 10*time.Second, func() bool { return p.UsableReplicas() == 1 }, "replica never usable")
	writer := p.Client(t, func(o *redis.Options) { o.PoolSize = 1 })
	if err := writer.Set(ctx, "user:1:name", "v1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	waitMirrored(t, p)
	redistest.Eventually(t, 10*time.Second, func() bool { return g.replicas[0].Client(t).Get(ctx, "user:1:name").Val() == "v1" }, "replica never synced")
	reader := p.Client(t, func(o *redis.Options) { o.PoolSize = 1 }).Conn()
	defer reader.Close()
	release := holdReplication(t, g.replicas[0], g.primary)
	defer release()
	if err := writer.Set(ctx, "user:1:name", "v2", 0).Err(); err != nil {
		t.Fatal(err)
	}
	waitMirrored(t, p)
	if v := ms.Client(t).Get(ctx, "user:1:name").Val(); v != "v2" {
		t.Fatalf("mirror has %q", v)
	}
	// The reader has written nothing: the lagging replica may answer it
	// (other clients' writes show up late on replicas, as documented).
	before := calls(t, g.replicas[0], "get")
	redistest.Eventually(t, 10*time.Second, func() bool {
		if err := reader.Get(ctx, "user:1:name").Err(); err != nil {
			t.Fatal(err)
		}
		return calls(t, g.replicas[0], "get") > before
	}, "the replica never served the reader")
	waitMirrored(t, p)
	if v := g.primary.Client(t).Get(ctx, "user:1:name").Val(); v != "v2" {
		t.Fatalf("primary has %q", v)
	}
	rep := p.Mirror().Report(10)
	if rep.Mismatches != 0 {
		t.Fatalf("primary and mirror both hold user:1:name = v2, yet the mirror counted %d mismatches (compared %d; patterns %+v): the replica's stale reply was compared as the primary's", rep.Mismatches, rep.Compared, rep.Patterns)
	}
	// The fix: a read a replica answered is mirrored but not compared, and
	// counted so.
	if rep.Skipped[mirror.SkipReplicaRead] == 0 {
		t.Fatalf("the replica-answered read was not counted as skipped{reason=%q}: %v", mirror.SkipReplicaRead, rep.Skipped)
	}
}
