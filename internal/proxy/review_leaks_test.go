package proxy_test

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/stampede"
)

// lkState is what a long-running proxy could accumulate, measured in
// the test process (the proxy runs in it) and on Redis.
type lkState struct {
	goroutines   int
	fds          int
	heapInuse    uint64
	redisClients int
	clients      float64 // redproxy_client_connections
	parked       float64 // redproxy_client_connections_parked
	dedicated    float64 // redproxy_upstream_dedicated_connections
}

func (s lkState) String() string {
	return fmt.Sprintf("goroutines=%d fds=%d heap_inuse=%.1fMB redis_clients=%d clients=%v parked=%v dedicated=%v",
		s.goroutines, s.fds, float64(s.heapInuse)/1e6, s.redisClients, s.clients, s.parked, s.dedicated)
}

func lkGauge(t testing.TB, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetGauge().GetValue()
		}
	}
	return sum
}

func lkFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(ents)
}

func lkRedisClients(t testing.TB, rc *redis.Client) int {
	t.Helper()
	all, _ := clientCount(t, rc)
	return all
}

func lkMeasure(t testing.TB, p *proxytest.Proxy, rc *redis.Client, withHeap bool) lkState {
	t.Helper()
	s := lkState{
		goroutines:   runtime.NumGoroutine(),
		fds:          lkFDs(t),
		redisClients: lkRedisClients(t, rc),
		clients:      lkGauge(t, p.Metrics.Registry, "redproxy_client_connections"),
		parked:       lkGauge(t, p.Metrics.Registry, "redproxy_client_connections_parked"),
		dedicated:    lkGauge(t, p.Metrics.Registry, "redproxy_upstream_dedicated_connections"),
	}
	if withHeap {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		s.heapInuse = ms.HeapInuse
	}
	return s
}

// settled polls, for up to 10 s, until the state is back within tol of
// base (goroutines, fds, Redis clients within tol; gauges equal), and
// returns the last state seen.
func lkSettled(t testing.TB, p *proxytest.Proxy, rc *redis.Client, base lkState, tol int) lkState {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s := lkMeasure(t, p, rc, false)
		ok := s.goroutines <= base.goroutines+tol && s.fds <= base.fds+tol && s.redisClients <= base.redisClients+tol &&
			s.clients <= base.clients && s.parked <= base.parked && s.dedicated <= base.dedicated
		if ok || time.Now().After(deadline) {
			return lkMeasure(t, p, rc, true)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// lkBaseline waits until no client is left and the goroutine count has
// held still for a while, then measures.
func lkBaseline(t testing.TB, p *proxytest.Proxy, rc *redis.Client) lkState {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	prev, same := -1, 0
	for time.Now().Before(deadline) {
		s := lkMeasure(t, p, rc, false)
		if s.clients == 0 && s.dedicated == 0 && s.goroutines == prev {
			if same++; same >= 10 {
				break
			}
		} else {
			same = 0
		}
		prev = s.goroutines
		time.Sleep(20 * time.Millisecond)
	}
	return lkMeasure(t, p, rc, true)
}

// resp encodes a command.
func lkCmd(args ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	return b.String()
}

// lkConn is a raw client connection with a reader of whole replies.
type lkConn struct {
	net.Conn
	r *bufio.Reader
}

// lkAuth, when set, is the AUTH every connection lkDial opens sends first.
var lkAuth string

func lkDial(t testing.TB, addr string) *lkConn {
	t.Helper()
	// Generous: a dial only times out here when the machine is starved
	// (CI's two -race halves and a compile beside them: one timed out at
	// 2 s), and the checks are about what is left behind, not speed.
	nc, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c := &lkConn{Conn: nc, r: bufio.NewReader(nc)}
	if lkAuth != "" {
		c.send(t, lkAuth)
		if r := c.reply(t); r != "+OK" {
			t.Errorf("AUTH: %s", r)
		}
	}
	return c
}

func (c *lkConn) send(t testing.TB, cmds ...string) {
	t.Helper()
	c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(strings.Join(cmds, ""))); err != nil {
		t.Fatal(err)
	}
}

// reply reads one whole reply and returns its first line.
func (c *lkConn) reply(t testing.TB) string {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	first, err := lkReadReply(c.r)
	if err != nil {
		t.Fatal(err)
	}
	return first
}

func lkReadReply(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", fmt.Errorf("empty line")
	}
	n := 0
	switch line[0] {
	case '$', '=', '!':
		fmt.Sscan(line[1:], &n)
		if n >= 0 {
			if _, err := r.Discard(n + 2); err != nil {
				return "", err
			}
		}
	case '*', '>', '~':
		fmt.Sscan(line[1:], &n)
		for range max(n, 0) {
			if _, err := lkReadReply(r); err != nil {
				return "", err
			}
		}
	case '%', '|':
		fmt.Sscan(line[1:], &n)
		for range 2 * n {
			if _, err := lkReadReply(r); err != nil {
				return "", err
			}
		}
	}
	return line, nil
}

