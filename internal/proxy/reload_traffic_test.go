package proxy_test

// Reload while traffic flows: defects a review found (each test says what
// was found and why it matters), and stress tests that held up.

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/stampede"
)

// Found: every reload, even one that changes nothing, stored the upstream
// TLS configuration again (Server.reloadTLS's apply) under reloadMu, while
// the replica poller read it without that lock whenever it found a
// replica (replicaSet.sync -> nodeOptions -> backendOptions), as did a
// session's first replica read with its own credential
// (replicaNode.backendFor) and the route and cluster replica pollers. A
// SIGHUP landing while a replica joins was a data race (run with -race):
// undefined behaviour in the process every client goes through.
func TestReloadDoesNotRaceReplicaDiscovery(t *testing.T) {
	g := startReplicated(t, 0)
	p := g.proxy(t, config.ReadReplicaPreferred, nil)
	stop, done := make(chan struct{}), make(chan int)
	go func() {
		reloads := 0
		defer func() { done <- reloads }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			next := *p.Config()
			if _, err := p.Reload(&next); err != nil {
				t.Error(err)
				return
			}
			reloads++
			time.Sleep(100 * time.Microsecond)
		}
	}()
	// A replica joins while reloads run.
	g.replicas = append(g.replicas, redistest.Start(t, "--replicaof", "127.0.0.1", strconv.Itoa(g.primary.Port())))
	redistest.Eventually(t, 20*time.Second, func() bool { return p.UsableReplicas() == 1 }, "the proxy never found the replica")
	close(stop)
	t.Logf("%d reloads while the replica joined", <-done)
}

// Found: a reload that changed anything in [stampede] (here only
// max_waiters) built a new stampede.Protection with new miss holds, and
// kept the old ones only when [stampede] was unchanged. A read already
// held on a miss was then released by nothing but its timeout: its
// filler's write, sent through the proxy after the reload, was recorded
// in the new holds, never in the old one holding the read. With a
// one-minute hold every client waiting on a hot key stalled for the full
// minute after an unrelated reload. Now the holds are kept whenever the
// hold and early refresh rules are unchanged, and when they change the
// new rules forward writes (and closes) to the old holds until they have
// drained, so the write releases the read in every case below.
func TestHeldReadReleasedByWriteAfterStampedeReload(t *testing.T) {
	rule := stampede.HoldRule{Pattern: "h:*", Timeout: units.Duration{Duration: 8 * time.Second}}
	for _, tc := range []struct {
		name   string
		mutate func(c *config.Config)
	}{
		{"max_waiters only", func(c *config.Config) { c.Stampede.MaxWaiters = 2000 }},
		{"coalesce off", func(c *config.Config) { c.Stampede.Coalesce = false }},
		{"hold timeout changed", func(c *config.Config) {
			c.Stampede.Hold = []stampede.HoldRule{{Pattern: "h:*", Timeout: units.Duration{Duration: 5 * time.Second}}}
		}},
		{"another rule added", func(c *config.Config) {
			c.Stampede.Hold = []stampede.HoldRule{{Pattern: "other:*", Timeout: units.Duration{Duration: time.Second}}, rule}
		}},
		{"hold rules removed", func(c *config.Config) { c.Stampede.Hold = nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := proxytest.Start(t, nil, func(c *config.Config) { c.Stampede.Hold = []stampede.HoldRule{rule} })
			got := holdSecondRead(t, p, "h:k")
			if _, err := p.Reload(reloaded(t, p, tc.mutate)); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if err := p.Client(t).Set(ctx, "h:k", "filled", 0).Err(); err != nil {
				t.Fatal(err)
			}
			select {
			case v := <-got:
				if v != "filled" {
					t.Fatalf("held read got %q, want the write's value", v)
				}
			case <-time.After(3 * time.Second):
				v := <-got
				t.Fatalf("the held read was not released by the write through the proxy after the reload; it waited %v for its timeout and got %q",
					time.Since(start).Round(100*time.Millisecond), v)
			}
		})
	}
}

