package proxy

import (
	"errors"

	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/upstream"
)

// A client on a connection of its own (a blocking command's, a relay's)
// sees Redis's restart or a lost connection as Redis would show it: its
// connection closes. Client libraries resend a command that was never
// answered when their connection closes (ioredis, go-redis on a network
// error) and resubscribe when they reconnect (redis-py, ioredis), but take
// an error reply as the command's answer: a BLPOP answered
// "-ERR redproxy: upstream connection lost" is a failed pop the worker
// does not retry, and a SUBSCRIBE refused while Redis is down left
// redis-py on an open connection subscribed to nothing, for good (found
// by the client review, review/clients on branch clientreview).
//
// Commands on the shared connections keep failing fast with an error
// reply while Redis is down (docs/COMPATIBILITY.md): closing every client
// on an outage would cost them their pipelined replies and make them all
// reconnect at once.

// dedicatedLost reports whether err, the outcome of a command sent on a
// client's dedicated connection (a blocking command, WAIT), says the
// connection was lost after the command was sent: Redis may or may not
// have run it, and the client's connection is closed without a reply, as
// Redis's own end would close it. A timeout the proxy imposed, the output
// limit or an UNBLOCK are answers, not losses.
func dedicatedLost(err error) bool {
	return errors.Is(err, upstream.ErrConnLost)
}

// upstreamDown reports whether err, from getting a dedicated connection
// for a relay (SUBSCRIBE, PSUBSCRIBE, SSUBSCRIBE, MONITOR, CLIENT TRACKING
// ON), says the upstream could not be reached: the dial failed, or Redis
// refused the connection for its client limit (and closed it). The
// refusal is answered and then the client's connection closed, so that
// the library reconnects and subscribes again, as it does when Redis
// refuses its connection. Definitive refusals (the user's ACL, a
// handshake Redis refused for credentials or a DB, upstream.max_pinned,
// routing, the guard) are not: the client keeps its connection.
func upstreamDown(err error) bool {
	if errors.Is(err, upstream.ErrTimeout) {
		// A dedicated connection's handshake Redis did not answer within
		// dead_timeout (paused, frozen): as unreachable (found by review:
		// a subscriber told "upstream reply timeout" kept its connection,
		// unsubscribed).
		return true
	}
	if !errors.Is(err, upstream.ErrUnavailable) {
		return false
	}
	if refusal, ok := errors.AsType[*upstream.HandshakeRefusal](err); ok {
		return refusal.ClientLimit()
	}
	return true
}

// closeUpstreamLost ends the session after its batch's replies so far
// (any error reply just given included) are written.
func (sess *Session) closeUpstreamLost() {
	sess.closing(metrics.CloseUpstreamLost)
	sess.quitting = true
}