// parallel runs f(i) for i in [0, n) on w workers.
func lkParallel(n, w int, f func(i int)) {
	var wg sync.WaitGroup
	ch := make(chan int)
	for range w {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range ch {
				f(i)
			}
		}()
	}
	for i := range n {
		ch <- i
	}
	close(ch)
	wg.Wait()
}

// lkBlockedOnRedis waits until Redis has n blocked clients.
func lkBlockedOnRedis(t testing.TB, rc *redis.Client, n int) {
	t.Helper()
	redistest.Eventually(t, 10*time.Second, func() bool {
		info, err := rc.Info(ctx, "clients").Result()
		if err != nil {
			return false
		}
		for _, l := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(l, "blocked_clients:"); ok {
				var k int
				fmt.Sscan(v, &k)
				return k >= n
			}
		}
		return false
	}, "redis never had %d blocked clients", n)
}

type lkDeparture struct {
	name string
	n    int
	run  func(t *testing.T, p *proxytest.Proxy, rc *redis.Client, n int)
}

// lkOneByOne makes each of n departures run f on its own connection.
func lkOneByOne(f func(t *testing.T, c *lkConn, i int)) func(t *testing.T, p *proxytest.Proxy, rc *redis.Client, n int) {
	return func(t *testing.T, p *proxytest.Proxy, rc *redis.Client, n int) {
		lkParallel(n, 8, func(i int) {
			c := lkDial(t, p.Addr)
			defer c.Close()
			f(t, c, i)
		})
	}
}

// lkBlockedBatch opens batch connections, sends each cmd (after setup, whose
// replies are read), waits until Redis blocks them all, then closes them.
func lkBlockedBatch(batch int, setup []string, cmd string) func(t *testing.T, p *proxytest.Proxy, rc *redis.Client, n int) {
	return func(t *testing.T, p *proxytest.Proxy, rc *redis.Client, n int) {
		for done := 0; done < n; done += batch {
			conns := make([]*lkConn, batch)
			lkParallel(batch, 8, func(i int) {
				c := lkDial(t, p.Addr)
				for _, s := range setup {
					c.send(t, s)
					c.reply(t)
				}
				c.send(t, cmd)
				conns[i] = c
			})
			lkBlockedOnRedis(t, rc, batch)
			for _, c := range conns {
				c.Close()
			}
			redistest.Eventually(t, 10*time.Second, func() bool {
				info, _ := rc.Info(ctx, "clients").Result()
				return strings.Contains(info, "blocked_clients:0\r")
			}, "blocked clients never unblocked")
		}
	}
}

func lkSubscribeThenClose(hello bool, cmd ...string) func(t *testing.T, c *lkConn, i int) {
	return func(t *testing.T, c *lkConn, i int) {
		if hello {
			c.send(t, lkCmd("HELLO", "3"))
			c.reply(t)
		}
		c.send(t, lkCmd(cmd...))
		c.reply(t)
	}
}

