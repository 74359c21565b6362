package proxy_test

// Relayed clients (issue 9, items 10 and 17): idle_timeout spares the
// ones Redis spares and counts traffic both ways for the rest, and their
// writes reach the local tier's write marks and the miss holds.

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/localcache"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/stampede"
)

// readNonPush reads the next reply that is not a RESP3 push.
func (c *rawConn) readNonPush() any {
	c.t.Helper()
	for {
		v, types := c.readReply()
		if types[0] != '>' {
			return v
		}
	}
}

// idle_timeout as Redis applies `timeout`: a subscriber or a MONITOR
// client is never closed for idleness; a tracking client (a relay too) is
// not closed while it sends, but is once nothing moves either way.
func TestIdleTimeoutAndRelayedClients(t *testing.T) {
	// Long enough that a loaded machine (a full test run beside other
	// work) does not stall a ping past it: 300 ms once closed the busy
	// tracking client in such a run.
	const idle = time.Second
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Server.IdleTimeout = units.Duration{Duration: idle} })
	direct := p.Redis.Client(t)

	sub := dialRaw(t, p.Addr)
	sub.send([]string{"SUBSCRIBE", "news"})
	sub.readReply()
	mon := dialRaw(t, p.Addr)
	if v := mon.do("MONITOR"); v != "OK" {
		t.Fatalf("MONITOR: %v", v)
	}
	tracker := dialRaw(t, p.Addr)
	tracker.do("HELLO", "3")
	if v := tracker.do("CLIENT", "TRACKING", "ON"); v != "OK" {
		t.Fatalf("CLIENT TRACKING ON: %v", v)
	}
	// The tracking client stays busy for several idle timeouts.
	for end := time.Now().Add(3 * idle); time.Now().Before(end); time.Sleep(idle / 10) {
		if v := tracker.readNonPushAfter("PING"); v != "PONG" {
			t.Fatalf("PING on an active tracking client: %v", v)
		}
	}
	// The quiet subscriber and MONITOR are still there.
	if n, err := direct.Publish(ctx, "news", "hello").Result(); err != nil || n != 1 {
		t.Fatalf("PUBLISH reached %d subscribers (%v); the idle subscriber was closed", n, err)
	}
	if v, _ := sub.readReply(); len(v.([]any)) != 3 || v.([]any)[2] != "hello" {
		t.Fatalf("subscriber got %v", v)
	}
	if err := p.Client(t).Set(ctx, "seen-by-monitor", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	for {
		v, _ := mon.readReply()
		if s, _ := v.(string); len(s) > 0 && strings.Contains(s, "seen-by-monitor") {
			break
		}
	}
	// Now the tracking client goes quiet: it is closed.
	if !connClosed(tracker.nc) {
		t.Fatal("an idle tracking client was never closed")
	}
}

func (c *rawConn) readNonPushAfter(cmd ...string) any {
	c.t.Helper()
	c.send(cmd)
	return c.readNonPush()
}

// slowTierProxy starts a proxy whose local tier admits every read and
// hears of Redis's invalidations pushDelay late, so a write a relay
// released too early would show as a stale hit; it returns the proxy, a
// client reading through it, and the tier's hit count so far.
func slowTierProxy(t *testing.T, pushDelay, staleness time.Duration) (*proxytest.Proxy, *redis.Client, func() float64) {
	t.Helper()
	return slowTierProxyOn(t, nil, pushDelay, staleness)
}

// slowTierProxyOn is slowTierProxy in front of rs (nil: a Redis of its own).
func slowTierProxyOn(t *testing.T, rs *redistest.Server, pushDelay, staleness time.Duration) (*proxytest.Proxy, *redis.Client, func() float64) {
	t.Helper()
	prev := localcache.SetTestHooks(&localcache.TestHooks{BeforePush: func() { time.Sleep(pushDelay) }})
	t.Cleanup(func() { localcache.SetTestHooks(prev) })
	p := proxytest.Start(t, rs, func(c *config.Config) {
		eagerTier(c, staleness)
	})
	redistest.Eventually(t, 10*time.Second, func() bool { return p.LocalTier().Live(0) }, "local tier never became live")
	return p, p.Client(t), func() float64 { return metricSum(t, p, "redproxy_localcache_hits_total") }
}

