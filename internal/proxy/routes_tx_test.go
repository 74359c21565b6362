package proxy_test

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/localcache"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/proxy"
	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/resp"
)

// Transactions with routes are held by the proxy until EXEC and sent
// whole, MULTI to EXEC in one write, to the one upstream all their keys
// route to (docs/COMPATIBILITY.md, Routes, MULTI/EXEC).

// resetStats zeroes INFO commandstats of servers.
func resetCommandStats(t *testing.T, servers ...*redistest.Server) {
	t.Helper()
	for _, rs := range servers {
		if err := rs.Client(t).ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// nothingRan fails t when any of names ran on any of servers.
func nothingRan(t *testing.T, what string, names []string, servers ...*redistest.Server) {
	t.Helper()
	for _, rs := range servers {
		for _, name := range names {
			if n := calls(t, rs, name); n != 0 {
				t.Errorf("%s: %s reached %s %d times, want none", what, name, rs.Addr(), n)
			}
		}
	}
}

// TestRoutesTxSingleRouteExactReply: a transaction whose keys all route
// to one upstream runs there, MULTI and EXEC once each, and the client
// gets Redis's replies exactly: +OK, +QUEUED per command, then EXEC's
// array; the upstream's own +OK and +QUEUED never reach the client. A
// keyless transaction runs on the default upstream; an empty one runs
// nowhere.
func TestRoutesTxSingleRouteExactReply(t *testing.T) {
	r := startRouted(t, nil)
	resetCommandStats(t, r.def, r.queue, r.cach)
	nc := dialAddr(t, r.p.Addr)
	cmds := [][]string{{"MULTI"}, {"PING"}, {"SET", "queue:a", "1"}, {"INCR", "queue:n"}, {"GET", "queue:a"}, {"EXEC"}}
	for _, c := range cmds {
		rawSend(t, nc, c...)
	}
	for i, want := range []string{"+OK\r\n", "+QUEUED\r\n", "+QUEUED\r\n", "+QUEUED\r\n", "+QUEUED\r\n", "*4\r\n+PONG\r\n+OK\r\n:1\r\n$1\r\n1\r\n"} {
		if got := rawRead(t, nc); got != want {
			t.Fatalf("reply %d to %v = %q, want %q", i, cmds[i], got, want)
		}
	}
	if got := r.holds(t, "queue:a"); got != "queue" {
		t.Fatalf("queue:a is on %q, want queue", got)
	}
	for name, want := range map[string]int{"multi": 1, "exec": 1, "set": 1, "incr": 1, "get": 1, "ping": 1} {
		if n := calls(t, r.queue, name); n != want {
			t.Errorf("%s ran %d times on the queue server, want %d", name, n, want)
		}
	}
	nothingRan(t, "single-route transaction", []string{"multi", "exec"}, r.def, r.cach)

	// Keyless: the default upstream.
	resetCommandStats(t, r.def, r.queue)
	for _, c := range [][]string{{"MULTI"}, {"ECHO", "x"}, {"EXEC"}} {
		rawSend(t, nc, c...)
	}
	for i, want := range []string{"+OK\r\n", "+QUEUED\r\n", "*1\r\n$1\r\nx\r\n"} {
		if got := rawRead(t, nc); got != want {
			t.Fatalf("keyless transaction: reply %d = %q, want %q", i, got, want)
		}
	}
	if n := calls(t, r.def, "multi"); n != 1 {
		t.Errorf("keyless transaction: MULTI ran %d times on the default server, want 1", n)
	}
	// Empty: answered by the proxy.
	resetCommandStats(t, r.def, r.queue)
	if got := rawDo(t, nc, "MULTI"); got != "+OK\r\n" {
		t.Fatal(got)
	}
	if got := rawDo(t, nc, "EXEC"); got != "*0\r\n" {
		t.Fatalf("empty EXEC = %q", got)
	}
	nothingRan(t, "empty transaction", []string{"multi", "exec"}, r.def, r.queue)

	// go-redis: the results of a pipelined transaction.
	res, err := r.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, "cache:g", "v", 0)
		p.Append(ctx, "cache:g", "w")
		p.Get(ctx, "cache:g")
		return nil
	})
	if err != nil || res[1].(*redis.IntCmd).Val() != 2 || res[2].(*redis.StringCmd).Val() != "vw" {
		t.Fatalf("go-redis transaction: %v %v", res, err)
	}
}

