package proxy_test

// Seams between features built in parallel (issue 9 review): the batch
// split of the output limits against the guard's look-ahead, ...

import (
	"errors"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/stampede"
)

// The guard lets a write pass without its fix-up when a later command of
// the same batch certainly gives the key its TTL. The output limits answer
// a batch in parts and close a client whose part overflows its limit; if
// the write and that later command land in different parts, the client is
// closed before the EXPIRE is ever sent and the key stays without TTL.
func TestTrustedTTLIsNotSplitFromItsWrite(t *testing.T) {
	const limit = 4 << 20
	p := proxytest.Start(t, nil, func(c *config.Config) {
		c.Server.ClientOutputLimit = limit
		c.Policy = policy.Config{Mode: "enforce", TTL: []policy.TTLRule{
			{Pattern: "s:*", Required: true, Default: policy.Duration{Duration: 24 * time.Hour}},
		}}
	})
	direct := p.Redis.Client(t)
	if err := direct.Set(ctx, "big", strings.Repeat("b", limit+1<<20), 0).Err(); err != nil {
		t.Fatal(err)
	}
	// A new client's replies are assumed large, so its batch is answered
	// in parts of two commands here: HSET and GET big, then EXPIRE. SCRIPT
	// KILL runs on a connection of its own after answering what came
	// before it: a split too.
	for i, middle := range [][]string{nil, {"SCRIPT", "KILL"}, {"FUNCTION", "KILL"}} {
		key := "s:k" + strconv.Itoa(i)
		batch := [][]string{{"HSET", key, "f", "v"}, {"GET", "big"}}
		if middle != nil {
			batch = append(batch, middle)
		}
		c := dialRaw(t, p.Addr)
		c.send(append(batch, []string{"EXPIRE", key, "100"})...)
		redistest.Eventually(t, 10*time.Second, func() bool { return closedFor(p, metrics.CloseOutputLimit) == float64(i+1) },
			"the client was never closed for its output limit")
		if !connClosed(c.nc) {
			t.Fatal("the output limit was counted but the connection stayed open")
		}
		ttl, err := direct.TTL(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ttl <= 0 {
			t.Errorf("%v: TTL %s = %v after the client was closed: the write ran, the EXPIRE trusted for it did not", batch, key, ttl)
		}
	}
}

// blockedID returns the Redis id of the connection blocked in BLPOP on key
// (from CLIENT LIST on Redis), or 0.
func blockedID(t *testing.T, direct *redis.Client, key string) int64 {
	t.Helper()
	list, err := direct.ClientList(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(list), "\n") {
		if infoValue(line, "cmd") != "blpop" {
			continue
		}
		id, _ := strconv.ParseInt(infoValue(line, "id"), 10, 64)
		return id
	}
	return 0
}

// burnIDs makes Redis hand out connection ids until the next one is next.
func burnIDs(t *testing.T, rs *redistest.Server, next int64) {
	t.Helper()
	for {
		c := dialRaw(t, rs.Addr())
		id := c.do("CLIENT", "ID").(int64)
		c.nc.Close()
		if id >= next-1 {
			return
		}
	}
}

// CLIENT UNBLOCK translates the proxy id of a blocked client into the Redis
// id of the dedicated connection it blocks on. A reload that switched the
// upstream to another server closes a client blocked on the old one
// (TestReloadMovesBlockedClients); an UNBLOCK of it after that names no
// one, and never whichever connection has the same Redis id on the new
// server, which may be another client of the proxy, blocked there.
func TestClientUnblockAfterUpstreamSwitch(t *testing.T) {
	a, b := redistest.Start(t), redistest.Start(t)
	p := proxytest.Start(t, a, nil)
	directA, directB := a.Client(t), b.Client(t)
	burnIDs(t, a, 100) // so that b, with fewer connections so far, can catch up
	blockedA := dialRaw(t, p.Addr)
	pid := blockedA.do("CLIENT", "ID").(int64)
	blockedA.send([]string{"BLPOP", "sw:a", "0"})
	redistest.Eventually(t, 5*time.Second, func() bool { return blockedClients(directA) == 1 }, "BLPOP on A never blocked")
	ridA := blockedID(t, directA, "sw:a")

	if _, err := p.Reload(reloaded(t, p, func(c *config.Config) { c.Upstream.Address = b.Addr() })); err != nil {
		t.Fatal(err)
	}
	if v, err := blockedA.next(nil); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the client blocked on the old upstream got %#v, %v; want its connection closed", v, err)
	}
	// Another client blocks on B, on a connection with, if nothing else
	// dials B meanwhile, the same Redis id as the first one's on A.
	directB.Ping(ctx) // its connection is made before the ids are lined up
	burnIDs(t, b, ridA)
	blockedB := dialRaw(t, p.Addr)
	blockedB.send([]string{"BLPOP", "sw:b", "0"})
	redistest.Eventually(t, 5*time.Second, func() bool { return blockedClients(directB) == 1 }, "BLPOP on B never blocked")
	t.Logf("blocked on A as Redis id %d, on B as %d", ridA, blockedID(t, directB, "sw:b"))

	admin := dialRaw(t, p.Addr)
	wantReplies(t, admin, []string{"CLIENT", "UNBLOCK", strconv.FormatInt(pid, 10)}, int64(0))
	if n := blockedClients(directB); n != 1 {
		t.Fatalf("%d clients blocked on the new upstream after an UNBLOCK of a client gone from the old, want 1", n)
	}
	directB.RPush(ctx, "sw:b", "x")
	if got, _ := blockedB.readReply(); !reflect.DeepEqual(got, []any{"sw:b", "x"}) {
		t.Fatalf("the client blocked on the new upstream got %#v", got)
	}
}

