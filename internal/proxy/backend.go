package proxy

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redproxy/redproxy/internal/upstream"
)

var errTooManyFiles = syscall.EMFILE

// BackendOptions configure the upstream side.
type BackendOptions struct {
	Addr, Username, Password string
	Connections, Databases   int
	DialTimeout              time.Duration
	ReplyTimeout             time.Duration
	ReconnectMin             time.Duration
	ReconnectMax             time.Duration
	Logger                   *slog.Logger
}

// Backend owns the shared upstream pools: one per database and protocol,
// created on first use so that a proxy whose clients only use DB 0 keeps
// only DB 0's connections.
type Backend struct {
	opt   BackendOptions
	mu    sync.Mutex
	pools []atomic.Pointer[upstream.Pool] // index db*2 + resp3
}

// NewBackend creates the pools for DB 0 eagerly (RESP2 and RESP3), so
// readiness reflects whether Redis is reachable.
func NewBackend(opt BackendOptions) *Backend {
	if opt.Databases < 1 {
		opt.Databases = 1
	}
	b := &Backend{opt: opt, pools: make([]atomic.Pointer[upstream.Pool], 2*opt.Databases)}
	b.Pool(0, false)
	b.Pool(0, true)
	return b
}

// Options returns the upstream options for a connection to db.
func (b *Backend) Options(db int, resp3 bool) upstream.Options {
	return upstream.Options{
		Addr: b.opt.Addr, Username: b.opt.Username, Password: b.opt.Password,
		DB: db, RESP3: resp3,
		DialTimeout: b.opt.DialTimeout, ReplyTimeout: b.opt.ReplyTimeout,
		ReconnectMin: b.opt.ReconnectMin, ReconnectMax: b.opt.ReconnectMax,
		Name:   "redproxy",
		Logger: b.opt.Logger,
	}
}

// Pool returns the shared pool for db and protocol, creating it if needed.
func (b *Backend) Pool(db int, resp3 bool) *upstream.Pool {
	i := db * 2
	if resp3 {
		i++
	}
	if p := b.pools[i].Load(); p != nil {
		return p
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if p := b.pools[i].Load(); p != nil {
		return p
	}
	p := upstream.NewPool(b.opt.Connections, b.Options(db, resp3))
	// The first client of a database or protocol should not fail just
	// because its connections are still being dialled; later outages fail
	// fast instead, since the pipes reconnect in the background.
	p.WaitUp(b.opt.DialTimeout)
	b.pools[i].Store(p)
	return p
}

// Ready reports whether DB 0 has a live connection.
func (b *Backend) Ready() bool { return b.Pool(0, false).Up() }

// Close closes every pool and waits for their goroutines.
func (b *Backend) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range b.pools {
		if p := b.pools[i].Load(); p != nil {
			p.Close()
		}
	}
}

// RegisterMetrics exposes upstream state, read when Prometheus scrapes.
func (b *Backend) RegisterMetrics(reg prometheus.Registerer) {
	reg.MustRegister(&backendCollector{b: b})
}

type backendCollector struct{ b *Backend }

var (
	descUp       = prometheus.NewDesc("redproxy_upstream_connections_up", "Shared upstream connections currently established.", []string{"db", "protocol"}, nil)
	descPending  = prometheus.NewDesc("redproxy_upstream_queue_depth", "Client batches sent or queued on shared upstream connections and not yet answered.", []string{"db", "protocol"}, nil)
	descFailures = prometheus.NewDesc("redproxy_upstream_connection_failures_total", "Shared upstream connections lost (errors, timeouts, Redis going away).", []string{"db", "protocol"}, nil)
	descTimeouts = prometheus.NewDesc("redproxy_upstream_timeouts_total", "Shared upstream connections closed because a reply took longer than upstream.reply_timeout.", []string{"db", "protocol"}, nil)
	descDials    = prometheus.NewDesc("redproxy_upstream_dials_total", "Connection attempts to Redis.", []string{"db", "protocol"}, nil)
	descCommands = prometheus.NewDesc("redproxy_upstream_commands_total", "Commands written to Redis on shared connections.", []string{"db", "protocol"}, nil)
)

func (c *backendCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descUp, descPending, descFailures, descTimeouts, descDials, descCommands} {
		ch <- d
	}
}

func (c *backendCollector) Collect(ch chan<- prometheus.Metric) {
	for i := range c.b.pools {
		p := c.b.pools[i].Load()
		if p == nil {
			continue
		}
		db := itoa(i / 2)
		proto := "resp2"
		if i%2 == 1 {
			proto = "resp3"
		}
		s, up := p.Stats()
		ch <- prometheus.MustNewConstMetric(descUp, prometheus.GaugeValue, float64(up), db, proto)
		ch <- prometheus.MustNewConstMetric(descPending, prometheus.GaugeValue, float64(s.Pending), db, proto)
		ch <- prometheus.MustNewConstMetric(descFailures, prometheus.CounterValue, float64(s.Failures), db, proto)
		ch <- prometheus.MustNewConstMetric(descTimeouts, prometheus.CounterValue, float64(s.Timeouts), db, proto)
		ch <- prometheus.MustNewConstMetric(descDials, prometheus.CounterValue, float64(s.Dials), db, proto)
		ch <- prometheus.MustNewConstMetric(descCommands, prometheus.CounterValue, float64(s.Commands), db, proto)
	}
}
