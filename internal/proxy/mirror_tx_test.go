package proxy_test

// Mirroring of what runs on a dedicated connection (transactions, writes
// under WATCH, blocking pops) and of scripts the mirror lacks, against
// real redis-servers.

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/mirror"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// compareThrough reads keys through the proxy (every read sampled and
// compared with the mirror's reply) and checks no mirrored read differed.
func compareThrough(t *testing.T, p *proxytest.Proxy, c *redis.Client, reads func()) {
	t.Helper()
	before := p.Mirror().Report(0)
	reads()
	waitMirrored(t, p)
	after := p.Mirror().Report(10)
	if after.Compared == before.Compared {
		t.Error("no read was compared")
	}
	if after.Mismatches != before.Mismatches {
		t.Errorf("%d sampled reads differ on the mirror: %+v", after.Mismatches-before.Mismatches, after.Patterns)
	}
}

// TestMirrorTransaction: a transaction that ran on the primary is mirrored
// as MULTI, its writes, EXEC, so the mirror runs it atomically too; also
// when it spans batches and SELECTs another database inside (the mirror's
// connection selects back after EXEC), and with writes under WATCH before
// it. Reads in it are not mirrored.
func TestMirrorTransaction(t *testing.T) {
	ms := redistest.Start(t)
	p := startMirrored(t, ms, func(c *config.Config) {
		c.Upstream.Databases = 4
		c.Mirror.ReadsSample, c.Mirror.Compare = 1, true
	})
	c := p.Client(t)
	mc := ms.Client(t)
	check := func(err error) {
		t.Helper()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
	}
	// One batch: MULTI ... EXEC pipelined.
	_, err := c.TxPipelined(ctx, func(tx redis.Pipeliner) error {
		tx.Set(ctx, "tx:a", "1", 0)
		tx.Incr(ctx, "tx:n")
		tx.RPush(ctx, "tx:l", "a", "b")
		tx.Get(ctx, "tx:a")
		return nil
	})
	check(err)

	// Across batches, with a SELECT inside: one client, one connection.
	one := p.Client(t, func(o *redis.Options) { o.PoolSize = 1; o.Protocol = 2 })
	for _, cmd := range [][]any{{"MULTI"}, {"SET", "tx:b", "2"}, {"SELECT", "2"}, {"SET", "tx:c", "3"}} {
		check(one.Do(ctx, cmd...).Err())
	}
	if res, err := one.Do(ctx, "EXEC").Slice(); err != nil || len(res) != 3 {
		t.Fatalf("EXEC = %v, %v", res, err)
	}
	check(one.Do(ctx, "SET", "tx:after", "4").Err()) // in db 2 now, on both
	// Another client's write in db 0 after the transaction: the mirror's
	// db-0 connection that ran the SELECT must be back in db 0.
	check(c.Set(ctx, "tx:db0", "5", 0).Err())

	// Writes under WATCH, then the transaction.
	w := p.Client(t, func(o *redis.Options) { o.PoolSize = 1 })
	for _, cmd := range [][]any{{"WATCH", "tx:w"}, {"SET", "tx:watched", "v"}, {"MULTI"}, {"SET", "tx:w", "1"}, {"EXEC"}} {
		check(w.Do(ctx, cmd...).Err())
	}
	waitMirrored(t, p)

	for key, want := range map[string]string{"tx:a": "1", "tx:n": "1", "tx:b": "2", "tx:db0": "5", "tx:watched": "v", "tx:w": "1"} {
		if got, err := mc.Get(ctx, key).Result(); err != nil || got != want {
			t.Errorf("mirror GET %s = %q, %v; want %q", key, got, err, want)
		}
	}
	if got, _ := mc.LRange(ctx, "tx:l", 0, -1).Result(); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("mirror tx:l = %v", got)
	}
	mc2 := redis.NewClient(&redis.Options{Addr: ms.Addr(), DB: 2})
	defer mc2.Close()
	for key, want := range map[string]string{"tx:c": "3", "tx:after": "4"} {
		if got, err := mc2.Get(ctx, key).Result(); err != nil || got != want {
			t.Errorf("mirror db 2 GET %s = %q, %v; want %q", key, got, err, want)
		}
		if n, _ := mc.Exists(ctx, key).Result(); n != 0 {
			t.Errorf("mirror db 0 has %s", key)
		}
	}
	if n := calls(t, ms, "multi"); n != 3 {
		t.Errorf("the mirror ran MULTI %d times, want 3", n)
	}
	if n := calls(t, ms, "exec"); n != 3 {
		t.Errorf("the mirror ran EXEC %d times, want 3", n)
	}
	rep := p.Mirror().Report(0)
	if rep.Errors[mirror.ErrReply] != 0 || rep.Errors[mirror.ErrConnection] != 0 || rep.Skipped[mirror.SkipTransaction] != 0 {
		t.Errorf("report = %+v", rep)
	}
	compareThrough(t, p, c, func() {
		for _, k := range []string{"tx:a", "tx:n", "tx:b", "tx:db0", "tx:w", "tx:watched"} {
			check(c.Get(ctx, k).Err())
		}
		check(c.LRange(ctx, "tx:l", 0, -1).Err())
	})
}

