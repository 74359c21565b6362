package proxy_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/redistest"
)

// onlineReplica starts a replica of primary and waits until primary counts it
// online, so that a WAIT can be answered by it.
func onlineReplica(t *testing.T, primary *redistest.Server) *redistest.Server {
	t.Helper()
	replica := redistest.Start(t, "--replicaof", "127.0.0.1", strconv.Itoa(primary.Port()))
	c := primary.Client(t)
	redistest.Eventually(t, 10*time.Second, func() bool {
		info, _ := c.Info(ctx, "replication").Result()
		return strings.Contains(info, "connected_slaves:1") && strings.Contains(info, "state=online")
	}, "replica of %s never came online", primary.Addr())
	return replica
}

// wait runs WAIT numreplicas timeout on c and fails the test unless it
// answers want.
func wait(t *testing.T, c interface {
	Wait(context.Context, int, time.Duration) *redis.IntCmd
}, numreplicas int, timeout time.Duration, want int64, what string) {
	t.Helper()
	n, err := c.Wait(ctx, numreplicas, timeout).Result()
	if err != nil || n != want {
		t.Fatalf("%s: WAIT %d %d answered %d %v, want %d", what, numreplicas, timeout.Milliseconds(), n, err, want)
	}
}

// A write routed to an upstream with no replica is on no replica, whatever
// [upstream]'s replicas say: WAIT must wait where the write went (it was
// asked of [upstream] only, which answered 1 for a write it never saw).
func TestRoutesWaitCountsTheUpstreamWrittenTo(t *testing.T) {
	r := startRoutedAfter(t, func(r *routed) { onlineReplica(t, r.def) }, nil)
	if err := r.c.Set(ctx, "queue:1", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	wait(t, r.c, 1, 200*time.Millisecond, 0, "a write on queue, which has no replica")

	// Writes on both: the write is on one replica only if both shares are.
	both := r.p.Client(t)
	if err := both.Set(ctx, "plain", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	wait(t, both, 1, 5*time.Second, 1, "a write on [upstream] only")
	if err := both.Set(ctx, "queue:2", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	wait(t, both, 1, 200*time.Millisecond, 0, "writes on [upstream] and queue")
}

// With a replica behind each upstream written to, WAIT answers 1 once
// both have the client's writes, and 0 when one of them cannot have them.
func TestRoutesWaitEveryUpstreamWrittenTo(t *testing.T) {
	var queueReplica *redistest.Server
	r := startRoutedAfter(t, func(r *routed) {
		onlineReplica(t, r.def)
		queueReplica = onlineReplica(t, r.queue)
	}, nil)
	for _, k := range []string{"plain", "queue:1", "cache:1"} {
		if err := r.c.Set(ctx, k, "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// cache has no replica: its share is on none.
	wait(t, r.c, 1, 200*time.Millisecond, 0, "writes on [upstream], queue and cache")

	c := r.p.Client(t)
	for _, k := range []string{"plain", "queue:1"} {
		if err := c.Set(ctx, k, "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	wait(t, c, 1, 5*time.Second, 1, "writes on [upstream] and queue, both replicated")
	// A frozen replica of queue acknowledges nothing: a write after the
	// freeze is not confirmed, though [upstream]'s replica confirms its own.
	queueReplica.Freeze(t)
	defer queueReplica.Thaw(t)
	if err := c.Set(ctx, "queue:2", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	wait(t, c, 1, 200*time.Millisecond, 0, "a write on queue after its replica froze")
}

// Writes that do not travel on the shared connections count as well: a
// held transaction, a script, a blocking command and a write under WATCH
// go to queue, which has no replica, so WAIT may not answer [upstream]'s 1.
func TestRoutesWaitCountsWritesOnDedicatedConnections(t *testing.T) {
	r := startRoutedAfter(t, func(r *routed) { onlineReplica(t, r.def) }, nil)
	if err := r.queue.Client(t).RPush(ctx, "queue:src", "a", "b").Err(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		write func(c *redis.Conn) error
	}{
		{"MULTI", func(c *redis.Conn) error {
			_, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.Set(ctx, "queue:tx", "v", 0)
				return nil
			})
			return err
		}},
		{"EVAL", func(c *redis.Conn) error {
			return c.Eval(ctx, "return redis.call('SET', KEYS[1], 'v')", []string{"queue:script"}).Err()
		}},
		{"BLMOVE", func(c *redis.Conn) error {
			return c.BLMove(ctx, "queue:src", "queue:dst", "LEFT", "RIGHT", time.Second).Err()
		}},
		{"WATCH", func(c *redis.Conn) error {
			// Written on the connection the WATCH pinned on queue.
			if err := c.Do(ctx, "WATCH", "queue:w").Err(); err != nil {
				return err
			}
			if err := c.Set(ctx, "queue:w", "v", 0).Err(); err != nil {
				return err
			}
			return c.Do(ctx, "UNWATCH").Err()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// One connection: go-redis runs a transaction on a
			// connection of its own.
			c := r.p.Client(t).Conn()
			defer c.Close()
			if err := tc.write(c); err != nil {
				t.Fatal(err)
			}
			wait(t, c, 1, 200*time.Millisecond, 0, "after "+tc.name+" on queue")
		})
	}
}

// A WATCH pins the client on its keys' upstream, and a WAIT under it
// runs there when the client's writes did; writes elsewhere are waited
// for where they went, not on the pinned connection.
func TestRoutesWaitUnderWatch(t *testing.T) {
	r := startRoutedAfter(t, func(r *routed) { onlineReplica(t, r.def) }, nil)
	c := r.p.Client(t).Conn()
	defer c.Close()
	if err := c.Set(ctx, "plain", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Do(ctx, "WATCH", "queue:w").Err(); err != nil {
		t.Fatal(err)
	}
	wait(t, c, 1, 5*time.Second, 1, "a write on [upstream], under a WATCH on queue")
	if err := c.Set(ctx, "queue:w", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	wait(t, c, 1, 200*time.Millisecond, 0, "writes on [upstream] and, under the WATCH, on queue")
	res, err := c.Do(ctx, "MULTI").Result()
	if err != nil || res != "OK" {
		t.Fatalf("MULTI after WAIT under WATCH: %v %v", res, err)
	}
	if err := c.Do(ctx, "EXEC").Err(); err != redis.Nil {
		t.Fatalf("EXEC after writing the WATCHed key: %v, want a null reply", err)
	}
}

// A client that wrote to one upstream only waits there alone, [upstream]
// as before routes when that is where its writes went; and one that wrote
// nowhere waits on [upstream].
func TestRoutesWaitOnOneUpstream(t *testing.T) {
	r := startRoutedAfter(t, func(r *routed) { onlineReplica(t, r.queue) }, func(c *config.Config) {})
	if err := r.c.Set(ctx, "queue:1", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	wait(t, r.c, 1, 5*time.Second, 1, "a write on queue, replicated")
	wait(t, r.p.Client(t), 1, 200*time.Millisecond, 0, "no write: [upstream], which has no replica")
	plain := r.p.Client(t)
	if err := plain.Set(ctx, "plain", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	wait(t, plain, 1, 200*time.Millisecond, 0, "a write on [upstream], which has no replica")
}

// An upstream's error is the answer of a WAIT on several: counting the
// others alone would vouch for what that one never confirmed.
func TestRoutesWaitAnswersAnUpstreamsError(t *testing.T) {
	r := startRouted(t, nil)
	c := r.p.Client(t).Conn()
	defer c.Close()
	for _, k := range []string{"plain", "queue:1"} {
		if err := c.Set(ctx, k, "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	err := c.Do(ctx, "WAIT", "one", "0").Err()
	if err == nil || !strings.Contains(err.Error(), "not an integer") {
		t.Fatalf("WAIT one 0 after writes on two upstreams: %v, want Redis's integer error", err)
	}
	wait(t, c, 0, 0, 0, "the connection after the error")
}

// CLIENT UNBLOCK ends a WAIT on several upstreams at once: each of its
// connections is unblocked, not only the first one's (the others would
// go on waiting, here forever).
func TestRoutesWaitOnSeveralUpstreamsUnblocks(t *testing.T) {
	r := startRouted(t, nil)
	c := r.p.Client(t, func(o *redis.Options) { o.ReadTimeout = 20 * time.Second }).Conn()
	defer c.Close()
	for _, k := range []string{"plain", "queue:1", "cache:1"} {
		if err := c.Set(ctx, k, "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	id, err := c.ClientID(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		// No upstream has a replica: without the UNBLOCK this never ends.
		n, err := c.Wait(ctx, 1, 0).Result()
		if err == nil && n != 0 {
			err = fmt.Errorf("answered %d, want 0", n)
		}
		done <- err
	}()
	other := r.p.Client(t)
	redistest.Eventually(t, 10*time.Second, func() bool {
		list, _ := other.ClientList(ctx).Result()
		for _, line := range strings.Split(list, "\n") {
			if strings.Contains(line, "id="+strconv.FormatInt(id, 10)+" ") && strings.Contains(line, "flags=b") {
				return true
			}
		}
		return false
	}, "the client never showed as blocked")
	if n, err := other.ClientUnblock(ctx, id).Result(); err != nil || n != 1 {
		t.Fatalf("CLIENT UNBLOCK: %d %v", n, err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("WAIT 1 0 unblocked: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WAIT on several upstreams still blocked after CLIENT UNBLOCK")
	}
	wait(t, c, 0, 0, 0, "the connection after the UNBLOCK")
}

// A WAIT after the server of an upstream the client wrote to changed
// (here a reload moving [upstream] to another address) answers 0: that
// server never had the write (waitAfterMove). Only the upstreams written
// to count: a client whose writes all went to queue waits there as usual.
func TestRoutesWaitAfterAnUpstreamMoved(t *testing.T) {
	r := startRoutedAfter(t, func(r *routed) {
		onlineReplica(t, r.def)
		onlineReplica(t, r.queue)
	}, nil)
	queueOnly := r.p.Client(t).Conn()
	defer queueOnly.Close()
	both := r.p.Client(t).Conn()
	defer both.Close()
	for _, w := range []struct {
		c   *redis.Conn
		key string
	}{{queueOnly, "queue:1"}, {both, "plain"}, {both, "queue:2"}} {
		if err := w.c.Set(ctx, w.key, "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	wait(t, both, 1, 5*time.Second, 1, "writes on [upstream] and queue, both replicated")

	moved := redistest.Start(t)
	onlineReplica(t, moved)
	if _, err := r.p.Reload(reloaded(t, r.p, func(c *config.Config) { c.Upstream.Address = moved.Addr() })); err != nil {
		t.Fatal(err)
	}
	wait(t, both, 1, 5*time.Second, 0, "writes on [upstream] before it moved, and on queue")
	wait(t, queueOnly, 1, 5*time.Second, 1, "writes on queue only, after [upstream] moved")
	// Written again, on [upstream]'s new server: counted there.
	if err := both.Set(ctx, "plain", "v2", 0).Err(); err != nil {
		t.Fatal(err)
	}
	wait(t, both, 1, 5*time.Second, 1, "a write on [upstream]'s new server, and queue's")
}
