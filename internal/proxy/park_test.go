package proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// Tests of parking idle clients (server.idle_park_after, park.go). A tiny
// park_after makes the sweeper park a client soon after it goes quiet; the
// tests wait for the parked count by polling, never by sleeping.

func parkingProxy(t *testing.T, mutate func(*config.Config)) *proxytest.Proxy {
	t.Helper()
	return proxytest.Start(t, nil, func(c *config.Config) {
		c.Server.IdleParkAfter = units.Duration{Duration: 20 * time.Millisecond}
		if mutate != nil {
			mutate(c)
		}
	})
}

func waitParked(t *testing.T, p *proxytest.Proxy, n int) {
	t.Helper()
	redistest.Eventually(t, 10*time.Second, func() bool { return p.ParkedClients() == n },
		"parked clients = %d, want %d", p.ParkedClients(), n)
}

func parkedGauge(t *testing.T, p *proxytest.Proxy) float64 {
	t.Helper()
	mfs, err := p.Metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "redproxy_client_connections_parked" {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatal("no redproxy_client_connections_parked metric")
	return 0
}

// A parked client that sends a command later gets its reply, over and
// over, through go-redis; the parked gauge follows.
func TestParkedClientIsAnswered(t *testing.T) {
	p := parkingProxy(t, nil)
	c := p.Client(t, func(o *redis.Options) { o.PoolSize = 1 })
	if err := c.Set(ctx, "park:k", "v0", 0).Err(); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		waitParked(t, p, 1)
		if g := parkedGauge(t, p); g != 1 {
			t.Fatalf("redproxy_client_connections_parked = %v, want 1", g)
		}
		got, err := c.Get(ctx, "park:k").Result()
		if err != nil || got != "v"+strconv.Itoa(i) {
			t.Fatalf("round %d: GET after parking = %q, %v", i, got, err)
		}
		if err := c.Set(ctx, "park:k", "v"+strconv.Itoa(i+1), 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// Parked clients hold no goroutine: parking n clients takes n goroutines
// away, resuming them gives them back only while they work.
func TestParkedClientsHoldNoGoroutine(t *testing.T) {
	p := parkingProxy(t, nil)
	const n = 20
	conns := parkedClients(t, p, n)
	parked := runtime.NumGoroutine()
	for i := range conns {
		rawDo(t, conns[i], "PING")
	}
	// Answered, they are served by goroutines again until they park.
	waitClientsParkedOrBusy(t, p, n, parked)
}

// waitClientsParkedOrBusy waits until all n clients are parked again and the
// goroutine count is back to what it was with them parked.
func waitClientsParkedOrBusy(t *testing.T, p *proxytest.Proxy, n, goroutines int) {
	t.Helper()
	waitParked(t, p, n)
	redistest.Eventually(t, 10*time.Second, func() bool { return runtime.NumGoroutine() <= goroutines },
		"goroutines = %d with %d clients parked again, want <= %d", runtime.NumGoroutine(), n, goroutines)
}

// A request whose bytes arrive in pieces never parks half-read, and a
// pipeline split across the moment of parking is answered whole, in
// order: many rounds with the split at varying points and delays.
func TestParkSplitPipelineNotLost(t *testing.T) {
	p := parkingProxy(t, nil)
	nc := p.Dial(t)
	r := bufio.NewReader(nc)
	var pipeline []byte
	const cmds = 20
	for i := range cmds {
		pipeline = fmt.Appendf(pipeline, "*2\r\n$4\r\nECHO\r\n$6\r\nm%05d\r\n", i)
	}
	// Half a request: the Reader holds bytes, so the client must not park
	// however long it waits.
	if _, err := nc.Write(pipeline[:7]); err != nil {
		t.Fatal(err)
	}
	// The sweeper looks every 10 ms; give it many looks, then check.
	before := closeCounts(p)
	time.Sleep(200 * time.Millisecond)
	if n := p.ParkedClients(); n != 0 {
		t.Fatalf("a client with half a request buffered parked (%d parked)", n)
	}
	if _, err := nc.Write(pipeline[7:]); err != nil {
		t.Fatal(err)
	}
	readEchoes(t, nc, r, 0, cmds)
	for round := range 60 {
		if round%2 == 0 {
			waitParked(t, p, 1)
		}
		cut := 1 + (round*37)%(len(pipeline)-1)
		if _, err := nc.Write(pipeline[:cut]); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(round%7) * 3 * time.Millisecond)
		if _, err := nc.Write(pipeline[cut:]); err != nil {
			t.Fatal(err)
		}
		readEchoes(t, nc, r, round, cmds)
	}
	if got := closeCounts(p); len(got) != len(before) {
		t.Fatalf("a client closed meanwhile: %v", got)
	}
}

func readEchoes(t *testing.T, nc net.Conn, r *bufio.Reader, round, n int) {
	t.Helper()
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	for i := range n {
		hdr, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("round %d: reply %d: %v", round, i, err)
		}
		body, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("round %d: reply %d: %v", round, i, err)
		}
		if want := fmt.Sprintf("m%05d\r\n", i); hdr != "$6\r\n" || body != want {
			t.Fatalf("round %d: reply %d = %q %q, want %q", round, i, hdr, body, want)
		}
	}
}