// TestMirrorTransactionAborted: a transaction that did not run on the
// primary (EXECABORT, a failed WATCH, DISCARD) mirrors nothing, and the
// next one of the same client is mirrored without the discarded writes.
func TestMirrorTransactionAborted(t *testing.T) {
	ms := redistest.Start(t)
	p := startMirrored(t, ms, nil)
	mc := ms.Client(t)
	other := p.Client(t)
	one := p.Client(t, func(o *redis.Options) { o.PoolSize = 1; o.Protocol = 2 })
	do := func(args ...any) error { return one.Do(ctx, args...).Err() }

	// A queue-time error: EXECABORT.
	if err := do("MULTI"); err != nil {
		t.Fatal(err)
	}
	if err := do("SET", "ab:x", "1"); err != nil {
		t.Fatal(err)
	}
	if err := do("SET", "ab:x"); err == nil {
		t.Fatal("SET with one argument queued")
	}
	if err := do("EXEC"); err == nil || !strings.Contains(err.Error(), "EXECABORT") {
		t.Fatalf("EXEC = %v, want EXECABORT", err)
	}
	// A WATCH that fails: EXEC answers null.
	if err := do("WATCH", "ab:k"); err != nil {
		t.Fatal(err)
	}
	if err := other.Set(ctx, "ab:k", "changed", 0).Err(); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range [][]any{{"MULTI"}, {"SET", "ab:y", "1"}} {
		if err := do(cmd...); err != nil {
			t.Fatal(err)
		}
	}
	if err := do("EXEC"); !errors.Is(err, redis.Nil) {
		t.Fatalf("EXEC after a changed WATCH = %v, want nil", err)
	}
	// DISCARD, then a transaction that runs.
	for _, cmd := range [][]any{{"MULTI"}, {"SET", "ab:z", "1"}, {"DISCARD"}, {"MULTI"}, {"SET", "ab:ok", "1"}, {"EXEC"}} {
		if err := do(cmd...); err != nil {
			t.Fatalf("%v: %v", cmd, err)
		}
	}
	waitMirrored(t, p)
	direct := p.Redis.Client(t)
	for _, key := range []string{"ab:x", "ab:y", "ab:z"} {
		if n, _ := direct.Exists(ctx, key).Result(); n != 0 {
			t.Errorf("%s ran on the primary", key)
		}
		if n, _ := mc.Exists(ctx, key).Result(); n != 0 {
			t.Errorf("%s of a transaction that did not run was mirrored", key)
		}
	}
	for _, key := range []string{"ab:ok", "ab:k"} {
		if n, _ := mc.Exists(ctx, key).Result(); n != 1 {
			t.Errorf("%s was not mirrored", key)
		}
	}
	if n := calls(t, ms, "exec"); n != 1 {
		t.Errorf("the mirror ran EXEC %d times, want 1", n)
	}
	if rep := p.Mirror().Report(0); rep.Skipped[mirror.SkipTransaction] != 2 || rep.Errors[mirror.ErrReply] != 0 {
		t.Errorf("skipped = %v, errors = %v; want 2 transactions skipped, no errors", rep.Skipped, rep.Errors)
	}
}

