package proxy_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/proxy"
	"github.com/redproxy/redproxy/internal/redistest"
)

// TestSentinelShutdownTwice: Shutdown may be called twice (proxytest's
// cleanup does after a test's own Shutdown, and the other modes tolerate
// it); in Sentinel mode the second call panicked, closing the watcher's
// stop channel again (found by review).
func TestSentinelShutdownTwice(t *testing.T) {
	g := redistest.StartSentinelGroup(t, redistest.SentinelOptions{Replicas: 1, Sentinels: 1})
	cfg := config.Default()
	cfg.Server.Listen = "127.0.0.1:0"
	cfg.Server.Admin = ""
	sentinelConfig(g, g.SentinelAddrs())(cfg)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	srv, err := proxy.NewServer(proxy.Options{Config: cfg, Table: commands.Builtin(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Metrics: metrics.New()})
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	srv.Shutdown(sctx)
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("second Shutdown panicked: %v", r)
		}
	}()
	srv.Shutdown(sctx)
}
