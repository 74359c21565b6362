package proxy_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/proxy"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// Clients the proxy closes for their output limit are each counted, but
// logged at most about once a second with the count of lines left out:
// before, each wrote a warning (found by review: 1,000 lines in 2 s from
// clients fetching one key past the limit).
func TestClosedClientsLogRateLimited(t *testing.T) {
	var logs redistest.LogBuffer
	rs := redistest.Start(t)
	if err := rs.Client(t).Set(ctx, "big", strings.Repeat("b", 200<<10), 0).Err(); err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.Server.Listen, cfg.Server.Admin, cfg.Upstream.Address = "127.0.0.1:0", "", rs.Addr()
	cfg.Server.ClientOutputLimit = 64 << 10
	reg := metrics.New()
	_, ln := serveLogged(t, cfg, reg, slog.NewTextHandler(&logs, nil))
	const clients = 100
	start := time.Now()
	for range clients {
		c := dialRaw(t, ln.Addr().String())
		c.send([]string{"GET", "big"})
		if !connClosed(c.nc) {
			t.Fatal("a client past its output limit was not closed")
		}
	}
	closed := func() float64 { return testutil.ToFloat64(reg.ClientsClosed.WithLabelValues(metrics.CloseOutputLimit)) }
	redistest.Eventually(t, 10*time.Second, func() bool { return closed() == clients },
		"%v clients counted as closed for their output limit, want %d", lazyFloat(closed), clients)
	elapsed := time.Since(start)
	lines := strings.Count(logs.String(), "closing client: replies exceed server.client_output_limit")
	if lines == 0 || lines > int(elapsed/time.Second)+2 {
		t.Fatalf("%d warnings for %d closed clients in %v, want one a second", lines, clients, elapsed.Round(time.Millisecond))
	}
	t.Logf("%d warnings for %d closed clients in %v", lines, clients, elapsed.Round(time.Millisecond))
}

type lazyFloat func() float64

func (f lazyFloat) String() string { return fmtFloat(f()) }

func fmtFloat(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// serveLogged starts a proxy with cfg whose log goes to h, where
// proxytest's would go to the test's output, and stops it at the end.
func serveLogged(t *testing.T, cfg *config.Config, reg *metrics.Metrics, h slog.Handler) (*proxy.Server, net.Listener) {
	t.Helper()
	srv, err := proxy.NewServer(proxy.Options{Config: cfg, Table: commands.Builtin(), Logger: slog.New(h), Metrics: reg})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(c)
	})
	return srv, ln
}

// oneClientProxy serves a proxy with server.max_clients = 1 (and
// proxy_protocol as asked) whose log the test reads.
func oneClientProxy(t *testing.T, proxyProtocol bool) (*metrics.Metrics, net.Listener, *redistest.LogBuffer) {
	logs := &redistest.LogBuffer{}
	rs := redistest.Start(t)
	cfg := config.Default()
	cfg.Server.Listen, cfg.Server.Admin, cfg.Upstream.Address = "127.0.0.1:0", "", rs.Addr()
	cfg.Server.MaxClients = 1
	cfg.Server.ProxyProtocol = proxyProtocol
	reg := metrics.New()
	_, ln := serveLogged(t, cfg, reg, slog.NewTextHandler(logs, nil))
	return reg, ln, logs
}

// Clients refused at server.max_clients are logged, at most about once a
// second with the count left out: before, they were only counted, while
// max_pinned's refusals were logged (found by the operations review).
func TestMaxClientsRefusalsLogged(t *testing.T) {
	_, ln, logs := oneClientProxy(t, false)
	in := dialRaw(t, ln.Addr().String())
	if got := in.do("PING"); got != "PONG" {
		t.Fatalf("PING of the one client allowed: %v", got)
	}
	const refused = 20
	start := time.Now()
	for range refused {
		c := dialRaw(t, ln.Addr().String())
		if got, _ := c.readReply(); got == nil || !strings.Contains(fmt.Sprint(got), "max number of clients reached") {
			t.Fatalf("a client over max_clients: %v", got)
		}
	}
	elapsed := time.Since(start)
	const msg = "client refused: server.max_clients reached"
	redistest.Eventually(t, 5*time.Second, func() bool { return strings.Contains(logs.String(), msg) },
		"no warning for %d clients refused at max_clients; log:\n%s", refused, logs)
	if lines := strings.Count(logs.String(), msg); lines > int(elapsed/time.Second)+2 {
		t.Fatalf("%d warnings for %d refused clients in %v, want one a second", lines, refused, elapsed.Round(time.Millisecond))
	}
}