func lkCounter(t testing.TB, p *proxytest.Proxy, name string) float64 {
	t.Helper()
	v, _, err := metrics.CounterSum(p.Metrics.Registry, name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// lkHeld runs n miss-hold departures in batches: a filler per key gets the
// nil, a second client's GET of the key is held; then, if heldLeaves, the
// held clients close first (the fillers write and close); otherwise the
// fillers close without writing and the held clients read their answer
// and close.
func lkHeld(batch int, heldLeaves bool) func(t *testing.T, p *proxytest.Proxy, rc *redis.Client, n int) {
	return func(t *testing.T, p *proxytest.Proxy, rc *redis.Client, n int) {
		for done := 0; done < n; done += batch {
			fillers, held := make([]*lkConn, batch), make([]*lkConn, batch)
			round := lkRound.Add(1)
			key := func(i int) string { return fmt.Sprintf("hold:%d:%d", round, i) }
			before := lkCounter(t, p, "redproxy_stampede_held_reads_total")
			lkParallel(batch, 8, func(i int) {
				fillers[i] = lkDial(t, p.Addr)
				fillers[i].send(t, lkCmd("GET", key(i)))
				if r := fillers[i].reply(t); r != "$-1" {
					t.Errorf("filler's GET: %s", r)
				}
				held[i] = lkDial(t, p.Addr)
				held[i].send(t, lkCmd("GET", key(i)))
			})
			redistest.Eventually(t, 10*time.Second, func() bool {
				return lkCounter(t, p, "redproxy_stampede_held_reads_total")-before >= float64(batch)
			}, "reads never held")
			if heldLeaves {
				for _, c := range held {
					c.Close()
				}
				lkParallel(batch, 8, func(i int) {
					fillers[i].send(t, lkCmd("SET", key(i), "v", "EX", "60"))
					fillers[i].reply(t)
					fillers[i].Close()
				})
			} else {
				for _, c := range fillers {
					c.Close()
				}
				lkParallel(batch, 8, func(i int) {
					held[i].reply(t)
					held[i].Close()
				})
			}
		}
	}
}

// lkKilled: each victim (in the state setup puts it in) is killed with
// CLIENT KILL ID from another client.
func lkKilled(setup ...string) func(t *testing.T, p *proxytest.Proxy, rc *redis.Client, n int) {
	return func(t *testing.T, p *proxytest.Proxy, rc *redis.Client, n int) {
		lkParallel(n, 8, func(i int) {
			v := lkDial(t, p.Addr)
			defer v.Close()
			v.send(t, lkCmd("CLIENT", "ID"))
			id := strings.TrimPrefix(v.reply(t), ":")
			for j, s := range setup {
				v.send(t, s)
				if j < len(setup)-1 || !strings.Contains(s, "BLPOP") {
					v.reply(t)
				}
			}
			k := lkDial(t, p.Addr)
			defer k.Close()
			k.send(t, lkCmd("CLIENT", "KILL", "ID", id))
			if r := k.reply(t); r != ":1" {
				t.Errorf("CLIENT KILL ID %s: %s", id, r)
			}
			v.SetReadDeadline(time.Now().Add(5 * time.Second))
			for {
				if _, err := lkReadReply(v.r); err != nil {
					break
				}
			}
		})
	}
}

var lkRound atomic.Int64

// lkUserPlaces checks that n connections can authenticate at once.
func lkUserPlaces(t *testing.T, p *proxytest.Proxy, n int) {
	t.Helper()
	conns := make([]*lkConn, n)
	lkParallel(n, 8, func(i int) { conns[i] = lkDial(t, p.Addr) })
	for _, c := range conns {
		c.Close()
	}
	redistest.Eventually(t, 10*time.Second, func() bool {
		return lkGauge(t, p.Metrics.Registry, "redproxy_client_connections") == 0
	}, "clients never left")
}

// lkIdleClosed: n clients, in batches, put in a state by setup, are closed
// by the proxy's idle timeout; each waits for EOF and closes.
func lkIdleClosed(setup ...string) func(t *testing.T, p *proxytest.Proxy, rc *redis.Client, n int) {
	return func(t *testing.T, p *proxytest.Proxy, rc *redis.Client, n int) {
		lkParallel(n, 100, func(i int) {
			c := lkDial(t, p.Addr)
			defer c.Close()
			for _, s := range setup {
				c.send(t, s)
				c.reply(t)
			}
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			for {
				if _, err := lkReadReply(c.r); err != nil {
					if ne, ok := err.(net.Error); ok && ne.Timeout() {
						t.Errorf("idle client never closed")
					}
					return
				}
			}
		})
	}
}

// lkParked: batches of clients, after setup, wait until parked, then close
// (or, if resume, send a PING first and read it, then close).
func lkParked(batch int, resume bool, setup ...string) func(t *testing.T, p *proxytest.Proxy, rc *redis.Client, n int) {
	return func(t *testing.T, p *proxytest.Proxy, rc *redis.Client, n int) {
		for done := 0; done < n; done += batch {
			conns := make([]*lkConn, batch)
			redistest.Eventually(t, 10*time.Second, func() bool {
				return lkGauge(t, p.Metrics.Registry, "redproxy_client_connections_parked") == 0
			}, "closed parked clients never left the parker: %d", p.ParkedClients())
			base := 0.0
			lkParallel(batch, 8, func(i int) {
				c := lkDial(t, p.Addr)
				for _, s := range setup {
					c.send(t, s)
					c.reply(t)
				}
				conns[i] = c
			})
			redistest.Eventually(t, 10*time.Second, func() bool {
				return lkGauge(t, p.Metrics.Registry, "redproxy_client_connections_parked")-base >= float64(batch)
			}, "clients never parked: gauge %v, ParkedClients %d", lkGauge(t, p.Metrics.Registry, "redproxy_client_connections_parked"), p.ParkedClients())
			lkParallel(batch, 8, func(i int) {
				c := conns[i]
				if resume {
					c.send(t, lkCmd("PING"))
					c.reply(t)
				}
				c.Close()
			})
		}
	}
}

// lkChurn keeps clients working (a go-redis pool doing SET/GET, pipelines,
// subscribers, blocked pops and MULTI on fresh connections) while Redis is
// killed and restarted on its port `restarts` times.
func lkChurn(t *testing.T, p *proxytest.Proxy, restarts int) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	worker := func(f func(c *redis.Client, i int)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := redis.NewClient(&redis.Options{Addr: p.Addr, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: 2 * time.Second, PoolSize: 4})
			defer c.Close()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				f(c, i)
			}
		}()
	}
	for range 2 {
		worker(func(c *redis.Client, i int) {
			c.Set(ctx, fmt.Sprint("k", i%100), "v", 0)
			c.Get(ctx, fmt.Sprint("k", i%100))
		})
	}
	worker(func(c *redis.Client, i int) {
		pipe := c.Pipeline()
		for j := range 20 {
			pipe.Get(ctx, fmt.Sprint("k", j))
		}
		pipe.Exec(ctx)
	})
	worker(func(c *redis.Client, i int) {
		sub := c.Subscribe(ctx, "ch")
		sub.Receive(ctx)
		time.Sleep(5 * time.Millisecond)
		sub.Close()
	})
	worker(func(c *redis.Client, i int) {
		c.BLPop(ctx, 20*time.Millisecond, "nolist")
	})
	worker(func(c *redis.Client, i int) {
		c.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
			pipe.Incr(ctx, "counter")
			return nil
		})
	})
	for range restarts {
		time.Sleep(200 * time.Millisecond) // let the clients work
		p.Redis.Kill(t)
		p.Redis.Restart(t)
		redistest.Eventually(t, 10*time.Second, p.Ready, "proxy never reconnected")
	}
	time.Sleep(200 * time.Millisecond)
	close(stop)
	wg.Wait()
}

