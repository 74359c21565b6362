package proxy_test

// Mirroring ([mirror]) against two real redis-servers: the primary behind
// the proxy and the mirror, each reached by go-redis clients directly to
// see what landed where.

import (
	"fmt"
	"io"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/mirror"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// startMirrored starts a primary, a mirror (ms, started with msArgs) and a
// proxy mirroring to it; mutate may change the configuration last.
func startMirrored(t *testing.T, ms *redistest.Server, mutate func(*config.Config)) *proxytest.Proxy {
	t.Helper()
	return proxytest.Start(t, nil, func(c *config.Config) {
		c.Upstreams = map[string]config.Upstream{"new": {Address: ms.Addr()}}
		c.Mirror = mirror.DefaultConfig()
		c.Mirror.Upstream = "new"
		if mutate != nil {
			mutate(c)
		}
	})
}

// waitMirrored waits until the mirror has taken every command queued so
// far (sent, dropped or failed), so what it holds can be checked.
func waitMirrored(t *testing.T, p *proxytest.Proxy) {
	t.Helper()
	redistest.Eventually(t, 10*time.Second, func() bool { n, _ := p.Mirror().Queued(); return n == 0 },
		"the mirror queue never drained")
}

// TestMirrorWrites: writes through the proxy land on the mirror, in the
// client's database, wrapped with the guard's TTL fix-ups; scripts, SCRIPT
// LOAD, transactions and blocking pops go too; reads and writes the
// primary refused do not.
func TestMirrorWrites(t *testing.T) {
	ms := redistest.Start(t)
	p := startMirrored(t, ms, func(c *config.Config) {
		c.Upstream.Databases = 4
		c.Policy.TTL = []policy.TTLRule{{Pattern: "h:*", Required: true, Default: policy.Duration{Duration: time.Hour}}}
	})
	c := p.Client(t)
	direct := p.Redis.Client(t)
	mc := ms.Client(t)

	check := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	check(c.Set(ctx, "user:1:name", "ann", 0).Err())
	pipe := c.Pipeline()
	for i := range 20 {
		pipe.Incr(ctx, "counter")
		pipe.RPush(ctx, "list", i)
	}
	_, err := pipe.Exec(ctx)
	check(err)
	check(c.HSet(ctx, "h:1", "f", "v").Err()) // the guard adds EXPIRE ... NX: MULTI/HSET/EXPIRE/EXEC
	check(c.Eval(ctx, "return redis.call('SET', KEYS[1], ARGV[1])", []string{"script:key"}, "s").Err())
	sha, err := c.ScriptLoad(ctx, "return redis.call('INCRBY', KEYS[1], ARGV[1])").Result()
	check(err)
	check(c.EvalSha(ctx, sha, []string{"sha:key"}, 5).Err())
	// A write the primary refuses is not mirrored.
	if err := c.LPush(ctx, "user:1:name", "x").Err(); err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Fatalf("LPUSH on a string: %v", err)
	}
	// A transaction is mirrored whole (TestMirrorTransaction).
	_, err = c.TxPipelined(ctx, func(tx redis.Pipeliner) error {
		tx.Set(ctx, "tx:key", "1", 0)
		return nil
	})
	check(err)
	// A blocking pop is mirrored as LPOP (TestMirrorBlockingPops).
	check(c.RPush(ctx, "queue:jobs", "job").Err())
	if got, err := c.BLPop(ctx, time.Second, "queue:jobs").Result(); err != nil || got[1] != "job" {
		t.Fatalf("BLPOP = %v, %v", got, err)
	}
	// The client's SELECTed database, on a connection of its own.
	c3 := p.Client(t, func(o *redis.Options) { o.DB = 3; o.PoolSize = 1 })
	check(c3.Set(ctx, "in:db3", "three", 0).Err())
	// RESP3 clients' writes go on the mirror's RESP3 connections.
	c3p := p.Client(t, func(o *redis.Options) { o.Protocol = 3 })
	check(c3p.Set(ctx, "resp3:key", "r3", 0).Err())
	waitMirrored(t, p)

	for key, want := range map[string]string{"user:1:name": "ann", "counter": "20", "script:key": "s", "sha:key": "5", "resp3:key": "r3"} {
		if got, err := mc.Get(ctx, key).Result(); err != nil || got != want {
			t.Errorf("mirror GET %s = %q, %v; want %q", key, got, err, want)
		}
	}
	if got, err := mc.LRange(ctx, "list", 0, -1).Result(); err != nil || len(got) != 20 || got[19] != "19" {
		t.Errorf("mirror list = %v, %v", got, err)
	}
	if got, _ := mc.HGet(ctx, "h:1", "f").Result(); got != "v" {
		t.Errorf("mirror h:1 f = %q", got)
	}
	if ttl, _ := mc.TTL(ctx, "h:1").Result(); ttl <= 0 {
		t.Errorf("mirror h:1 TTL = %v: the guard's fix-up was not mirrored", ttl)
	}
	if ttl, _ := direct.TTL(ctx, "h:1").Result(); ttl <= 0 {
		t.Errorf("primary h:1 TTL = %v", ttl)
	}
	if n, _ := mc.Exists(ctx, "tx:key").Result(); n != 1 {
		t.Error("a write inside MULTI/EXEC was not mirrored")
	}
	if n, _ := direct.Exists(ctx, "tx:key").Result(); n != 1 {
		t.Error("the transaction did not run on the primary")
	}
	mc3 := redis.NewClient(&redis.Options{Addr: ms.Addr(), DB: 3})
	defer mc3.Close()
	if got, err := mc3.Get(ctx, "in:db3").Result(); err != nil || got != "three" {
		t.Errorf("mirror db 3 in:db3 = %q, %v", got, err)
	}
	if n, _ := mc.Exists(ctx, "in:db3").Result(); n != 0 {
		t.Error("a write of db 3 landed in the mirror's db 0")
	}

	rep := p.Mirror().Report(10)
	if rep.Skipped[mirror.SkipTransaction] != 0 || rep.Skipped[mirror.SkipPrimaryError] != 1 || rep.Skipped[mirror.SkipBlocking] != 0 {
		t.Errorf("skipped = %v, want 1 primary_error only", rep.Skipped)
	}
	if got, _ := mc.LRange(ctx, "queue:jobs", 0, -1).Result(); len(got) != 0 {
		t.Errorf("mirror queue:jobs = %v: the blocking pop was not mirrored", got)
	}
	// Writes: SET, 40 in the pipeline, HSET, EVAL, SCRIPT LOAD, EVALSHA,
	// the transaction, the RPUSH, its BLPOP (as LPOP), the SET in db 3 and
	// the RESP3 one.
	if rep.Sent != 50 || rep.Errors[mirror.ErrReply] != 0 || rep.Errors[mirror.ErrConnection] != 0 || rep.Sampled != 0 {
		t.Errorf("report = %+v, want 50 sent, no errors, no reads", rep)
	}
	for _, d := range rep.Dropped {
		if d != 0 {
			t.Errorf("dropped = %v", rep.Dropped)
		}
	}
}

