// Package metrics holds the proxy's Prometheus metrics. Per-command metric
// handles are resolved once per command name and cached, so the hot path
// does no label hashing.
package metrics

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics is one registry and the metrics the data path updates directly.
// Gauges that mirror other packages' state are registered as collectors by
// their owners through Registry.
type Metrics struct {
	Registry *prometheus.Registry

	commands *prometheus.CounterVec
	errors   *prometheus.CounterVec
	latency  *latencyVec

	ClientsConnected prometheus.Gauge
	ClientsTotal     prometheus.Counter
	ClientsRejected  prometheus.Counter
	ProtocolErrors   prometheus.Counter
	SlowConsumers    prometheus.Counter
	// SlowCommands counts entries of the slow log, by the command that
	// named the batch.
	SlowCommands *prometheus.CounterVec
	// ClientsClosed counts ended client connections by reason (the Close*
	// constants); count through ClientClosed.
	ClientsClosed *prometheus.CounterVec
	// BatchRequests is the number of requests per batch a client's
	// pipeline was split into.
	BatchRequests prometheus.Histogram
	// DirectReplies counts replies the upstream connection's reader wrote
	// to the client itself (a lone forwarded command).
	DirectReplies prometheus.Counter

	mu     sync.Mutex
	byName atomic.Pointer[map[string]*Command] // copy-on-write: reads take no lock
}

// Command holds the metrics of one command name.
type Command struct {
	Calls   prometheus.Counter
	Errors  prometheus.Counter
	Latency *Latency
}

// New registers the data-path metrics and the Go runtime collectors.
func New() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		commands: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "redproxy_commands_total", Help: "Commands received from clients, by command name.",
		}, []string{"command"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "redproxy_command_errors_total", Help: "Commands answered with an error reply (from Redis or the proxy), by command name.",
		}, []string{"command"}),
		latency: newLatencyVec(),
		ClientsConnected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "redproxy_client_connections", Help: "Client connections currently open.",
		}),
		ClientsTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "redproxy_client_connections_total", Help: "Client connections accepted, those then refused at server.max_clients included (redproxy_client_connections_rejected_total); Redis's total_connections_received leaves those out.",
		}),
		ClientsRejected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "redproxy_client_connections_rejected_total", Help: "Client connections refused because server.max_clients was reached.",
		}),
		ProtocolErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "redproxy_client_protocol_errors_total", Help: "Client connections closed for malformed or oversized requests.",
		}),
		SlowConsumers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "redproxy_client_slow_consumers_total", Help: "Client connections closed because their output exceeded the output limit.",
		}),
		SlowCommands: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "redproxy_slow_commands_total", Help: "Batches slower than server.slowlog_threshold (entries of /debug/slowlog), by their first command.",
		}, []string{"command"}),
		ClientsClosed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "redproxy_clients_closed_total", Help: "Client connections closed, by reason.",
		}, []string{"reason"}),
		BatchRequests: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "redproxy_client_batch_requests",
			Help:    "Requests per batch read from a client's pipeline (capped, so a deep pipeline is split).",
			Buckets: prometheus.ExponentialBuckets(1, 4, 6), // 1 .. 1024
		}),
		DirectReplies: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "redproxy_direct_replies_total", Help: "Replies to a lone forwarded command that the upstream connection's reader wrote to the client itself, without waking the client's session.",
		}),
	}
	// Every reason is exported from the start, so a dashboard's rate() has
	// a series before the first close of that kind.
	for _, r := range CloseReasons {
		m.ClientsClosed.WithLabelValues(r)
	}
	m.byName.Store(&map[string]*Command{})
	m.Registry.MustRegister(m.commands, m.errors, m.latency, m.ClientsConnected, m.ClientsTotal,
		m.ClientsRejected, m.ProtocolErrors, m.SlowConsumers, m.SlowCommands, m.ClientsClosed, m.BatchRequests,
		m.DirectReplies, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Why a client connection ended: the values of redproxy_clients_closed_total's
// reason label.
const (
	CloseQuit          = "quit"           // the client sent QUIT
	CloseClient        = "client_closed"  // the client closed its side
	CloseProtocolError = "protocol_error" // malformed or oversized request
	CloseIdleTimeout   = "idle_timeout"   // server.idle_timeout passed with no request
	CloseShutdown      = "shutdown"       // the proxy is shutting down
	CloseKilled        = "killed"         // CLIENT KILL
	CloseWriteError    = "write_error"    // writing a reply failed (client gone, slow consumer)
	CloseReadError     = "read_error"     // reading failed for another reason
	ClosePanic         = "internal_error" // a bug while serving the client
	// CloseOutputLimit: replies waiting for the client exceeded
	// server.client_output_limit (or pubsub_output_limit on a relay).
	CloseOutputLimit = "output_limit"
	// CloseWriteTimeout: the client took none of its replies within
	// server.client_write_timeout.
	CloseWriteTimeout = "write_timeout"
	// CloseUpstreamLost: the client's own upstream connection ended under
	// it (a relay's connection closed by Redis, the connection a blocking
	// command or WAIT was waiting on lost, or SHUTDOWN), or a relay could
	// not get one because the upstream is down (the client is told, then
	// closed, so that it reconnects and subscribes again).
	CloseUpstreamLost = "upstream_lost"
	// CloseHeldWrites: a relayed client whose replies may be muted (CLIENT
	// REPLY) wrote more than the relay can keep track of, and would not
	// have seen the refusal.
	CloseHeldWrites = "held_writes"
	// CloseCrossProtocol: the client sent POST or Host: as a command, an
	// HTTP request aimed at the port (cross-protocol scripting); Redis
	// closes such a connection too.
	CloseCrossProtocol = "cross_protocol"
)

// CloseReasons lists every reason label value.
var CloseReasons = []string{CloseQuit, CloseClient, CloseProtocolError, CloseIdleTimeout,
	CloseShutdown, CloseKilled, CloseWriteError, CloseReadError, ClosePanic, CloseOutputLimit, CloseWriteTimeout,
	CloseUpstreamLost, CloseHeldWrites, CloseCrossProtocol}

// ClientClosed counts one closed client connection. reason is one of
// CloseReasons. It is called once per connection, not per command, so the
// label lookup is not on the hot path.
func (m *Metrics) ClientClosed(reason string) { m.ClientsClosed.WithLabelValues(reason).Inc() }

// Command returns the cached metrics of a command name. name must be a
// bounded set (the command table's names, or "unknown"), never client input.
func (m *Metrics) Command(name string) *Command {
	if c := (*m.byName.Load())[name]; c != nil {
		return c
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	old := *m.byName.Load()
	if c := old[name]; c != nil {
		return c
	}
	c := &Command{
		Calls:   m.commands.WithLabelValues(name),
		Errors:  m.errors.WithLabelValues(name),
		Latency: m.latency.get(name),
	}
	next := make(map[string]*Command, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	next[name] = c
	m.byName.Store(&next)
	return c
}