// A client that hangs up while parked is cleaned up: the connection count
// drops, its close is counted as the client's, and no goroutine is left.
func TestParkedClientHangsUp(t *testing.T) {
	p := parkingProxy(t, nil)
	// A first client brings up what the proxy starts on first use (the
	// shared upstream connections' goroutines), which stays.
	warm := p.Dial(t)
	rawDo(t, warm, "PING")
	warm.Close()
	waitClients(t, p, 0)
	base := runtime.NumGoroutine()
	nc, err := p.DialErr()
	if err != nil {
		t.Fatal(err)
	}
	rawDo(t, nc, "PING")
	waitParked(t, p, 1)
	nc.Close()
	waitParked(t, p, 0)
	waitClients(t, p, 0)
	waitCloses(t, p, map[string]float64{metrics.CloseClient: 2}) // warm and nc
	redistest.Eventually(t, 10*time.Second, func() bool { return runtime.NumGoroutine() <= base },
		"goroutines = %d after the parked client left, want <= %d", runtime.NumGoroutine(), base)
}

// A parked client that resets its connection (RST rather than FIN) leaves
// a socket with no peer: resuming it must end only that client. It used to
// take the whole proxy down: net.FileConn gave a connection whose
// RemoteAddr was nil, and logging the session's end panicked outside the
// session's recover.
func TestParkedClientResetsConnection(t *testing.T) {
	p := parkingProxy(t, nil)
	for range 3 {
		nc, err := p.DialErr()
		if err != nil {
			t.Fatal(err)
		}
		rawDo(t, nc, "PING")
		waitParked(t, p, 1)
		if err := nc.(*net.TCPConn).SetLinger(0); err != nil {
			t.Fatal(err)
		}
		nc.Close() // a reset
		waitParked(t, p, 0)
		waitClients(t, p, 0)
	}
	waitCloses(t, p, map[string]float64{metrics.CloseClient: 3})
	other := p.Dial(t)
	rawDo(t, other, "PING") // the proxy is still up
}

// server.idle_timeout closes a parked client when it is due. (Two
// seconds, so that the check that it parked first has room on a loaded
// machine.)
func TestParkedClientIdleTimeout(t *testing.T) {
	p := parkingProxy(t, func(c *config.Config) {
		c.Server.IdleTimeout = units.Duration{Duration: 2 * time.Second}
	})
	nc := p.Dial(t)
	r := bufio.NewReader(nc)
	if got := send(t, nc, r, "PING"); got != "+PONG" {
		t.Fatalf("PING = %q", got)
	}
	waitParked(t, p, 1)
	waitEOF(t, nc, r)
	waitParked(t, p, 0)
	waitClients(t, p, 0)
	waitCloses(t, p, map[string]float64{metrics.CloseIdleTimeout: 1})
}

// A parked client that keeps sending within idle_timeout is not closed:
// parking does not restart nor shorten its idle clock wrongly.
func TestParkedClientActiveWithinIdleTimeout(t *testing.T) {
	p := parkingProxy(t, func(c *config.Config) {
		c.Server.IdleTimeout = units.Duration{Duration: 2 * time.Second}
	})
	nc := p.Dial(t)
	r := bufio.NewReader(nc)
	for range 5 {
		if got := send(t, nc, r, "PING"); got != "+PONG" {
			t.Fatalf("PING = %q", got)
		}
		waitParked(t, p, 1)
	}
	if got := closeCounts(p); len(got) != 0 {
		t.Fatalf("closed: %v", got)
	}
}

