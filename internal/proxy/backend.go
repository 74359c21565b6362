package proxy

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
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
	MaxPinned                int
	DialTimeout              time.Duration
	ReplyTimeout             time.Duration
	DeadTimeout              time.Duration
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

	// Dedicated connections: pinned to one client for a transaction or a
	// blocking command, or relayed raw for pub/sub and MONITOR. pinned
	// counts those in use; idle keeps clean ones for reuse per DB and
	// protocol, so a transaction does not pay a dial.
	pinned    atomic.Int64
	idleMu    sync.Mutex
	idle      map[int][]*upstream.Pipe
	closedDed bool
}

// ErrTooManyPinned is returned when upstream.max_pinned dedicated
// connections are already in use.
var ErrTooManyPinned = errors.New("redproxy: too many dedicated upstream connections in use (upstream.max_pinned)")

const maxIdlePerKey = 16

// AcquirePipe returns a dedicated pipelined connection for one client.
func (b *Backend) AcquirePipe(db int, resp3 bool) (*upstream.Pipe, error) {
	if b.pinned.Add(1) > int64(b.opt.MaxPinned) {
		b.pinned.Add(-1)
		return nil, ErrTooManyPinned
	}
	key := db*2 + btoi(resp3)
	b.idleMu.Lock()
	for n := len(b.idle[key]); n > 0; n = len(b.idle[key]) {
		p := b.idle[key][n-1]
		b.idle[key] = b.idle[key][:n-1]
		if p.Up() {
			b.idleMu.Unlock()
			return p, nil
		}
		go p.Close()
	}
	b.idleMu.Unlock()
	o := b.Options(db, resp3)
	o.Name = "redproxy-pinned"
	p, err := upstream.DialPipe(o)
	if err != nil {
		b.pinned.Add(-1)
		return nil, fmt.Errorf("%w: %v", upstream.ErrUnavailable, err)
	}
	return p, nil
}

// ReleasePipe gives a dedicated connection back. Only a connection whose
// state the caller knows to be clean (no MULTI, no WATCH, the DB and
// protocol it was dialled with) may be reused; anything else is closed.
func (b *Backend) ReleasePipe(p *upstream.Pipe, db int, resp3, clean bool) {
	b.pinned.Add(-1)
	if clean && p.Up() {
		key := db*2 + btoi(resp3)
		b.idleMu.Lock()
		if !b.closedDed && len(b.idle[key]) < maxIdlePerKey {
			if b.idle == nil {
				b.idle = make(map[int][]*upstream.Pipe)
			}
			b.idle[key] = append(b.idle[key], p)
			b.idleMu.Unlock()
			return
		}
		b.idleMu.Unlock()
	}
	go p.Close()
}

// AcquireConn dials a raw dedicated connection for relaying (pub/sub,
// MONITOR, client-side tracking). It is never reused.
func (b *Backend) AcquireConn(db int, resp3 bool) (net.Conn, error) {
	if b.pinned.Add(1) > int64(b.opt.MaxPinned) {
		b.pinned.Add(-1)
		return nil, ErrTooManyPinned
	}
	o := b.Options(db, resp3)
	o.Name = "redproxy-relay"
	nc, err := upstream.Dial(o)
	if err != nil {
		b.pinned.Add(-1)
		return nil, fmt.Errorf("%w: %v", upstream.ErrUnavailable, err)
	}
	return nc, nil
}

// ReleaseConn closes a relayed connection.
func (b *Backend) ReleaseConn(nc net.Conn) {
	nc.Close()
	b.pinned.Add(-1)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
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
		DialTimeout: b.opt.DialTimeout, ReplyTimeout: b.opt.ReplyTimeout, DeadTimeout: b.opt.DeadTimeout,
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

// RoundTrip runs one command on a connection of its own (see busy.go).
func (b *Backend) RoundTrip(resp3 bool, raw []byte) ([]byte, error) {
	o := b.Options(0, resp3)
	o.Name = "redproxy-alone"
	return upstream.RoundTrip(o, raw)
}

var cmdPing = []byte("*1\r\n$4\r\nPING\r\n")

// Ready reports whether Redis answers a PING with PONG on a shared
// connection of DB 0, promptly: a Redis that is unreachable, busy running a
// script (-BUSY), loading its dataset (-LOADING) or not answering is not
// ready to serve clients, whatever the state of the proxy's connections.
func (b *Backend) Ready() bool {
	p := b.Pool(0, false)
	if !p.Up() {
		return false
	}
	c := upstream.NewCall()
	c.Add(cmdPing)
	if err := p.Send(c); err != nil {
		return false
	}
	t := time.NewTimer(min(b.opt.ReplyTimeout, time.Second))
	defer t.Stop()
	select {
	case <-c.Done():
	case <-t.C:
		return false // the Call is dropped; the pipe completes it unseen
	}
	r, err := c.Reply(0)
	return err == nil && string(r) == "+PONG\r\n"
}

// Close closes every pool and waits for their goroutines.
func (b *Backend) Close() {
	b.idleMu.Lock()
	b.closedDed = true
	for _, ps := range b.idle {
		for _, p := range ps {
			p.Close()
		}
	}
	b.idle = nil
	b.idleMu.Unlock()
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
	descTimeouts = prometheus.NewDesc("redproxy_upstream_timeouts_total", "Shared upstream connections closed because Redis answered nothing, not even a PING on a fresh connection, for upstream.dead_timeout.", []string{"db", "protocol"}, nil)
	descOverdue  = prometheus.NewDesc("redproxy_upstream_overdue_replies_total", "Times a shared upstream connection's oldest reply took longer than upstream.reply_timeout and Redis was probed (slow command, busy script, CLIENT PAUSE, or a dead server).", []string{"db", "protocol"}, nil)
	descDials    = prometheus.NewDesc("redproxy_upstream_dials_total", "Connection attempts to Redis.", []string{"db", "protocol"}, nil)
	descPinned   = prometheus.NewDesc("redproxy_upstream_dedicated_connections", "Dedicated upstream connections in use (transactions, blocking commands, pub/sub, MONITOR).", nil, nil)
	descCommands = prometheus.NewDesc("redproxy_upstream_commands_total", "Commands written to Redis on shared connections.", []string{"db", "protocol"}, nil)
)

func (c *backendCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descPinned
	for _, d := range []*prometheus.Desc{descUp, descPending, descFailures, descTimeouts, descOverdue, descDials, descCommands} {
		ch <- d
	}
}

func (c *backendCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(descPinned, prometheus.GaugeValue, float64(c.b.pinned.Load()))
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
		ch <- prometheus.MustNewConstMetric(descOverdue, prometheus.CounterValue, float64(s.Overdue), db, proto)
		ch <- prometheus.MustNewConstMetric(descDials, prometheus.CounterValue, float64(s.Dials), db, proto)
		ch <- prometheus.MustNewConstMetric(descCommands, prometheus.CounterValue, float64(s.Commands), db, proto)
	}
}
