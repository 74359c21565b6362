package cluster

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/resp"
	"github.com/redproxy/redproxy/internal/upstream"
)

// A primary that stops answering (hung, its host frozen or cut off) sends
// no MOVED and drops no connection, so nothing but the periodic reload
// used to tell the router that its replica took over: with the default
// 10 s interval, writes to its slots kept going to the hung node for up
// to 10 s after the failover. A reply overdue by reply_timeout now asks
// for a reload. The interval here is an hour, so only that can find the
// new owner.
func TestOverdueNodeReloadsTheSlotMap(t *testing.T) {
	c := redistest.StartCluster(t, 3, 1)
	r := New(Options{
		Seeds: c.Seeds(),
		Backend: upstream.BackendOptions{Connections: 1, MaxPinned: 16, DialTimeout: time.Second,
			ReplyTimeout: 300 * time.Millisecond, DeadTimeout: time.Minute},
		Table:           commands.Builtin(),
		RefreshInterval: time.Hour,
	})
	t.Cleanup(r.Close)
	key := "overdue:k"
	slot := Slot([]byte(key))
	// The node's connections are up before it hangs: a first dial to a
	// hung node fails, and a failed dial asks for a reload by itself.
	first := upstream.NewCall()
	first.Add(resp.AppendCommandStrings(nil, "SET", key, "before"))
	r.Do(first, false)
	if reply, err := first.Reply(0); err != nil || string(reply) != "+OK\r\n" {
		t.Fatalf("SET before the node hung: %q, %v", reply, err)
	}
	oldAddr := r.Map().Owner(slot)
	old, replica := nodeAndReplica(t, c, oldAddr)

	old.Freeze(t)
	t.Cleanup(func() { old.Thaw(t) })
	rr := redis.NewClient(&redis.Options{Addr: replica.Addr(), MaxRetries: -1})
	defer rr.Close()
	if err := rr.Do(context.Background(), "CLUSTER", "FAILOVER", "TAKEOVER").Err(); err != nil {
		t.Fatal(err)
	}
	// A write on the hung node: its reply is overdue from here on.
	stuck := upstream.NewCall()
	stuck.Add(resp.AppendCommandStrings(nil, "SET", key, "to-the-hung-node"))
	go r.Do(stuck, false)
	redistest.Eventually(t, 30*time.Second, func() bool { return r.Map().Owner(slot) == replica.Addr() },
		"the slot map still says %s owns slot %d (the hung node); the new owner is %s", r.Map().Owner(slot), slot, replica.Addr())
	next := upstream.NewCall()
	next.Add(resp.AppendCommandStrings(nil, "SET", key, "to-the-new-owner"))
	r.Do(next, false)
	if reply, err := next.Reply(0); err != nil || string(reply) != "+OK\r\n" {
		t.Fatalf("SET after the reload: %q, %v", reply, err)
	}
}

// TestNoMapAtStartIsAskedForAgainSoon: a router that found no node
// answering at the start serves nothing until it has a map, and asked again
// only every RefreshInterval (10 s by default): a proxy started before its
// cluster served nothing for up to that long after the cluster answered.
// The interval here is an hour; the map must come anyway.
func TestNoMapAtStartIsAskedForAgainSoon(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	thaw := redistest.FreezeAll(t, c.Nodes...)
	r := New(Options{
		Seeds: c.Seeds(),
		Backend: upstream.BackendOptions{Connections: 1, MaxPinned: 16, DialTimeout: 200 * time.Millisecond,
			ReplyTimeout: 200 * time.Millisecond, DeadTimeout: time.Minute},
		Table:           commands.Builtin(),
		RefreshInterval: time.Hour,
	})
	t.Cleanup(r.Close)
	if r.Map() != nil {
		t.Fatal("a map was loaded from frozen nodes")
	}
	thaw()
	redistest.Eventually(t, 30*time.Second, func() bool { return r.Map() != nil },
		"no slot map loaded after the nodes answered (the next periodic reload is an hour away)")
}