// eagerTier turns the local tier on, admitting every key at its first
// read, with the given staleness bound.
func eagerTier(c *config.Config, staleness time.Duration) {
	c.LocalCache.Enabled = true
	c.LocalCache.AdmitMinReads = 0
	c.LocalCache.WriteRatio = 1000
	c.LocalCache.Staleness = units.Duration{Duration: staleness}
	c.LocalCache.MaxTTL = units.Duration{Duration: time.Minute}
}

// waitTierHit reads key through reader until the tier serves it (hits
// counts the tier's hits), so that an entry left stale would show.
func waitTierHit(t *testing.T, reader *redis.Client, hits func() float64, key string) {
	t.Helper()
	redistest.Eventually(t, 5*time.Second, func() bool {
		before := hits()
		reader.Get(ctx, key)
		return hits() > before
	}, "%s never became a hit", key)
}

// C1 for relayed writers: with invalidations slowed down, once a tracking
// client (as rueidis is) or a RESP3 subscriber got OK for a SET through the
// proxy, no read through the local tier returns the old value.
func TestRelayedWritesAreSeenByTheLocalTier(t *testing.T) {
	p, reader, hits := slowTierProxy(t, 20*time.Millisecond, 200*time.Millisecond)
	for _, start := range [][]string{{"CLIENT", "TRACKING", "ON"}, {"SUBSCRIBE", "elsewhere"}} {
		t.Run(start[0], func(t *testing.T) {
			relay := func() *rawConn {
				w := dialRaw(t, p.Addr)
				w.do("HELLO", "3")
				w.send(start)
				if start[0] == "CLIENT" {
					w.readNonPush()
				}
				return w
			}
			w := relay()
			key := "rw:" + start[0]
			if err := p.Redis.Client(t).Set(ctx, key, "start", 0).Err(); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 20; i++ {
				// Make sure the old value is in the tier: the relay's last
				// write was released once its reply came (for a RESP3
				// subscriber too, as its subscriptions are counted).
				waitTierHit(t, reader, hits, key)
				want := "v" + strconv.Itoa(i)
				if v := w.readNonPushAfter("SET", key, want); v != "OK" {
					t.Fatalf("relayed SET: %v", v)
				}
				if got, err := reader.Get(ctx, key).Result(); err != nil && err != redis.Nil || got != want {
					t.Fatalf("round %d: read %q after a relayed SET of %q was acknowledged (%v)", i, got, want, err)
				}
			}
		})
	}
}