// TestMirrorBlockingPops: each blocking pop that took something is
// mirrored as the non-blocking command with the same effect, so the
// mirror's lists and sorted sets end equal to the primary's; a timed-out
// one mirrors nothing; a blocking XREADGROUP is skipped, counted. Both
// protocols.
func TestMirrorBlockingPops(t *testing.T) {
	ms := redistest.Start(t)
	p := startMirrored(t, ms, func(c *config.Config) {
		c.Mirror.ReadsSample, c.Mirror.Compare = 1, true
	})
	mc := ms.Client(t)
	direct := p.Redis.Client(t)
	for _, proto := range []int{2, 3} {
		k := func(name string) string { return fmt.Sprintf("p%d:%s", proto, name) }
		c := p.Client(t, func(o *redis.Options) { o.Protocol = proto })
		do := func(want any, args ...any) {
			t.Helper()
			got, err := c.Do(ctx, args...).Result()
			if errors.Is(err, redis.Nil) {
				got, err = nil, nil
			}
			if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("RESP%d %v = %v, %v; want %v", proto, args, got, err, want)
			}
		}
		do(int64(6), "RPUSH", k("l"), "a", "b", "c", "d", "e", "f")
		do(int64(3), "RPUSH", k("src"), "x", "y", "z")
		do(int64(6), "ZADD", k("z"), 1, "m1", 2, "m2", 3, "m3", 4, "m4", 5, "m5", 6, "m6")

		do([]any{k("l"), "a"}, "BLPOP", k("l"), 1)
		do([]any{k("l"), "f"}, "BRPOP", k("l"), 1)
		do("x", "BLMOVE", k("src"), k("dst"), "LEFT", "RIGHT", 1)
		do("z", "BRPOPLPUSH", k("src"), k("dst"), 1)
		do([]any{k("l"), []any{"b", "c"}}, "BLMPOP", 1, 1, k("l"), "LEFT", "COUNT", 2)
		if got, err := c.Do(ctx, "BZPOPMIN", k("z"), 1).Slice(); err != nil || len(got) != 3 || got[1] != "m1" {
			t.Fatalf("BZPOPMIN = %v, %v", got, err)
		}
		if got, err := c.Do(ctx, "BZPOPMAX", k("z"), 1).Slice(); err != nil || len(got) != 3 || got[1] != "m6" {
			t.Fatalf("BZPOPMAX = %v, %v", got, err)
		}
		if got, err := c.Do(ctx, "BZMPOP", 1, 1, k("z"), "MIN", "COUNT", 2).Slice(); err != nil || len(got) != 2 {
			t.Fatalf("BZMPOP = %v, %v", got, err)
		}
		// A timeout took nothing.
		do(nil, "BLPOP", k("empty"), "0.05")
		do(nil, "BLMOVE", k("empty"), k("dst"), "LEFT", "RIGHT", "0.05")

		// One that really waits for another client's push.
		var wg sync.WaitGroup
		wg.Add(1)
		var popped []string
		var popErr error
		go func() {
			defer wg.Done()
			popped, popErr = c.BLPop(ctx, 10*time.Second, k("wait")).Result()
		}()
		redistest.Eventually(t, 10*time.Second, func() bool {
			info, _ := direct.Info(ctx, "clients").Result()
			return !strings.Contains(info, "blocked_clients:0\r")
		}, "the BLPOP never blocked")
		if err := p.Client(t).RPush(ctx, k("wait"), "w1", "w2").Err(); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if popErr != nil || len(popped) != 2 || popped[1] != "w1" {
			t.Fatalf("BLPOP wait = %v, %v", popped, popErr)
		}

		// XREADGROUP BLOCK: skipped, counted.
		do("OK", "XGROUP", "CREATE", k("s"), "g", "$", "MKSTREAM")
		if err := c.XAdd(ctx, &redis.XAddArgs{Stream: k("s"), Values: []any{"f", "v"}}).Err(); err != nil {
			t.Fatal(err)
		}
		if got, err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{k("s"), ">"}, Block: 100 * time.Millisecond}).Result(); err != nil || len(got) != 1 {
			t.Fatalf("XREADGROUP = %v, %v", got, err)
		}
		waitMirrored(t, p)

		for _, key := range []string{k("l"), k("src"), k("dst"), k("wait"), k("empty")} {
			want, _ := direct.LRange(ctx, key, 0, -1).Result()
			got, _ := mc.LRange(ctx, key, 0, -1).Result()
			if !slices.Equal(got, want) {
				t.Errorf("RESP%d mirror %s = %v, primary %v", proto, key, got, want)
			}
		}
		want, _ := direct.ZRangeWithScores(ctx, k("z"), 0, -1).Result()
		got, _ := mc.ZRangeWithScores(ctx, k("z"), 0, -1).Result()
		if fmt.Sprint(got) != fmt.Sprint(want) || len(want) != 2 {
			t.Errorf("RESP%d mirror %s = %v, primary %v", proto, k("z"), got, want)
		}
		compareThrough(t, p, c, func() {
			for _, key := range []string{k("l"), k("src"), k("dst"), k("wait")} {
				c.LRange(ctx, key, 0, -1)
			}
			c.ZRangeWithScores(ctx, k("z"), 0, -1)
		})
	}
	rep := p.Mirror().Report(0)
	if rep.Skipped[mirror.SkipBlocking] != 2 || rep.Errors[mirror.ErrReply] != 0 || rep.Errors[mirror.ErrConnection] != 0 {
		t.Errorf("skipped = %v, errors = %v; want the 2 XREADGROUPs skipped, no errors", rep.Skipped, rep.Errors)
	}
}