// TestRoutesTxQueueTimeErrors: what Redis refuses at queue time (an
// unknown command, a wrong number of arguments, WATCH inside MULTI) and
// what the proxy refuses (a command concerning every upstream, a guard
// refusal) is answered at once, EXEC answers EXECABORT, and nothing of the
// transaction reaches any upstream.
func TestRoutesTxQueueTimeErrors(t *testing.T) {
	r := startRouted(t, nil)
	nc := dialAddr(t, r.p.Addr)
	for _, tc := range []struct {
		bad  []string
		want string
	}{
		{[]string{"NOSUCHCOMMAND", "queue:a"}, "-ERR unknown command"},
		{[]string{"SET", "queue:a"}, "-ERR wrong number of arguments"},
		// (WATCH inside MULTI is Redis's error but no queue-time error:
		// TestCompatReviewWatchInsideHeldMultiDoesNotAbort.)
		{[]string{"CLIENT", "KILL", "ID", "999"}, "-ERR redproxy: 'CLIENT KILL' inside MULTI is not supported"},
		{[]string{"DBSIZE"}, "-ERR redproxy: DBSIZE inside a transaction is not supported with routes"},
		{[]string{"SET", "plain:a", "1"}, "-CROSSROUTE redproxy: the keys of 'SET' go to upstream 'default', the transaction's are on 'queue'"},
		{[]string{"MSETNX", "queue:x", "1", "plain:x", "1"}, "-CROSSROUTE"},
		{[]string{"SUBSCRIBE", "jobs.x"}, "-ERR redproxy: 'SUBSCRIBE' inside MULTI is not supported"},
		{[]string{"FLUSHALL"}, "-"}, // the policy's default refusal
	} {
		resetCommandStats(t, r.def, r.queue, r.cach)
		cmds := [][]string{{"MULTI"}, {"SET", "queue:a", "1"}, tc.bad, {"SET", "queue:b", "2"}}
		for _, c := range cmds {
			rawSend(t, nc, c...)
		}
		for i, want := range []string{"+OK\r\n", "+QUEUED\r\n", tc.want, "+QUEUED\r\n"} {
			if got := rawRead(t, nc); !strings.HasPrefix(got, want) {
				t.Fatalf("%v: reply %d = %q, want %q...", tc.bad, i, got, want)
			}
		}
		if got := rawDo(t, nc, "EXEC"); !strings.HasPrefix(got, "-EXECABORT") {
			t.Fatalf("%v: EXEC = %q, want EXECABORT", tc.bad, got)
		}
		nothingRan(t, strings.Join(tc.bad, " "), []string{"multi", "exec", "set", "flushall", "dbsize", "watch", "msetnx", "subscribe"}, r.def, r.queue, r.cach)
	}
	if got := r.holds(t, "queue:a"); got != "" {
		t.Fatalf("queue:a written on %q", got)
	}
}

// TestRoutesTxDiscard: DISCARD of a held transaction answers +OK and
// sends nothing; the client's next transaction runs normally.
func TestRoutesTxDiscard(t *testing.T) {
	r := startRouted(t, nil)
	resetCommandStats(t, r.def, r.queue)
	nc := dialAddr(t, r.p.Addr)
	for _, c := range [][]string{{"MULTI"}, {"SET", "queue:d", "1"}, {"DISCARD"}, {"GET", "queue:d"}} {
		rawSend(t, nc, c...)
	}
	for i, want := range []string{"+OK\r\n", "+QUEUED\r\n", "+OK\r\n", "$-1\r\n"} {
		if got := rawRead(t, nc); got != want {
			t.Fatalf("reply %d = %q, want %q", i, got, want)
		}
	}
	nothingRan(t, "DISCARD", []string{"multi", "exec", "discard", "set"}, r.def, r.queue)
	if got := rawDo(t, nc, "EXEC"); !strings.HasPrefix(got, "-ERR EXEC without MULTI") {
		t.Fatalf("EXEC after DISCARD = %q", got)
	}
}