// A command the policy refuses inside MULTI makes EXEC fail, so that a
// transaction runs whole or not at all; a relayed client (here RESP3
// tracking, as rueidis does it) is no exception. Its refusal travels as a
// command Redis answers with an error; queued in MULTI, that command must
// be one Redis rejects at queue time, not a script EXEC would run while
// the rest of the transaction commits.
func TestRefusalInsideMultiOnRelayAbortsTransaction(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) {
		c.Policy = policy.Config{Mode: "enforce", Commands: policy.CommandRules{Deny: []string{"keys"}}}
	})
	c := dialRaw(t, p.Addr)
	c.do("HELLO", "3")
	if v := c.do("CLIENT", "TRACKING", "ON"); v != "OK" {
		t.Fatalf("CLIENT TRACKING ON: %v", v)
	}
	c.send([]string{"MULTI"}, []string{"INCR", "rt:n"}, []string{"KEYS", "*"}, []string{"EXEC"})
	var got []any
	for range 4 {
		got = append(got, c.readNonPush())
	}
	if e, ok := got[2].(respError); !ok || !strings.Contains(string(e), "KEYS is disabled") {
		t.Errorf("KEYS inside MULTI answered %#v, want the refusal", got[2])
	}
	if e, ok := got[3].(respError); !ok || !strings.HasPrefix(string(e), "EXECABORT") {
		t.Errorf("EXEC answered %#v, want EXECABORT", got[3])
	}
	if n, err := p.Redis.Client(t).Exists(ctx, "rt:n").Result(); err != nil || n != 0 {
		t.Fatalf("the rest of a transaction with a refused command ran (rt:n exists: %d, %v); replies %#v", n, err, got)
	}
}

// A reload that switches the upstream closes the old connections once what
// was sent on them is answered. A command slower than reply_timeout is
// still running on the old server, which the pipes wait for up to
// dead_timeout (Redis alive but slow); the switch must not fail it
// sooner, while Redis would still answer it.
func TestSwitchWaitsForSlowCommandOnOldUpstream(t *testing.T) {
	p, _ := busyRedis(t, 1, 10*time.Second) // reply_timeout 150ms
	b := redistest.Start(t)
	sleeper := dialAddr(t, p.Addr)
	rawSend(t, sleeper, "DEBUG", "SLEEP", "2")
	waitOverdue(t, p)
	if _, err := p.Reload(reloaded(t, p, func(c *config.Config) { c.Upstream.Address = b.Addr() })); err != nil {
		t.Fatal(err)
	}
	if got := rawRead(t, sleeper); got != "+OK\r\n" {
		t.Fatalf("DEBUG SLEEP sent before the switch: %q", got)
	}
}

// A read held by a miss hold waits for the filler's write and then reads
// the key. A reload that switches the upstream meanwhile closes the old
// connections once nothing is pending on them; the held read must then
// read from the new upstream, not fail on a closed connection.
func TestHeldReadAcrossUpstreamSwitch(t *testing.T) {
	a, b := redistest.Start(t), redistest.Start(t)
	p := proxytest.Start(t, a, func(c *config.Config) {
		c.Stampede.Hold = []stampede.HoldRule{{Pattern: "h:*", Timeout: units.Duration{Duration: time.Minute}}}
	})
	got := holdSecondRead(t, p, "h:k")
	old := p.Backend().Pool(0, false)
	if _, err := p.Reload(reloaded(t, p, func(c *config.Config) { c.Upstream.Address = b.Addr() })); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 10*time.Second, func() bool { return !old.Up() }, "the old upstream's connections were never closed")
	if err := p.Client(t).Set(ctx, "h:k", "filled", 0).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case v := <-got:
		if v != "filled" {
			t.Fatalf("held read got %q, want the write's value from the new upstream", v)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the held read was not released by the write")
	}
}
