package proxy

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"syscall"

	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/resp"
)

// Every session ends for exactly one reason (metrics.CloseReasons), counted
// in redproxy_clients_closed_total{reason} when serve returns, as
// nats-server records a ClosedState. Whoever decides or first sees that the
// session must end records why (closing): QUIT, a protocol error, the
// output limit, a write timeout, a failed write, the idle timeout, the
// client's or the upstream's side closing. The first reason recorded wins,
// because it explains what fails after it: a client closed for its output
// limit then also fails to read. A shutdown or CLIENT KILL explains any
// failure that follows it.

// logger returns the session's logger, which names the client in every
// line. It is built on first use: most sessions never log.
func (sess *Session) logger() *slog.Logger {
	if l := sess.log.Load(); l != nil {
		return l
	}
	l := sess.srv.log.With("client_id", sess.id, "client", sess.nc.RemoteAddr().String())
	if !sess.log.CompareAndSwap(nil, l) {
		return sess.log.Load()
	}
	return l
}

// closing records why the session ends, unless a reason is recorded
// already. Safe from the session's other goroutines (relay).
func (sess *Session) closing(reason string) {
	if sess.closeReason.Load() != nil {
		return
	}
	if sess.interrupted.Load() {
		reason = sess.interruptReason()
	}
	sess.closeReason.CompareAndSwap(nil, &reason)
}

// closedFor returns the reason recorded, or "" when none is.
func (sess *Session) closedFor() string {
	if r := sess.closeReason.Load(); r != nil {
		return *r
	}
	return ""
}

// ended counts the session's end under its reason and logs it. A path
// that recorded none is a bug; it is counted as the client's own close.
func (sess *Session) ended() {
	sess.setUser(nil) // gives back the user's connection (max_connections)
	reason := sess.closedFor()
	if reason == "" {
		reason = metrics.CloseClient
		sess.logger().Error("BUG: client connection ended without a recorded reason")
	}
	sess.srv.metrics.ClientClosed(reason)
	if sess.srv.log.Enabled(context.Background(), slog.LevelDebug) {
		sess.logger().Debug("client closed", "reason", reason)
	}
}

// closeFor records that the proxy closes the client for reason, a decision
// of its own (output limit, write timeout), and logs it.
func (sess *Session) closeFor(reason, msg string, attrs ...any) {
	sess.closing(reason)
	if reason == metrics.CloseOutputLimit {
		sess.srv.metrics.SlowConsumers.Inc()
	}
	// One line a second: a client library reconnecting in a loop, or
	// many clients fetching one big key, would otherwise write a line per
	// connection (found by review: 1,000 lines in 2 s). The metric counts
	// every close.
	if n, ok := sess.srv.closeLogFor(reason).allow(); ok {
		sess.logger().Warn("closing client: "+msg, append([]any{"reason", reason, "suppressed", n}, attrs...)...)
	}
}

// closeLogFor is the limiter of closeFor's warning for reason: one per
// reason, so that a flood of one kind (output limits) does not hide
// another (a relayed stream that is not RESP).
func (s *Server) closeLogFor(reason string) *logLimiter {
	if l, ok := s.closeLogs.Load(reason); ok {
		return l.(*logLimiter)
	}
	l, _ := s.closeLogs.LoadOrStore(reason, new(logLimiter))
	return l.(*logLimiter)
}

// interruptReason tells a shutdown from a CLIENT KILL; both interrupt.
func (sess *Session) interruptReason() string {
	sess.srv.mu.Lock()
	defer sess.srv.mu.Unlock()
	if sess.srv.closing {
		return metrics.CloseShutdown
	}
	return metrics.CloseKilled
}

// readEnded records why reading the client's requests failed, and logs
// what is worth it.
func (sess *Session) readEnded(err error) {
	var pe *resp.ProtocolError
	switch {
	case errors.As(err, &pe):
		sess.closing(metrics.CloseProtocolError)
		sess.logger().Debug("closing client after protocol error", "err", pe.Msg)
	case sess.interrupted.Load():
		sess.closing(sess.interruptReason())
	case errors.Is(err, os.ErrDeadlineExceeded):
		sess.closing(metrics.CloseIdleTimeout)
	case errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed), errors.Is(err, syscall.ECONNRESET):
		// The client closed (a reset: it closed with replies unread).
		sess.closing(metrics.CloseClient)
	default:
		sess.closing(metrics.CloseReadError)
		sess.logger().Debug("client read failed", "err", err)
	}
}