// A relayed client's writes are marked in the database its connection is
// in, which the relay follows without reading Redis's replies: a SELECT
// queued in a transaction that was discarded, or followed by RESET (back to
// DB 0), used to leave the relay marking DB 1 while its SETs changed DB 0,
// and a read after the acknowledged SET was a tier hit on the old value
// (found by review). After an EXEC of a transaction with a SELECT the
// relay cannot tell which database it is in, and marks both.
func TestRelayedWritesFollowTheDatabase(t *testing.T) {
	p, reader, hits := slowTierProxy(t, 150*time.Millisecond, time.Second)
	for i, tc := range []struct {
		name  string
		drift [][]string
	}{
		{"no SELECT", nil},
		{"MULTI SELECT DISCARD", [][]string{{"MULTI"}, {"SELECT", "1"}, {"DISCARD"}}},
		{"SELECT then RESET", [][]string{{"SELECT", "1"}, {"RESET"}, {"HELLO", "3"}}},
		{"WATCH MULTI SELECT EXEC aborted", [][]string{{"WATCH", "touched"}, {"MULTI"}, {"SELECT", "1"}, {"EXEC"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "rdb:" + strconv.Itoa(i)
			if err := p.Redis.Client(t).Set(ctx, key, "old", 0).Err(); err != nil {
				t.Fatal(err)
			}
			waitTierHit(t, reader, hits, key)
			w := dialRaw(t, p.Addr)
			w.do("HELLO", "3")
			if v := w.readNonPushAfter("CLIENT", "TRACKING", "ON"); v != "OK" {
				t.Fatalf("CLIENT TRACKING ON: %v", v)
			}
			for _, c := range tc.drift {
				if c[0] == "EXEC" {
					// Abort it: the watched key changes meanwhile.
					if err := p.Redis.Client(t).Set(ctx, "touched", "x", 0).Err(); err != nil {
						t.Fatal(err)
					}
				}
				w.readNonPushAfter(c...)
			}
			if v := w.readNonPushAfter("SET", key, "new"); v != "OK" {
				t.Fatalf("relayed SET: %v", v)
			}
			if v, err := p.Redis.Client(t).Get(ctx, key).Result(); err != nil || v != "new" {
				t.Fatalf("Redis's DB 0 has %q (%v): the SET ran elsewhere", v, err)
			}
			before := hits()
			if got, err := reader.Get(ctx, key).Result(); err != nil || got != "new" {
				t.Fatalf("GET %s after the relayed SET was acknowledged = %q (%v), want \"new\" (tier hit: %v)", key, got, err, hits() > before)
			}
		})
	}
}

// A read held by a miss hold is released by the filler's write even when
// the filler is a relayed client, not at the hold's timeout.
func TestHeldReadReleasedByRelayedWrite(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) {
		c.Stampede.Hold = []stampede.HoldRule{{Pattern: "h:*", Timeout: units.Duration{Duration: time.Minute}}}
	})
	writer := dialRaw(t, p.Addr)
	writer.do("HELLO", "3")
	writer.readNonPushAfter("CLIENT", "TRACKING", "ON")
	got := holdSecondRead(t, p, "h:k")
	if v := writer.readNonPushAfter("SET", "h:k", "filled"); v != "OK" {
		t.Fatalf("relayed SET: %v", v)
	}
	select {
	case v := <-got:
		if v != "filled" {
			t.Fatalf("held read got %q, want the relayed write's value", v)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the held read was not released by the relayed client's write (it waits for the one-minute hold timeout)")
	}
}

func metricSum(t *testing.T, p *proxytest.Proxy, name string) float64 {
	t.Helper()
	return counterSum(t, p, name, "", "")
}

// Writes on a relay whose replies cannot be counted (here a RESP2 client
// that subscribed, then unsubscribed from everything and named its
// connection on the relay, which keeps it there: relayexit.go) stay marked
// until the connection ends; past 1024 of them, further writes are refused
// rather than left unmarked.
func TestUncountedRelayWritesAreCapped(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) { c.LocalCache.Enabled = true })
	c := dialRaw(t, p.Addr)
	c.send([]string{"SUBSCRIBE", "x"}, []string{"UNSUBSCRIBE"}, []string{"CLIENT", "SETNAME", "n"})
	c.readReply()
	c.readReply()
	if v, _ := c.readReply(); v != "OK" {
		t.Fatalf("CLIENT SETNAME: %v", v)
	}
	var cmds [][]string
	for i := 0; i <= 1024; i++ {
		cmds = append(cmds, []string{"SET", "u:" + strconv.Itoa(i), "v"})
	}
	c.send(cmds...)
	for i := 0; i < 1024; i++ {
		if v, _ := c.readReply(); v != "OK" {
			t.Fatalf("write %d: %v", i, v)
		}
	}
	v, _ := c.readReply()
	if e, ok := v.(respError); !ok || !strings.Contains(string(e), "too many writes on a relayed connection") {
		t.Fatalf("write 1025: %v, want the refusal", v)
	}
	if n, _ := p.Redis.Client(t).Exists(ctx, "u:1024").Result(); n != 0 {
		t.Fatal("the refused write reached Redis")
	}
}

// holdSecondRead reads key through p twice: the first read misses and makes
// its reader the filler, so the second is held by the miss hold (which
// must cover key). It returns the held read's result (its value, or
// "error: ..."), once the hold releases it.
func holdSecondRead(t *testing.T, p *proxytest.Proxy, key string) <-chan string {
	t.Helper()
	if err := p.Client(t).Get(ctx, key).Err(); err != redis.Nil {
		t.Fatalf("first GET: %v, want a miss", err)
	}
	got := make(chan string, 1)
	go func() {
		v, err := p.Client(t).Get(ctx, key).Result()
		if err != nil {
			v = "error: " + err.Error()
		}
		got <- v
	}()
	redistest.Eventually(t, 5*time.Second, func() bool {
		return metricSum(t, p, "redproxy_stampede_held_reads_total") >= 1
	}, "the second GET was never held")
	return got
}

