package proxy

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/redistest"
)

// testProxy is a proxy server running in the test process in front of a
// real redis-server.
type testProxy struct {
	*Server
	addr  string
	redis *redistest.Server
}

// startProxy starts redis-server (unless one is given) and a proxy in front
// of it. mutate may change the configuration before the server is built.
func startProxy(t testing.TB, rs *redistest.Server, mutate func(*config.Config)) *testProxy {
	t.Helper()
	if rs == nil {
		rs = redistest.Start(t)
	}
	cfg := config.Default()
	cfg.Server.Listen = "127.0.0.1:0"
	cfg.Server.Admin = ""
	cfg.Upstream.Address = rs.Addr()
	cfg.Upstream.ReconnectMin = units.Duration{Duration: 10 * time.Millisecond}
	cfg.Upstream.ReconnectMax = units.Duration{Duration: 100 * time.Millisecond}
	cfg.Upstream.Connections = 2
	if mutate != nil {
		mutate(cfg)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	srv := NewServer(Options{Config: cfg, Table: commands.Builtin(), Logger: log, Metrics: metrics.New()})
	ln, err := net.Listen("tcp", cfg.Server.Listen)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	p := &testProxy{Server: srv, addr: ln.Addr().String(), redis: rs}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	redistest.Eventually(t, 5*time.Second, srv.Ready, "proxy never connected to redis at %s", rs.Addr())
	return p
}

// client returns a go-redis client connected to the proxy.
func (p *testProxy) client(t testing.TB, mutate ...func(*redis.Options)) *redis.Client {
	t.Helper()
	opt := &redis.Options{Addr: p.addr, MaxRetries: -1, DialTimeout: 2 * time.Second, ReadTimeout: 10 * time.Second, PoolSize: 4}
	for _, f := range mutate {
		f(opt)
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	return c
}

// dial opens a raw TCP connection to the proxy.
func (p *testProxy) dial(t testing.TB) net.Conn {
	t.Helper()
	nc, err := net.DialTimeout("tcp", p.addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return nc
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

var ctx = context.Background()

func contextWithTimeout(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}
