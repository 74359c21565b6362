package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/cluster"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// moveEmptySlot gives slot s, which holds no key, from its owner in the
// proxy's map to another primary, and returns the new owner's address.
func moveEmptySlot(t *testing.T, c *redistest.Cluster, p *proxytest.Proxy, s int) string {
	t.Helper()
	ctx := context.Background()
	src := nodeAt(t, c, p.Router().Map().Owner(s))
	// The proxy's map may be stale (that is what the callers test), but
	// the cluster itself must not have moved the slot: a failover nobody
	// asked for (a node that missed cluster-node-timeout on a loaded
	// machine) would make the SETSLOTs below fail ("I'm already the owner
	// of hash slot N", seen once in CI), so say so plainly.
	if owner := slotOwnerSeenBy(t, src, s); owner != src.Addr() {
		nodes, _ := src.Client(t).ClusterNodes(ctx).Result()
		t.Fatalf("moveEmptySlot: the proxy's map has slot %d on %s, the cluster has it on %s (a failover the test did not make?); CLUSTER NODES:\n%s", s, src.Addr(), owner, nodes)
	}
	var dst *redistest.Server
	for _, n := range c.Primaries(t) {
		if n != src {
			dst = n
			break
		}
	}
	// As redis-cli --cluster does: the new owner first, so that it bumps
	// its config epoch and the other nodes take its word.
	srcID, dstID := redistest.NodeID(t, src), redistest.NodeID(t, dst)
	type setslot struct {
		on   *redistest.Server
		args []any
	}
	steps := []setslot{
		{dst, []any{"IMPORTING", srcID}},
		{src, []any{"MIGRATING", dstID}},
		{dst, []any{"NODE", dstID}},
	}
	for _, n := range c.Primaries(t) {
		if n != dst {
			steps = append(steps, setslot{n, []any{"NODE", dstID}})
		}
	}
	for _, st := range steps {
		if err := st.on.Client(t).Do(ctx, append([]any{"CLUSTER", "SETSLOT", s}, st.args...)...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	return dst.Addr()
}

// slotOwnerSeenBy is the address of slot s's primary in n's own view of
// the cluster ("" if n knows of no owner).
func slotOwnerSeenBy(t *testing.T, n *redistest.Server, s int) string {
	t.Helper()
	slots, err := n.Client(t).ClusterSlots(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range slots {
		if r.Start <= s && s <= r.End && len(r.Nodes) > 0 {
			return r.Nodes[0].Addr
		}
	}
	return ""
}

// TestClusterPinned drives transactions and blocking commands through the
// proxy in cluster mode: each pins a connection on the node owning its
// slot, and the client sees Redis Cluster's rules (one slot per
// transaction, CROSSSLOT, EXECABORT), never MOVED or ASK.
func TestClusterPinned(t *testing.T) {
	c, p := startClusterProxy(t)
	rc := p.Client(t)
	other := p.Client(t)
	direct := c.ClusterClient(t)
	ctx := context.Background()

	t.Run("WatchMultiExec", func(t *testing.T) {
		if err := rc.Set(ctx, "tx:w", 10, 0).Err(); err != nil {
			t.Fatal(err)
		}
		err := rc.Watch(ctx, func(tx *redis.Tx) error {
			v, err := tx.Get(ctx, "tx:w").Int()
			if err != nil {
				return err
			}
			_, err = tx.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
				pipe.Set(ctx, "tx:w", v+1, 0)
				return nil
			})
			return err
		}, "tx:w")
		if err != nil {
			t.Fatalf("WATCH/MULTI/EXEC: %v", err)
		}
		if v, err := direct.Get(ctx, "tx:w").Int(); err != nil || v != 11 {
			t.Fatalf("after the transaction tx:w = %d, %v; want 11", v, err)
		}
		// A write by another client between WATCH and EXEC: EXEC answers
		// nil and nothing of the transaction runs.
		err = rc.Watch(ctx, func(tx *redis.Tx) error {
			if err := other.Set(ctx, "tx:w", 100, 0).Err(); err != nil {
				return err
			}
			_, err := tx.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
				pipe.Set(ctx, "tx:w", 0, 0)
				return nil
			})
			return err
		}, "tx:w")
		if !errors.Is(err, redis.TxFailedErr) {
			t.Fatalf("EXEC after a conflicting write: %v, want %v", err, redis.TxFailedErr)
		}
		if v, err := direct.Get(ctx, "tx:w").Int(); err != nil || v != 100 {
			t.Fatalf("after the failed transaction tx:w = %d, %v; want 100", v, err)
		}
		// WATCH of keys in two slots is Redis Cluster's CROSSSLOT.
		if err := rc.Do(ctx, "WATCH", "{a}x", "{b}x").Err(); err == nil || !strings.HasPrefix(err.Error(), "CROSSSLOT") {
			t.Fatalf("WATCH across slots: %v", err)
		}
	})

	t.Run("HashTags", func(t *testing.T) {
		// PING comes before the first key: it is queued until the
		// transaction has its node, and its result is in EXEC's.
		cmds, err := rc.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
			pipe.Ping(ctx)
			pipe.Set(ctx, "{t}a", "1", 0)
			pipe.Incr(ctx, "{t}b")
			pipe.RPush(ctx, "{t}l", "x", "y")
			pipe.MGet(ctx, "{t}a", "{t}b")
			return nil
		})
		if err != nil {
			t.Fatalf("MULTI with hash-tagged keys: %v", err)
		}
		if s := cmds[0].(*redis.StatusCmd).Val(); s != "PONG" {
			t.Errorf("PING in MULTI = %q", s)
		}
		if n := cmds[2].(*redis.IntCmd).Val(); n != 1 {
			t.Errorf("INCR in MULTI = %d", n)
		}
		if vals := cmds[4].(*redis.SliceCmd).Val(); fmt.Sprint(vals) != "[1 1]" {
			t.Errorf("MGET in MULTI = %v", vals)
		}
		if n := direct.LLen(ctx, "{t}l").Val(); n != 2 {
			t.Errorf("LLEN {t}l = %d after the transaction", n)
		}
		// Sent one command at a time, as redis-cli does.
		conn := rc.Conn()
		defer conn.Close()
		for _, step := range []struct {
			cmd  []any
			want string
		}{
			{[]any{"MULTI"}, "OK"},
			{[]any{"ECHO", "e"}, "QUEUED"},
			{[]any{"SET", "{t}c", "3"}, "QUEUED"},
			{[]any{"GET", "{t}c"}, "QUEUED"},
			{[]any{"EXEC"}, "[e OK 3]"},
			{[]any{"MULTI"}, "OK"},
			{[]any{"PING"}, "QUEUED"},
			{[]any{"EXEC"}, "[PONG]"},
			{[]any{"MULTI"}, "OK"},
			{[]any{"EXEC"}, "[]"},
			{[]any{"MULTI"}, "OK"},
			{[]any{"SET", "{t}d", "4"}, "QUEUED"},
			{[]any{"DISCARD"}, "OK"},
		} {
			v, err := conn.Do(ctx, step.cmd...).Result()
			if got := fmt.Sprint(v); err != nil || got != step.want {
				t.Fatalf("%v = %v, %v; want %s", step.cmd, v, err, step.want)
			}
		}
		if n := direct.Exists(ctx, "{t}d").Val(); n != 0 {
			t.Fatal("a discarded SET ran")
		}
	})

	t.Run("CrossSlot", func(t *testing.T) {
		conn := rc.Conn()
		defer conn.Close()
		isErr := func(cmd []any, prefix string) {
			t.Helper()
			if err := conn.Do(ctx, cmd...).Err(); err == nil || !strings.HasPrefix(err.Error(), prefix) {
				t.Fatalf("%v: %v, want %s...", cmd, err, prefix)
			}
		}
		isOK := func(cmd []any, want string) {
			t.Helper()
			if v, err := conn.Do(ctx, cmd...).Result(); err != nil || fmt.Sprint(v) != want {
				t.Fatalf("%v = %v, %v; want %s", cmd, v, err, want)
			}
		}
		// A second slot after the transaction has its node.
		isOK([]any{"MULTI"}, "OK")
		isOK([]any{"SET", "{x1}k", "1"}, "QUEUED")
		isErr([]any{"SET", "{x2}k", "1"}, "CROSSSLOT")
		isErr([]any{"EXEC"}, "EXECABORT")
		// Two slots in the first keyed command.
		isOK([]any{"MULTI"}, "OK")
		isErr([]any{"MSET", "{x1}k", "1", "{x2}k", "2"}, "CROSSSLOT")
		isOK([]any{"SET", "{x1}k", "1"}, "QUEUED")
		isErr([]any{"EXEC"}, "EXECABORT")
		// A whole-keyspace command has no one node.
		isOK([]any{"MULTI"}, "OK")
		isErr([]any{"DBSIZE"}, "ERR redproxy: DBSIZE inside a transaction")
		isErr([]any{"EXEC"}, "EXECABORT")
		// A queue-time error before the transaction has a node.
		isOK([]any{"MULTI"}, "OK")
		isErr([]any{"NOSUCHCOMMAND", "a"}, "ERR unknown command 'NOSUCHCOMMAND'")
		isOK([]any{"SET", "{x1}k", "1"}, "QUEUED")
		isErr([]any{"EXEC"}, "EXECABORT")
		// Under WATCH, a key of another slot.
		isOK([]any{"WATCH", "{x1}k"}, "OK")
		isErr([]any{"GET", "{x2}k"}, "CROSSSLOT")
		isOK([]any{"UNWATCH"}, "OK")
		if n := direct.Exists(ctx, "{x1}k", "{x2}k").Val(); n != 0 {
			t.Fatalf("%d keys written by aborted transactions", n)
		}
		// The connection is in a clean state afterwards.
		isOK([]any{"SET", "{x2}k", "v"}, "OK")
		isOK([]any{"GET", "{x2}k"}, "v")
	})

	t.Run("Blocking", func(t *testing.T) {
		const key = "bl:list"
		owner := nodeAt(t, c, p.Router().Map().Owner(cluster.Slot([]byte(key)))).Client(t)
		popped := make(chan []string, 1)
		errc := make(chan error, 1)
		go func() {
			v, err := rc.BLPop(ctx, 8*time.Second, key).Result()
			popped <- v
			errc <- err
		}()
		redistest.Eventually(t, 5*time.Second, func() bool {
			info := owner.Info(ctx, "clients").Val()
			return strings.Contains(info, "blocked_clients:1")
		}, "BLPOP never blocked on the owner of %s", key)
		if err := other.LPush(ctx, key, "woken").Err(); err != nil {
			t.Fatal(err)
		}
		if v, err := <-popped, <-errc; err != nil || fmt.Sprint(v) != "[bl:list woken]" {
			t.Fatalf("BLPOP = %v, %v", v, err)
		}
		if err := rc.LPush(ctx, "{bl}src", "e").Err(); err != nil {
			t.Fatal(err)
		}
		if v, err := rc.BLMove(ctx, "{bl}src", "{bl}dst", "LEFT", "RIGHT", time.Second).Result(); err != nil || v != "e" {
			t.Fatalf("BLMOVE in one slot = %q, %v", v, err)
		}
		if err := rc.BLMove(ctx, "{bl}src", "other", "LEFT", "RIGHT", time.Second).Err(); err == nil || !strings.HasPrefix(err.Error(), "CROSSSLOT") {
			t.Fatalf("BLMOVE across slots: %v", err)
		}
		// The slot moves while a client is blocked on it: Redis unblocks
		// it with MOVED, which the client sees as TRYAGAIN (the pop did
		// not happen; sending it again reaches the new owner).
		const movingKey = "{blmv}l"
		errs := make(chan error, 1)
		go func() { errs <- rc.BLPop(ctx, 8*time.Second, movingKey).Err() }()
		redistest.Eventually(t, 5*time.Second, func() bool {
			owner := nodeAt(t, c, p.Router().Map().Owner(cluster.Slot([]byte(movingKey)))).Client(t)
			return strings.Contains(owner.Info(ctx, "clients").Val(), "blocked_clients:1")
		}, "BLPOP never blocked on the owner of %s", movingKey)
		moveEmptySlot(t, c, p, cluster.Slot([]byte(movingKey)))
		if err := <-errs; err == nil || !strings.HasPrefix(err.Error(), "TRYAGAIN") {
			t.Fatalf("BLPOP whose slot moved: %v, want TRYAGAIN", err)
		}
		if err := other.RPush(ctx, movingKey, "v").Err(); err != nil {
			t.Fatal(err)
		}
		if v, err := rc.BLPop(ctx, time.Second, movingKey).Result(); err != nil || fmt.Sprint(v) != "[{blmv}l v]" {
			t.Fatalf("BLPOP sent again = %v, %v", v, err)
		}
		// CLIENT UNBLOCK from another client reaches the node the blocked
		// client's connection is on.
		conn := rc.Conn()
		defer conn.Close()
		id, err := conn.ClientID(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		go func() { errs <- conn.BLPop(ctx, 8*time.Second, key).Err() }()
		redistest.Eventually(t, 5*time.Second, func() bool {
			return strings.Contains(owner.Info(ctx, "clients").Val(), "blocked_clients:1")
		}, "BLPOP never blocked on the owner of %s", key)
		if n, err := other.ClientUnblock(ctx, id).Result(); err != nil || n != 1 {
			t.Fatalf("CLIENT UNBLOCK %d = %d, %v", id, n, err)
		}
		if err := <-errs; err != redis.Nil {
			t.Fatalf("BLPOP unblocked: %v, want nil", err)
		}
		// WAIT goes to the node of the last write (TestClusterWait).
		if n, err := rc.Do(ctx, "WAIT", 0, 0).Int(); err != nil || n < 0 {
			t.Fatalf("WAIT: %d, %v", n, err)
		}
	})

	t.Run("SlotMovedDuringTransaction", func(t *testing.T) {
		// move gives slot s, which holds no key, to another primary.
		var moved []int
		var owners []string
		move := func(s int) {
			t.Helper()
			moved, owners = append(moved, s), append(owners, moveEmptySlot(t, c, p, s))
		}
		noRedirect := func(err error) {
			t.Helper()
			if err != nil && (strings.HasPrefix(err.Error(), "MOVED") || strings.HasPrefix(err.Error(), "ASK")) {
				t.Fatalf("the client saw %v", err)
			}
		}
		conn := rc.Conn()
		defer conn.Close()
		do := func(cmd ...any) error {
			t.Helper()
			err := conn.Do(ctx, cmd...).Err()
			noRedirect(err)
			return err
		}
		// The slot moves between two queued commands.
		if err := do("MULTI"); err != nil {
			t.Fatal(err)
		}
		if err := do("SET", "{mv1}k", "1"); err != nil {
			t.Fatal(err)
		}
		move(cluster.Slot([]byte("{mv1}k")))
		if err := do("SET", "{mv1}k", "2"); err == nil {
			t.Fatal("a command of a moved slot was queued")
		}
		if err := do("EXEC"); err == nil || !strings.HasPrefix(err.Error(), "EXECABORT") {
			t.Fatalf("EXEC after the slot moved: %v", err)
		}
		// The slot moves after the last queued command: EXEC itself is
		// redirected.
		if err := do("MULTI"); err != nil {
			t.Fatal(err)
		}
		if err := do("SET", "{mv2}k", "1"); err != nil {
			t.Fatal(err)
		}
		move(cluster.Slot([]byte("{mv2}k")))
		if err := do("EXEC"); err == nil || !strings.HasPrefix(err.Error(), "EXECABORT") {
			t.Fatalf("EXEC of a moved slot: %v", err)
		}
		if n := direct.Exists(ctx, "{mv1}k", "{mv2}k").Val(); n != 0 {
			t.Fatalf("%d keys written by failed transactions", n)
		}
		// The proxy learnt the new owners from the MOVED replies (or its
		// refresh), and the retried transactions run there.
		for i, s := range moved {
			redistest.Eventually(t, 5*time.Second, func() bool {
				return p.Router().Map().Owner(s) == owners[i]
			}, "the proxy's map never learnt slot %d's new owner", s)
		}
		for _, k := range []string{"{mv1}k", "{mv2}k"} {
			if _, err := rc.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
				pipe.Set(ctx, k, "ok", 0)
				return nil
			}); err != nil {
				noRedirect(err)
				t.Fatalf("the transaction on %s, retried: %v", k, err)
			}
			if v := direct.Get(ctx, k).Val(); v != "ok" {
				t.Fatalf("%s = %q after the retried transaction", k, v)
			}
		}
	})
}
