// Package proxytest runs a real proxy in the test process, in front of a
// real redis-server, for behaviour tests of any package.
package proxytest

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/proxy"
	"github.com/redproxy/redproxy/internal/redistest"
)

// Proxy is a proxy server listening on a free loopback port.
type Proxy struct {
	*proxy.Server
	Addr    string // the plaintext listener; "" if server.listen is ""
	TLSAddr string // the TLS listener, when [server.tls] is on
	// Addrs are the addresses of every client listener, by name
	// ("plain", "tls" and each [[server.listeners]] entry's).
	Addrs   map[string]string
	Redis   *redistest.Server
	Metrics *metrics.Metrics
}

// Start starts redis-server (unless rs is given) and a proxy in front of it.
// mutate may change the configuration first. The proxy is shut down when
// the test ends.
func Start(t testing.TB, rs *redistest.Server, mutate func(*config.Config)) *Proxy {
	t.Helper()
	return StartWithTable(t, rs, commands.Builtin(), mutate)
}

// StartUnready is Start without waiting for the proxy to reach Redis,
// which it may never do (a refused TLS handshake, a Sentinel that names no
// primary). rs may be nil: the configuration then says where Redis is.
func StartUnready(t testing.TB, rs *redistest.Server, mutate func(*config.Config)) *Proxy {
	t.Helper()
	return startUnready(t, rs, commands.Builtin(), mutate)
}

// StartWithTable is Start with the command table table instead of the
// built-in one: the table the proxy would load from another Redis (a newer
// one, or one with modules).
func StartWithTable(t testing.TB, rs *redistest.Server, table *commands.Table, mutate func(*config.Config)) *Proxy {
	t.Helper()
	if rs == nil {
		rs = redistest.Start(t)
	}
	p := startUnready(t, rs, table, mutate)
	redistest.Eventually(t, 5*time.Second, p.allReady, "proxy never connected to redis at %s, or to a named upstream", rs.Addr())
	return p
}

// StartStandIn is StartWithTable where table stands in for a table the
// upstream did not give (proxy.Options.TableStandIn), as when the proxy
// starts before its Redis.
func StartStandIn(t testing.TB, rs *redistest.Server, table *commands.Table, mutate func(*config.Config)) *Proxy {
	t.Helper()
	p := start(t, rs, table, true, mutate)
	redistest.Eventually(t, 5*time.Second, p.allReady, "proxy never connected to redis at %s, or to a named upstream", rs.Addr())
	return p
}

// StartUnreadyStandIn is StartUnready with table standing in for the
// upstream's until one answers (StartStandIn).
func StartUnreadyStandIn(t testing.TB, table *commands.Table, mutate func(*config.Config)) *Proxy {
	t.Helper()
	return start(t, nil, table, true, mutate)
}

func startUnready(t testing.TB, rs *redistest.Server, table *commands.Table, mutate func(*config.Config)) *Proxy {
	t.Helper()
	return start(t, rs, table, false, mutate)
}

func start(t testing.TB, rs *redistest.Server, table *commands.Table, standIn bool, mutate func(*config.Config)) *Proxy {
	t.Helper()
	cfg := config.Default()
	cfg.Server.Listen = "127.0.0.1:0"
	cfg.Server.Admin = ""
	if rs != nil {
		cfg.Upstream.Address = rs.Addr()
	}
	cfg.Upstream.ReconnectMin = units.Duration{Duration: 10 * time.Millisecond}
	cfg.Upstream.ReconnectMax = units.Duration{Duration: 100 * time.Millisecond}
	cfg.Upstream.Connections = 2
	if mutate != nil {
		mutate(cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("proxytest: invalid config: %v", err)
	}
	// Every level enabled even when nothing is shown, so that what the
	// proxy does only to log at debug level runs in every test too.
	log := slog.New(allDiscarded{})
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	reg := metrics.New()
	srv, err := proxy.NewServer(proxy.Options{Config: cfg, Table: table, TableStandIn: standIn, Logger: log, Metrics: reg})
	if err != nil {
		t.Fatalf("proxytest: %v", err)
	}
	p := &Proxy{Server: srv, Redis: rs, Metrics: reg, Addrs: map[string]string{}}
	for _, lc := range cfg.ClientListeners() {
		ln, err := net.Listen("tcp", lc.Listen)
		if err != nil {
			t.Fatal(err)
		}
		go srv.ServeListener(lc.Name, ln)
		p.Addrs[lc.Name] = ln.Addr().String()
	}
	p.Addr, p.TLSAddr = p.Addrs[config.ListenerPlain], p.Addrs[config.ListenerTLS]
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return p
}

// Client returns a go-redis client connected to the proxy, closed when the
// test ends. It does not retry, so errors surface as they happen.
func (p *Proxy) Client(t testing.TB, mutate ...func(*redis.Options)) *redis.Client {
	t.Helper()
	opt := &redis.Options{Addr: p.Addr, MaxRetries: -1, DialTimeout: 2 * time.Second, ReadTimeout: 10 * time.Second, PoolSize: 4}
	for _, f := range mutate {
		f(opt)
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	return c
}

// allReady is Ready and every named upstream ready: a test's first
// command to one of them must not race its connections.
func (p *Proxy) allReady() bool { return p.Ready() && p.NamedUpstreamsReady() }

// DialErr opens a raw TCP connection to the proxy; the caller closes it.
func (p *Proxy) DialErr() (net.Conn, error) {
	return net.DialTimeout("tcp", p.Addr, 2*time.Second)
}

// Dial opens a raw TCP connection to the proxy.
func (p *Proxy) Dial(t testing.TB) net.Conn {
	t.Helper()
	nc, err := net.DialTimeout("tcp", p.Addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return nc
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(string(b))
	return len(b), nil
}

// allDiscarded is a slog.Handler enabled at every level that drops every
// record without formatting it.
type allDiscarded struct{}

func (allDiscarded) Enabled(context.Context, slog.Level) bool  { return true }
func (allDiscarded) Handle(context.Context, slog.Record) error { return nil }
func (h allDiscarded) WithAttrs([]slog.Attr) slog.Handler      { return h }
func (h allDiscarded) WithGroup(string) slog.Handler           { return h }
