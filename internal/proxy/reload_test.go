package proxy_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxy"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// reloaded returns a copy of the proxy's configuration changed by mutate,
// validated as a file would be.
func reloaded(t *testing.T, p *proxytest.Proxy, mutate func(*config.Config)) *config.Config {
	t.Helper()
	next := *p.Config()
	next.Stampede = p.Config().Stampede.Clone()
	mutate(&next)
	if err := next.Validate(); err != nil {
		t.Fatal(err)
	}
	return &next
}

// TestReloadSwitchesUpstream: a reload that changes upstream.address
// drains and switches while clients keep working. Both servers hold the
// same read-only data, so every reply of the load loop is checkable
// whichever server answers it; writes after the reload land on the new
// server; a client inside MULTI keeps its connection, and a subscriber's
// is closed, so that it resubscribes on the new server.
func TestReloadSwitchesUpstream(t *testing.T) {
	a, b := redistest.Start(t), redistest.Start(t)
	for _, rs := range []*redistest.Server{a, b} {
		c := rs.Client(t)
		for i := range 100 {
			if err := c.Set(ctx, "r:"+strconv.Itoa(i), "v"+strconv.Itoa(i), 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	p := proxytest.Start(t, a, nil)
	directA, directB := a.Client(t), b.Client(t)

	// A subscriber from before the switch.
	sub := p.Client(t).Subscribe(ctx, "news")
	t.Cleanup(func() { sub.Close() })
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	// A client in the middle of a transaction when the switch happens.
	txc := p.Client(t, func(o *redis.Options) { o.PoolSize = 1 })
	conn := txc.Conn()
	t.Cleanup(func() { conn.Close() })
	if err := conn.Do(ctx, "MULTI").Err(); err != nil {
		t.Fatal(err)
	}
	if err := conn.Do(ctx, "SET", "tx:key", "in-multi").Err(); err != nil {
		t.Fatal(err)
	}

	var ops, bad atomic.Int64
	var firstErr atomic.Value
	fail := func(format string, args ...any) {
		if bad.Add(1) == 1 {
			firstErr.Store(fmt.Sprintf(format, args...))
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 6 {
		c := p.Client(t, func(o *redis.Options) { o.PoolSize = 2 })
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				i := (g*7 + n) % 100
				key := fmt.Sprintf("w:%d:%d", g, n)
				var get *redis.StringCmd
				var set *redis.StatusCmd
				var echo *redis.StringCmd
				_, err := c.Pipelined(ctx, func(pp redis.Pipeliner) error {
					set = pp.Set(ctx, key, "x", time.Minute)
					get = pp.Get(ctx, "r:"+strconv.Itoa(i))
					echo = pp.Echo(ctx, key)
					return nil
				})
				switch {
				case err != nil:
					fail("client %d op %d: %v", g, n, err)
				case set.Val() != "OK":
					fail("client %d: SET = %q", g, set.Val())
				case get.Val() != "v"+strconv.Itoa(i):
					fail("client %d: GET r:%d = %q", g, i, get.Val())
				case echo.Val() != key:
					fail("client %d: ECHO %s = %q (another client's reply?)", g, key, echo.Val())
				}
				if v, err := c.Get(ctx, "r:"+strconv.Itoa(i)).Result(); err != nil || v != "v"+strconv.Itoa(i) {
					fail("client %d: lone GET r:%d = %q, %v", g, i, v, err)
				}
				ops.Add(1)
			}
		}()
	}
	waitOps := func(n int64) {
		t.Helper()
		target := ops.Load() + n
		redistest.Eventually(t, 30*time.Second, func() bool { return ops.Load() >= target || bad.Load() > 0 }, "load loop stalled at %d ops", ops.Load())
	}
	waitOps(300)

	// Requests in flight on A when the switch happens: A pauses every
	// client, so each load client's next request waits on A's connections.
	// They must finish there, after the switch, with the right replies.
	if err := directA.ClientPause(ctx, 700*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 10*time.Second, func() bool {
		s2, _ := p.Backend().Pool(0, false).Stats()
		s3, _ := p.Backend().Pool(0, true).Stats()
		return s2.Pending+s3.Pending >= 6
	}, "the load clients' requests never queued on the paused upstream")

	changed, err := p.Reload(reloaded(t, p, func(c *config.Config) { c.Upstream.Address = b.Addr() }))
	if err != nil {
		t.Fatalf("Reload: %v", err)
	}
	if len(changed) != 1 || changed[0] != "upstream.address" {
		t.Errorf("changed = %v", changed)
	}
	// From here on, new commands go to B.
	pc := p.Client(t)
	if err := pc.Set(ctx, "after:switch", "1", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if directB.Get(ctx, "after:switch").Val() != "1" || directA.Exists(ctx, "after:switch").Val() != 0 {
		t.Fatal("a write after the reload did not go to the new upstream only")
	}
	waitOps(600)
	close(stop)
	wg.Wait()
	if n := bad.Load(); n > 0 {
		t.Fatalf("%d bad replies during the switch; first: %v", n, firstErr.Load())
	}
	if p.Config().Upstream.Address != b.Addr() {
		t.Errorf("Config().Upstream.Address = %s", p.Config().Upstream.Address)
	}
	nA, _ := directA.DBSize(ctx).Result()
	nB, _ := directB.DBSize(ctx).Result()
	t.Logf("%d load iterations; keys on A %d, on B %d", ops.Load(), nA, nB)
	if nB <= 101 {
		t.Errorf("B got no writes of the load loop (%d keys)", nB)
	}

	// The transaction opened before the switch finishes on A.
	if err := conn.Do(ctx, "INCR", "tx:n").Err(); err != nil {
		t.Fatal(err)
	}
	if res, err := conn.Do(ctx, "EXEC").Slice(); err != nil || len(res) != 2 {
		t.Fatalf("EXEC = %v, %v", res, err)
	}
	if directA.Get(ctx, "tx:key").Val() != "in-multi" || directB.Exists(ctx, "tx:key").Val() != 0 {
		t.Error("the transaction begun before the switch did not stay on the old upstream")
	}
	// The subscriber's relay to A was closed: go-redis reconnects at its
	// next receive and subscribes again, now on B, where PUBLISH goes.
	// Left on A, it heard nothing published after the switch.
	redistest.Eventually(t, 10*time.Second, func() bool {
		sub.ReceiveTimeout(ctx, 50*time.Millisecond) // drives the reconnection
		return directB.PubSubNumSub(ctx, "news").Val()["news"] == 1
	}, "the subscriber never subscribed again on the new upstream")
	if n := directA.PubSubNumSub(ctx, "news").Val()["news"]; n != 0 {
		t.Errorf("%d subscribers left on the old upstream", n)
	}
	if n, err := p.Client(t).Publish(ctx, "news", "on-b").Result(); err != nil || n != 1 {
		t.Fatalf("PUBLISH through the proxy after the switch = %d, %v", n, err)
	}
	msg, err := sub.ReceiveMessage(ctx)
	if err != nil || msg.Payload != "on-b" {
		t.Fatalf("subscriber after the switch: %v, %v", msg, err)
	}
}

// TestReloadRefusesRestartOnly: a change that needs a restart refuses the
// whole snapshot, names the setting and why, and keeps everything in force,
// including the settings the same snapshot would have changed safely.
func TestReloadRefusesRestartOnly(t *testing.T) {
	a, b := redistest.Start(t), redistest.Start(t)
	p := proxytest.Start(t, a, nil)
	before := p.Config()
	for _, tc := range []struct {
		name   string
		mutate func(*config.Config)
		want   string
	}{
		{"listen", func(c *config.Config) { c.Server.Listen = "127.0.0.1:1"; c.Upstream.Address = b.Addr() },
			"server.listen: the client listener is bound once at start"},
		{"databases", func(c *config.Config) { c.Upstream.Databases = 4; c.Server.MaxClients = 1 },
			"upstream.databases:"},
		{"local tier", func(c *config.Config) { c.LocalCache.Enabled = true }, "localcache.enabled:"},
		{"listeners", func(c *config.Config) {
			c.Server.Listeners = []config.Listener{{Name: "more", Listen: "127.0.0.1:0"}}
		}, "server.listeners: the client listeners are bound once at start"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			changed, err := p.Reload(reloaded(t, p, tc.mutate))
			if !errors.Is(err, proxy.ErrRestartRequired) || !containsStr(err.Error(), tc.want) {
				t.Fatalf("Reload = %v, %v; want ErrRestartRequired naming %q", changed, err, tc.want)
			}
			if p.Config() != before {
				t.Fatal("a refused reload replaced the configuration")
			}
			c := p.Client(t)
			if err := c.Set(ctx, "still:"+tc.name, "1", time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			if a.Client(t).Get(ctx, "still:"+tc.name).Val() != "1" {
				t.Fatal("a refused reload switched the upstream")
			}
		})
	}

	// A safe change applies: max_clients at once.
	if _, err := p.Reload(reloaded(t, p, func(c *config.Config) { c.Server.MaxClients = 1 })); err != nil {
		t.Fatal(err)
	}
	// The subtests' clients have closed; wait until the proxy has seen
	// them go, or they would still count against max_clients.
	redistest.Eventually(t, 5*time.Second, func() bool {
		return testutil.ToFloat64(p.Metrics.ClientsConnected) == 0
	}, "earlier clients still counted")
	c1 := p.Client(t, func(o *redis.Options) { o.PoolSize = 1 })
	if err := c1.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	nc := p.Dial(t)
	nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, _ := bufio.NewReader(nc).ReadString('\n')
	if line != "-ERR max number of clients reached\r\n" {
		t.Fatalf("second client under max_clients = 1 got %q", line)
	}
}

func containsStr(s, sub string) bool { return strings.Contains(s, sub) }

// TestReloadRefusedWhileShuttingDown: a reload that arrives once Shutdown
// has begun (SIGHUP or POST /reload while the proxy drains on SIGTERM) is
// refused with ErrShuttingDown and applies nothing. It used to switch the
// upstream: new pools were dialled to the new address after Shutdown had
// closed the old ones, and nothing closed them.
func TestReloadRefusedWhileShuttingDown(t *testing.T) {
	a, b := redistest.Start(t), redistest.Start(t)
	p := proxytest.Start(t, a, nil)
	next := reloaded(t, p, func(c *config.Config) { c.Upstream.Address = b.Addr() })
	shutCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := p.Shutdown(shutCtx); err != nil {
		t.Fatal(err)
	}
	changed, err := p.Reload(next)
	if !errors.Is(err, proxy.ErrShuttingDown) {
		t.Fatalf("Reload after Shutdown = %v, %v; want ErrShuttingDown", changed, err)
	}
	if got := p.Config().Upstream.Address; got != a.Addr() {
		t.Errorf("upstream.address after the refused reload = %s, want %s", got, a.Addr())
	}
	info, err := b.Client(t).Info(ctx, "clients").Result()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(info, "connected_clients:1\r\n") {
		t.Errorf("the new upstream has connections other than the test's own:\n%s", info)
	}
}

// A client blocked (BLPOP 0) when a reload moves the upstream to another
// server has its connection closed, as after a failover, and blocks again
// where the pushes now go. Left on the old server, it waited for ever for
// pushes that went to the new one.
func TestReloadMovesBlockedClients(t *testing.T) {
	a, b := redistest.Start(t), redistest.Start(t)
	p := proxytest.Start(t, a, nil)
	directA, directB := a.Client(t), b.Client(t)
	blocked := dialRaw(t, p.Addr)
	blocked.send([]string{"BLPOP", "moved:q", "0"})
	redistest.Eventually(t, 5*time.Second, func() bool { return blockedClients(directA) == 1 }, "BLPOP never blocked on A")

	if _, err := p.Reload(reloaded(t, p, func(c *config.Config) { c.Upstream.Address = b.Addr() })); err != nil {
		t.Fatal(err)
	}
	if v, err := blocked.next(nil); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the client blocked on the old upstream got %#v, %v; want its connection closed", v, err)
	}
	redistest.Eventually(t, 5*time.Second, func() bool { return blockedClients(directA) == 0 }, "the BLPOP stayed blocked on A")

	again := dialRaw(t, p.Addr)
	again.send([]string{"BLPOP", "moved:q", "0"})
	redistest.Eventually(t, 5*time.Second, func() bool { return blockedClients(directB) == 1 }, "the new BLPOP never blocked on B")
	if err := directB.RPush(ctx, "moved:q", "job").Err(); err != nil {
		t.Fatal(err)
	}
	if got, _ := again.readReply(); fmt.Sprint(got) != "[moved:q job]" {
		t.Fatalf("BLPOP after the switch = %#v", got)
	}
}

// After a reload to another Redis, HELLO and INFO name the new server's
// version: it is learned from the new pools' dials (found by review:
// after a reload from a Redis 6.2.99 to a 7.0.15 they kept saying
// 6.2.99). The old server's version is set by hand here, as both servers
// of the test run the same build.
func TestReloadLearnsTheNewUpstreamsVersion(t *testing.T) {
	a, b := redistest.Start(t), redistest.Start(t)
	p := proxytest.Start(t, a, nil)
	serverInfo, err := b.Client(t).Info(ctx, "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	want := infoField(serverInfo, "redis_version")
	p.SetUpstreamVersion("6.2.99")
	if _, err := p.Reload(reloaded(t, p, func(c *config.Config) { c.Upstream.Address = b.Addr() })); err != nil {
		t.Fatal(err)
	}
	c := p.Client(t)
	redistest.Eventually(t, 10*time.Second, func() bool {
		info, _ := c.Info(ctx, "proxy").Result()
		return strings.Contains(info, "upstream_redis_version:"+want+"\r")
	}, "INFO proxy never named the new upstream's version %s (HELLO: %v)", want, lazyHello{p})
	if v := p.UpstreamVersion(); v != want {
		t.Fatalf("HELLO's version after the reload: %q, want %q", v, want)
	}
}

type lazyHello struct{ p *proxytest.Proxy }

func (l lazyHello) String() string { return l.p.UpstreamVersion() }