// TestMirrorEvalshaScripts: an EVALSHA whose script the mirror lacks (its
// cache was flushed) still runs there when the proxy saw the body (sent as
// EVAL); one whose body the proxy never saw is dropped, counted as
// noscript, not as a mirror error.
func TestMirrorEvalshaScripts(t *testing.T) {
	ms := redistest.Start(t)
	p := startMirrored(t, ms, nil)
	c := p.Client(t)
	mc := ms.Client(t)
	const known = "return redis.call('INCRBY', KEYS[1], ARGV[1])"
	sha, err := c.ScriptLoad(ctx, known).Result()
	if err != nil {
		t.Fatal(err)
	}
	waitMirrored(t, p)
	if err := mc.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.EvalSha(ctx, sha, []string{"sc:known"}, 7).Err(); err != nil {
		t.Fatal(err)
	}
	// Loaded on the primary only, behind the proxy's back.
	unknown, err := p.Redis.Client(t).ScriptLoad(ctx, "return redis.call('SET', KEYS[1], 'u')").Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.EvalSha(ctx, unknown, []string{"sc:unknown"}).Err(); err != nil {
		t.Fatal(err)
	}
	waitMirrored(t, p)
	if got, _ := mc.Get(ctx, "sc:known").Result(); got != "7" {
		t.Errorf("mirror sc:known = %q: the EVALSHA did not run on the mirror", got)
	}
	if n, _ := mc.Exists(ctx, "sc:unknown").Result(); n != 0 {
		t.Error("an unknown script ran on the mirror")
	}
	rep := p.Mirror().Report(0)
	if rep.Dropped[mirror.DropNoScript] != 1 || rep.Errors[mirror.ErrReply] != 0 {
		t.Errorf("dropped = %v, errors = %v; want 1 noscript, no errors", rep.Dropped, rep.Errors)
	}
}