// lkProxy starts the proxy the departure checks share: a user "app" whose
// max_connections is maxConns (every connection lkDial opens logs in as
// it, so a session that never gives its place back shows), the local tier
// on (its tracking connection and invalidation relay), and a miss hold on
// hold:*.
func lkProxy(t *testing.T, maxConns int, mutate func(*config.Config)) (*proxytest.Proxy, *redis.Client) {
	t.Helper()
	p := proxytest.Start(t, nil, func(c *config.Config) {
		c.Upstream.MaxPinned = 1000
		u := user("app", appPass, "+@all ~*")
		u.MaxConnections = maxConns
		c.Users = []auth.UserConfig{u}
		c.LocalCache.Enabled = true
		c.Stampede.Hold = []stampede.HoldRule{{Pattern: "hold:*", Timeout: units.Duration{Duration: 5 * time.Second}}}
		if mutate != nil {
			mutate(c)
		}
	})
	lkAuth = lkCmd("AUTH", "app", appPass)
	t.Cleanup(func() { lkAuth = "" })
	return p, p.Redis.Client(t)
}

// lkTolerance is how far goroutines, descriptors and Redis's clients may
// be above the baseline after settling: far below one per departure.
const lkTolerance = 8

// lkCheck runs each departure kind d.n times after a warm-up (a tenth of
// that, 1 to 20), and
// fails when, after settling, what the proxy holds has grown: goroutines,
// open descriptors (client and upstream sockets), Redis's client list,
// the proxy's client, parked and dedicated-connection gauges.
func lkCheck(t *testing.T, p *proxytest.Proxy, rc *redis.Client, deps []lkDeparture) {
	t.Helper()
	for _, d := range deps {
		d.run(t, p, rc, max(1, min(20, d.n/10))) // warm-up: pools, buffers, the tier's relay
		if t.Failed() {
			t.FailNow()
		}
		base := lkBaseline(t, p, rc)
		d.run(t, p, rc, d.n)
		after := lkSettled(t, p, rc, base, lkTolerance)
		if after.goroutines > base.goroutines+lkTolerance || after.fds > base.fds+lkTolerance ||
			after.redisClients > base.redisClients+lkTolerance || after.clients > 0 || after.parked > 0 || after.dedicated > 0 {
			var b strings.Builder
			pprof.Lookup("goroutine").WriteTo(&b, 1)
			t.Errorf("%s: after %d departures and settling\n  before %v\n  after  %v\n%s", d.name, d.n, base, after, b.String())
		}
	}
}