// Found: in cluster mode Reload refuses any change to [upstream] but
// max_pinned (the router cannot switch generations), and it counted a
// rotated [upstream.tls] file as such a change: the files are read again
// on every reload, so once a CA or client certificate was replaced in
// place (README "Rotating certificates") every later SIGHUP or POST
// /reload was refused, whatever it changed (a policy fix, max_clients),
// until a restart, with an error naming no setting the operator touched.
// Now the rest of such a reload is applied and the log warns that the
// cluster keeps its certificates until a restart; a real change of an
// upstream setting is still refused, naming the setting.
func TestClusterUpstreamTLSRotationDoesNotBlockReloads(t *testing.T) {
	certs := redistest.NewCerts(t)
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	copyFile(t, certs.CAFile, caFile)
	seed := "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t)) // the reload's decision needs no cluster
	p := proxytest.StartUnready(t, nil, func(c *config.Config) {
		c.Upstream.Mode = config.ModeCluster
		c.Upstream.Seeds = []string{seed}
		c.Upstream.TLS = &config.UpstreamTLS{CAFile: caFile}
	})
	if _, err := p.Reload(reloaded(t, p, func(c *config.Config) { c.Server.MaxClients = 500 })); err != nil {
		t.Fatalf("reload of max_clients before any rotation: %v", err)
	}
	// The CA file is replaced in place; the configuration is not touched.
	copyFile(t, certs.OtherCAFile, caFile)
	for _, n := range []int{77, 78} { // and again: the rotation does not stick as a refusal
		if _, err := p.Reload(reloaded(t, p, func(c *config.Config) { c.Server.MaxClients = n })); err != nil {
			t.Fatalf("a reload changing only server.max_clients, after the upstream CA file was rotated in place, is refused:\n%v", err)
		}
		if got := p.Config().Server.MaxClients; got != n {
			t.Errorf("server.max_clients in force = %d after the reload to %d", got, n)
		}
	}
	// A real change of an upstream setting is refused, naming it.
	_, err := p.Reload(reloaded(t, p, func(c *config.Config) { c.Upstream.Connections++ }))
	if err == nil || !strings.Contains(err.Error(), "upstream.connections") {
		t.Errorf("a change of upstream.connections in cluster mode: %v, want a refusal naming it", err)
	}
}

// Found: README says upstream.reply_timeout reloads ("drain and switch")
// and, under "Replica reads", that a replica reply_timeout late hands the
// read back to the primary. The replica set kept the reply_timeout it
// started with (makeReplicaSet copied it), and its nodes' pools kept the
// options they were built with (Server.Reload only restarted the set
// when the address moved): after lowering reply_timeout from 3s to 300ms
// by reload, a read sent to a stalled replica still waited 3s before the
// primary answered it; connections, dial_timeout and [upstream.tls] did
// not reach the replica pools either. Now the set's reply_timeout is
// atomic and a reload switches the replicas' pools (replicaSet.reconfigure).
func TestReloadedReplyTimeoutAppliesToReplicaReads(t *testing.T) {
	g := startReplicated(t, 1)
	g.primary.Client(t).Set(ctx, "k", "v", 0)
	redistest.Eventually(t, 5*time.Second, func() bool { return g.replicas[0].Client(t).Get(ctx, "k").Val() == "v" }, "the replica never got k")
	p := g.proxy(t, config.ReadReplicaPreferred, func(c *config.Config) {
		// One poll at start, and the one the reload asks for: no other.
		c.Upstream.ReplicaPollInterval = units.Duration{Duration: time.Minute}
		c.Upstream.MaxReplicaLag = units.Duration{Duration: 2 * time.Minute}
		c.Upstream.ReplyTimeout = units.Duration{Duration: 3 * time.Second}
	})
	c := p.Client(t)
	before := calls(t, g.replicas[0], "get")
	if v := c.Get(ctx, "k").Val(); v != "v" {
		t.Fatalf("GET k = %q", v)
	}
	if calls(t, g.replicas[0], "get") == before {
		t.Fatal("the read did not go to the replica: the test shows nothing")
	}
	rc := g.replicas[0].Client(t)
	received := func() int {
		n, _ := strconv.Atoi(infoField(rc.Info(ctx, "stats").Val(), "total_connections_received"))
		return n
	}
	dialled := received()
	if _, err := p.Reload(reloaded(t, p, func(c *config.Config) {
		c.Upstream.ReplyTimeout = units.Duration{Duration: 300 * time.Millisecond}
		c.Upstream.Connections++
	})); err != nil {
		t.Fatal(err)
	}
	// The replica's pools were switched when Reload returned: the proxy
	// dialled it again.
	if n := received(); n <= dialled {
		t.Errorf("the replica received no new connection from the reload (total_connections_received %d, before %d)", n, dialled)
	}
	g.replicas[0].Freeze(t)
	t.Cleanup(func() { g.replicas[0].Thaw(t) })
	start := time.Now()
	v, err := c.Get(ctx, "k").Result()
	took := time.Since(start)
	if err != nil || v != "v" {
		t.Fatalf("GET k with the replica stalled = %q, %v", v, err)
	}
	if took > 1500*time.Millisecond {
		t.Errorf("with reply_timeout reloaded to 300ms, a read on a stalled replica fell back to the primary after %v (the reply_timeout the proxy started with was 3s)", took.Round(10*time.Millisecond))
	}
}

