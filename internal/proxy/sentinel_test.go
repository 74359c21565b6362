package proxy_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/admin"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// sentinelConfig turns c into upstream.mode = "sentinel" for g.
func sentinelConfig(g *redistest.SentinelGroup, sentinels []string) func(*config.Config) {
	return func(c *config.Config) {
		c.Upstream.Mode = config.ModeSentinel
		c.Upstream.Sentinels = sentinels
		c.Upstream.MasterName = g.Name
		c.Upstream.DialTimeout = units.Duration{Duration: 500 * time.Millisecond}
	}
}

// failoverLoad is clients working through the proxy while the primary
// changes. Each client writes keys of its own, one new key per write, and
// checks every reply it gets: an ECHO must return the token just sent, a
// SET must say OK, a GET of the key just written must return this
// client's value (or nothing, if Redis lost the write in the failover).
// Any reply meant for another client fails one of these checks.
type failoverLoad struct {
	t       *testing.T
	stop    chan struct{}
	wg      sync.WaitGroup
	clients int

	mu       sync.Mutex
	acked    []string       // keys whose SET was acknowledged, with value = key
	errs     map[string]int // error replies by text
	wrong    []string       // replies that were not this client's
	lastOK   []time.Time    // per client, the start of its last successful round
	lastErr  []time.Time    // per client, when its last error came
	firstErr time.Time      // the first error of the run
	ops      atomic.Int64   // rounds done
}

func startFailoverLoad(t *testing.T, p *proxytest.Proxy, clients int) *failoverLoad {
	l := &failoverLoad{t: t, stop: make(chan struct{}), clients: clients, errs: map[string]int{},
		lastOK: make([]time.Time, clients), lastErr: make([]time.Time, clients)}
	for i := range clients {
		c := p.Client(t, func(o *redis.Options) {
			o.PoolSize = 1
			o.ReadTimeout = 5 * time.Second
		})
		l.wg.Add(1)
		go l.run(i, c)
	}
	redistest.Eventually(t, 10*time.Second, func() bool { return l.ops.Load() >= int64(20*clients) }, "load never got going")
	return l
}

func (l *failoverLoad) run(id int, c *redis.Client) {
	defer l.wg.Done()
	for seq := 0; ; seq++ {
		select {
		case <-l.stop:
			return
		default:
		}
		start := time.Now()
		key := fmt.Sprintf("fo:%d:%d", id, seq)
		err := l.round(c, key)
		l.ops.Add(1)
		l.mu.Lock()
		if err == nil {
			l.lastOK[id] = start
		} else {
			if l.firstErr.IsZero() {
				l.firstErr = time.Now()
			}
			l.lastErr[id] = time.Now()
			var w wrongReply
			if errors.As(err, &w) {
				l.wrong = append(l.wrong, fmt.Sprintf("client %d: %v", id, err))
			} else {
				l.errs[errText(err)]++
			}
		}
		l.mu.Unlock()
		if err != nil {
			// A client backs off a little on errors, as real ones do; this
			// also keeps the error count meaningful.
			time.Sleep(10 * time.Millisecond)
		}
	}
}

type wrongReply struct{ msg string }

func (w wrongReply) Error() string { return w.msg }

// round is one client's checked exchange. A SET whose reply was an error
// is not counted as acknowledged even if Redis applied it.
func (l *failoverLoad) round(c *redis.Client, key string) error {
	token := "echo-" + key
	got, err := c.Echo(ctx, token).Result()
	if err != nil {
		return err
	}
	if got != token {
		return wrongReply{fmt.Sprintf("ECHO %s = %q", token, got)}
	}
	ok, err := c.Set(ctx, key, key, 0).Result()
	if err != nil {
		return err
	}
	if ok != "OK" {
		return wrongReply{fmt.Sprintf("SET %s = %q", key, ok)}
	}
	l.mu.Lock()
	l.acked = append(l.acked, key)
	l.mu.Unlock()
	v, err := c.Get(ctx, key).Result()
	if err == redis.Nil {
		return nil // lost by Redis in the failover; checked at the end
	}
	if err != nil {
		return err
	}
	if v != key {
		return wrongReply{fmt.Sprintf("GET %s = %q", key, v)}
	}
	return nil
}