// TestReviewLeaksClientDepartures: clients of the shared connections
// that leave (QUIT, a pipeline's replies unread, inside MULTI, after
// WATCH, in the middle of a 10 MB reply) leave nothing behind: no
// goroutine, descriptor, Redis connection, dedicated connection or
// max_connections place.
func TestReviewLeaksClientDepartures(t *testing.T) {
	const maxConns = 100
	p, rc := lkProxy(t, maxConns, nil)
	rc.Set(ctx, "mid", strings.Repeat("m", 4096), 0)
	rc.Set(ctx, "big", strings.Repeat("b", 10<<20), 0)
	const n = 100
	lkCheck(t, p, rc, []lkDeparture{
		{"quit", n, lkOneByOne(func(t *testing.T, c *lkConn, i int) {
			c.send(t, lkCmd("SET", "k", "v"), lkCmd("QUIT"))
			c.reply(t)
			c.reply(t)
		})},
		{"pipeline-unread", n, lkOneByOne(func(t *testing.T, c *lkConn, i int) {
			c.send(t, strings.Repeat(lkCmd("GET", "mid"), 50))
		})},
		{"multi", n, lkOneByOne(func(t *testing.T, c *lkConn, i int) {
			c.send(t, lkCmd("MULTI"), lkCmd("SET", "m", "1"))
			c.reply(t)
			c.reply(t)
		})},
		{"watch", n, lkOneByOne(lkSubscribeThenClose(false, "WATCH", "w"))},
		{"big-reply-unread", 10, lkOneByOne(func(t *testing.T, c *lkConn, i int) {
			c.send(t, lkCmd("GET", "big"))
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			c.r.Peek(1) // the reply has started
		})},
	})
	lkUserPlaces(t, p, maxConns)
}

// TestReviewLeaksBlockedAndKilled: clients closed while Redis blocks them
// (BLPOP 0, XREAD BLOCK 0, WAIT), and clients CLIENT KILLed by another
// client while idle, blocked, subscribed, inside MULTI or tracking, give
// back their dedicated connections (Redis unblocks and drops them) and
// everything else.
func TestReviewLeaksBlockedAndKilled(t *testing.T) {
	// A killed client blocked in BLPOP gives its place back when its
	// session notices it has left, at the blocking wait's next 50 ms
	// tick: kill-blpop's 150 kills, 8 at a time, left 76-98 places
	// still taken at its end, and under load more than the 120 the test
	// had, so AUTH was refused mid-run (seen in CI-like runs, at 1187ac0
	// too). With 400 places, lkUserPlaces still finds a single place that
	// is never given back.
	const maxConns = 400
	p, rc := lkProxy(t, maxConns, nil)
	const n = 150
	lkCheck(t, p, rc, []lkDeparture{
		{"blpop", n, lkBlockedBatch(50, nil, lkCmd("BLPOP", "nolist", "0"))},
		{"xread", n, lkBlockedBatch(50, nil, lkCmd("XREAD", "BLOCK", "0", "STREAMS", "nostream", "$"))},
		{"wait", n, lkBlockedBatch(50, nil, lkCmd("WAIT", "1", "0"))},
		{"kill-idle", n, lkKilled()},
		{"kill-blpop", n, lkKilled(lkCmd("BLPOP", "nolist", "0"))},
		{"kill-subscribed", n, lkKilled(lkCmd("SUBSCRIBE", "ch"))},
		{"kill-multi", n, lkKilled(lkCmd("MULTI"))},
		{"kill-tracking", n, lkKilled(lkCmd("CLIENT", "TRACKING", "ON"))},
	})
	lkUserPlaces(t, p, maxConns)
}