// A RESP3 subscriber's SUBSCRIBE refused by Redis (here -BUSY while a
// script runs) is answered with one error and no push. Counted as no
// reply, it made the relay release a later write's marks one reply early:
// with a BLPOP holding the write back, the tier kept serving the old value
// after the write's OK (found by review). Now a subscription makes the
// stream uncountable, and the write stays marked until the relay ends.
func TestRefusedResp3SubscribeKeepsWritesMarked(t *testing.T) {
	rs := redistest.Start(t, "--busy-reply-threshold", "50")
	p, reader, hits := slowTierProxyOn(t, rs, 300*time.Millisecond, 2*time.Second)
	rc := rs.Client(t)
	if err := rc.Set(ctx, "k", "old", 0).Err(); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 5*time.Second, func() bool {
		before := hits()
		reader.Get(ctx, "k")
		return hits() > before
	}, "k never became a hit")

	w := dialRaw(t, p.Addr)
	w.do("HELLO", "3")
	w.send([]string{"SUBSCRIBE", "a"})
	w.readReply()
	// A long script, killed once both refusals are read: a short one could
	// end before a loaded machine sent the SUBSCRIBEs.
	done := startLoop(t, rs.Addr(), false, 20000)
	redistest.Eventually(t, 5*time.Second, func() bool { return redisBusy(t, rs) }, "Redis never busy")
	w.send([]string{"SUBSCRIBE", "c1"}, []string{"SUBSCRIBE", "c2"})
	for range 2 {
		if v, _ := w.readReply(); !strings.HasPrefix(fmt.Sprint(v), "BUSY") {
			t.Fatalf("SUBSCRIBE while Redis is busy: %v", v)
		}
	}
	if err := rc.ScriptKill(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	<-done
	w.send([]string{"BLPOP", "l", "0"}, []string{"SET", "k", "new"})
	redistest.Eventually(t, 5*time.Second, func() bool {
		info, _ := rc.Info(ctx, "clients").Result()
		return strings.Contains(info, "blocked_clients:1\r")
	}, "BLPOP never blocked")
	if err := rc.Publish(ctx, "a", "m").Err(); err != nil { // a chunk for the relay's reader
		t.Fatal(err)
	}
	if v, _ := w.readReply(); fmt.Sprint(v) != "[message a m]" {
		t.Fatalf("message: %v", v)
	}
	for range 3 {
		reader.Get(ctx, "k") // reads that may fill the tier while the write is held back
	}
	if err := rc.LPush(ctx, "l", "x").Err(); err != nil {
		t.Fatal(err)
	}
	if v, _ := w.readReply(); fmt.Sprint(v) != "[l x]" {
		t.Fatalf("BLPOP: %v", v)
	}
	if v, _ := w.readReply(); v != "OK" {
		t.Fatalf("SET: %v", v)
	}
	if got, err := reader.Get(ctx, "k").Result(); err != nil || got != "new" {
		t.Fatalf("read %q after the relayed SET of \"new\" was acknowledged (%v)", got, err)
	}
}

// A RESP3 client that subscribed keeps writing on the same connection
// (rueidis multiplexes its subscriptions on the connection it tracks keys
// on). Its writes are counted as any relayed client's, so the 1025th and
// later are answered, not refused as writes the relay could no longer
// track; a subscribe refused in between (its arity) does not stop that.
func TestResp3SubscriberWritesAreNotCapped(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) { c.LocalCache.Enabled = true })
	c := dialRaw(t, p.Addr)
	c.do("HELLO", "3")
	cmds := [][]string{{"SUBSCRIBE", "x"}}
	for i := 0; i < 1500; i++ {
		cmds = append(cmds, []string{"SET", "u:" + strconv.Itoa(i), "v"})
		if i == 700 {
			cmds = append(cmds, []string{"SUBSCRIBE"})
		}
	}
	c.send(cmds...)
	for i := 0; i < 1500; i++ {
		if v := c.readNonPush(); v != "OK" {
			t.Fatalf("write %d: %v", i, v)
		}
		if i == 700 {
			if v := c.readNonPush(); !strings.Contains(fmt.Sprint(v), "wrong number of arguments") {
				t.Fatalf("SUBSCRIBE without a channel: %v", v)
			}
		}
	}
}

