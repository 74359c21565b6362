package proxy_test

import (
	"context"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/redistest"
)

// replicatedAndPlain is upstream A, a primary with one replica, and B, a
// server alone; k is "from-A" on A (and its replica) and "from-B" on B.
func replicatedAndPlain(t *testing.T) (*replicated, *redistest.Server) {
	t.Helper()
	ctx := context.Background()
	a := startReplicated(t, 1)
	b := redistest.Start(t)
	a.primary.Client(t).Set(ctx, "k", "from-A", 0)
	b.Client(t).Set(ctx, "k", "from-B", 0)
	redistest.Eventually(t, 5*time.Second, func() bool {
		return a.replicas[0].Client(t).Get(ctx, "k").Val() == "from-A"
	}, "the replica never got k")
	return a, b
}

// A reload that moved upstream.address from A to B switched the pools,
// the tier and the coalescing group, but not the replica set: with
// read_from = "replica_preferred" it kept the view of its last poll of A,
// so reads sent after Reload returned were answered by A's replica until
// the next poll (found by review; with a 2s poll interval, every one of
// them). Reload now clears the view (Server.Reload, replicaSet.restart):
// from its return every read is answered from B.
func TestReloadSwitchStopsOldReplicaReads(t *testing.T) {
	ctx := context.Background()
	a, b := replicatedAndPlain(t)

	p := a.proxy(t, config.ReadReplicaPreferred, func(c *config.Config) {
		c.Upstream.ReplicaPollInterval = units.Duration{Duration: 2 * time.Second}
		c.Upstream.MaxReplicaLag = units.Duration{Duration: 10 * time.Second}
	})
	c := p.Client(t)
	before := calls(t, a.replicas[0], "get")
	if v := c.Get(ctx, "k").Val(); v != "from-A" {
		t.Fatalf("before the reload GET k = %q", v)
	}
	if calls(t, a.replicas[0], "get") == before {
		t.Fatal("before the reload the read did not go to A's replica: the test shows nothing")
	}

	next := *p.Config()
	next.Upstream.Address = b.Addr()
	if _, err := p.Reload(&next); err != nil {
		t.Fatal(err)
	}
	fresh := p.Client(t)
	for i := range 20 {
		if v := fresh.Get(ctx, "k").Val(); v != "from-B" {
			t.Fatalf("read %d after the reload to B returned = %q: answered by the old upstream's replica", i, v)
		}
		if v := c.Get(ctx, "k").Val(); v != "from-B" {
			t.Fatalf("read %d on a client from before the reload = %q: answered by the old upstream's replica", i, v)
		}
	}
}

// The same with a 20ms poll interval: the window until the next poll is
// short, but the first read after Reload still fell into it.
func TestReloadSwitchStopsOldReplicaReadsFastPoll(t *testing.T) {
	ctx := context.Background()
	a, b := replicatedAndPlain(t)
	p := a.proxy(t, config.ReadReplicaPreferred, nil)
	c := p.Client(t)
	if v := c.Get(ctx, "k").Val(); v != "from-A" {
		t.Fatalf("before the reload GET k = %q", v)
	}
	next := *p.Config()
	next.Upstream.Address = b.Addr()
	if _, err := p.Reload(&next); err != nil {
		t.Fatal(err)
	}
	if v := c.Get(ctx, "k").Val(); v != "from-B" {
		t.Fatalf("first read after the reload returned = %q (the old upstream's replica)", v)
	}
}

// After the switch the replica set follows B: it learns B's replicas from
// B's INFO, and with read_from = "replica" they serve reads as soon as
// Reload returns (it waits for the first poll of B, as the start does for
// A), none of them going to A's replica.
func TestReloadSwitchReadsNewReplicas(t *testing.T) {
	ctx := context.Background()
	a := startReplicated(t, 1)
	b := startReplicated(t, 1)
	a.primary.Client(t).Set(ctx, "k", "from-A", 0)
	b.primary.Client(t).Set(ctx, "k", "from-B", 0)
	for _, g := range []*replicated{a, b} {
		redistest.Eventually(t, 5*time.Second, func() bool {
			return g.replicas[0].Client(t).Get(ctx, "k").Val() != ""
		}, "a replica never got k")
	}
	p := a.proxy(t, config.ReadReplica, nil)
	c := p.Client(t)
	if v := c.Get(ctx, "k").Val(); v != "from-A" {
		t.Fatalf("before the reload GET k = %q", v)
	}
	next := *p.Config()
	next.Upstream.Address = b.primary.Addr()
	if _, err := p.Reload(&next); err != nil {
		t.Fatal(err)
	}
	onA, onB, onBPrimary := calls(t, a.replicas[0], "get"), calls(t, b.replicas[0], "get"), calls(t, b.primary, "get")
	for i := range 10 {
		if v, err := c.Get(ctx, "k").Result(); v != "from-B" || err != nil {
			t.Fatalf("read %d after the reload = %q, %v; want from-B from B's replica", i, v, err)
		}
	}
	if n := calls(t, a.replicas[0], "get") - onA; n != 0 {
		t.Errorf("A's replica answered %d reads after the reload", n)
	}
	if n := calls(t, b.primary, "get") - onBPrimary; n != 0 {
		t.Errorf("B's primary answered %d reads with read_from = replica", n)
	}
	if n := calls(t, b.replicas[0], "get") - onB; n != 10 {
		t.Errorf("B's replica answered %d of the 10 reads", n)
	}
	if n := p.UsableReplicas(); n != 1 {
		t.Errorf("usable replicas after the reload = %d, want B's one", n)
	}
}

// With routes, [upstream]'s replica set is the default route's: a reload
// moving upstream.address forgets its replicas the same way, and leaves a
// named upstream's (restart-only, so never moved by a reload) alone.
func TestReloadSwitchStopsOldReplicaReadsWithRoutes(t *testing.T) {
	ctx := context.Background()
	// A 2s poll interval: the next poll does not hide the old view.
	r := startRoutedReplicasPolled(t, 10*time.Second, 2*time.Second)
	r.seed(t, 1)
	c := redistest.Start(t)
	c.Client(t).Set(ctx, "a:0", "from-C", 0)
	cl := r.p.Client(t)
	if v := cl.Get(ctx, "a:0").Val(); v != "a:v0" {
		t.Fatalf("before the reload GET a:0 = %q", v)
	}
	next := *r.p.Config()
	next.Upstream.Address = c.Addr()
	if _, err := r.p.Reload(&next); err != nil {
		t.Fatal(err)
	}
	onB := calls(t, r.b.replicas[0], "get")
	for i := range 10 {
		if v := cl.Get(ctx, "a:0").Val(); v != "from-C" {
			t.Fatalf("read %d of the default route after the reload = %q: answered by the old upstream's replica", i, v)
		}
		if v := cl.Get(ctx, "b:0").Val(); v != "b:v0" {
			t.Fatalf("read %d of route b after the reload = %q", i, v)
		}
	}
	if n := calls(t, r.b.replicas[0], "get") - onB; n != 10 {
		t.Errorf("b's replica answered %d of route b's 10 reads after the reload, want all", n)
	}
}