func errText(err error) string {
	s := err.Error()
	if i := strings.Index(s, " (was "); i > 0 { // keep error kinds, not addresses
		s = s[:i]
	}
	return s
}

// recoveredAfter reports whether every client has completed a round that
// it started after since.
func (l *failoverLoad) recoveredAfter(since time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ok := range l.lastOK {
		if !ok.After(since) {
			return false
		}
	}
	return true
}

// end stops the clients and checks what they saw: no reply meant for
// another client, and every acknowledged write that Redis kept (on the new
// primary, read directly) reads the same through the proxy. It returns
// the writes Redis lost, for the report.
func (l *failoverLoad) end(p *proxytest.Proxy, primary *redistest.Server) (lost int) {
	t := l.t
	close(l.stop)
	l.wg.Wait()
	if len(l.wrong) > 0 {
		t.Fatalf("%d replies were not the client's own, e.g. %s", len(l.wrong), l.wrong[0])
	}
	direct := primary.Client(t)
	via := p.Client(t)
	for _, key := range l.acked {
		want, err := direct.Get(ctx, key).Result()
		if err == redis.Nil {
			lost++
			continue
		}
		if err != nil {
			t.Fatalf("GET %s on the new primary: %v", key, err)
		}
		got, err := via.Get(ctx, key).Result()
		if err != nil || got != want || want != key {
			t.Fatalf("acknowledged write %s: via proxy %q, %v; on the new primary %q", key, got, err, want)
		}
	}
	return lost
}

func (l *failoverLoad) errorSummary() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	if !l.firstErr.IsZero() {
		var last time.Time
		for _, e := range l.lastErr {
			if e.After(last) {
				last = e
			}
		}
		fmt.Fprintf(&b, " clients saw errors for %v;", last.Sub(l.firstErr))
	}
	n := 0
	for e, c := range l.errs {
		n += c
		fmt.Fprintf(&b, " [%d x %q]", c, e)
	}
	return fmt.Sprintf("%d errors:%s", n, b.String())
}