// TestMirrorComparesSampledReads: with reads_sample = 1 and compare on,
// every read of a key is also sent to the mirror and its reply compared;
// a value changed on the mirror alone is counted as a mismatch under its
// key's pattern, whichever path the read took (a lone read through
// coalescing, reads pipelined with others).
func TestMirrorComparesSampledReads(t *testing.T) {
	ms := redistest.Start(t)
	p := startMirrored(t, ms, func(c *config.Config) {
		c.Mirror.ReadsSample = 1
		c.Mirror.Compare = true
	})
	c := p.Client(t)
	mc := ms.Client(t)
	for i := range 5 {
		if err := c.Set(ctx, fmt.Sprintf("user:%d:name", i), "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	waitMirrored(t, p)
	read := func() {
		t.Helper()
		if err := c.Get(ctx, "user:1:name").Err(); err != nil {
			t.Fatal(err)
		}
		pipe := c.Pipeline()
		for i := range 5 {
			pipe.Get(ctx, fmt.Sprintf("user:%d:name", i))
		}
		pipe.TTL(ctx, "user:1:name") // sampled, never compared
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
		waitMirrored(t, p)
	}
	read()
	rep := p.Mirror().Report(10)
	if rep.Sampled != 7 || rep.Compared != 6 || rep.Mismatches != 0 {
		t.Fatalf("in sync: sampled %d compared %d mismatches %d, want 7, 6, 0", rep.Sampled, rep.Compared, rep.Mismatches)
	}

	if err := mc.Set(ctx, "user:1:name", "changed on the mirror", 0).Err(); err != nil {
		t.Fatal(err)
	}
	read()
	rep = p.Mirror().Report(10)
	if rep.Compared != 12 || rep.Mismatches != 2 {
		t.Fatalf("after the change: compared %d mismatches %d, want 12, 2", rep.Compared, rep.Mismatches)
	}
	if len(rep.Patterns) != 1 || rep.Patterns[0] != (mirror.PatternCount{Pattern: "user:*:*", Command: "get", Mismatches: 2}) {
		t.Fatalf("patterns = %+v", rep.Patterns)
	}
	if got, _ := c.Get(ctx, "user:1:name").Result(); got != "v" {
		t.Fatalf("the client read %q: replies must come from the primary", got)
	}
}

// TestMirrorStalledNeverSlowsPrimary: while the mirror does not answer
// (stopped with SIGSTOP, paused with CLIENT PAUSE, or busy in DEBUG SLEEP),
// every client keeps getting its replies from the primary, the queue
// stays within its limits and the excess is dropped and counted; once the
// mirror answers again, writes reach it again.
func TestMirrorStalledNeverSlowsPrimary(t *testing.T) {
	for _, tc := range []struct {
		name  string
		stall func(t *testing.T, ms *redistest.Server)
		end   func(t *testing.T, ms *redistest.Server)
	}{
		{"SIGSTOP", func(t *testing.T, ms *redistest.Server) { ms.Freeze(t) }, func(t *testing.T, ms *redistest.Server) { ms.Thaw(t) }},
		{"CLIENT PAUSE", func(t *testing.T, ms *redistest.Server) {
			if err := ms.Client(t).Do(ctx, "CLIENT", "PAUSE", 4000, "ALL").Err(); err != nil {
				t.Fatal(err)
			}
		}, nil},
		{"DEBUG SLEEP", func(t *testing.T, ms *redistest.Server) {
			c := ms.Client(t)
			go c.Do(ctx, "DEBUG", "SLEEP", 4)
			// DEBUG SLEEP holds the server: a PING that waits shows it began.
			redistest.Eventually(t, 5*time.Second, func() bool {
				pc := redis.NewClient(&redis.Options{Addr: ms.Addr(), ReadTimeout: 50 * time.Millisecond, MaxRetries: -1})
				defer pc.Close()
				return pc.Ping(ctx).Err() != nil
			}, "DEBUG SLEEP never started")
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms := redistest.Start(t, "--enable-debug-command", "local")
			const queue, queueBytes = 50, 16 * units.KB
			p := startMirrored(t, ms, func(c *config.Config) {
				c.Mirror.Queue = queue
				c.Mirror.QueueBytes = queueBytes
			})
			c := p.Client(t)
			if err := c.Set(ctx, "before", "1", 0).Err(); err != nil {
				t.Fatal(err)
			}
			waitMirrored(t, p)
			tc.stall(t, ms)
			value := strings.Repeat("x", 200)
			for i := range 1000 {
				key := fmt.Sprintf("w:%d", i)
				if i%10 == 0 {
					pipe := c.Pipeline()
					for j := range 20 {
						pipe.Set(ctx, fmt.Sprintf("%s:%d", key, j), value, 0)
					}
					if _, err := pipe.Exec(ctx); err != nil {
						t.Fatalf("pipeline %d with the mirror stalled: %v", i, err)
					}
				} else if err := c.Set(ctx, key, value, 0).Err(); err != nil {
					t.Fatalf("write %d with the mirror stalled: %v", i, err)
				}
				if n, b := p.Mirror().Queued(); n > queue || b > int64(queueBytes) {
					t.Fatalf("queue holds %d commands, %d bytes: over its limits %d, %d", n, b, queue, queueBytes)
				}
			}
			if got, err := p.Redis.Client(t).Get(ctx, "w:999").Result(); err != nil || got != value {
				t.Fatalf("primary w:999 = %q, %v", got, err)
			}
			rep := p.Mirror().Report(0)
			if rep.Dropped[mirror.DropQueueFull] == 0 {
				t.Fatalf("nothing dropped while the mirror was stalled: %+v", rep)
			}
			if tc.end != nil {
				tc.end(t, ms)
			}
			// The mirror answers again: new writes reach it.
			mc := ms.Client(t)
			redistest.Eventually(t, 20*time.Second, func() bool {
				c.Set(ctx, "after", "1", 0)
				got, _ := mc.Get(ctx, "after").Result()
				return got == "1"
			}, "writes never reached the mirror again")
		})
	}
}

// TestMirrorDown: a mirror nobody listens on costs the clients nothing:
// writes succeed and are counted as dropped for want of a connection.
func TestMirrorDown(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) {
		c.Upstreams = map[string]config.Upstream{"new": {Address: fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))}}
		c.Mirror = mirror.DefaultConfig()
		c.Mirror.Upstream = "new"
		c.Mirror.ReadsSample = 1
		c.Mirror.Compare = true
	})
	c := p.Client(t)
	for i := range 200 {
		if err := c.Set(ctx, fmt.Sprintf("k:%d", i), "v", 0).Err(); err != nil {
			t.Fatalf("write %d with the mirror down: %v", i, err)
		}
		if got, err := c.Get(ctx, fmt.Sprintf("k:%d", i)).Result(); err != nil || got != "v" {
			t.Fatalf("read %d with the mirror down: %q, %v", i, got, err)
		}
	}
	redistest.Eventually(t, 10*time.Second, func() bool {
		r := p.Mirror().Report(0)
		return r.Dropped[mirror.DropUnavailable] > 0 && r.Queued == 0
	}, "no command counted as dropped with the mirror down: %+v", p.Mirror().Report(0))
	if r := p.Mirror().Report(0); r.Compared != 0 || r.Mismatches != 0 {
		t.Fatalf("reads compared with no mirror: %+v", r)
	}
}