// infoField is one "name:value" field of an INFO reply.
func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return v
		}
	}
	return ""
}

// Found: a client holding a WATCH when a reload moves upstream.address
// from A to B keeps its pinned connection to A. Its MULTI/SET/EXEC, all
// sent after the reload replied, committed on A and EXEC answered OK, yet
// every read after it (the same client's included) goes to B and does not
// see the write. With routes the same situation (the WATCH's keys moved
// to another upstream by a reload) answers a null EXEC (reroutedHeld).
// Now EXEC under a WATCH taken before an address switch is discarded on
// the old upstream and answers a null reply, as a failed WATCH does; the
// client's retry runs on B. Both protocols.
func TestWatchAcrossUpstreamSwitchFailsExec(t *testing.T) {
	for _, tc := range []struct {
		name   string
		proto  int
		routes bool // with [[route]]s, wk on the default upstream (the held-transaction path)
	}{{"resp2", 2, false}, {"resp3", 3, false}, {"routes", 2, true}} {
		proto := tc.proto
		t.Run(tc.name, func(t *testing.T) {
			a, b := redistest.Start(t), redistest.Start(t)
			a.Client(t).Set(ctx, "wk", "old-A", 0)
			b.Client(t).Set(ctx, "wk", "old-B", 0)
			p := proxytest.Start(t, a, func(c *config.Config) {
				if tc.routes {
					q := redistest.Start(t)
					c.Upstreams = map[string]config.Upstream{"queue": namedUpstream(q.Addr())}
					c.Routes = []config.Route{{Pattern: "q:*", Upstream: "queue"}}
				}
			})
			c := p.Client(t, func(o *redis.Options) { o.PoolSize = 1; o.Protocol = proto })
			tries := 0
			err := c.Watch(ctx, func(tx *redis.Tx) error {
				tries++
				_, err := tx.TxPipelined(ctx, func(pp redis.Pipeliner) error {
					pp.Set(ctx, "wk", "new", 0)
					return nil
				})
				return err
			}, "wk")
			if err != nil || tries != 1 {
				t.Fatalf("WATCH/MULTI/EXEC without a switch: %v after %d tries", err, tries)
			}
			err = c.Watch(ctx, func(tx *redis.Tx) error {
				if _, err := p.Reload(reloaded(t, p, func(c *config.Config) { c.Upstream.Address = b.Addr() })); err != nil {
					t.Fatal(err)
				}
				_, err := tx.TxPipelined(ctx, func(pp redis.Pipeliner) error {
					pp.Set(ctx, "wk", "switched", 0)
					return nil
				})
				return err
			}, "wk")
			if err != redis.TxFailedErr {
				t.Fatalf("EXEC under a WATCH taken before the switch to B = %v, want a null reply (redis.TxFailedErr)", err)
			}
			if v := a.Client(t).Get(ctx, "wk").Val(); v != "new" {
				t.Errorf("the failed EXEC changed A: wk = %q", v)
			}
			// The connection is usable, and the retry runs on B.
			if err := c.Watch(ctx, func(tx *redis.Tx) error {
				_, err := tx.TxPipelined(ctx, func(pp redis.Pipeliner) error {
					pp.Set(ctx, "wk", "retried", 0)
					return nil
				})
				return err
			}, "wk"); err != nil {
				t.Fatalf("the retry on B: %v", err)
			}
			if v := b.Client(t).Get(ctx, "wk").Val(); v != "retried" {
				t.Errorf("after the retry, B's wk = %q", v)
			}
			if v := c.Get(ctx, "wk").Val(); v != "retried" {
				t.Errorf("GET wk through the proxy after the retry = %q", v)
			}
		})
	}
}

