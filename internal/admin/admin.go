// Package admin serves the proxy's HTTP endpoints: Prometheus metrics,
// liveness and readiness, and the feature endpoints registered by other
// packages. It listens on its own address, loopback by default, because
// some endpoints (reload, reports) are operator tools.
package admin

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Server is the admin HTTP server.
type Server struct {
	mux  *http.ServeMux
	http *http.Server
	log  *slog.Logger
}

// New builds the admin server. ready reports whether Redis is reachable.
func New(reg *prometheus.Registry, ready func() bool, log *slog.Logger) *Server {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready() {
			http.Error(w, "upstream unreachable", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok\n"))
	})
	// Profiles are how a CPU-per-request regression is explained; the admin
	// address is loopback by default, so exposing them is safe.
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return &Server{mux: mux, log: log, http: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}}
}

// Handle registers another endpoint (pattern as for http.ServeMux).
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// Serve serves on ln until Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	err := s.http.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Shutdown stops the server, waiting for requests in flight up to ctx.
func (s *Server) Shutdown(ctx context.Context) error { return s.http.Shutdown(ctx) }