// TestMirrorOwnCredentials: the mirror is reached with its own upstream's
// credentials, whatever the primary's and the clients' are.
func TestMirrorOwnCredentials(t *testing.T) {
	ms := redistest.Start(t)
	// Set after the start: redistest checks a new server with a bare PING.
	if err := ms.Client(t).ConfigSet(ctx, "requirepass", "m1rror-pw").Err(); err != nil {
		t.Fatal(err)
	}
	p := startMirrored(t, ms, func(c *config.Config) {
		c.Upstreams["new"] = config.Upstream{Address: ms.Addr(), Password: "m1rror-pw"}
	})
	if err := p.Client(t).Set(ctx, "cred", "ok", 0).Err(); err != nil {
		t.Fatal(err)
	}
	waitMirrored(t, p)
	mc := redis.NewClient(&redis.Options{Addr: ms.Addr(), Password: "m1rror-pw"})
	defer mc.Close()
	if got, err := mc.Get(ctx, "cred").Result(); err != nil || got != "ok" {
		t.Fatalf("mirror GET cred = %q, %v", got, err)
	}
}

// TestMirrorQueueMemoryBounded: 20 MB of writes while the mirror is
// stopped leave the proxy's live heap where it was: the queue holds at most
// queue_bytes, and the rest is dropped, not buffered.
func TestMirrorQueueMemoryBounded(t *testing.T) {
	ms := redistest.Start(t)
	const queueBytes = 256 * units.KB
	p := startMirrored(t, ms, func(c *config.Config) { c.Mirror.QueueBytes = queueBytes })
	c := p.Client(t)
	if err := c.Set(ctx, "warm", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	waitMirrored(t, p)
	ms.Freeze(t)
	defer ms.Thaw(t)
	value := strings.Repeat("v", 1024)
	write := func(round int) {
		pipe := c.Pipeline()
		for j := range 100 {
			pipe.Set(ctx, fmt.Sprintf("big:%d:%d", round, j), value, 0)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 10 { // the queue fills; buffers reach their working size
		write(i)
	}
	runtime.GC()
	before := liveHeap()
	for i := 10; i < 210; i++ {
		write(i)
	}
	runtime.GC()
	after := liveHeap()
	if n, b := p.Mirror().Queued(); b > int64(queueBytes) {
		t.Fatalf("queue holds %d commands, %d bytes, over queue_bytes", n, b)
	}
	rep := p.Mirror().Report(0)
	if rep.Dropped[mirror.DropQueueFull] < 19000 {
		t.Fatalf("dropped %d of 20000 writes with the mirror stopped", rep.Dropped[mirror.DropQueueFull])
	}
	// 20 MB went by; a queue that kept them would show it.
	if grew := after - before; grew > 4<<20 {
		t.Fatalf("live heap grew by %d bytes over 20 MB of writes with the mirror stopped", grew)
	}
	t.Logf("live heap %d -> %d bytes; dropped %d", before, after, rep.Dropped[mirror.DropQueueFull])
}

// BenchmarkForwardPipeline16Mirrored is BenchmarkForwardPipeline16 with
// every read also mirrored and compared (reads_sample = 1): the cost of
// mirroring on the client's path is one copy of the batch per batch.
func BenchmarkForwardPipeline16Mirrored(b *testing.B) {
	ms := redistest.Start(b)
	p := proxytest.Start(b, nil, func(c *config.Config) {
		c.Upstreams = map[string]config.Upstream{"new": {Address: ms.Addr()}}
		c.Mirror = mirror.DefaultConfig()
		c.Mirror.Upstream = "new"
		c.Mirror.ReadsSample = 1
		c.Mirror.Compare = true
	})
	value := strings.Repeat("v", 64)
	for _, c := range []*redis.Client{p.Redis.Client(b), ms.Client(b)} {
		if err := c.Set(ctx, "key:000000012345", value, 0).Err(); err != nil {
			b.Fatal(err)
		}
	}
	nc := p.Dial(b)
	req := strings.Repeat("*2\r\n$3\r\nGET\r\n$16\r\nkey:000000012345\r\n", 16)
	buf := make([]byte, 16*len("$64\r\n"+value+"\r\n"))
	round := func() {
		if _, err := nc.Write([]byte(req)); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(nc, buf); err != nil {
			b.Fatal(err)
		}
	}
	for range 100 {
		round()
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		round()
	}
	b.StopTimer()
	rep := p.Mirror().Report(1)
	if rep.Mismatches != 0 || rep.Compared == 0 {
		b.Fatalf("mirror report: %+v", rep)
	}
	b.ReportMetric(float64(rep.Dropped[mirror.DropQueueFull])/float64(b.N*16), "dropped/op")
}

// DEBUG is not mirrored: the write hooks count it (DEBUG RELOAD replaces
// the dataset, for the local tier), and mirrored it made the mirror sleep
// (stalling its queue), reload its own file or crash on the primary's
// account (found by review).
func TestMirrorLeavesDebugOut(t *testing.T) {
	ms := redistest.Start(t, "--enable-debug-command", "yes")
	rs := redistest.Start(t, "--enable-debug-command", "yes")
	p := proxytest.Start(t, rs, func(c *config.Config) {
		c.Upstreams = map[string]config.Upstream{"new": {Address: ms.Addr()}}
		c.Mirror = mirror.DefaultConfig()
		c.Mirror.Upstream = "new"
		c.Policy.Commands.Allow = append(c.Policy.Commands.Allow, "debug") // refused by default
	})
	c := p.Client(t)
	if err := c.Set(ctx, "before", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Do(ctx, "DEBUG", "SLEEP", "0").Err(); err != nil {
		t.Fatalf("DEBUG SLEEP 0: %v", err)
	}
	if err := c.Set(ctx, "after", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	waitMirrored(t, p)
	rep := p.Mirror().Report(10)
	if rep.Sent != 2 || rep.Errors[mirror.ErrReply] != 0 {
		t.Errorf("report = %+v, want the two SETs sent and nothing else", rep)
	}
	for reason, n := range rep.Skipped {
		if n != 0 {
			t.Errorf("skipped %s = %d", reason, n)
		}
	}
	if n, _ := ms.Client(t).Exists(ctx, "before", "after").Result(); n != 2 {
		t.Errorf("%d of the two SETs on the mirror", n)
	}
}
