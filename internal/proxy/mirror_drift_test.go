package proxy_test

// Mirror defects found by a review where the mirror drifted from the
// primary through the proxy's own doing, each reproduced against real
// servers.

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/mirror"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/redistest"
)

// Writes whose effect the server chooses (SPOP picks random members, XADD
// * takes its ID from the server's clock) were mirrored as sent, so the
// mirror applied a different effect: after SPOP set 100 the two sets held
// different members, and an XDEL of the ID the primary chose missed on the
// mirror. They are now mirrored as Redis replicates them, rebuilt from the
// primary's reply: SREM of the members popped, XADD with the ID chosen.
func TestMirrorNondeterministicWritesDiverge(t *testing.T) {
	ms := redistest.Start(t)
	p := startMirrored(t, ms, nil)
	c := p.Client(t)
	mc := ms.Client(t)
	direct := p.Redis.Client(t)
	members := make([]any, 200)
	for i := range members {
		members[i] = i
	}
	if err := c.SAdd(ctx, "set", members...).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.SPopN(ctx, "set", 100).Err(); err != nil {
		t.Fatal(err)
	}
	id, err := c.XAdd(ctx, &redis.XAddArgs{Stream: "stream", Values: []any{"f", "v"}}).Result()
	if err != nil {
		t.Fatal(err)
	}
	waitMirrored(t, p)
	// Stream IDs: the mirror, stopped, gets the next XADD only after its
	// clock has moved on from the primary's.
	ms.Freeze(t)
	id2, err := c.XAdd(ctx, &redis.XAddArgs{Stream: "stream", Values: []any{"f", "v2"}}).Result()
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // a gap in time is the point: no condition to poll
	ms.Thaw(t)
	waitMirrored(t, p)
	if err := c.XDel(ctx, "stream", id2).Err(); err != nil {
		t.Fatal(err)
	}
	waitMirrored(t, p)

	pm, _ := direct.SMembers(ctx, "set").Result()
	mm, _ := mc.SMembers(ctx, "set").Result()
	sort.Strings(pm)
	sort.Strings(mm)
	if len(pm) != 100 || !slices.Equal(pm, mm) {
		t.Errorf("after SPOP set 100 the sets differ: primary %d members, mirror %d, first primary %v, first mirror %v",
			len(pm), len(mm), pm[:min(5, len(pm))], mm[:min(5, len(mm))])
	}
	ps, _ := direct.XRange(ctx, "stream", "-", "+").Result()
	mst, _ := mc.XRange(ctx, "stream", "-", "+").Result()
	ids := func(m []redis.XMessage) (out []string) {
		for _, x := range m {
			out = append(out, x.ID)
		}
		return out
	}
	if len(ps) != 1 || !slices.Equal(ids(ps), ids(mst)) {
		t.Errorf("streams differ after XADD * ... and XDEL: primary %v (first id %s), mirror %v", ids(ps), id, ids(mst))
	}
}