// TestRoutesTxCap: a held transaction is capped in commands and bytes;
// the command beyond the cap is refused with an error saying why, EXEC
// answers EXECABORT, and nothing reaches the upstream.
func TestRoutesTxCap(t *testing.T) {
	r := startRouted(t, nil)
	resetCommandStats(t, r.queue)
	c := r.p.Client(t, func(o *redis.Options) { o.MaxRetries = -1 })
	const count = 8192
	var cmds []redis.Cmder
	_, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for i := range count + 1 {
			cmds = append(cmds, p.Set(ctx, "queue:cap", i, 0))
		}
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "EXECABORT") {
		t.Fatalf("EXEC of %d commands: %v, want EXECABORT", count+1, err)
	}
	if e := cmds[count].Err(); e == nil || !strings.Contains(e.Error(), "transaction too long") {
		t.Fatalf("command %d: %v, want the cap's error", count+1, e)
	}
	// Bytes: three 3 MiB values are more than 8 MiB.
	big := strings.Repeat("x", 3<<20)
	cmds = cmds[:0]
	_, err = c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for range 3 {
			cmds = append(cmds, p.Set(ctx, "queue:big", big, 0))
		}
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "EXECABORT") {
		t.Fatalf("EXEC of 9 MiB: %v, want EXECABORT", err)
	}
	if e := cmds[2].Err(); e == nil || !strings.Contains(e.Error(), "transaction too long") {
		t.Fatalf("third 3 MiB SET: %v, want the cap's error", e)
	}
	nothingRan(t, "over the cap", []string{"multi", "exec", "set"}, r.queue)
	// Just under the cap is fine.
	res, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for i := range count {
			p.Set(ctx, "queue:cap", i, 0)
		}
		return nil
	})
	if err != nil || len(res) != count {
		t.Fatalf("EXEC of %d commands: %d results, %v", count, len(res), err)
	}
	if v, _ := r.queue.Client(t).Get(ctx, "queue:cap").Result(); v != strconv.Itoa(count-1) {
		t.Fatalf("queue:cap = %q", v)
	}
}

// TestRoutesWatchCrossRouteMulti: WATCH pins the upstream of its keys;
// the MULTI after it is held, and a command routing to another upstream
// makes EXEC answer EXECABORT with no MULTI sent. EXEC and DISCARD end the
// WATCH there (UNWATCH), as on Redis. A WATCH whose key changed still
// fails EXEC, empty transaction included.
func TestRoutesWatchCrossRouteMulti(t *testing.T) {
	r := startRouted(t, nil)
	resetCommandStats(t, r.def, r.queue)
	nc := dialAddr(t, r.p.Addr)
	cmds := [][]string{{"WATCH", "queue:w"}, {"MULTI"}, {"SET", "queue:w", "1"}, {"SET", "plain:w", "2"}, {"EXEC"}}
	for _, c := range cmds {
		rawSend(t, nc, c...)
	}
	for i, want := range []string{"+OK\r\n", "+OK\r\n", "+QUEUED\r\n", "-CROSSROUTE redproxy: the keys of 'SET' go to upstream 'default', the transaction's are on 'queue'", "-EXECABORT"} {
		if got := rawRead(t, nc); !strings.HasPrefix(got, want) {
			t.Fatalf("reply %d to %v = %q, want %q...", i, cmds[i], got, want)
		}
	}
	if n := calls(t, r.queue, "watch"); n != 1 {
		t.Errorf("WATCH ran %d times on the queue server, want 1", n)
	}
	if n := calls(t, r.queue, "unwatch"); n != 1 {
		t.Errorf("UNWATCH ran %d times on the queue server, want 1 (EXEC ends the WATCH)", n)
	}
	nothingRan(t, "WATCH then a cross-route MULTI", []string{"multi", "exec", "set"}, r.def, r.queue)

	// DISCARD ends the WATCH too: a later transaction is not guarded by it.
	resetCommandStats(t, r.queue)
	for _, c := range [][]string{{"WATCH", "queue:w"}, {"MULTI"}, {"SET", "queue:w", "1"}, {"DISCARD"}} {
		rawSend(t, nc, c...)
	}
	for i, want := range []string{"+OK\r\n", "+OK\r\n", "+QUEUED\r\n", "+OK\r\n"} {
		if got := rawRead(t, nc); got != want {
			t.Fatalf("DISCARD: reply %d = %q, want %q", i, got, want)
		}
	}
	if err := r.queue.Client(t).Set(ctx, "queue:w", "other", 0).Err(); err != nil {
		t.Fatal(err)
	}
	for _, c := range [][]string{{"MULTI"}, {"SET", "queue:w", "mine"}, {"EXEC"}} {
		rawSend(t, nc, c...)
	}
	for i, want := range []string{"+OK\r\n", "+QUEUED\r\n", "*1\r\n+OK\r\n"} {
		if got := rawRead(t, nc); got != want {
			t.Fatalf("after DISCARD: reply %d = %q, want %q", i, got, want)
		}
	}
	if n := calls(t, r.queue, "unwatch"); n != 1 {
		t.Errorf("UNWATCH ran %d times after DISCARD, want 1", n)
	}

	// A WATCH that fires: EXEC answers a null array, empty or not.
	for _, queued := range [][][]string{nil, {{"SET", "queue:w", "lost"}}} {
		rawDo(t, nc, "WATCH", "queue:w")
		if err := r.queue.Client(t).Set(ctx, "queue:w", "changed", 0).Err(); err != nil {
			t.Fatal(err)
		}
		rawDo(t, nc, "MULTI")
		for _, c := range queued {
			rawDo(t, nc, c...)
		}
		if got := rawDo(t, nc, "EXEC"); got != "*-1\r\n" {
			t.Fatalf("EXEC after the watched key changed (%d queued) = %q, want a null array", len(queued), got)
		}
	}
	if v, _ := r.queue.Client(t).Get(ctx, "queue:w").Result(); v != "changed" {
		t.Fatalf("queue:w = %q", v)
	}
}