// Stress (held up, kept as a regression test): reloads that switch the
// upstream generation (connections 2 <-> 3, same server) and change
// [stampede] run back to back while writers write their own key and then
// read it, through their own connection and through another, and readers
// keep the keys hot in the local tier and in coalesced fetches. After a
// write's OK no read may return an older value.
func TestReloadChurnReadsAfterAckedWrites(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) { eagerTier(c, 200*time.Millisecond) })
	redistest.Eventually(t, 10*time.Second, func() bool { return p.LocalTier().Live(0) }, "local tier never became live")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var bad failures
	fail := bad.add
	const writers = 2
	for g := range writers {
		own, other := p.Client(t), p.Client(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := "w:" + strconv.Itoa(g)
			for i := 1; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if err := own.Set(ctx, key, i, 0).Err(); err != nil {
					fail("SET %s %d: %v", key, i, err)
					continue
				}
				for _, c := range []*redis.Client{own, other} {
					v, err := c.Get(ctx, key).Int()
					if err != nil || v < i {
						fail("GET %s after SET %d acknowledged = %d, %v", key, i, v, err)
					}
				}
			}
		}()
	}
	for range 3 {
		c := p.Client(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				c.Get(ctx, "w:"+strconv.Itoa(n%writers))
			}
		}()
	}
	deadline := time.Now().Add(4 * time.Second)
	reloads := 0
	for n := 0; time.Now().Before(deadline); n++ {
		next := reloaded(t, p, func(c *config.Config) {
			c.Upstream.Connections = 2 + n%2
			c.Stampede.Coalesce = n%3 != 0
			c.Stampede.MaxWaiters = 100 + n%5
			if n%4 == 0 {
				c.Stampede.Hold = []stampede.HoldRule{{Pattern: "w:*", Timeout: units.Duration{Duration: time.Second}}}
			}
		})
		if _, err := p.Reload(next); err != nil {
			t.Fatal(err)
		}
		reloads++
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	t.Logf("%d reloads; tier hits %v", reloads, metricSum(t, p, "redproxy_localcache_hits_total"))
	if n, first := bad.result(); n > 0 {
		t.Fatalf("%d stale or failed reads after acknowledged writes; first: %s", n, first)
	}
}