// The forms of SPOP and XADD rebuilt from their replies, in both
// protocols and wrapped with the guard's TTL fix-ups, leave the mirror
// equal to the primary; those that did nothing mirror nothing; the
// nondeterministic writes that cannot be rebuilt are not mirrored and are
// counted (skipped{reason="nondeterministic"}).
func TestMirrorNondeterministicWritesAsEffects(t *testing.T) {
	ms := redistest.Start(t)
	p := startMirrored(t, ms, func(c *config.Config) {
		c.Policy.TTL = []policy.TTLRule{{Pattern: "h:*", Required: true, Default: policy.Duration{Duration: time.Hour}}}
	})
	direct := p.Redis.Client(t)
	mc := ms.Client(t)
	for _, proto := range []int{2, 3} {
		c := p.Client(t, func(o *redis.Options) { o.Protocol = proto })
		do := func(args ...any) {
			t.Helper()
			if err := c.Do(ctx, args...).Err(); err != nil && err != redis.Nil {
				t.Fatalf("%v: %v", args, err)
			}
		}
		do("SADD", "s", "a", "b", "c", "d", "e", "f")
		do("SPOP", "s")
		do("SPOP", "s", 2)
		do("SPOP", "s", 0)
		do("SPOP", "missing")
		do("SPOP", "missing", 3)
		do("SADD", "h:s", "a", "b", "c")
		do("SPOP", "h:s")
		do("XADD", "x", "*", "f", "1")
		do("XADD", "x", "nomkstream", "MAXLEN", "~", 1000, "LIMIT", 10, "*", "f", "2")
		do("XADD", "x", "MINID", "=", "0-1", "*", "f", "3")
		do("XADD", "x", "MAXLEN", 100, "NOMKSTREAM", "99999999999999-*", "f", "4") // sequence chosen by the server
		do("XADD", "absent", "NOMKSTREAM", "*", "f", "v")
		do("XADD", "h:x", "*", "f", "v")
		do("XTRIM", "x", "MAXLEN", "=", 3)
		waitMirrored(t, p)
		for _, k := range []string{"s", "h:s"} {
			pm, _ := direct.SMembers(ctx, k).Result()
			mm, _ := mc.SMembers(ctx, k).Result()
			sort.Strings(pm)
			sort.Strings(mm)
			if !slices.Equal(pm, mm) {
				t.Errorf("RESP%d: %s: primary %v, mirror %v", proto, k, pm, mm)
			}
		}
		for _, k := range []string{"x", "h:x"} {
			ps, _ := direct.XRange(ctx, k, "-", "+").Result()
			mst, _ := mc.XRange(ctx, k, "-", "+").Result()
			if len(ps) == 0 || fmt.Sprint(ps) != fmt.Sprint(mst) {
				t.Errorf("RESP%d: %s: primary %v, mirror %v", proto, k, ps, mst)
			}
		}
		if ttl, _ := mc.TTL(ctx, "h:x").Result(); ttl <= 0 {
			t.Errorf("RESP%d: mirror TTL h:x = %v: the fix-up did not follow the rebuilt XADD", proto, ttl)
		}
		if n, _ := mc.Exists(ctx, "absent", "missing").Result(); n != 0 {
			t.Errorf("RESP%d: the mirror has %d of absent, missing", proto, n)
		}
		if err := direct.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if err := mc.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}

	// Not rebuilt: skipped, counted.
	c := p.Client(t)
	if err := c.XAdd(ctx, &redis.XAddArgs{Stream: "x", ID: "1-1", Values: []any{"f", "v"}}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.XGroupCreate(ctx, "x", "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c1", Streams: []string{"x", ">"}}).Err(); err != nil {
		t.Fatal(err)
	}
	waitMirrored(t, p)
	before := p.Mirror().Report(0).Skipped[mirror.SkipNondeterministic]
	for _, args := range [][]any{
		{"XCLAIM", "x", "g", "c2", 0, "1-1"},
		{"XAUTOCLAIM", "x", "g", "c3", 0, "0"},
		{"XTRIM", "x", "MAXLEN", "~", 0},
	} {
		if err := c.Do(ctx, args...).Err(); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
	}
	waitMirrored(t, p)
	if n := p.Mirror().Report(0).Skipped[mirror.SkipNondeterministic] - before; n != 3 {
		t.Errorf("skipped nondeterministic = %d, want 3 (XCLAIM, XAUTOCLAIM, XTRIM ~)", n)
	}
}

// A blocking pop's mirrored LPOP is held while another client's write is
// in flight (mirror/order.go), but the same client's next write was
// queued at once, ahead of its own held pop: the client's order broke on
// the mirror, and the list diverged (primary [mine], mirror [job]). The
// in-flight write is one to a stalled routed upstream; on a busy proxy any
// concurrent write batch does the same. Now a session's entries queue
// behind its own held one.
func TestMirrorPopHeldKeepsOwnClientOrder(t *testing.T) {
	ms := redistest.Start(t)
	slow := redistest.Start(t)
	p := startMirrored(t, ms, func(c *config.Config) {
		c.Upstreams["slow"] = namedUpstream(slow.Addr())
		c.Routes = []config.Route{{Pattern: "slow:*", Upstream: "slow"}}
	})
	a := p.Client(t)
	b := p.Client(t)
	cl := p.Client(t)
	direct := p.Redis.Client(t)
	mc := ms.Client(t)
	if err := cl.Set(ctx, "slow:warm", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	waitMirrored(t, p)

	// Another client's write, in flight (to a stopped server) for a while.
	slow.Freeze(t)
	go cl.Set(ctx, "slow:1", "x", 0)
	time.Sleep(50 * time.Millisecond) // sent: nothing outside the proxy shows it

	popped := make(chan []string, 1)
	go func() {
		v, _ := a.BLPop(ctx, 5*time.Second, "q").Result()
		popped <- v
	}()
	redistest.Eventually(t, 5*time.Second, func() bool {
		info, _ := direct.Info(ctx, "clients").Result()
		return strings.Contains(info, "blocked_clients:1\r")
	}, "BLPOP never blocked on the primary")
	if err := b.RPush(ctx, "q", "job").Err(); err != nil {
		t.Fatal(err)
	}
	if v := <-popped; len(v) != 2 || v[1] != "job" {
		t.Fatalf("BLPOP = %v", v)
	}
	// The same client, after its pop: its next write.
	if err := a.LPush(ctx, "q", "mine").Err(); err != nil {
		t.Fatal(err)
	}
	// The held pop goes once the stalled write's ticket is given up
	// (maxHold), while that write is still in flight.
	waitMirrored(t, p)
	slow.Thaw(t)
	waitMirrored(t, p)
	pl, _ := direct.LRange(ctx, "q", 0, -1).Result()
	ml, _ := mc.LRange(ctx, "q", 0, -1).Result()
	if !slices.Equal(pl, ml) {
		t.Fatalf("list q: primary %v, mirror %v: the client's LPUSH reached the mirror before its own (held) LPOP", pl, ml)
	}
}
