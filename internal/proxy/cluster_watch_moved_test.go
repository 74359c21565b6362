package proxy_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/cluster"
)

// TestClusterWatchAfterSlotMoved: the proxy's slot map is stale (the slot
// of k moved to another node behind its back, as after a reshard between
// two refreshes). WATCH k pins a connection on the old owner, which
// answers MOVED. Retrying on the same connection must work (the proxy
// learnt the new owner from that MOVED): WATCH k, GET k, MULTI, SET k,
// EXEC.
//
// What went wrong: the WATCH answered MOVED kept its pin on the old owner,
// so every retried WATCH went to the same node and failed the same way
// ("slot moved ... retry the transaction") until UNWATCH, EXEC or DISCARD,
// and an unrelated GET on the connection then answered CROSSSLOT. A WATCH
// that was answered MOVED watches nothing: the client following the
// advice to retry looped forever.
func TestClusterWatchAfterSlotMoved(t *testing.T) {
	c, p := startClusterProxy(t)
	rc := p.Client(t, func(o *redis.Options) { o.PoolSize = 1 })
	ctx := context.Background()
	k := "watched"
	moveEmptySlot(t, c, p, cluster.Slot([]byte(k)))
	conn := rc.Conn()
	defer conn.Close()
	first := conn.Do(ctx, "WATCH", k).Err()
	t.Logf("first WATCH: %v", first)
	var last error
	for i := range 5 {
		err := conn.Do(ctx, "WATCH", k).Err()
		t.Logf("WATCH retry %d: %v", i, err)
		if err == nil {
			last = nil
			break
		}
		last = err
		time.Sleep(200 * time.Millisecond)
	}
	if last != nil {
		t.Fatalf("WATCH %s keeps failing on the connection after the proxy learnt the slot's owner: %v", k, last)
	}
	if err := conn.Do(ctx, "GET", k).Err(); err != nil && err != redis.Nil {
		t.Fatalf("GET after WATCH: %v", err)
	}
	if err := conn.Do(ctx, "MULTI").Err(); err != nil {
		t.Fatal(err)
	}
	conn.Do(ctx, "SET", k, "v")
	if v, err := conn.Do(ctx, "EXEC").Result(); err != nil {
		t.Fatalf("EXEC = %v, %v", v, err)
	}
}

// TestClusterWatchMovedAfterWatch: a WATCH of several keys of one slot the
// stale map gives to the old owner is sent again on the new owner, as a
// single key's is; but a WATCH answered MOVED on a pin that already holds
// a successful WATCH (the slot moved after it) must not drop the pin: it
// guards real watches, the client is told the transaction will fail, and
// EXEC does fail (a null reply, as for a watched key that changed), even
// for a transaction of keyless commands, which the old node would have run.
func TestClusterWatchMovedAfterWatch(t *testing.T) {
	c, p := startClusterProxy(t)
	rc := p.Client(t, func(o *redis.Options) { o.PoolSize = 1 })
	ctx := context.Background()

	// Several keys, stale map: re-pinned on the new owner.
	many := []any{"WATCH", "{wm}a", "{wm}b", "{wm}c"}
	moveEmptySlot(t, c, p, cluster.Slot([]byte("{wm}a")))
	conn := rc.Conn()
	defer conn.Close()
	if err := conn.Do(ctx, many...).Err(); err != nil {
		t.Fatalf("WATCH of several keys of a moved slot: %v", err)
	}
	if err := conn.Do(ctx, "MULTI").Err(); err != nil {
		t.Fatal(err)
	}
	conn.Do(ctx, "SET", "{wm}b", "v")
	if v, err := conn.Do(ctx, "EXEC").Result(); err != nil {
		t.Fatalf("EXEC after WATCH of several keys = %v, %v", v, err)
	}

	// A WATCH that succeeded, then the slot moves, then another WATCH.
	a, b := "{wa}a", "{wa}b"
	if err := conn.Do(ctx, "WATCH", a).Err(); err != nil {
		t.Fatal(err)
	}
	moveEmptySlot(t, c, p, cluster.Slot([]byte(a)))
	err := conn.Do(ctx, "WATCH", b).Err()
	if err == nil || !strings.Contains(err.Error(), "moved to another node") {
		t.Fatalf("second WATCH after the slot moved: %v, want the slot-moved error", err)
	}
	if err := conn.Do(ctx, "MULTI").Err(); err != nil {
		t.Fatal(err)
	}
	conn.Do(ctx, "PING")
	if v, err := conn.Do(ctx, "EXEC").Result(); err != redis.Nil {
		t.Fatalf("EXEC after a WATCH answered MOVED = %v, %v; want a null reply (the transaction fails)", v, err)
	}
	// EXEC ended the transaction: the next one runs on the new owner.
	if err := conn.Do(ctx, "WATCH", a, b).Err(); err != nil {
		t.Fatalf("WATCH after EXEC: %v", err)
	}
	if err := conn.Do(ctx, "MULTI").Err(); err != nil {
		t.Fatal(err)
	}
	conn.Do(ctx, "SET", a, "v")
	if v, err := conn.Do(ctx, "EXEC").Result(); err != nil {
		t.Fatalf("EXEC of the retried transaction = %v, %v", v, err)
	}
}
