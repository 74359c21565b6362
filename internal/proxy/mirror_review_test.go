package proxy_test

// Mirror defects found by a review, each reproduced against real servers.

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strings"

	"github.com/redis/go-redis/v9"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/mirror"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// A script's error reply is taken to mean "it may have written", so the
// script is mirrored; but some errors come before Redis runs any script.
// An EVAL the primary refused with -BUSY (another script running) ran on
// the mirror alone, and the two diverged.
func TestMirrorScriptRefusedByPrimaryIsNotMirrored(t *testing.T) {
	rs := redistest.Start(t, "--busy-reply-threshold", "100")
	ms := redistest.Start(t)
	p := proxytest.Start(t, rs, func(c *config.Config) {
		c.Upstreams = map[string]config.Upstream{"new": {Address: ms.Addr()}}
		c.Mirror = mirror.DefaultConfig()
		c.Mirror.Upstream = "new"
	})
	c := p.Client(t)
	direct := rs.Client(t)
	busy := make(chan error, 1)
	go func() {
		busy <- direct.Eval(ctx, `local t = redis.call('TIME')
while true do
  local n = redis.call('TIME')
  if (n[1]-t[1])*1000000 + (n[2]-t[2]) > 1500000 then break end
end
return 1`, nil).Err()
	}()
	// Until the busy script holds Redis, the EVAL runs (on both servers).
	redistest.Eventually(t, 5*time.Second, func() bool {
		err := c.Eval(ctx, "return redis.call('INCR', KEYS[1])", []string{"counter"}).Err()
		return err != nil && strings.HasPrefix(err.Error(), "BUSY")
	}, "EVAL was never answered BUSY")
	if err := <-busy; err != nil {
		t.Fatal(err)
	}
	waitMirrored(t, p)
	pv, _ := direct.Get(ctx, "counter").Result()
	mv, _ := ms.Client(t).Get(ctx, "counter").Result()
	if pv != mv {
		t.Fatalf("counter: primary %q, mirror %q: a script the primary refused (BUSY) ran on the mirror", pv, mv)
	}
}

// One client's commands in two databases went to the mirror as two runs
// sent at the same time, so a command that changes another database (MOVE
// here) and what the client did next in that database could run in the
// other order on the mirror, which then held other data (found by review:
// 3 of 3 runs). An entry that crosses databases now runs alone; so does a
// transaction holding such a command (a second review: 3 of 3 runs).
func TestMirrorCrossDatabaseOrder(t *testing.T) {
	for _, how := range []string{"pipeline", "transaction"} {
		t.Run(how, func(t *testing.T) {
			ms := redistest.Start(t)
			p := startMirrored(t, ms, nil)
			c := p.Client(t, func(o *redis.Options) { o.PoolSize = 1 })
			conn := c.Conn()
			defer conn.Close()
			direct := p.Redis.Client(t)
			if err := conn.Set(ctx, "warm", "1", 0).Err(); err != nil {
				t.Fatal(err)
			}
			waitMirrored(t, p)
			ms.Freeze(t)
			// Taken by the sender at once, so what follows queues into one round.
			if err := conn.Set(ctx, "warm", "2", 0).Err(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond)
			if err := conn.Set(ctx, "big", strings.Repeat("x", 8<<20), 0).Err(); err != nil {
				t.Fatal(err)
			}
			pipe := conn.Pipeline()
			if how == "transaction" {
				pipe = conn.TxPipeline()
			}
			pipe.Set(ctx, "k", "1", 0)
			pipe.Move(ctx, "k", 1)
			if _, err := pipe.Exec(ctx); err != nil {
				t.Fatal(err)
			}
			if err := conn.Select(ctx, 1).Err(); err != nil {
				t.Fatal(err)
			}
			if err := conn.Incr(ctx, "k").Err(); err != nil {
				t.Fatal(err)
			}
			ms.Thaw(t)
			waitMirrored(t, p)
			m1, p1 := ms.ClientDB(t, 1), p.Redis.ClientDB(t, 1)
			pv, _ := p1.Get(ctx, "k").Result()
			mv, _ := m1.Get(ctx, "k").Result()
			p0, _ := direct.Exists(ctx, "k").Result()
			m0, _ := ms.Client(t).Exists(ctx, "k").Result()
			if pv != mv || p0 != m0 {
				t.Fatalf("primary: db1 k=%q, db0 has k: %d; mirror: db1 k=%q, db0 has k: %d", pv, p0, mv, m0)
			}
		})
	}
}

// A mirrored write whose reply is larger than mirror.queue_bytes (GETDEL
// of a big value) ran on the mirror, and so did the write after it in the
// same run; both were counted as errors{kind="connection"}, "no reply",
// because the run's reply cap had cut their replies (found by review).
func TestMirrorBigWriteReplyIsNoError(t *testing.T) {
	ms := redistest.Start(t)
	p := startMirrored(t, ms, func(c *config.Config) { c.Mirror.QueueBytes = 256 * units.KB })
	c := p.Client(t)
	chunk := strings.Repeat("v", 100<<10)
	for range 4 { // 400 KB on both servers, 100 KB a batch
		if err := c.Append(ctx, "big", chunk).Err(); err != nil {
			t.Fatal(err)
		}
		waitMirrored(t, p)
	}
	mc := ms.Client(t)
	if n, _ := mc.StrLen(ctx, "big").Result(); n != 400<<10 {
		t.Fatalf("mirror big = %d bytes", n)
	}
	pipe := c.Pipeline()
	pipe.GetDel(ctx, "big")
	pipe.Set(ctx, "after", "1", 0)
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	waitMirrored(t, p)
	// Both ran on the mirror.
	if n, _ := mc.Exists(ctx, "big").Result(); n != 0 {
		t.Fatal("GETDEL did not run on the mirror")
	}
	if v, _ := mc.Get(ctx, "after").Result(); v != "1" {
		t.Fatal("SET after did not run on the mirror")
	}
	rep := p.Mirror().Report(0)
	if rep.Errors[mirror.ErrConnection] != 0 || rep.Errors[mirror.ErrReply] != 0 {
		t.Fatalf("errors = %v, though the mirror answered and ran both commands (sent %d)", rep.Errors, rep.Sent)
	}
}