// TestSentinelFailoverUnderLoad: the proxy finds the primary through the
// Sentinels at start, and when an operator moves it (SENTINEL FAILOVER)
// while clients work, the proxy follows within the failover time plus a
// second, every client works again, no client gets another's reply, and
// every acknowledged write that Redis kept reads back through the proxy.
func TestSentinelFailoverUnderLoad(t *testing.T) {
	g := redistest.StartSentinelGroup(t, redistest.SentinelOptions{})
	old := g.Nodes[0]
	p := proxytest.Start(t, old, sentinelConfig(g, g.SentinelAddrs()))
	if got := p.SentinelPrimary(); got != old.Addr() {
		t.Fatalf("primary at start = %q, want %s", got, old.Addr())
	}
	if err := p.Client(t).Set(ctx, "start", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if v, err := old.Client(t).Get(ctx, "start").Result(); v != "1" {
		t.Fatalf("the write did not reach the primary: %q, %v", v, err)
	}

	l := startFailoverLoad(t, p, 8)
	t0 := time.Now()
	g.Failover(t)
	next := g.WaitNewPrimary(t, old, 30*time.Second)
	agreed := time.Now()
	redistest.Eventually(t, time.Second, func() bool { return p.SentinelPrimary() == next.Addr() },
		"the proxy did not follow to %s within a second of the Sentinels (it has %q)", next.Addr(), p.SentinelPrimary())
	followed := time.Now()
	// Three seconds for eight clients to finish a round each through a
	// -race build on a loaded machine; the log line gives the real time.
	redistest.Eventually(t, 3*time.Second, func() bool { return l.recoveredAfter(agreed) },
		"not every client worked again within three seconds of the failover")
	recovered := time.Now()
	lost := l.end(p, next)
	t.Logf("SENTINEL FAILOVER: Sentinels agreed on %s after %v; proxy followed %v later; every client recovered %v after the Sentinels agreed; first client error %v after the failover began; %d rounds, %d acknowledged writes, %d lost by Redis; %s",
		next.Addr(), agreed.Sub(t0), followed.Sub(agreed), recovered.Sub(agreed), sinceOrNever(l.firstErr, t0), l.ops.Load(), len(l.acked), lost, l.errorSummary())
}

// TestSentinelKilledPrimaryUnderLoad: the primary is killed (SIGKILL)
// while clients work; the Sentinels promote a replica and the proxy
// follows within a second of their agreement, as above.
func TestSentinelKilledPrimaryUnderLoad(t *testing.T) {
	g := redistest.StartSentinelGroup(t, redistest.SentinelOptions{})
	old := g.Nodes[0]
	p := proxytest.Start(t, old, sentinelConfig(g, g.SentinelAddrs()))
	l := startFailoverLoad(t, p, 8)
	t0 := time.Now()
	old.Kill(t)
	// While the Sentinels have not yet agreed on a new primary, the old
	// one is gone: the proxy says it is not ready.
	redistest.Eventually(t, 5*time.Second, func() bool { return !p.Ready() }, "the proxy stayed ready with its primary killed")
	next := g.WaitNewPrimary(t, old, 30*time.Second)
	agreed := time.Now()
	redistest.Eventually(t, time.Second, func() bool { return p.SentinelPrimary() == next.Addr() },
		"the proxy did not follow to %s within a second of the Sentinels (it has %q)", next.Addr(), p.SentinelPrimary())
	followed := time.Now()
	// Three seconds for eight clients to finish a round each through a
	// -race build on a loaded machine; the log line gives the real time.
	redistest.Eventually(t, 3*time.Second, func() bool { return l.recoveredAfter(agreed) },
		"not every client worked again within three seconds of the failover")
	recovered := time.Now()
	redistest.Eventually(t, 5*time.Second, p.Ready, "the proxy never became ready on the new primary")
	lost := l.end(p, next)
	t.Logf("killed primary: Sentinels agreed on %s after %v; proxy followed %v later; every client recovered %v after the Sentinels agreed; %d rounds, %d acknowledged writes, %d lost by Redis; %s",
		next.Addr(), agreed.Sub(t0), followed.Sub(agreed), recovered.Sub(agreed), l.ops.Load(), len(l.acked), lost, l.errorSummary())
}

func sinceOrNever(t, t0 time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.Sub(t0).String()
}

// TestSentinelLocalTierDropsOldPrimary: with the local tier on, an entry
// cached from the old primary is never served after the switch. The test
// writes a new value straight to the new primary (so no invalidation can
// come from the proxy's own writes or from tracking there) and reads it
// through the proxy.
func TestSentinelLocalTierDropsOldPrimary(t *testing.T) {
	g := redistest.StartSentinelGroup(t, redistest.SentinelOptions{})
	old := g.Nodes[0]
	p := proxytest.Start(t, old, func(c *config.Config) {
		sentinelConfig(g, g.SentinelAddrs())(c)
		c.LocalCache.Enabled = true
		c.LocalCache.AdmitMinReads = 0
		c.LocalCache.WriteRatio = 1000
		c.LocalCache.MaxTTL = units.Duration{Duration: time.Minute}
	})
	redistest.Eventually(t, 10*time.Second, func() bool { return p.LocalTier().Live(0) }, "local tier never became live")
	hits := func() float64 { return metricSum(t, p, "redproxy_localcache_hits_total") }
	c := p.Client(t)
	if err := c.Set(ctx, "tiered", "old", 0).Err(); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 5*time.Second, func() bool {
		before := hits()
		v, err := c.Get(ctx, "tiered").Result()
		if err != nil || v != "old" {
			t.Fatalf("GET before the failover = %q, %v", v, err)
		}
		return hits() > before
	}, "the key never became a local-tier hit")

	g.Failover(t)
	next := g.WaitNewPrimary(t, old, 30*time.Second)
	redistest.Eventually(t, time.Second, func() bool { return p.SentinelPrimary() == next.Addr() },
		"the proxy did not follow to %s", next.Addr())
	if err := next.Client(t).Set(ctx, "tiered", "new", 0).Err(); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		v, err := c.Get(ctx, "tiered").Result()
		if err != nil {
			continue // the client's pooled connection may meet the switch
		}
		if v != "new" {
			t.Fatalf("GET after the switch = %q: served from the old primary", v)
		}
	}
	// And the tier works again on the new primary.
	redistest.Eventually(t, 5*time.Second, func() bool {
		before := hits()
		v, err := c.Get(ctx, "tiered").Result()
		return err == nil && v == "new" && hits() > before
	}, "the tier never served hits from the new primary")
}