// C1 for a RESP3 subscriber that writes, under a flood of messages and
// random subscribe, unsubscribe (to everything too: the relay leaves and
// the next SUBSCRIBE starts another) and refused subscribe commands
// pipelined before each write: with invalidations slowed down, once the
// subscriber got OK for its SET, no read through the local tier returns
// the value before it. The key must also be served from the tier between
// writes, or there was nothing stale to return.
func TestResp3SubscriberWritesUnderFlood(t *testing.T) {
	p, reader, hits := slowTierProxy(t, 20*time.Millisecond, 200*time.Millisecond)
	stop := make(chan struct{})
	flooded := make(chan int)
	go func() {
		pub := p.Redis.Client(t)
		n := 0
		defer func() { flooded <- n }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if pub.Publish(ctx, "flood", strconv.Itoa(n)).Err() == nil {
				n++
			}
		}
	}()
	rng := rand.New(rand.NewPCG(7, uint64(time.Now().UnixNano())))
	ops := [][]string{
		{"SUBSCRIBE", "flood"}, {"SUBSCRIBE", "flood", "quiet"}, {"PSUBSCRIBE", "fl*"},
		{"UNSUBSCRIBE", "flood"}, {"UNSUBSCRIBE"}, {"PUNSUBSCRIBE"}, {"UNSUBSCRIBE", "never"},
		{"SUBSCRIBE"}, {"PING"},
	}
	w := dialRaw(t, p.Addr)
	w.do("HELLO", "3")
	const key = "flooded:k"
	if err := p.Redis.Client(t).Set(ctx, key, "start", 0).Err(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 150; i++ {
		// The value before the write, served from the tier (once the
		// last write's invalidation, slowed down, has come).
		redistest.Eventually(t, 5*time.Second, func() bool {
			before := hits()
			reader.Get(ctx, key)
			return hits() > before
		}, "round %d: %s never became a hit: the subscriber's last write stayed marked", i, key)
		cmds := [][]string{{"SUBSCRIBE", "flood"}}
		for range rng.IntN(4) {
			cmds = append(cmds, ops[rng.IntN(len(ops))])
		}
		want := "v" + strconv.Itoa(i)
		cmds = append(cmds, []string{"SET", key, want})
		w.send(cmds...)
		for _, c := range cmds[:len(cmds)-1] {
			// In RESP3 a subscribe command is answered by pushes, which
			// readNonPush passes over, unless refused.
			if c[0] == "PING" || len(c) == 1 && c[0] == "SUBSCRIBE" {
				w.readNonPush()
			}
		}
		if v := w.readNonPush(); v != "OK" {
			t.Fatalf("round %d (%v): SET answered %v", i, cmds, v)
		}
		if got, err := reader.Get(ctx, key).Result(); err != nil || got != want {
			t.Fatalf("round %d (%v): read %q after the SET of %q was acknowledged (%v)", i, cmds, got, want, err)
		}
	}
	close(stop)
	t.Logf("%d messages published meanwhile", <-flooded)
}

// readRawUntil reads raw bytes from c until they end with suffix.
func (c *rawConn) readRawUntil(suffix string) []byte {
	c.t.Helper()
	var got []byte
	buf := make([]byte, 4096)
	c.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	for !bytes.HasSuffix(got, []byte(suffix)) {
		n, err := c.rd.Read(buf)
		if err != nil {
			c.t.Fatalf("read (have %q): %v", got, err)
		}
		got = append(got, buf[:n]...)
	}
	return got
}