// TestReviewLeaksRelayAndHoldDepartures: held GETs whose clients leave,
// and fillers that leave without writing, end their holds at once (the
// held reads are answered well within the hold's 5 s timeout, no hold
// ends by timeout); and relayed clients that leave (subscribed on RESP2
// and RESP3, SUBSCRIBE, SSUBSCRIBE, PSUBSCRIBE, in MONITOR, with tracking
// on) give back their dedicated connection; nothing is left behind.
func TestReviewLeaksRelayAndHoldDepartures(t *testing.T) {
	const maxConns = 120
	p, rc := lkProxy(t, maxConns, nil)
	timeouts := lkCounter(t, p, "redproxy_stampede_hold_timeouts_total")
	// Whether a held read waited for the hold's timeout is the timeout
	// counter's to say (checked below), not the wall clock's: the two
	// rounds' settling alone can take seconds on a loaded machine.
	lkCheck(t, p, rc, []lkDeparture{
		{"held-client-leaves", 200, lkHeld(50, true)},
		{"filler-leaves", 200, lkHeld(50, false)},
	})
	const n = 100
	lkCheck(t, p, rc, []lkDeparture{
		{"subscribe-resp2", n, lkOneByOne(lkSubscribeThenClose(false, "SUBSCRIBE", "ch"))},
		{"ssubscribe-resp2", n, lkOneByOne(lkSubscribeThenClose(false, "SSUBSCRIBE", "sch"))},
		{"subscribe-resp3", n, lkOneByOne(lkSubscribeThenClose(true, "SUBSCRIBE", "ch"))},
		{"psubscribe-resp3", n, lkOneByOne(lkSubscribeThenClose(true, "PSUBSCRIBE", "ch*"))},
		{"monitor", n, lkOneByOne(lkSubscribeThenClose(false, "MONITOR"))},
		{"tracking-resp3", n, lkOneByOne(lkSubscribeThenClose(true, "CLIENT", "TRACKING", "ON"))},
	})
	if got := lkCounter(t, p, "redproxy_stampede_hold_timeouts_total") - timeouts; got != 0 {
		t.Errorf("%v holds ended by their timeout, not by their filler's departure", got)
	}
	lkUserPlaces(t, p, maxConns)
}

// TestReviewLeaksIdleAndParked: clients closed by the idle timeout (plain,
// parked, after WATCH with a dedicated connection, with tracking on), and
// parked clients that close (or come back and then close), leave nothing
// behind.
func TestReviewLeaksIdleAndParked(t *testing.T) {
	const maxConns = 120
	p, rc := lkProxy(t, maxConns, func(c *config.Config) {
		c.Server.IdleTimeout = units.Duration{Duration: 500 * time.Millisecond}
		c.Server.IdleParkAfter = units.Duration{Duration: 50 * time.Millisecond}
	})
	lkCheck(t, p, rc, []lkDeparture{
		{"idle-timeout-parked", 100, lkIdleClosed(lkCmd("PING"))},
		{"idle-timeout-watch", 100, lkIdleClosed(lkCmd("WATCH", "w"))},
		{"idle-timeout-tracking", 100, lkIdleClosed(lkCmd("CLIENT", "TRACKING", "ON"))},
	})
	lkUserPlaces(t, p, maxConns)
	// Without an idle timeout, so that every client of a batch is parked
	// at once before the batch leaves.
	p, rc = lkProxy(t, maxConns, func(c *config.Config) {
		c.Server.IdleParkAfter = units.Duration{Duration: 50 * time.Millisecond}
	})
	lkCheck(t, p, rc, []lkDeparture{
		{"parked-close", 100, lkParked(100, false, lkCmd("PING"))},
		{"parked-resume-close", 100, lkParked(100, true, lkCmd("SET", "k", "v"))},
	})
	lkUserPlaces(t, p, maxConns)
}

// TestReviewLeaksRedisRestarts: Redis killed (SIGKILL) and restarted on
// its port three times while clients keep working (commands, pipelines,
// subscribers, blocked pops, transactions): once the clients are gone the
// proxy holds no more goroutines, descriptors or Redis connections than
// before, and no dedicated connection.
func TestReviewLeaksRedisRestarts(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) {
		c.Upstream.MaxPinned = 1000
		c.LocalCache.Enabled = true
	})
	rc := p.Redis.Client(t)
	lkChurn(t, p, 1)
	base := lkBaseline(t, p, rc)
	lkChurn(t, p, 3)
	after := lkSettled(t, p, rc, base, lkTolerance)
	if after.goroutines > base.goroutines+lkTolerance || after.fds > base.fds+lkTolerance ||
		after.redisClients > base.redisClients+lkTolerance || after.clients > 0 || after.dedicated > 0 {
		var b strings.Builder
		pprof.Lookup("goroutine").WriteTo(&b, 1)
		t.Errorf("after 3 Redis restarts\n  before %v\n  after  %v\n%s", base, after, b.String())
	}
}
