package proxy_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestAskedMultiKeyWriteLandsAfterLaterWrite (found by review): during a
// slot migration a client pipelines MSET {rv}a 1 {rv}b 1 then SET {rv}b 2;
// {rv}b has already moved to the importing node, {rv}a has not. Round 1,
// both on the source: the MSET gets TRYAGAIN (some keys there, some not),
// the SET gets ASK. Round 2: the MSET goes to the source again (TRYAGAIN),
// the SET to the importing node with ASKING, where it runs: {rv}b = 2.
// The router only refused to retry a command when a later command of its
// slot ran in the same node call of the same round, so the MSET kept being
// retried, and once the resharder moved {rv}a it ran on the importing
// node: {rv}b = 1. Both were answered +OK, yet the client's later write was
// lost: one client's writes to one key ran out of order. What must hold:
// the SET answered OK is the last write to {rv}b, the MSET being refused
// (TRYAGAIN, which the client may retry) or run before it. (The reviewer's
// test checked {rv}b only when both were OK; this checks it whenever the
// SET was.)
func TestAskedMultiKeyWriteLandsAfterLaterWrite(t *testing.T) {
	c, p := startClusterProxy(t)
	rc := p.Client(t)
	ctx := context.Background()
	ka, kb := "{rv}a", "{rv}b"
	for _, k := range []string{ka, kb} {
		if err := rc.Set(ctx, k, "0", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	m := startSlotMigration(t, c, p, ka)
	sc, dst := m.src.Client(t), m.dst
	if err := sc.Do(ctx, "MIGRATE", "127.0.0.1", dst.Port(), "", 0, 5000, "KEYS", kb).Err(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		// The resharder moves the slot's next key a little later, as
		// redis-cli --cluster reshard does key batch by key batch.
		time.Sleep(300 * time.Millisecond)
		if err := sc.Do(ctx, "MIGRATE", "127.0.0.1", dst.Port(), "", 0, 5000, "KEYS", ka).Err(); err != nil {
			t.Error(err)
		}
		for _, n := range c.Primaries(t) {
			if err := n.Client(t).Do(ctx, "CLUSTER", "SETSLOT", m.slot, "NODE", m.dstID).Err(); err != nil {
				t.Error(err)
			}
		}
	}()
	cmds, err := rc.Pipelined(ctx, func(pp redis.Pipeliner) error {
		pp.MSet(ctx, ka, "1", kb, "1")
		pp.Set(ctx, kb, "2", 0)
		return nil
	})
	<-done
	t.Logf("replies: %v (err %v)", cmds, err)
	if len(cmds) != 2 || cmds[1].Err() != nil {
		return // the SET was refused: no later write to lose
	}
	// Whether the MSET was refused (it never ran) or ran first, the SET
	// answered OK is the last write to {rv}b.
	if v := rc.Get(ctx, kb).Val(); v != "2" {
		t.Fatalf("pipeline MSET %s 1 %s 1; SET %s 2: replies %v, but %s = %q afterwards, want \"2\" (the MSET ran after the later SET)", ka, kb, kb, cmds, kb, v)
	}
}