// TestRoutesTxConcurrentPipelines: clients pipelining transactions on
// two routes at once each get their own EXEC replies, in order, never
// another client's.
func TestRoutesTxConcurrentPipelines(t *testing.T) {
	r := startRouted(t, nil)
	const clients, rounds = 4, 40
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for w := range clients {
		c := r.p.Client(t, func(o *redis.Options) { o.PoolSize = 1 })
		prefix := []string{"queue:", "cache:", "plain:", "queue:"}[w]
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("%sc%d", prefix, w)
			for i := range rounds {
				// Two transactions and a plain command in one pipeline.
				val := fmt.Sprintf("%d-%d", w, i)
				p := c.Pipeline()
				p.Do(ctx, "MULTI")
				p.Do(ctx, "SET", key, val)
				p.Do(ctx, "GET", key)
				exec1 := p.Do(ctx, "EXEC")
				p.Do(ctx, "MULTI")
				p.Do(ctx, "INCR", key+":n")
				exec2 := p.Do(ctx, "EXEC")
				get := p.Get(ctx, key)
				if _, err := p.Exec(ctx); err != nil {
					errs <- err
					return
				}
				if got := fmt.Sprint(exec1.Val()); got != "[OK "+val+"]" {
					errs <- fmt.Errorf("client %d round %d: first EXEC = %s, want [OK %s]", w, i, got, val)
					return
				}
				if got := fmt.Sprint(exec2.Val()); got != fmt.Sprintf("[%d]", i+1) {
					errs <- fmt.Errorf("client %d round %d: second EXEC = %s, want [%d]", w, i, got, i+1)
					return
				}
				if get.Val() != val {
					errs <- fmt.Errorf("client %d round %d: GET = %q, want %q", w, i, get.Val(), val)
					return
				}
			}
		}()
	}
	// And raw clients sending MULTI..EXEC pipelined in one write.
	for w := range 2 {
		nc := dialAddr(t, r.p.Addr)
		key := []string{"queue:raw", "cache:raw"}[w]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				var buf []byte
				val := fmt.Sprintf("raw%d-%d", w, i)
				for _, c := range [][]string{{"MULTI"}, {"SET", key, val}, {"GET", key}, {"EXEC"}, {"MULTI"}, {"INCR", key + ":n"}, {"EXEC"}} {
					buf = resp.AppendCommandStrings(buf, c...)
				}
				if _, err := nc.Write(buf); err != nil {
					errs <- err
					return
				}
				want := []string{"+OK\r\n", "+QUEUED\r\n", "+QUEUED\r\n", fmt.Sprintf("*2\r\n+OK\r\n$%d\r\n%s\r\n", len(val), val), "+OK\r\n", "+QUEUED\r\n", fmt.Sprintf("*1\r\n:%d\r\n", i+1)}
				for k, wnt := range want {
					if got := rawRead(t, nc); got != wnt {
						errs <- fmt.Errorf("raw client %d round %d reply %d = %q, want %q", w, i, k, got, wnt)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestRoutesTxWritesReachTheLocalTier: a held transaction's writes reach
// the local tier's write bookkeeping when EXEC sends them, as a pinned
// transaction's do: with Redis's invalidations slowed down, a read right
// after EXEC returns the transaction's value, not the one the tier held.
func TestRoutesTxWritesReachTheLocalTier(t *testing.T) {
	prev := localcache.SetTestHooks(&localcache.TestHooks{BeforePush: func() { time.Sleep(50 * time.Millisecond) }})
	t.Cleanup(func() { localcache.SetTestHooks(prev) })
	r := startRouted(t, func(c *config.Config) {
		c.LocalCache.Enabled = true
		c.LocalCache.AdmitMinReads = 0
		c.LocalCache.WriteRatio = 1000
		c.LocalCache.Staleness = units.Duration{Duration: 500 * time.Millisecond}
		c.LocalCache.MaxTTL = units.Duration{Duration: time.Minute}
	})
	redistest.Eventually(t, 10*time.Second, func() bool {
		return r.p.LocalTier().LiveOwner(config.DefaultUpstream, 0) && r.p.LocalTier().LiveOwner("queue", 0)
	}, "local tier never became live")
	hits := func() float64 { return metricSum(t, r.p, "redproxy_localcache_hits_total") }
	for _, key := range []string{"queue:tier", "plain:tier"} {
		if err := r.c.Set(ctx, key, "start", 0).Err(); err != nil {
			t.Fatal(err)
		}
		for i := range 5 {
			redistest.Eventually(t, 5*time.Second, func() bool {
				before := hits()
				r.c.Get(ctx, key)
				return hits() > before
			}, "%s never became a hit", key)
			want := "v" + strconv.Itoa(i)
			res, err := r.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.Ping(ctx)
				p.Set(ctx, key, want, 0)
				return nil
			})
			if err != nil || len(res) != 2 {
				t.Fatalf("transaction: %v %v", res, err)
			}
			if got, err := r.c.Get(ctx, key).Result(); err != nil || got != want {
				t.Fatalf("%s round %d: read %q after EXEC set %q (%v)", key, i, got, want, err)
			}
		}
	}
}

// TestRoutesTxGuardFixups: the guard's TTL fix-ups of a held command go
// with it into the transaction at EXEC, and their results are cut from
// EXEC's reply, as for a transaction on a pinned connection.
func TestRoutesTxGuardFixups(t *testing.T) {
	r := startRouted(t, func(c *config.Config) {
		c.Policy.TTL = []policy.TTLRule{{Pattern: "queue:ttl*", Required: true, Default: policy.Duration{Duration: time.Hour}}}
	})
	nc := dialAddr(t, r.p.Addr)
	cmds := [][]string{{"MULTI"}, {"SET", "queue:ttl1", "a"}, {"INCR", "queue:n"}, {"SET", "queue:ttl2", "b"}, {"EXEC"}}
	for _, c := range cmds {
		rawSend(t, nc, c...)
	}
	for i, want := range []string{"+OK\r\n", "+QUEUED\r\n", "+QUEUED\r\n", "+QUEUED\r\n", "*3\r\n+OK\r\n:1\r\n+OK\r\n"} {
		if got := rawRead(t, nc); got != want {
			t.Fatalf("reply %d to %v = %q, want %q", i, cmds[i], got, want)
		}
	}
	for _, key := range []string{"queue:ttl1", "queue:ttl2"} {
		if ttl := r.queue.Client(t).TTL(ctx, key).Val(); ttl <= 0 {
			t.Errorf("%s on the queue server has TTL %v, want the policy's default", key, ttl)
		}
	}
}

// TestRoutesSplitMSETWithFixups: an MSET over two routes is split, and
// with a TTL rule each upstream's part gets its fix-ups behind it there.
// Wrapped in one MULTI of the proxy's own it was refused CROSSROUTE and
// nothing was written (found by a cluster probe, in cluster mode's twin).
func TestRoutesSplitMSETWithFixups(t *testing.T) {
	r := startRouted(t, func(c *config.Config) {
		c.Policy.TTL = []policy.TTLRule{
			{Pattern: "queue:ttl*", Required: true, Default: policy.Duration{Duration: time.Hour}},
			{Pattern: "cache:ttl*", Required: true, Default: policy.Duration{Duration: 2 * time.Hour}},
		}
	})
	nc := dialAddr(t, r.p.Addr)
	rawSend(t, nc, "MSET", "queue:ttl1", "a", "cache:ttl2", "b", "plain", "c", "cache:no", "d")
	if got := rawRead(t, nc); got != "+OK\r\n" {
		t.Fatalf("MSET over three routes: %q, want +OK", got)
	}
	for _, k := range []struct {
		rs       *redistest.Server
		key, val string
		ttl      time.Duration // the rule's; 0: none
	}{
		{r.queue, "queue:ttl1", "a", time.Hour},
		{r.cach, "cache:ttl2", "b", 2 * time.Hour},
		{r.def, "plain", "c", 0},
		{r.cach, "cache:no", "d", 0},
	} {
		c := k.rs.Client(t)
		if v := c.Get(ctx, k.key).Val(); v != k.val {
			t.Errorf("%s = %q on its upstream, want %q", k.key, v, k.val)
		}
		ttl := c.TTL(ctx, k.key).Val()
		if k.ttl == 0 && ttl != -1 || k.ttl != 0 && (ttl <= k.ttl-time.Minute || ttl > k.ttl) {
			t.Errorf("%s has TTL %v, want %v (0: none)", k.key, ttl, k.ttl)
		}
	}
}

// TestRoutesTxNamespace: in a namespace, FLUSHDB (a script of the
// namespace's, fanned out over the upstreams) is refused inside a held
// transaction instead of running ahead of it, and EXEC then answers
// EXECABORT with nothing of the transaction run; a command whose reply
// names keys (BLPOP) is held, sent at EXEC, and its element of EXEC's
// reply comes back without the prefix.
func TestRoutesTxNamespace(t *testing.T) {
	r := startRouted(t, func(c *config.Config) {
		a := user("tenant-a", nsPass, "+@all ~* allchannels")
		a.Namespace = "a:"
		c.Users = []auth.UserConfig{a}
		c.Policy.Commands.Allow = []string{"flushdb"}
	})
	direct := r.def.Client(t)
	if err := direct.Set(ctx, "a:keep", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := direct.RPush(ctx, "a:l", "x").Err(); err != nil {
		t.Fatal(err)
	}
	c := nsClient(t, r.p, "tenant-a", func(o *redis.Options) { o.MaxRetries = -1 })
	// FLUSHDB fans out over the upstreams, which a transaction cannot.
	var queued []redis.Cmder
	_, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		queued = append(queued, p.Set(ctx, "k", "1", 0), p.Do(ctx, "FLUSHDB"))
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "EXECABORT") {
		t.Fatalf("FLUSHDB inside MULTI: EXEC gave %v, want EXECABORT", err)
	}
	if e := queued[1].Err(); e == nil || !strings.Contains(e.Error(), "not supported") {
		t.Fatalf("FLUSHDB inside MULTI: %v", e)
	}
	if n, _ := direct.Exists(ctx, "a:keep", "a:l").Result(); n != 2 {
		t.Fatalf("%d of a:keep, a:l left: FLUSHDB ran", n)
	}
	if n, _ := direct.Exists(ctx, "a:k").Result(); n != 0 {
		t.Fatal("the aborted transaction's SET ran")
	}
	// BLPOP is held and sent at EXEC; its result in EXEC's reply names
	// the key without the namespace's prefix.
	var pop *redis.StringSliceCmd
	if _, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		pop = p.BLPop(ctx, 0, "l")
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := pop.Val(); len(got) != 2 || got[0] != "l" || got[1] != "x" {
		t.Fatalf("BLPOP inside MULTI: %q, want [l x]", got)
	}
	if n, _ := direct.Exists(ctx, "a:l").Result(); n != 0 {
		t.Fatal("BLPOP inside EXEC did not pop a:l")
	}
	if n, _ := direct.Exists(ctx, "a:keep").Result(); n != 1 {
		t.Fatal("a:keep is gone")
	}
}

// TestRoutesTxReplicaReadYourWrites: a held transaction's writes count
// as the client's writes for replica reads when EXEC sends them: while
// both replicas' replication is held, the client's reads right after EXEC
// return what its transaction wrote, on either route; once released, the
// replicas serve its reads again. With the read-your-writes floor off the
// same steps read stale values, so the check can fail.
func TestRoutesTxReplicaReadYourWrites(t *testing.T) {
	r := startRoutedReplicas(t, 10*time.Second)
	// A raw connection: the transaction and the reads are surely one
	// client's.
	nc := dialAddr(t, r.p.Addr)
	exec := func(key, val string) {
		for _, c := range [][]string{{"MULTI"}, {"SET", key, val}, {"EXEC"}} {
			rawSend(t, nc, c...)
		}
		for i, want := range []string{"+OK\r\n", "+QUEUED\r\n", "*1\r\n+OK\r\n"} {
			if got := rawRead(t, nc); got != want {
				t.Fatalf("transaction reply %d = %q, want %q", i, got, want)
			}
		}
	}
	get := func(key string) string {
		got := rawDo(t, nc, "GET", key)
		if _, v, ok := strings.Cut(strings.TrimSuffix(got, "\r\n"), "\r\n"); ok && strings.HasPrefix(got, "$") {
			return v
		}
		return got
	}
	if stale, first := heldSteps(t, r.ownRoutes("txown"), 3, false, exec, get); stale != 0 {
		t.Fatalf("%d reads did not return the transaction's write; first: %s", stale, first)
	}
	restore := proxy.SetTestNoReadYourWrites(true)
	defer restore()
	if stale, _ := heldSteps(t, r.ownRoutes("txown"), 2, true, exec, get); stale == 0 {
		t.Fatal("without the read-your-writes floor no read was stale: the replicas were not read while held")
	}
}

// TestRoutesWatchMultiWithArguments: MULTI with arguments under WATCH
// gets Redis's arity error and opens no transaction, so the next EXEC is
// Redis's "EXEC without MULTI", and the WATCH still holds: a transaction
// after a change of the watched key fails.
func TestRoutesWatchMultiWithArguments(t *testing.T) {
	r := startRouted(t, nil)
	nc := dialAddr(t, r.p.Addr)
	for _, c := range [][]string{{"WATCH", "queue:m"}, {"MULTI", "x"}, {"EXEC"}} {
		rawSend(t, nc, c...)
	}
	for i, want := range []string{"+OK\r\n", "-ERR wrong number of arguments for 'multi' command", "-ERR EXEC without MULTI"} {
		if got := rawRead(t, nc); !strings.HasPrefix(got, want) {
			t.Fatalf("reply %d = %q, want %q...", i, got, want)
		}
	}
	if err := r.queue.Client(t).Set(ctx, "queue:m", "other", 0).Err(); err != nil {
		t.Fatal(err)
	}
	for _, c := range [][]string{{"MULTI"}, {"SET", "queue:m", "mine"}, {"EXEC"}} {
		rawSend(t, nc, c...)
	}
	for i, want := range []string{"+OK\r\n", "+QUEUED\r\n", "*-1\r\n"} {
		if got := rawRead(t, nc); got != want {
			t.Fatalf("transaction after the watched key changed: reply %d = %q, want %q", i, got, want)
		}
	}
}

// TestRoutesNamespaceFlushDBRefused: with routes a namespace's keys live
// on several upstreams, and the namespace's FLUSHDB (a script) would run
// on the default one only, leaving the others' keys; it is refused and
// every key stays.
func TestRoutesNamespaceFlushDBRefused(t *testing.T) {
	r := startRouted(t, func(c *config.Config) {
		a := user("tenant-a", nsPass, "+@all ~* allchannels")
		a.Namespace = "a:"
		c.Users = []auth.UserConfig{a}
		c.Policy.Commands.Allow = []string{"flushdb"}
		// Routes match the key as Redis sees it, prefix included.
		c.Routes = []config.Route{{Pattern: "a:queue:*", Upstream: "queue"}}
	})
	c := nsClient(t, r.p, "tenant-a", func(o *redis.Options) { o.MaxRetries = -1 })
	for _, k := range []string{"k", "queue:k"} {
		if err := c.Set(ctx, k, "1", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, cmd := range []string{"FLUSHDB", "RANDOMKEY"} {
		if err := c.Do(ctx, cmd).Err(); err == nil || !strings.Contains(err.Error(), "one upstream only") {
			t.Fatalf("%s in a namespace with routes: %v, want the refusal", cmd, err)
		}
	}
	if n, _ := r.def.Client(t).Exists(ctx, "a:k").Result(); n != 1 {
		t.Fatal("a:k is gone from the default upstream")
	}
	if n, _ := r.queue.Client(t).Exists(ctx, "a:queue:k").Result(); n != 1 {
		t.Fatal("a:queue:k is gone from the queue upstream")
	}
}

// TestRoutesTxPublishOnItsChannelsUpstream: PUBLISH inside a routed
// transaction goes where its channel routes ([[channel_route]]), where
// its subscribers are; a transaction whose keys are elsewhere fails
// before anything is sent.
func TestRoutesTxPublishOnItsChannelsUpstream(t *testing.T) {
	r := startRouted(t, nil)
	sub := r.p.Client(t).Subscribe(ctx, "jobs.new")
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	cmds, err := r.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, "queue:j", "1", 0)
		p.Publish(ctx, "jobs.new", "j")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := cmds[1].(*redis.IntCmd).Val(); n != 1 {
		t.Fatalf("PUBLISH inside MULTI reached %d subscribers, want 1", n)
	}
	select {
	case m := <-sub.Channel():
		if m.Payload != "j" {
			t.Fatalf("got %q", m.Payload)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the subscriber never got the message")
	}
	_, err = r.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, "k", "1", 0) // the default upstream's
		p.Publish(ctx, "jobs.new", "lost")
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "EXECABORT") {
		t.Fatalf("transaction across the default upstream and jobs.*'s: %v, want EXECABORT", err)
	}
}

// TestRoutesNamespacedSubscriberRoutesByStoredNames: on a namespaced
// client's subscribed connection, routes match keys and channels as Redis
// stores them, prefix included, as on every other path. They matched the
// client's own names: its GET of a key stored on another upstream was
// answered nil from the relay's, its SET stored the key there, and a
// channel that goes to the relay's upstream was refused (found by a
// probe).
func TestRoutesNamespacedSubscriberRoutesByStoredNames(t *testing.T) {
	r := startRouted(t, func(c *config.Config) {
		a := user("tenant-a", nsPass, "+@all ~* allchannels")
		a.Namespace = "a:"
		c.Users = []auth.UserConfig{a}
		c.Routes = append([]config.Route{{Pattern: "a:*", Upstream: "cache"}}, c.Routes...)
	})
	if err := nsClient(t, r.p, "tenant-a").Set(ctx, "k1", "on-cache", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if where := r.holds(t, "a:k1"); where != "cache" {
		t.Fatalf("a:k1 is on %q, want cache", where)
	}
	s := dialRaw(t, r.p.Addr)
	if v, ok := s.do("HELLO", "3", "AUTH", "tenant-a", nsPass).([]any); !ok {
		t.Fatalf("HELLO 3 AUTH = %v", v)
	}
	// a:other.x and a:jobs.x: no channel route matches either (jobs.* does
	// not), so both go to the default upstream, the relay's.
	for i, ch := range []string{"other.x", "jobs.x"} {
		if v := fmt.Sprint(s.do("SUBSCRIBE", ch)); v != fmt.Sprintf("[subscribe %s %d]", ch, i+1) {
			t.Fatalf("SUBSCRIBE %s = %s", ch, v)
		}
	}
	// k1 is a:k1, on cache: not the relay's upstream.
	for _, cmd := range [][]string{{"GET", "k1"}, {"SET", "newkey", "x"}} {
		if v, ok := s.do(cmd...).(respError); !ok || !strings.Contains(string(v), "another upstream") {
			t.Errorf("%v on the subscribed connection = %v, want the other-upstream refusal", cmd, v)
		}
	}
	if where := r.holds(t, "a:newkey"); where != "" {
		t.Errorf("the refused SET stored a:newkey on %s", where)
	}
}