// TestSentinelDownAtStart: the first Sentinel listed is down when the
// proxy starts; it asks the next ones, finds the primary, and still follows
// a failover (the two Sentinels left are a quorum). The clients on
// dedicated connections to the old primary see the loss: a transaction
// open across the failover is aborted (EXECABORT) instead of running on
// the old primary, a BLPOP blocked there has its connection closed with no
// reply (as a lost connection to Redis would; a client library resends
// it, to the new primary), and a subscriber's connection is closed instead
// of listening on to a server that is no longer the primary.
func TestSentinelDownAtStart(t *testing.T) {
	g := redistest.StartSentinelGroup(t, redistest.SentinelOptions{})
	addrs := g.SentinelAddrs()
	g.Sentinels[0].Kill(t)
	old := g.Nodes[0]
	p := proxytest.Start(t, old, sentinelConfig(g, addrs))
	if got := p.SentinelPrimary(); got != old.Addr() {
		t.Fatalf("primary at start = %q, want %s", got, old.Addr())
	}

	tx := p.Dial(t)
	txr := bufio.NewReader(tx)
	exchange := func(cmd, want string) {
		t.Helper()
		tx.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := tx.Write([]byte(cmd)); err != nil {
			t.Fatal(err)
		}
		line, err := txr.ReadString('\n')
		if err != nil || !strings.HasPrefix(line, want) {
			t.Fatalf("%q: got %q, %v; want %q", cmd, line, err, want)
		}
	}
	exchange("*1\r\n$5\r\nMULTI\r\n", "+OK")
	exchange("*3\r\n$3\r\nSET\r\n$2\r\ntx\r\n$3\r\nold\r\n", "+QUEUED")
	sub := p.Client(t).Subscribe(ctx, "news")
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	subErr := make(chan error, 1)
	go func() {
		_, err := sub.Receive(ctx)
		subErr <- err
	}()
	blocked := p.Client(t)
	blockErr := make(chan error, 1)
	go func() { blockErr <- blocked.BLPop(ctx, 0, "nothing").Err() }()
	redistest.Eventually(t, 5*time.Second, func() bool {
		n, _ := old.Client(t).Do(ctx, "INFO", "clients").Text()
		return strings.Contains(n, "blocked_clients:1")
	}, "BLPOP never blocked on the primary")

	g.Failover(t)
	next := g.WaitNewPrimary(t, old, 30*time.Second)
	redistest.Eventually(t, time.Second, func() bool { return p.SentinelPrimary() == next.Addr() },
		"the proxy did not follow to %s", next.Addr())
	// The aborted transaction as docs/COMPATIBILITY.md describes it.
	exchange("*1\r\n$4\r\nEXEC\r\n", "-EXECABORT")
	select {
	case err := <-blockErr:
		// (p.Client does not retry: the closed connection shows.)
		if err == nil || !errors.Is(err, io.EOF) && !strings.Contains(err.Error(), "connection reset") {
			t.Fatalf("BLPOP blocked on the old primary ended with %v, want its connection closed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("BLPOP still blocked on the old primary after the switch")
	}
	select {
	case err := <-subErr:
		if err == nil {
			t.Fatal("the subscriber got a message instead of losing its connection")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the subscriber still listens on the old primary after the switch")
	}
	if n, err := next.Client(t).Exists(ctx, "tx").Result(); err != nil || n != 0 {
		t.Fatalf("the transaction's SET ran: EXISTS tx on the new primary = %d, %v", n, err)
	}
	c := p.Client(t)
	redistest.Eventually(t, 5*time.Second, func() bool { return c.Set(ctx, "after", "1", 0).Err() == nil }, "writes never worked again")
	if v, err := next.Client(t).Get(ctx, "after").Result(); v != "1" {
		t.Fatalf("the write did not reach the new primary: %q, %v", v, err)
	}
}

// TestSentinelNotReadyWithoutPrimary: while no Sentinel names a server
// that is a primary, the proxy starts but /readyz says 503 and clients get
// an error; when the primary appears, it becomes ready and serves. Then a
// primary that demotes itself (REPLICAOF: its writes answer -READONLY)
// makes it not ready again rather than writing to a replica.
func TestSentinelNotReadyWithoutPrimary(t *testing.T) {
	primary := redistest.Start(t)
	other := redistest.Start(t)
	primary.Kill(t)
	// One Sentinel monitoring the dead address: it keeps naming it.
	g := &redistest.SentinelGroup{Name: "solo"}
	s := redistest.StartSentinel(t, redistest.SentinelOptions{Name: g.Name}, primary.Port(), 1)

	p := proxytest.StartUnready(t, nil, sentinelConfig(g, []string{s.Addr()}))
	aln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	adm := admin.New(p.Metrics.Registry, p.Ready, slog.New(slog.NewTextHandler(io.Discard, nil)))
	go adm.Serve(aln)
	t.Cleanup(func() { adm.Shutdown(ctx) })
	readyz := func() int {
		r, err := http.Get("http://" + aln.Addr().String() + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		return r.StatusCode
	}

	if code := readyz(); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz with no primary = %d, want 503", code)
	}
	c := redis.NewClient(&redis.Options{Addr: p.Addr, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	if err := c.Set(ctx, "k", "v", 0).Err(); err == nil || !strings.Contains(err.Error(), "upstream unavailable") {
		t.Fatalf("SET with no primary: %v, want upstream unavailable", err)
	}

	primary.Restart(t)
	redistest.Eventually(t, 10*time.Second, func() bool { return readyz() == http.StatusOK }, "never ready once the primary answered")
	redistest.Eventually(t, 5*time.Second, func() bool { return c.Set(ctx, "k", "v", 0).Err() == nil }, "writes never worked")

	// The primary demotes itself; the Sentinel (alone, quorum 1, with no
	// replica to promote) still names it.
	if err := primary.Client(t).Do(ctx, "REPLICAOF", "127.0.0.1", strconv.Itoa(other.Port())).Err(); err != nil {
		t.Fatal(err)
	}
	err = c.Set(ctx, "k", "v2", 0).Err()
	if err == nil {
		t.Fatal("SET on a demoted primary succeeded")
	}
	redistest.Eventually(t, 5*time.Second, func() bool { return readyz() == http.StatusServiceUnavailable }, "still ready with the primary demoted (last SET error: %v)", err)
	if got := p.Server.SentinelPrimary(); got != "" {
		t.Fatalf("primary known = %q with the only candidate a replica", got)
	}
}

// A primary turned into a replica whose connections are then closed (as
// Sentinel's +convert-to-slave does, CLIENT KILL TYPE normal) is not
// dialled again as the primary: the redialled connections served reads
// from it, with the data of the primary it now follows, not what the
// proxy had acknowledged (found by review of an aborted failover). Here
// the only Sentinel still names it, so the proxy has no primary: reads
// fail rather than return the replica's data.
func TestSentinelDemotedPrimaryIsNotRedialled(t *testing.T) {
	primary := redistest.Start(t)
	other := redistest.Start(t)
	g := &redistest.SentinelGroup{Name: "solo"}
	s := redistest.StartSentinel(t, redistest.SentinelOptions{Name: g.Name}, primary.Port(), 1)
	p := proxytest.Start(t, primary, sentinelConfig(g, []string{s.Addr()}))
	c := p.Client(t, func(o *redis.Options) { o.MaxRetries = -1 })
	if err := c.Set(ctx, "dm:k", "acknowledged", 0).Err(); err != nil {
		t.Fatal(err)
	}
	direct := primary.Client(t)
	if err := direct.Do(ctx, "REPLICAOF", "127.0.0.1", strconv.Itoa(other.Port())).Err(); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 10*time.Second, func() bool {
		info, _ := direct.Info(ctx, "replication").Result()
		n, _ := direct.DBSize(ctx).Result()
		return strings.Contains(info, "master_link_status:up") && n == 0
	}, "the demoted primary never took the other server's (empty) data")
	if err := direct.Do(ctx, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes").Err(); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		v, err := c.Get(ctx, "dm:k").Result()
		if err == nil || err == redis.Nil {
			t.Fatalf("GET %d after the demotion: %q %v, served by a replica (want an error: no primary)", i, v, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