// A Redis that refuses the proxy's handshake (here: it wants a password
// the proxy was not given) answers every command "upstream unavailable";
// the error now says why, as it did only for MULTI and BLPOP, which dial
// their own connection (found by review with redis-cli: the cause was in
// the proxy's log only).
func TestUnavailableNamesARefusedHandshake(t *testing.T) {
	rs := redistest.Start(t)
	if err := rs.Client(t).ConfigSet(ctx, "requirepass", "s3cret-pw").Err(); err != nil {
		t.Fatal(err)
	}
	p := proxytest.StartUnready(t, rs, nil)
	c := p.Client(t)
	var err error
	redistest.Eventually(t, 10*time.Second, func() bool {
		err = c.Get(ctx, "k").Err()
		return err != nil && strings.Contains(err.Error(), "NOAUTH")
	}, "GET with Redis refusing the handshake: %v, want upstream unavailable naming NOAUTH", lazyErr{&err})
	if !strings.Contains(err.Error(), "upstream unavailable") {
		t.Errorf("GET: %v, want it to say upstream unavailable", err)
	}
	t.Logf("GET: %v", err)
}

// Review of fb98596: behind a load balancer (server.proxy_protocol), a
// client over max_clients is refused in acceptProxied (proxyproto.go),
// which still only counts it: the warning added for max_clients refusals
// is never logged there, the case where connection storms come from.
func TestMaxClientsRefusalsLoggedWithProxyProtocol(t *testing.T) {
	reg, ln, logs := oneClientProxy(t, true)
	// The one place: a connection waiting for its PROXY header.
	dialRaw(t, ln.Addr().String())
	redistest.Eventually(t, 5*time.Second, func() bool {
		c := dialRaw(t, ln.Addr().String())
		c.nc.SetReadDeadline(time.Now().Add(time.Second))
		_, err := c.nc.Read(make([]byte, 1))
		return err != nil && testutil.ToFloat64(reg.ClientsRejected) > 0
	}, "no client was refused at max_clients")
	const msg = "client refused: server.max_clients reached"
	redistest.Eventually(t, 5*time.Second, func() bool { return strings.Contains(logs.String(), msg) },
		"%v clients refused at max_clients behind proxy_protocol, no warning; log:\n%s", testutil.ToFloat64(reg.ClientsRejected), logs)
}

// A failed AUTH is logged with the client's address, at most about once a
// second with the count left out, and never with the password: only a
// counter said anything, and the AUTH never reaches Redis's ACL LOG
// (found by a probe).
func TestFailedAuthLogged(t *testing.T) {
	var logs redistest.LogBuffer
	rs := redistest.Start(t)
	if err := rs.Client(t).ConfigSet(ctx, "requirepass", "right-secret").Err(); err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.Server.Listen, cfg.Server.Admin, cfg.Upstream.Address = "127.0.0.1:0", "", rs.Addr()
	cfg.Upstream.Password = "right-secret"
	_, ln := serveLogged(t, cfg, metrics.New(), slog.NewTextHandler(&logs, nil))
	c := dialRaw(t, ln.Addr().String())
	for range 5 {
		if got := c.do("AUTH", "wrong-secret"); !strings.Contains(fmt.Sprint(got), "WRONGPASS") {
			t.Fatalf("AUTH with a wrong password: %v", got)
		}
	}
	line := ""
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, `msg="AUTH failed"`) {
			line = l
		}
	}
	if line == "" || !strings.Contains(line, "client="+c.nc.LocalAddr().String()) || !strings.Contains(line, "reason=wrongpass") {
		t.Fatalf("no AUTH-failed line with the client's address:\n%s", logs.String())
	}
	if n := strings.Count(logs.String(), `msg="AUTH failed"`); n > 2 {
		t.Errorf("%d lines for 5 failed AUTHs in well under a second, want one (or two across a second)", n)
	}
	if strings.Contains(logs.String(), "wrong-secret") {
		t.Errorf("the password is in the log:\n%s", logs.String())
	}
}