// Stress (held up, kept as a regression test): the policy switches between
// enforce and report (as POST /policy/reload does) while clients pipeline
// writes that enforce gives a hidden TTL fix-up (HSET of h:*), alone and
// inside MULTI, and SETs it rewrites. Every client must get exactly its
// own replies: no fix-up result leaking into an EXEC reply or a pipeline,
// no reply missing.
func TestPolicyReloadModeChurnKeepsRepliesInShape(t *testing.T) {
	ttl := []policy.TTLRule{
		{Pattern: "h:*", Required: true, Default: policy.Duration{Duration: time.Hour}},
		{Pattern: "s:*", Required: true, Default: policy.Duration{Duration: time.Hour}},
	}
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Policy.TTL = ttl })
	g := p.Guard()
	var mode atomic.Int64
	g.SetSource(func() (policy.Config, error) {
		m := "enforce"
		if mode.Add(1)%2 == 0 {
			m = "report"
		}
		return policy.Config{Mode: m, TTL: ttl}, nil
	})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var ops atomic.Int64
	var bad failures
	fail := bad.add
	for w := range 4 {
		c := p.Client(t, func(o *redis.Options) { o.PoolSize = 1 })
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				hk, sk, ek := fmt.Sprintf("h:%d:%d", w, n%50), fmt.Sprintf("s:%d:%d", w, n%50), fmt.Sprintf("e:%d:%d", w, n)
				var cmds []redis.Cmder
				var err error
				if n%2 == 0 {
					cmds, err = c.TxPipelined(ctx, func(pp redis.Pipeliner) error {
						pp.HSet(ctx, hk, "f", n)
						pp.Set(ctx, sk, n, 0)
						pp.Echo(ctx, ek)
						return nil
					})
				} else {
					cmds, err = c.Pipelined(ctx, func(pp redis.Pipeliner) error {
						pp.HSet(ctx, hk, "f", n)
						pp.Set(ctx, sk, n, 0)
						pp.Echo(ctx, ek)
						return nil
					})
				}
				if err != nil {
					fail("client %d op %d: %v", w, n, err)
					continue
				}
				if len(cmds) != 3 {
					fail("client %d op %d: %d replies", w, n, len(cmds))
					continue
				}
				if v := cmds[2].(*redis.StringCmd).Val(); v != ek {
					fail("client %d op %d: ECHO = %q, want %q", w, n, v, ek)
				}
				if v := cmds[1].(*redis.StatusCmd).Val(); v != "OK" {
					fail("client %d op %d: SET = %q", w, n, v)
				}
				if v, err := cmds[0].(*redis.IntCmd).Result(); err != nil || v < 0 || v > 1 {
					fail("client %d op %d: HSET = %d, %v", w, n, v, err)
				}
				ops.Add(1)
			}
		}()
	}
	deadline := time.Now().Add(3 * time.Second)
	reloads := 0
	for time.Now().Before(deadline) {
		if err := g.Reload(); err != nil {
			t.Fatal(err)
		}
		reloads++
		time.Sleep(2 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	t.Logf("%d policy reloads, %d operations", reloads, ops.Load())
	if n, first := bad.result(); n > 0 {
		t.Fatalf("%d bad replies; first: %s", n, first)
	}
}

// Stress (held up, kept as a regression test): [[route]] reloads move x:*
// between the default upstream and "queue" (where q:* always goes) while
// clients run MULTI SET q:.. SET x:.. EXEC, held by the proxy until EXEC.
// A transaction that EXEC answers with results must have run whole on one
// upstream; one refused (EXECABORT, CROSSROUTE) must have run nowhere.
func TestRouteReloadChurnKeepsTransactionsWhole(t *testing.T) {
	def, q := redistest.Start(t), redistest.Start(t)
	same := []config.Route{{Pattern: "q:*", Upstream: "queue"}, {Pattern: "x:*", Upstream: "queue"}}
	split := []config.Route{{Pattern: "q:*", Upstream: "queue"}}
	p := proxytest.Start(t, def, func(c *config.Config) {
		c.Upstreams = map[string]config.Upstream{"queue": namedUpstream(q.Addr())}
		c.Routes = same
		c.LocalCache.Enabled = true
		c.LocalCache.AdmitMinReads = 0
	})
	dDef, dQ := def.Client(t), q.Client(t)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var ok, refused atomic.Int64
	var bad failures
	fail := bad.add
	for w := range 3 {
		c := p.Client(t, func(o *redis.Options) { o.PoolSize = 1 })
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				qk, xk := fmt.Sprintf("q:%d:%d", w, n), fmt.Sprintf("x:%d:%d", w, n)
				_, err := c.TxPipelined(ctx, func(pp redis.Pipeliner) error {
					pp.Set(ctx, qk, n, 0)
					pp.Set(ctx, xk, n, 0)
					return nil
				})
				onDef := dDef.Exists(ctx, qk, xk).Val()
				onQ := dQ.Exists(ctx, qk, xk).Val()
				switch {
				case err == nil && !(onDef == 0 && onQ == 2 || onDef == 2 && onQ == 0):
					fail("client %d tx %d: EXEC OK, but %d of its keys on default and %d on queue", w, n, onDef, onQ)
				case err == nil:
					ok.Add(1)
				case onDef+onQ != 0:
					fail("client %d tx %d: EXEC failed (%v), yet %d of its keys on default and %d on queue", w, n, err, onDef, onQ)
				default:
					refused.Add(1)
				}
				// The same client reads its keys back where they route now.
				if err == nil {
					if v, gerr := c.Get(ctx, qk).Int(); gerr != nil || v != n {
						fail("client %d tx %d: GET %s after EXEC = %d, %v", w, n, qk, v, gerr)
					}
				}
			}
		}()
	}
	deadline := time.Now().Add(3 * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		rules := same
		if i%2 == 1 {
			rules = split
		}
		if _, err := p.Reload(reloaded(t, p, func(c *config.Config) { c.Routes = rules })); err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	t.Logf("%d transactions committed, %d refused", ok.Load(), refused.Load())
	if n, first := bad.result(); n > 0 {
		t.Fatalf("%d bad transactions; first: %s", n, first)
	}
}

// failures counts what the churn tests' clients saw go wrong, keeping the
// first for the report.
type failures struct {
	n     atomic.Int64
	first atomic.Value
}

func (f *failures) add(format string, args ...any) {
	if f.n.Add(1) == 1 {
		f.first.Store(fmt.Sprintf(format, args...))
	}
}

func (f *failures) result() (int64, any) { return f.n.Load(), f.first.Load() }