// TestMirrorTransactionTooLarge: a transaction larger than
// mirror.queue_bytes, which the queue could never take, is not copied past
// that size and is dropped whole at EXEC, counted as too_large; the next
// one of the same client is mirrored.
func TestMirrorTransactionTooLarge(t *testing.T) {
	ms := redistest.Start(t)
	p := startMirrored(t, ms, func(c *config.Config) { c.Mirror.QueueBytes = units.KB })
	mc := ms.Client(t)
	c := p.Client(t, func(o *redis.Options) { o.PoolSize = 1 })
	big := strings.Repeat("x", 600)
	_, err := c.TxPipelined(ctx, func(tx redis.Pipeliner) error {
		tx.Set(ctx, "big:1", big, 0)
		tx.Set(ctx, "big:2", big, 0)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.TxPipelined(ctx, func(tx redis.Pipeliner) error { return tx.Set(ctx, "small", "s", 0).Err() }); err != nil {
		t.Fatal(err)
	}
	waitMirrored(t, p)
	if n, _ := mc.Exists(ctx, "big:1", "big:2").Result(); n != 0 {
		t.Errorf("%d keys of the oversized transaction mirrored", n)
	}
	if v, _ := mc.Get(ctx, "small").Result(); v != "s" {
		t.Errorf("mirror small = %q", v)
	}
	if rep := p.Mirror().Report(0); rep.Dropped[mirror.DropTooLarge] != 1 {
		t.Errorf("dropped = %v, want 1 too_large", rep.Dropped)
	}
}

// TestMirrorRoutedTransaction: with routes the proxy holds a transaction
// until EXEC and replays it there (placeHeld); its writes are mirrored
// as one MULTI ... EXEC like a pinned transaction's, and a transaction
// that crosses routes (EXECABORT, nothing sent) mirrors nothing.
func TestMirrorRoutedTransaction(t *testing.T) {
	ms := redistest.Start(t)
	r := startRouted(t, func(c *config.Config) {
		c.Upstreams["new"] = config.Upstream{Address: ms.Addr()}
		c.Mirror = mirror.DefaultConfig()
		c.Mirror.Upstream = "new"
	})
	mc := ms.Client(t)
	if _, err := r.c.TxPipelined(ctx, func(tx redis.Pipeliner) error {
		tx.Set(ctx, "queue:a", "1", 0)
		tx.RPush(ctx, "queue:l", "x", "y")
		tx.Incr(ctx, "queue:n")
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	_, err := r.c.TxPipelined(ctx, func(tx redis.Pipeliner) error {
		tx.Set(ctx, "queue:crossed", "1", 0)
		tx.Set(ctx, "cache:crossed", "1", 0)
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "EXECABORT") {
		t.Fatalf("cross-route transaction: %v, want EXECABORT", err)
	}
	waitMirrored(t, r.p)
	for key, want := range map[string]string{"queue:a": "1", "queue:n": "1"} {
		if got, err := mc.Get(ctx, key).Result(); err != nil || got != want {
			t.Errorf("mirror GET %s = %q, %v; want %q", key, got, err, want)
		}
	}
	if got, _ := mc.LRange(ctx, "queue:l", 0, -1).Result(); !slices.Equal(got, []string{"x", "y"}) {
		t.Errorf("mirror queue:l = %v", got)
	}
	if n, _ := mc.Exists(ctx, "queue:crossed", "cache:crossed").Result(); n != 0 {
		t.Errorf("the aborted transaction reached the mirror (%d keys)", n)
	}
	if n := calls(t, ms, "exec"); n != 1 {
		t.Errorf("the mirror ran EXEC %d times, want 1", n)
	}
}
