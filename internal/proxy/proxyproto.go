package proxy

import (
	"errors"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/redproxy/redproxy/internal/proxyproto"
)

// The PROXY protocol on the client listeners (server.proxy_protocol):
//
//   - Every accepted connection must start with a version 1 or 2 header,
//     read on a goroutine of its own within proxyHeaderTimeout and bounded
//     in size (package proxyproto), before anything else, the TLS handshake
//     on the TLS listener included. Connections waiting for their header
//     count against max_clients.
//   - The client's address from the header replaces the socket's peer in
//     everything that shows or keys on it (CLIENT LIST/INFO addr, CLIENT
//     KILL ADDR, logs, the slow log, the failed-AUTH limit, policy reports):
//     they all ask the connection's RemoteAddr, which proxiedConn answers.
//     laddr stays the proxy's own listener address.
//   - Bytes the load balancer sent after the header in the same read are
//     served first by proxiedConn. resp.Reader waits on the socket itself
//     when it can (bypassing Read), so a connection with such bytes is
//     read through Read with a small idle buffer (Reader.WaitSmall), as a
//     TLS client is; one without them keeps the socket path.
//   - A connection without a valid header is closed, counted by reason and
//     logged at most once a second.

// proxyHeaderTimeout bounds the wait for a connection's PROXY header.
const proxyHeaderTimeout = 5 * time.Second

// Reasons a connection's PROXY header was refused
// (redproxy_client_proxy_header_failures_total).
const (
	proxyFailMissing = "missing" // the connection started with something else
	proxyFailInvalid = "invalid" // malformed or too long
	proxyFailTimeout = "timeout" // no complete header within proxyHeaderTimeout
	proxyFailClosed  = "closed"  // the peer left or reset before a complete header
)

// proxyProtoState is the server's part of the PROXY protocol.
type proxyProtoState struct {
	failures *prometheus.CounterVec
	logLimit logLimiter
	// pending are the connections whose header is being read; Shutdown
	// closes them. Guarded by Server.mu.
	pending map[net.Conn]struct{}
	// waiting is len(pending), read without Server.mu by startSession:
	// they count against max_clients on every listener, or a flood of
	// silent ones on a PROXY-protocol port held max_clients descriptors
	// while as many clients again were served on the others (found by a
	// probe).
	waiting atomic.Int64
}

func initProxyProtocol(s *Server) error {
	p := &s.proxyProto
	p.pending = make(map[net.Conn]struct{})
	p.failures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "redproxy_client_proxy_header_failures_total",
		Help: "Client connections closed for want of a valid PROXY protocol header (server.proxy_protocol), by reason: missing, invalid, timeout, closed.",
	}, []string{"reason"})
	for _, r := range []string{proxyFailMissing, proxyFailInvalid, proxyFailTimeout, proxyFailClosed} {
		p.failures.WithLabelValues(r)
	}
	return s.metrics.Registry.Register(p.failures)
}

// acceptProxied reads a new connection's PROXY header on a goroutine of
// its own, then serves the client as accept would have.
func (s *Server) acceptProxied(nc net.Conn, l *listener) {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		nc.Close()
		return
	}
	if int64(len(s.proxyProto.pending))+s.clients.Load() >= int64(s.maxClients()) {
		// Connections waiting for their header count against max_clients
		// too, or a flood of silent ones could hold every descriptor for
		// proxyHeaderTimeout. Nothing can be said to them: whatever the
		// load balancer relays is not read yet.
		s.mu.Unlock()
		s.metrics.ClientsRejected.Inc()
		if suppressed, ok := s.maxClientsLog.allow(); ok {
			// As startSession's (the address is the load balancer's:
			// the header naming the client is not read).
			s.log.Warn("client refused: server.max_clients reached", "max_clients", s.maxClients(),
				"client", nc.RemoteAddr().String(), "listener", l.cfg.Name, "refused_not_logged", suppressed)
		}
		nc.Close()
		return
	}
	s.proxyProto.pending[nc] = struct{}{}
	s.proxyProto.waiting.Add(1)
	s.active.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.active.Done()
		pc, err := s.readProxyHeader(nc)
		s.mu.Lock()
		delete(s.proxyProto.pending, nc)
		s.proxyProto.waiting.Add(-1)
		closing := s.closing
		s.mu.Unlock()
		if err != nil || closing {
			nc.Close()
			return
		}
		s.startSession(pc, l)
	}()
}

// readProxyHeader reads nc's header and returns the connection to serve,
// or an error once the refusal is counted and logged.
func (s *Server) readProxyHeader(nc net.Conn) (net.Conn, error) {
	nc.SetReadDeadline(time.Now().Add(proxyHeaderTimeout))
	h, rest, err := proxyproto.Read(nc)
	if err == nil {
		err = nc.SetReadDeadline(time.Time{})
	}
	if err != nil {
		s.mu.Lock()
		closing := s.closing
		s.mu.Unlock()
		if closing {
			return nil, err
		}
		reason := proxyFailClosed
		switch {
		case errors.Is(err, proxyproto.ErrNoHeader):
			reason = proxyFailMissing
		case errors.Is(err, proxyproto.ErrInvalid), errors.Is(err, proxyproto.ErrTooLong):
			reason = proxyFailInvalid
		case errors.Is(err, os.ErrDeadlineExceeded):
			reason = proxyFailTimeout
		}
		s.proxyProto.failures.WithLabelValues(reason).Inc()
		if n, ok := s.proxyProto.logLimit.allow(); ok {
			s.log.Warn("client connection without a valid PROXY protocol header closed (server.proxy_protocol is on: connect through the load balancer)",
				"peer", nc.RemoteAddr().String(), "reason", reason, "err", err, "similar_failures_not_logged", n)
		}
		return nil, err
	}
	pc := &proxiedConn{Conn: nc, remote: nc.RemoteAddr(), rest: rest, buffered: len(rest) > 0}
	if h.Source != nil {
		pc.remote = h.Source
	}
	return pc, nil
}

// proxiedConn is a client connection that came through a load balancer
// speaking the PROXY protocol.
type proxiedConn struct {
	net.Conn          // the socket
	remote   net.Addr // the client's address, from the header
	// rest is what was read past the header, served before the socket's
	// bytes; only the session goroutine reads it.
	rest []byte
	// buffered: rest was not empty when the header was read. Fixed, so
	// that SyscallConn gives the same answer whenever it is asked.
	buffered bool
}

func (c *proxiedConn) Read(b []byte) (int, error) {
	if len(c.rest) > 0 {
		n := copy(b, c.rest)
		c.rest = c.rest[n:]
		if len(c.rest) == 0 {
			c.rest = nil
		}
		return n, nil
	}
	return c.Conn.Read(b)
}

func (c *proxiedConn) RemoteAddr() net.Addr { return c.remote }

// SyscallConn lets resp.Reader wait on the socket and read it directly,
// which would skip the bytes in rest: it is refused for a connection that
// had any. What only peeks at the socket goes through socketOf.
func (c *proxiedConn) SyscallConn() (syscall.RawConn, error) {
	if c.buffered {
		return nil, errors.ErrUnsupported
	}
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, errors.ErrUnsupported
	}
	return sc.SyscallConn()
}
