package proxy_test

import (
	"context"
	"crypto/sha1"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/cluster"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// TestClusterNoScriptKeepsWriteOrder: an EVALSHA answered NOSCRIPT was sent
// again (with SCRIPT LOAD) in a later round, after the pipeline's next
// command on the same key had run: the client's writes to k applied out of
// order, both acknowledged (found by review). Now the NOSCRIPT is the
// answer, as Redis gives it, when a later command of its slot ran.
func TestClusterNoScriptKeepsWriteOrder(t *testing.T) {
	c, p := startClusterProxy(t)
	rc := p.Client(t)
	ctx := context.Background()
	body := "return redis.call('SET', KEYS[1], ARGV[1])"
	sha := fmt.Sprintf("%x", sha1.Sum([]byte(body)))
	if err := rc.ScriptLoad(ctx, body).Err(); err != nil {
		t.Fatal(err)
	}
	// The key's node lost its scripts (as a replica promoted since would).
	k := "ns:key"
	owner := nodeAt(t, c, p.Router().Map().Owner(cluster.Slot([]byte(k))))
	if err := owner.Client(t).ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	cmds, err := rc.Pipelined(ctx, func(pp redis.Pipeliner) error {
		pp.EvalSha(ctx, sha, []string{k}, "1")
		pp.Set(ctx, k, "2", 0)
		return nil
	})
	t.Logf("replies: %v (err %v)", cmds, err)
	if v := rc.Get(ctx, k).Val(); v != "2" {
		t.Fatalf("after EVALSHA(SET k 1), SET k 2 (both acknowledged) k = %q, want \"2\"", v)
	}
}

// TestClusterTryAgainKeepsWriteOrder: a multi-key command of a migrating
// slot got TRYAGAIN and was retried in later rounds, while the pipeline's
// next command on one of its keys, still on the source node, ran in round
// one; when the migration ended the retried MSET landed last (found by
// review).
func TestClusterTryAgainKeepsWriteOrder(t *testing.T) {
	c, p := startClusterProxy(t)
	rc := p.Client(t)
	ctx := context.Background()
	ka, kb := "{t}a", "{t}b"
	for _, k := range []string{ka, kb} {
		if err := rc.Set(ctx, k, "0", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	m := startSlotMigration(t, c, p, ka)
	slot, sc, dst, dstID := m.slot, m.src.Client(t), m.dst, m.dstID
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(sc.Do(ctx, "MIGRATE", "127.0.0.1", dst.Port(), "", 0, 5000, "KEYS", ka).Err())
	// What does the source answer a multi-key write now?
	t.Logf("src answers MSET: %v", sc.MSet(ctx, ka, "x", kb, "x").Err())

	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(150 * time.Millisecond)
		if err := sc.Do(ctx, "MIGRATE", "127.0.0.1", dst.Port(), "", 0, 5000, "KEYS", kb).Err(); err != nil {
			t.Error(err)
		}
		for _, n := range c.Primaries(t) {
			if err := n.Client(t).Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dstID).Err(); err != nil {
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
	// The MSET may fail (TRYAGAIN, as Redis answers it during the move),
	// but whatever ran, ran in the pipeline's order: {t}b ends as 2.
	if v := rc.Get(ctx, kb).Val(); v != "2" {
		t.Fatalf("after MSET {t}a 1 {t}b 1, SET {t}b 2 (both +OK) {t}b = %q, want \"2\"", v)
	}
}

// TestClusterFixupGroupFollowsAsk: the proxy's own MULTI/HSET/EXPIRE
// NX/EXEC group met ASK (a new key of a migrating slot) and was resent to
// the importing node with ASKING before every member; inside MULTI those
// were queued, so EXEC's array had extra elements and the client's reply
// was taken from the wrong one (found by review). ASKING now goes once,
// before MULTI.
func TestClusterFixupGroupFollowsAsk(t *testing.T) {
	c, p := startClusterTTLProxy(t)
	rc := p.Client(t)
	ctx := context.Background()
	k := "sess:{t}new"
	m := startSlotMigration(t, c, p, k)
	dst := m.dst
	_, asked0, _ := p.Router().Stats()
	n, err := rc.HSet(ctx, k, "f", "v").Result()
	_, asked, _ := p.Router().Stats()
	t.Logf("HSET = %d, %v (ASK followed: %d)", n, err, asked-asked0)
	if err != nil || n != 1 {
		t.Fatalf("HSET of a new key in a migrating slot = %d, %v; want 1", n, err)
	}
	dconn := dst.Client(t).Conn()
	defer dconn.Close()
	dconn.Do(ctx, "ASKING")
	if ttl, err := dconn.TTL(ctx, k).Result(); err != nil || ttl <= 0 {
		t.Fatalf("TTL on the importing node = %v, %v", ttl, err)
	}
}

// TestClusterNeverShowsARedirection: MSET of two keys of a migrating slot,
// one on the importing node and one on neither: the source answers ASK,
// the importing node TRYAGAIN, round after round; past maxRedirects the
// client was shown the raw -ASK (found by review). It gets TRYAGAIN.
func TestClusterNeverShowsARedirection(t *testing.T) {
	c, p := startClusterProxy(t)
	rc := p.Client(t)
	ctx := context.Background()
	ka, kb := "{u}a", "{u}b"
	if err := rc.Set(ctx, ka, "0", 0).Err(); err != nil {
		t.Fatal(err)
	}
	m := startSlotMigration(t, c, p, ka)
	sc, dst := m.src.Client(t), m.dst
	if err := sc.Do(ctx, "MIGRATE", "127.0.0.1", dst.Port(), "", 0, 5000, "KEYS", ka).Err(); err != nil {
		t.Fatal(err)
	}
	err := rc.MSet(ctx, ka, "1", kb, "1").Err()
	t.Logf("MSET during migration: %v", err)
	if err != nil && (strings.HasPrefix(err.Error(), "ASK ") || strings.HasPrefix(err.Error(), "MOVED ")) {
		t.Fatalf("the client was shown a redirection: %v", err)
	}
}

// slotMigration is a slot being moved from src to dst: IMPORTING on dst,
// MIGRATING on src, no key moved yet.
type slotMigration struct {
	slot         int
	src, dst     *redistest.Server
	srcID, dstID string
}

// startSlotMigration starts moving key's slot from its owner to another
// primary of c.
func startSlotMigration(t *testing.T, c *redistest.Cluster, p *proxytest.Proxy, key string) slotMigration {
	t.Helper()
	ctx := context.Background()
	m := slotMigration{slot: cluster.Slot([]byte(key))}
	m.src = nodeAt(t, c, p.Router().Map().Owner(m.slot))
	for _, n := range c.Primaries(t) {
		if n != m.src {
			m.dst = n
			break
		}
	}
	m.srcID, m.dstID = redistest.NodeID(t, m.src), redistest.NodeID(t, m.dst)
	if err := m.dst.Client(t).Do(ctx, "CLUSTER", "SETSLOT", m.slot, "IMPORTING", m.srcID).Err(); err != nil {
		t.Fatal(err)
	}
	if err := m.src.Client(t).Do(ctx, "CLUSTER", "SETSLOT", m.slot, "MIGRATING", m.dstID).Err(); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestClusterScriptReturningNoScriptRunsOnce: a script that wrote and
// then returned an error of its own starting "NOSCRIPT" (or TRYAGAIN,
// CLUSTERDOWN) ran; taken for Redis's, the router ran it again up to its
// retry limit, and its INCR happened 9 times. The router knows Redis's
// errors by their texts.
func TestClusterScriptReturningNoScriptRunsOnce(t *testing.T) {
	_, p := startClusterProxy(t)
	rc := p.Client(t)
	ctx := context.Background()
	for _, code := range []string{"NOSCRIPT", "TRYAGAIN", "CLUSTERDOWN"} {
		body := "redis.call('INCR', KEYS[1]); return redis.error_reply('" + code + " of its own')"
		sha, err := rc.ScriptLoad(ctx, body).Result()
		if err != nil {
			t.Fatal(err)
		}
		// Raw: go-redis reports any error starting NOSCRIPT as its ErrNoScript.
		c := dialRaw(t, p.Addr)
		key := "once:" + code
		c.send([]string{"EVALSHA", sha, "1", key})
		if v, _ := c.readReply(); v != respError(code+" of its own") {
			t.Fatalf("EVALSHA: %v, want the script's own error", v)
		}
		if v := rc.Get(ctx, key).Val(); v != "1" {
			t.Errorf("after one EVALSHA of a script that INCRs once and returns %s, the counter is %q", code, v)
		}
	}
}