// A client with CLIENT TRACKING on (client-side caching: an ordinary
// read/write application) is relayed, and its writes were neither mirrored
// nor counted anywhere (found by review). They are still not mirrored (the
// relay is raw bytes), but each is counted, skipped{reason="relayed"}.
func TestMirrorRelayedWritesAreCounted(t *testing.T) {
	ms := redistest.Start(t)
	p := startMirrored(t, ms, nil)
	c := p.Client(t, func(o *redis.Options) { o.Protocol = 3; o.PoolSize = 1 })
	if err := c.Do(ctx, "CLIENT", "TRACKING", "ON").Err(); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if err := c.Set(ctx, fmt.Sprintf("tracked:%d", i), "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if err := c.Get(ctx, fmt.Sprintf("tracked:%d", i)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	waitMirrored(t, p)
	if got := p.Mirror().Report(0).Skipped[mirror.SkipRelayed]; got != 10 {
		t.Fatalf("skipped{reason=relayed} = %d after 10 writes and 10 reads of a tracking client, want 10", got)
	}
	// A write on a MONITOR or RESP2 subscribed connection never runs
	// (Redis refuses it there): nothing was missed, nothing is counted.
	for _, start := range []string{"MONITOR\r\n", "SUBSCRIBE ch\r\n"} {
		nc := p.Dial(t)
		rd := bufio.NewReader(nc)
		nc.SetDeadline(time.Now().Add(5 * time.Second))
		nc.Write([]byte(start))
		if first, _ := rd.ReadString('\n'); strings.HasPrefix(first, "*") {
			for range 5 { // the rest of SUBSCRIBE's reply
				rd.ReadString('\n')
			}
		}
		nc.Write([]byte("SET relayed:k v\r\n"))
		for {
			line, err := rd.ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			if strings.HasPrefix(line, "-") {
				break
			}
		}
		nc.Close()
	}
	if n, _ := p.Redis.Client(t).Exists(ctx, "relayed:k").Result(); n != 0 {
		t.Fatal("a SET on a MONITOR or subscribed connection ran on the primary")
	}
	if got := p.Mirror().Report(0).Skipped[mirror.SkipRelayed]; got != 10 {
		t.Fatalf("skipped{reason=relayed} = %d after two writes Redis refused, want still 10", got)
	}
}

// A Sentinel mirror whose Sentinels accept connections but never answer
// keeps the sender looking for the primary (up to 3 x dial_timeout x
// sentinels), and Shutdown waited for it whatever its context said: 10 s
// with a 1 s context (found by review). The search now ends with the mirror.
func TestMirrorSentinelDiscoveryDoesNotHoldShutdown(t *testing.T) {
	var addrs []string
	for range 3 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				t.Cleanup(func() { c.Close() }) // accepted, never answered
			}
		}()
		addrs = append(addrs, ln.Addr().String())
	}
	rs := redistest.Start(t)
	p := proxytest.Start(t, rs, func(c *config.Config) {
		u := namedUpstream("")
		u.Mode, u.Sentinels, u.MasterName = config.ModeSentinel, addrs, "mymaster"
		c.Upstreams = map[string]config.Upstream{"new": u}
		c.Mirror = mirror.DefaultConfig()
		c.Mirror.Upstream = "new"
	})
	if err := p.Client(t).Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	p.Server.Shutdown(sctx)
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Shutdown with a 1s context took %v: it waited for the mirror's Sentinel discovery", d)
	}
}

// A script that wrote and then returned an error of its own whose code is
// one Redis refuses scripts with (BUSY, NOSCRIPT, READONLY, ...) ran, and
// is mirrored: the refusals are known by Redis's texts, not their codes
// (found by a probe: the mirror missed the write for 7 such codes).
func TestMirrorScriptThatReturnsARefusalCodeIsMirrored(t *testing.T) {
	ms := redistest.Start(t)
	p := startMirrored(t, ms, nil)
	c := dialRaw(t, p.Addr)
	codes := []string{"BUSY fake", "NOSCRIPT fake", "READONLY fake", "NOPERM fake", "LOADING fake", "MISCONF fake", "MASTERDOWN fake", "NOREPLICAS fake"}
	for i, code := range codes {
		c.send([]string{"EVAL", "redis.call('SET', KEYS[1], 'written'); return redis.error_reply(ARGV[1])", "1", fmt.Sprintf("scripted:%d", i), code})
		if v, _ := c.readReply(); v != respError(code) {
			t.Fatalf("EVAL returning %q: %v", code, v)
		}
	}
	waitMirrored(t, p)
	mc := ms.Client(t)
	for i, code := range codes {
		if v, _ := mc.Get(ctx, fmt.Sprintf("scripted:%d", i)).Result(); v != "written" {
			t.Errorf("a script that wrote and returned %q: the mirror has %q, want its write", code, v)
		}
	}
}
