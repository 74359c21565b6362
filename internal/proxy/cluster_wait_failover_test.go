package proxy_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/cluster"
	"github.com/redproxy/redproxy/internal/redistest"
)

// A write the old primary acknowledged and no replica had, then a
// failover (the replica takes over), then the old primary comes back as
// the new primary's replica and drops the write in its resync. On Redis
// directly the writing connection was to the old primary: it broke, or its
// WAIT runs there (now a replica, which refuses WAIT). Through the proxy
// the client's connection never broke, and its WAIT ran on the slot's new
// owner, whose replica (the old primary) took the marker: WAIT 1 answered
// 1, vouching for a write that is gone. A WAIT after the slot of the
// client's last write changed owner is answered 0 by the proxy, as in
// Sentinel mode (TestSentinelWaitAfterFailoverAnswersZero).
func TestClusterWaitAfterFailoverAnswersZero(t *testing.T) {
	c, p := startPubSubClusterProxy(t, 1)
	ctx := context.Background()
	rc := p.Client(t, func(o *redis.Options) { o.PoolSize = 1; o.MaxRetries = -1 })
	key := "wait-failover:k"
	slot := cluster.Slot([]byte(key))
	oldAddr := p.Router().Map().Owner(slot)
	var old *redistest.Server
	for _, n := range c.Primaries(t) {
		if n.Addr() == oldAddr {
			old = n
		}
	}
	if old == nil {
		t.Fatalf("no primary at %s", oldAddr)
	}
	replica := replicaOf(t, c, oldAddr)
	if err := rc.Set(ctx, key, "kept", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := rc.Wait(ctx, 1, 5*time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 after the first write = %d, %v; want 1", n, err)
	}

	// The replica stops hearing the primary: frozen, and its link cut, so
	// the next write reaches no replica.
	replica.Freeze(t)
	frozen := true
	defer func() {
		if frozen {
			replica.Thaw(t)
		}
	}()
	if err := old.Client(t).Do(ctx, "CLIENT", "KILL", "TYPE", "replica").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rc.Set(ctx, key, "lost", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// The old primary is frozen in turn, and the replica takes over
	// without it.
	old.Freeze(t)
	oldFrozen := true
	defer func() {
		if oldFrozen {
			old.Thaw(t)
		}
	}()
	replica.Thaw(t)
	frozen = false
	rr := redis.NewClient(&redis.Options{Addr: replica.Addr(), MaxRetries: -1})
	defer rr.Close()
	if err := rr.Do(ctx, "CLUSTER", "FAILOVER", "TAKEOVER").Err(); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 10*time.Second, func() bool {
		role, err := rr.Do(ctx, "ROLE").Slice()
		return err == nil && len(role) > 0 && role[0] == "master"
	}, "the replica never took over")
	old.Thaw(t)
	oldFrozen = false
	// The old primary rejoins as the new one's replica, resynced from it.
	ro := redis.NewClient(&redis.Options{Addr: old.Addr(), MaxRetries: -1})
	defer ro.Close()
	redistest.Eventually(t, 20*time.Second, func() bool {
		role, err := ro.Do(ctx, "ROLE").Slice()
		return err == nil && len(role) >= 4 && role[0] == "slave" && role[3] == "connected"
	}, "the old primary never became the new one's replica")
	redistest.Eventually(t, 20*time.Second, func() bool {
		p.Router().RefreshSoon()
		return p.Router().Map().Owner(slot) == replica.Addr()
	}, "the proxy never learnt the new owner of slot %d", slot)
	if v, err := rr.Get(ctx, key).Result(); err != nil || v != "kept" {
		t.Fatalf("GET on the new primary = %q, %v; want the write from before the cut (the test's premise)", v, err)
	}

	if n, err := rc.Wait(ctx, 1, 2*time.Second).Result(); err != nil || n != 0 {
		t.Fatalf("WAIT 1 for a write the old primary alone took, after the failover = %d, %v; want 0", n, err)
	}
	// Once the client writes again, to the new owner, WAIT runs there.
	if err := rc.Set(ctx, key, "again", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := rc.Wait(ctx, 1, 5*time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 after a write to the new owner = %d, %v; want 1", n, err)
	}
}