// A dead node fails the dials of dedicated connections (transactions,
// blocking commands, relays), which go through no batch of the router and
// so asked for no reload: those clients failed until the periodic one, up
// to 10 s after the node's replica took over, where plain commands
// recovered in under a second (found by a probe). A failed dedicated dial
// now asks for a reload. The interval here is an hour, so only that can
// find the new owner.
func TestDedicatedDialFailureReloadsTheSlotMap(t *testing.T) {
	c := redistest.StartCluster(t, 3, 1)
	r := New(Options{
		Seeds: c.Seeds(),
		Backend: upstream.BackendOptions{Connections: 1, MaxPinned: 16, DialTimeout: time.Second,
			ReplyTimeout: time.Second, DeadTimeout: time.Minute},
		Table:           commands.Builtin(),
		RefreshInterval: time.Hour,
	})
	t.Cleanup(r.Close)
	slot := Slot([]byte("{bk}"))
	b, err := r.BackendFor(slot)
	if err != nil {
		t.Fatal(err)
	}
	oldAddr := b.Addr()
	old, replica := nodeAndReplica(t, c, oldAddr)
	old.Kill(t)
	rr := redis.NewClient(&redis.Options{Addr: replica.Addr(), MaxRetries: -1})
	defer rr.Close()
	if err := rr.Do(context.Background(), "CLUSTER", "FAILOVER", "TAKEOVER").Err(); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 30*time.Second, func() bool {
		b, err := r.BackendFor(slot)
		if err != nil {
			return false
		}
		p, err := b.AcquirePipe(0, false)
		if err == nil {
			b.ReleasePipe(p, 0, false, true)
		}
		return b.Addr() == replica.Addr() && err == nil
	}, "a dedicated connection for slot %d still goes to %s (dead); the new owner is %s", slot, r.Map().Owner(slot), replica.Addr())
}

// After SCRIPT FLUSH through the router, EVALSHA of a script loaded
// before answers NOSCRIPT, as Redis Cluster does: the router's cache of
// script bodies loaded it on the node again and ran it, while SCRIPT
// EXISTS said 0 (found by a probe).
func TestScriptFlushForgetsTheCachedBodies(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	r := New(Options{Seeds: c.Seeds(), Backend: upstream.BackendOptions{Connections: 1, DialTimeout: time.Second,
		ReplyTimeout: time.Second, DeadTimeout: time.Minute}, Table: commands.Builtin()})
	t.Cleanup(r.Close)
	do := func(args ...string) string {
		call := upstream.NewCall()
		call.Add(resp.AppendCommandStrings(nil, args...))
		r.Do(call, false)
		reply, err := call.Reply(0)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		return string(reply)
	}
	const body = "return 'again'"
	sha := shaOf(body)
	if got := do("SCRIPT", "LOAD", body); !strings.Contains(got, sha) {
		t.Fatalf("SCRIPT LOAD: %q", got)
	}
	if got := do("EVALSHA", sha, "1", "{q}k"); got != "$5\r\nagain\r\n" {
		t.Fatalf("EVALSHA before the flush: %q", got)
	}
	if got := do("SCRIPT", "FLUSH"); got != "+OK\r\n" {
		t.Fatalf("SCRIPT FLUSH: %q", got)
	}
	if got := do("EVALSHA", sha, "1", "{q}k"); !strings.HasPrefix(got, "-NOSCRIPT") {
		t.Fatalf("EVALSHA after SCRIPT FLUSH: %q, want NOSCRIPT", got)
	}
}

// nodeAndReplica finds the node of c at addr and a replica of it, waiting
// for the replica to report its primary.
func nodeAndReplica(t *testing.T, c *redistest.Cluster, addr string) (node, replica *redistest.Server) {
	t.Helper()
	redistest.Eventually(t, 30*time.Second, func() bool {
		for _, n := range c.Nodes {
			rc := redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1})
			role, err := rc.Do(context.Background(), "ROLE").Slice()
			rc.Close()
			switch {
			case n.Addr() == addr:
				node = n
			case err == nil && len(role) >= 3 && role[0] == "slave" && fmt.Sprintf("%v:%v", role[1], role[2]) == addr:
				replica = n
			}
		}
		return node != nil && replica != nil
	}, "no replica of %s", addr)
	return node, replica
}