// Shutdown reaches parked clients: it closes them at once, rather than
// waiting for its deadline.
func TestShutdownClosesParkedClients(t *testing.T) {
	p := parkingProxy(t, nil)
	var conns []net.Conn
	for range 3 {
		nc := p.Dial(t)
		rawDo(t, nc, "PING")
		conns = append(conns, nc)
	}
	waitParked(t, p, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v (parked clients were not closed)", err)
	}
	for _, nc := range conns {
		waitEOF(t, nc, bufio.NewReader(nc))
	}
	waitCloses(t, p, map[string]float64{metrics.CloseShutdown: 3})
}

// CLIENT KILL reaches a parked client, which CLIENT LIST still lists.
func TestClientKillParkedClient(t *testing.T) {
	p := parkingProxy(t, nil)
	victim := p.Dial(t)
	vr := bufio.NewReader(victim)
	id := send(t, victim, vr, "CLIENT ID")
	waitParked(t, p, 1)
	admin := p.Client(t, func(o *redis.Options) { o.PoolSize = 1 })
	list, err := admin.ClientList(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(list, "id="+strings.TrimPrefix(id, ":")+" ") {
		t.Fatalf("CLIENT LIST does not list the parked client %s:\n%s", id, list)
	}
	n, err := admin.ClientKillByFilter(ctx, "ID", strings.TrimPrefix(id, ":")).Result()
	if err != nil || n != 1 {
		t.Fatalf("CLIENT KILL ID = %d, %v", n, err)
	}
	waitEOF(t, victim, vr)
	waitCloses(t, p, map[string]float64{metrics.CloseKilled: 1})
}

// Clients in a transaction or under WATCH hold a pinned connection and
// never park; they park again once it ends.
func TestPinnedClientDoesNotPark(t *testing.T) {
	p := parkingProxy(t, nil)
	nc := p.Dial(t)
	r := bufio.NewReader(nc)
	if got := send(t, nc, r, "MULTI"); got != "+OK" {
		t.Fatalf("MULTI = %q", got)
	}
	time.Sleep(200 * time.Millisecond) // twenty sweeps
	if n := p.ParkedClients(); n != 0 {
		t.Fatalf("a client in MULTI parked (%d parked)", n)
	}
	if got := send(t, nc, r, "SET park:tx 1"); got != "+QUEUED" {
		t.Fatalf("SET in MULTI = %q", got)
	}
	if got := send(t, nc, r, "EXEC"); got != "*1" {
		t.Fatalf("EXEC = %q", got)
	}
	if got, _ := r.ReadString('\n'); got != "+OK\r\n" {
		t.Fatalf("EXEC result = %q", got)
	}
	waitParked(t, p, 1)
}

// Many clients parking and resuming at once each get exactly their own
// replies (run under -race).
func TestParkManyClientsOwnReplies(t *testing.T) {
	p := parkingProxy(t, nil)
	const clients, rounds = 24, 12
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nc, err := p.DialErr()
			if err != nil {
				errs <- err
				return
			}
			defer nc.Close()
			r := bufio.NewReader(nc)
			for i := range rounds {
				val := fmt.Sprintf("c%d-r%d", c, i)
				cmd := fmt.Sprintf("SET park:many:%d %s\r\nGET park:many:%d\r\nECHO %s\r\n", c, val, c, val)
				nc.SetDeadline(time.Now().Add(10 * time.Second))
				if _, err := nc.Write([]byte(cmd)); err != nil {
					errs <- err
					return
				}
				want := []string{"+OK\r\n", fmt.Sprintf("$%d\r\n", len(val)), val + "\r\n", fmt.Sprintf("$%d\r\n", len(val)), val + "\r\n"}
				for _, w := range want {
					line, err := r.ReadString('\n')
					if err != nil || line != w {
						errs <- fmt.Errorf("client %d round %d: got %q, %v; want %q", c, i, line, err, w)
						return
					}
				}
				// Pauses around the park moment: some rounds park, some
				// are caught mid-park, some never park.
				time.Sleep(time.Duration((c*7+i*13)%40) * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// A reload that sets idle_timeout applies to clients connected after it,
// also when a client connected before it resumes from parked: it is
// neither closed at once nor given the new timeout.
func TestParkedClientKeepsItsIdleTimeoutAcrossReload(t *testing.T) {
	p := parkingProxy(t, nil)
	nc := p.Dial(t)
	r := bufio.NewReader(nc)
	if got := send(t, nc, r, "PING"); got != "+PONG" {
		t.Fatalf("PING = %q", got)
	}
	waitParked(t, p, 1)
	if _, err := p.Reload(reloaded(t, p, func(c *config.Config) {
		c.Server.IdleTimeout = units.Duration{Duration: 300 * time.Millisecond}
	})); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if got := send(t, nc, r, "PING"); got != "+PONG" {
			t.Fatalf("PING after the reload = %q", got)
		}
		waitParked(t, p, 1)
	}
	if got := closeCounts(p); len(got) != 0 {
		t.Fatalf("closed: %v", got)
	}
}

// TLS clients never park: crypto/tls may hold decrypted bytes the socket's
// readiness would not report. A plaintext client of the same proxy does.
func TestTLSClientDoesNotPark(t *testing.T) {
	certs := redistest.NewCerts(t)
	rs := redistest.StartTLS(t, certs, "no")
	p := tlsProxy(t, certs, rs, false, func(c *config.Config) {
		c.Server.IdleParkAfter = units.Duration{Duration: 20 * time.Millisecond}
	})
	sc := tlsClient(t, p.TLSAddr, certs.ClientConfig(t, false))
	if err := sc.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	plain := p.Dial(t)
	rawDo(t, plain, "PING")
	waitParked(t, p, 1)                // the plaintext one
	time.Sleep(200 * time.Millisecond) // twenty more sweeps
	if n := p.ParkedClients(); n != 1 {
		t.Fatalf("%d clients parked, want only the plaintext one", n)
	}
	if err := sc.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
}

// A parked client keeps the connection state it set before parking (name,
// DB, RESP3, library name and version), as CLIENT LIST shows while it is
// parked (with its addresses, which parking keeps apart from the socket)
// and as its own commands show once it is back: CLIENT INFO, a key of DB
// 3, a reply in RESP3's shape. Several rounds, each parking again.
func TestParkedClientKeepsItsState(t *testing.T) {
	p := parkingProxy(t, nil)
	nc := p.Dial(t)
	if got := rawDo(t, nc, "HELLO", "3"); !strings.HasPrefix(got, "%") {
		t.Fatalf("HELLO 3 = %q", got)
	}
	for _, cmd := range [][]string{
		{"SELECT", "3"},
		{"CLIENT", "SETNAME", "parked-one"},
		{"SET", "park:state", "in-db-3"},
	} {
		if got := rawDo(t, nc, cmd...); got != "+OK\r\n" {
			t.Fatalf("%v = %q", cmd, got)
		}
	}
	id := strings.TrimPrefix(strings.TrimSpace(rawDo(t, nc, "CLIENT", "ID")), ":")
	state := []string{"id=" + id + " ", "name=parked-one ", "db=3 ", "resp=3 ",
		"addr=" + nc.LocalAddr().String() + " ", "laddr=" + nc.RemoteAddr().String() + " "}
	// CLIENT SETINFO is in the command table only with Redis 7.2 or later
	// upstream (the table is Redis's own).
	switch got := rawDo(t, nc, "CLIENT", "SETINFO", "LIB-NAME", "parklib"); {
	case got == "+OK\r\n":
		if got := rawDo(t, nc, "CLIENT", "SETINFO", "LIB-VER", "1.2.3"); got != "+OK\r\n" {
			t.Fatalf("CLIENT SETINFO LIB-VER = %q", got)
		}
		state = append(state, "lib-name=parklib ", "lib-ver=1.2.3")
	case strings.Contains(got, "unknown subcommand"):
		t.Log("upstream Redis has no CLIENT SETINFO (before 7.2): lib-name and lib-ver not checked")
	default:
		t.Fatalf("CLIENT SETINFO LIB-NAME = %q", got)
	}
	admin := p.Dial(t)
	for round := range 3 {
		redistest.Eventually(t, 10*time.Second, func() bool { return p.ParkedClients() >= 1 && parkedLine(t, admin, id) != "" },
			"round %d: the client did not park", round)
		line := parkedLine(t, admin, id)
		for _, want := range state {
			if !strings.Contains(line+" ", want) {
				t.Fatalf("round %d: CLIENT LIST while parked lacks %q:\n%s", round, want, line)
			}
		}
		info := rawDo(t, nc, "CLIENT", "INFO")
		for _, want := range state {
			if !strings.Contains(info, want) {
				t.Fatalf("round %d: CLIENT INFO after parking lacks %q:\n%s", round, want, info)
			}
		}
		if got := rawDo(t, nc, "GET", "park:state"); got != "$7\r\nin-db-3\r\n" {
			t.Fatalf("round %d: GET in DB 3 after parking = %q", round, got)
		}
		if got := rawDo(t, nc, "HGETALL", "park:none"); got != "%0\r\n" {
			t.Fatalf("round %d: HGETALL after parking = %q, want RESP3's empty map", round, got)
		}
	}
	other := p.Dial(t)
	if got := rawDo(t, other, "GET", "park:state"); got != "$-1\r\n" {
		t.Fatalf("GET in DB 0 = %q: the key went to the wrong DB", got)
	}
}

// parkedLine is the CLIENT LIST line of client id if it is parked now (no
// line otherwise), asked through admin.
func parkedLine(t *testing.T, admin net.Conn, id string) string {
	t.Helper()
	list := rawDo(t, admin, "CLIENT", "LIST")
	for line := range strings.SplitSeq(list, "\n") {
		if strings.Contains(line, "id="+id+" ") && strings.Contains(line, " idle=") && !strings.Contains(line, " idle=0 ") {
			return line
		}
	}
	return ""
}

// A client that sent a request and went quiet is waited on by its
// session's goroutine alone, parked or not: the Reader's read coroutine
// (resp.Reader.reads) is a goroutine too, whose record the runtime keeps
// for good, and it starts only for a client that keeps sending. With it
// started for every client, n idle clients held 2n goroutines until they
// parked, and the process kept 2n goroutine records after.
func TestIdleClientHoldsOneGoroutine(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) {
		c.Server.IdleParkAfter = units.Duration{} // not parked: the wait itself is looked at
	})
	warm := p.Dial(t) // upstream connections and their goroutines exist from here on
	if got := rawDo(t, warm, "GET", "idle:k"); got != "$-1\r\n" {
		t.Fatalf("GET = %q", got)
	}
	base := runtime.NumGoroutine()
	const n = 20
	for range n {
		nc := p.Dial(t)
		if got := rawDo(t, nc, "GET", "idle:k"); got != "$-1\r\n" {
			t.Fatalf("GET = %q", got)
		}
	}
	redistest.Eventually(t, 10*time.Second, func() bool { return runtime.NumGoroutine() <= base+n },
		"%d goroutines with %d more idle clients than at %d, want at most one each", runtime.NumGoroutine(), n, base)
}

// A PROXY-protocol client whose header came alone parks with its net.Conn
// (it is not detached: its address is the header's), is answered from
// parked, and CLIENT LIST shows the header's address meanwhile.
func TestProxyProtocolClientParksWithItsConn(t *testing.T) {
	p := parkingProxy(t, func(c *config.Config) { c.Server.ProxyProtocol = true })
	const addr = "203.0.113.9:40009"
	nc := p.Dial(t)
	if _, err := nc.Write([]byte("PROXY TCP4 203.0.113.9 198.51.100.1 40009 6380\r\n")); err != nil {
		t.Fatal(err)
	}
	// Another client (header and command at once, so it never parks)
	// sees the first once its header is read: the PING after it is then
	// not read with the header, which would keep the client from parking.
	listed := func() string {
		o := p.Dial(t)
		defer o.Close()
		if _, err := o.Write([]byte("PROXY TCP4 192.0.2.1 198.51.100.1 5000 6380\r\nCLIENT LIST\r\n")); err != nil {
			t.Fatal(err)
		}
		return rawRead(t, o)
	}
	redistest.Eventually(t, 10*time.Second, func() bool { return strings.Contains(listed(), "addr="+addr+" ") },
		"CLIENT LIST does not show %s", addr)
	for i := range 3 {
		if got := rawDo(t, nc, "PING"); got != "+PONG\r\n" {
			t.Fatalf("round %d: PING = %q", i, got)
		}
		waitParked(t, p, 1)
		if l := listed(); !strings.Contains(l, "addr="+addr+" ") {
			t.Fatalf("round %d: CLIENT LIST with the client parked does not show %s:\n%s", i, addr, l)
		}
	}
}

// A parked client keeps no raw writer: the writer refers to the net.Conn
// the client gave up when it parked, and would keep it (its descriptor
// record and poller entry) alive for as long as the client idles. Once
// resumed, the client is written to as before.
func TestParkedClientKeepsNoWriter(t *testing.T) {
	p := parkingProxy(t, nil)
	const n = 5
	conns := parkedClients(t, p, n)
	if k := p.ParkedClientsKeepingAWriter(); k != 0 {
		t.Fatalf("%d of %d parked clients keep the writer of the net.Conn they gave up", k, n)
	}
	pingAll(t, conns)
}

// parkedClients connects n clients that each answer a PING and waits until
// all of them are parked.
func parkedClients(t *testing.T, p *proxytest.Proxy, n int) []net.Conn {
	t.Helper()
	conns := dialPing(t, p, n)
	waitParked(t, p, n)
	return conns
}