// C1 for a RESP3 subscriber to keyevent notifications, which Redis 7.0
// writes to it inside its own MGET's or ZPOPMIN's reply: its SET, sent
// behind such a command and a BLPOP that blocks for a second, stays
// marked until its OK, so a read meanwhile does not fill the tier with the
// old value to be served after the OK (found by review: the counter took
// the pushes for elements and released the SET's marks with MGET's reply).
func TestResp3SubscriberPushesInsideRepliesKeepWritesMarked(t *testing.T) {
	for _, tc := range []struct {
		name string
		mget []string
	}{
		{"two lazily expired keys", []string{"MGET", "a", "e1", "e2", "a"}},
		{"ZPOPMIN with a count, twice (no expiry)", []string{"ZPOPMIN", "z", "1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := redistest.Start(t, "--enable-debug-command", "local")
			p, reader, hits := slowTierProxyOn(t, rs, 300*time.Millisecond, 2*time.Second)
			direct := rs.Client(t)
			for _, cmd := range [][]any{
				{"CONFIG", "SET", "notify-keyspace-events", "Exz"},
				{"DEBUG", "SET-ACTIVE-EXPIRE", "0"},
				{"SET", "a", "1"}, {"SET", "k", "old"}, {"ZADD", "z", "1", "a", "2", "b", "3", "c"},
			} {
				if err := direct.Do(ctx, cmd...).Err(); err != nil {
					t.Fatal(cmd, err)
				}
			}
			w := dialRaw(t, p.Addr)
			w.do("HELLO", "3")
			w.send([]string{"SUBSCRIBE", "__keyevent@0__:expired", "__keyevent@0__:zpopmin"})
			w.readReply()
			w.readReply()
			for _, e := range []string{"e1", "e2"} {
				direct.Do(ctx, "SET", e, "x", "PX", "1")
			}
			time.Sleep(20 * time.Millisecond)
			redistest.Eventually(t, 5*time.Second, func() bool {
				before := hits()
				reader.Get(ctx, "k")
				return hits() > before
			}, "k never became a hit")
			cmds := [][]string{tc.mget}
			if tc.mget[0] == "ZPOPMIN" {
				cmds = append(cmds, tc.mget)
			}
			w.send(append(cmds, []string{"BLPOP", "nothing", "1"}, []string{"SET", "k", "new"})...)
			time.Sleep(300 * time.Millisecond) // MGET answered, BLPOP blocking, SET not run
			for range 3 {
				if v, _ := reader.Get(ctx, "k").Result(); v != "old" {
					t.Fatalf("read %q before the SET ran", v)
				}
				time.Sleep(20 * time.Millisecond)
			}
			stream := w.readRawUntil("+OK\r\n")
			if got, err := reader.Get(ctx, "k").Result(); err != nil || got != "new" {
				t.Fatalf("read %q after the relayed SET of \"new\" was acknowledged (%v); relay stream %q", got, err, stream)
			}
		})
	}
}

// rueidis's pattern: RESP3, CLIENT TRACKING ON OPTIN, a subscription on
// the same connection, a cached read (CLIENT CACHING YES, MULTI, PTTL, GET,
// EXEC), then writes: all answered (MULTI on a subscribed connection made
// the stream uncountable, and the 1025th write was refused).
func TestRueidisPatternWritesAreNotCapped(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) { c.LocalCache.Enabled = true })
	c := dialRaw(t, p.Addr)
	c.do("HELLO", "3")
	if v := c.do("CLIENT", "TRACKING", "ON", "OPTIN"); v != "OK" {
		t.Fatal(v)
	}
	c.send([]string{"SUBSCRIBE", "ch"})
	c.readReply()
	c.send([]string{"CLIENT", "CACHING", "YES"}, []string{"MULTI"}, []string{"PTTL", "k"}, []string{"GET", "k"}, []string{"EXEC"})
	for range 5 {
		c.readNonPush()
	}
	var cmds [][]string
	for i := 0; i < 1100; i++ {
		cmds = append(cmds, []string{"SET", "u:" + strconv.Itoa(i), "v"})
	}
	c.send(cmds...)
	for i := 0; i < 1100; i++ {
		if v := c.readNonPush(); v != "OK" {
			t.Fatalf("write %d: %v", i, v)
		}
	}
}
