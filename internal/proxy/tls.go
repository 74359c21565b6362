package proxy

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/upstream"
)

// TLS on the client side ([server.tls]):
//
//   - ServeTLS accepts on a listener of its own and wraps each connection
//     with tls.Server; the handshake runs on the client's goroutine, bounded
//     by server.tls.handshake_timeout, so a client that connects and says
//     nothing holds up nobody else's accept.
//   - The listener's tls.Config asks for the configuration in force on
//     every handshake (GetConfigForClient), and a reload swaps it whole: a
//     rotated certificate, client CA or min_version applies to connections
//     accepted after the reload, and connections already up keep the
//     session they negotiated.
//   - A *tls.Conn has no socket the resp.Reader can wait on without a
//     buffer (the bytes must be decrypted first), so TLS clients are read
//     through io.Reader; clientConn does not forward SyscallConn for them.
//     What an idle TLS client costs is measured in README "TLS".

// notTLSReply is what a client that speaks plaintext RESP to the TLS port
// is told before it is closed, in plaintext so that it can read it.
var notTLSReply = []byte("-ERR this port speaks TLS: connect with TLS (redis-cli --tls), or use the plaintext port\r\n")

// tlsState is the client-side TLS the server serves with (each TLS
// listener's own configuration is in listeners.go).
type tlsState struct {
	// upstream is the TLS configuration for connections to Redis, nil for
	// plaintext. A reload stores it (under Server.reloadMu); it is loaded
	// without that lock wherever pools are built: the replica pollers
	// (primary's, routes', cluster's), a session's first replica read with
	// its own credential (replicaNode.backendFor), the user backends.
	upstream atomic.Pointer[tls.Config]

	failures *prometheus.CounterVec
	logLimit logLimiter
}

// Reasons a client's TLS handshake failed (redproxy_client_tls_handshake_failures_total).
const (
	tlsFailNotTLS  = "not_tls"   // plaintext sent to the TLS port
	tlsFailTimeout = "timeout"   // no complete handshake within server.tls.handshake_timeout
	tlsFailRefused = "handshake" // version, cipher or certificate refused (by either side)
	tlsFailClosed  = "closed"    // closed or reset by the client mid-handshake: a TCP health check
)

func initTLS(s *Server) error {
	t := &s.tls
	t.failures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "redproxy_client_tls_handshake_failures_total",
		Help: "Client TLS handshakes that failed, by reason: not_tls (plaintext sent to the TLS port), timeout, handshake (refused certificate, version or cipher), closed (the client closed or reset the connection before the handshake finished, as a TCP health check does).",
	}, []string{"reason"})
	for _, r := range []string{tlsFailNotTLS, tlsFailTimeout, tlsFailRefused, tlsFailClosed} {
		t.failures.WithLabelValues(r)
	}
	if err := s.metrics.Registry.Register(t.failures); err != nil {
		return err
	}
	if err := initListeners(s); err != nil {
		return err
	}
	up, err := s.cfg.Upstream.ClientTLS()
	if err != nil {
		return err
	}
	t.upstream.Store(up)
	warnInsecureUpstream(s, s.cfg)
	return nil
}

// warnInsecureUpstream says loudly that Redis's certificate is not checked.
func warnInsecureUpstream(s *Server, c *config.Config) {
	if c.Upstream.TLS != nil && c.Upstream.TLS.InsecureSkipVerify {
		s.log.Warn("INSECURE: upstream.tls.insecure_skip_verify is set: Redis's certificate is NOT verified, so anyone on the network path can pose as Redis and read every command and reply. Set upstream.tls.ca_file instead.",
			"upstream", c.Upstream.Address)
	}
}

// reloadTLS reads next's certificate files again. It returns what to
// apply once the rest of the reload is accepted, which says the client
// listeners whose certificate changed: a rotated certificate is a reload
// even when no setting changed. apply(false) leaves the upstream
// TLS configuration as it is (cluster mode cannot switch it).
func (s *Server) reloadTLS(next *config.Config) (apply func(upstream bool) (rotated []string), up *tls.Config, upstreamChanged bool, err error) {
	applyListeners, err := s.reloadListenerTLS(next)
	if err != nil {
		return nil, nil, false, err
	}
	up, err = next.Upstream.ClientTLS()
	if err != nil {
		return nil, nil, false, err
	}
	upstreamChanged = !sameClientTLS(s.tls.upstream.Load(), up)
	return func(upstream bool) []string {
		rotated := applyListeners()
		if upstream {
			s.tls.upstream.Store(up)
			warnInsecureUpstream(s, next)
		}
		return rotated
	}, up, upstreamChanged, nil
}

// verifiesUpstream dials the upstream next names with the TLS
// configuration up (nil: no TLS, nothing to verify) and refuses it when
// Redis's certificate does not verify: applied, a CA file rotated to one that does not sign Redis's
// certificate failed every request until the next reload (found by a
// probe: 19,728 "upstream unavailable" in a run). A Redis that cannot be
// reached says nothing of the files, and the reload goes on.
func (s *Server) verifiesUpstream(next *config.Config, up *tls.Config) error {
	if up == nil {
		return nil
	}
	addr := next.Upstream.Address
	if next.Upstream.Mode == config.ModeSentinel || addr == config.EmbeddedAddress {
		addr = s.upstreamAddr
	}
	d := net.Dialer{Timeout: next.Upstream.DialTimeout.Duration}
	err, refused := probeTLS(&d, addr, up, next.Upstream.DialTimeout.Duration)
	if refused != nil {
		return &config.Error{Key: "upstream.tls", Msg: fmt.Sprintf("Redis at %s refuses the client certificate of the new files, so every connection would fail; the configuration in force stays: %v", addr, refused)}
	}
	if err != nil && unverified(err) {
		return &config.Error{Key: "upstream.tls", Msg: fmt.Sprintf("Redis at %s presents a certificate the new files do not verify, so every connection would fail; the configuration in force stays: %v", addr, err)}
	}
	if next.Upstream.Mode != config.ModeSentinel {
		return nil
	}
	// The Sentinels are dialled with the same files (Watcher.SetTLS):
	// files that verify the data servers but no Sentinel were taken, and
	// the next Sentinel connection dialled after the reload failed, so
	// failovers were no longer followed (found by review). One Sentinel
	// that verifies is enough; unreachable ones say nothing. All at once,
	// under one deadline: the reload holds reloadMu, which a failover
	// waits for, and one after the other unreachable Sentinels held it
	// for twice the dial timeout each (review).
	type result struct {
		addr string
		err  error
	}
	results := make(chan result, len(next.Upstream.Sentinels))
	d.Deadline = time.Now().Add(2 * next.Upstream.DialTimeout.Duration)
	for _, sa := range next.Upstream.Sentinels {
		go func() {
			err, refused := probeTLS(&d, sa, up, time.Until(d.Deadline))
			if refused != nil {
				err = refused
			}
			results <- result{sa, err}
		}()
	}
	var refusal error
	for range next.Upstream.Sentinels {
		r := <-results
		if r.err == nil {
			return nil
		}
		if (unverified(r.err) || tlsAlert(r.err)) && refusal == nil {
			refusal = &config.Error{Key: "upstream.tls", Msg: fmt.Sprintf("the Sentinel at %s presents a certificate the new files do not verify, or refuses their client certificate (nor does any other Sentinel reached take them), so the proxy could not follow a failover; the configuration in force stays: %v", r.addr, r.err)}
		}
	}
	return refusal
}

// probeTLS dials addr with up and returns the dial's error, or, for a
// dial that worked, refused: why the server then refused the connection
// (nil when it did not). Under TLS 1.3 the client's handshake ends before
// the server has checked the client's certificate, so a certificate Redis
// refuses (signed by a CA it does not trust, or none where it requires
// one) shows only at the first read, and such files were taken by a
// reload (every connection then failed). The probe sends PING: a reply
// says the files do; a TLS alert says Redis refused them. Closed under the
// PING, the reset can discard the alert (CI under -race saw the reload
// accepted so), so a second connection sends nothing and reads: an alert
// or a close there is a refusal; silence until wait says nothing against
// the files.
func probeTLS(d *net.Dialer, addr string, up *tls.Config, wait time.Duration) (err, refused error) {
	nc, err := upstream.DialConn(d, addr, up)
	if err != nil {
		return err, nil
	}
	err = firstRead(nc, wait, true)
	nc.Close()
	switch {
	case err == nil:
		return nil, nil
	case tlsAlert(err):
		return nil, err
	case !upstream.PeerClosed(err):
		return nil, nil // silent or slow: nothing against the files
	}
	nc, err = upstream.DialConn(d, addr, up)
	if err != nil {
		return err, nil
	}
	err = firstRead(nc, wait, false)
	nc.Close()
	if tlsAlert(err) || upstream.PeerClosed(err) {
		return nil, err
	}
	return nil, nil
}

// firstRead reads what the server sends first on nc within wait, after a
// PING if ping; nil when bytes came.
func firstRead(nc net.Conn, wait time.Duration, ping bool) error {
	nc.SetDeadline(time.Now().Add(wait))
	if ping {
		if _, err := nc.Write([]byte("PING\r\n")); err != nil {
			return err
		}
	}
	var b [64]byte
	_, err := nc.Read(b[:])
	return err
}

// tlsAlert reports whether err is a TLS alert the peer sent.
func tlsAlert(err error) bool {
	return err != nil && strings.Contains(err.Error(), "remote error: tls:")
}

// unverified reports whether err is a TLS dial's failure to verify the
// server's certificate.
func unverified(err error) bool {
	var verify *tls.CertificateVerificationError
	var hostname x509.HostnameError
	var authority x509.UnknownAuthorityError
	var invalid x509.CertificateInvalidError
	return errors.As(err, &verify) || errors.As(err, &hostname) || errors.As(err, &authority) || errors.As(err, &invalid)
}

// sameClientTLS reports whether two upstream TLS configurations dial
// alike: same roots, client certificate, name and verification.
func sameClientTLS(a, b *tls.Config) bool {
	if a == nil || b == nil {
		return a == b
	}
	if a.ServerName != b.ServerName || a.InsecureSkipVerify != b.InsecureSkipVerify || !sameCertificates(a, b) {
		return false
	}
	if a.RootCAs == nil || b.RootCAs == nil {
		return a.RootCAs == b.RootCAs
	}
	return a.RootCAs.Equal(b.RootCAs)
}

func sameCertificates(a, b *tls.Config) bool {
	if a == nil || b == nil {
		return a == b
	}
	if len(a.Certificates) != len(b.Certificates) {
		return false
	}
	for i := range a.Certificates {
		x, y := a.Certificates[i].Certificate, b.Certificates[i].Certificate
		if len(x) != len(y) {
			return false
		}
		for j := range x {
			if !bytes.Equal(x[j], y[j]) {
				return false
			}
		}
	}
	return true
}

// ServeTLS accepts TLS clients on ln (a plain TCP listener: the server
// runs the handshakes) until Shutdown. [server.tls] must be configured.
func (s *Server) ServeTLS(ln net.Listener) error {
	l := s.listeners.byName[config.ListenerTLS]
	if l == nil {
		ln.Close()
		return errors.New("redproxy: ServeTLS without [server.tls] listen, cert_file and key_file")
	}
	return s.serve(ln, l)
}

// tlsHandshake runs a TLS client's handshake on its session goroutine and
// reports whether the session may go on. A failure is counted and logged
// (rate-limited: a scanner can cause many), and the client is closed.
func (s *Server) tlsHandshake(sess *Session, tc *tls.Conn) bool {
	tc.SetDeadline(time.Now().Add(s.Config().Server.TLS.Handshake()))
	if sess.interrupted.Load() {
		// Shut down between accept and here: the deadline just set would
		// have replaced the one interrupt set.
		return false
	}
	err := tc.Handshake()
	// Cleared before interrupted is read: an interrupt that comes after
	// this sets its own deadline, one before it is seen below.
	tc.SetDeadline(time.Time{})
	if err == nil {
		return !sess.interrupted.Load()
	}
	if sess.interrupted.Load() {
		return false
	}
	reason := tlsFailRefused
	var rhe tls.RecordHeaderError
	switch {
	case errors.As(err, &rhe) && rhe.Conn != nil:
		// Not TLS at all: most likely a client that forgot --tls. Tell it
		// in its own protocol; tls.Server left the socket to us for that.
		reason = tlsFailNotTLS
		rhe.Conn.SetWriteDeadline(time.Now().Add(time.Second))
		rhe.Conn.Write(notTLSReply)
	case errors.Is(err, os.ErrDeadlineExceeded):
		reason = tlsFailTimeout
	case err == io.EOF || errors.Is(err, syscall.ECONNRESET):
		// Connected and closed (or reset) with nothing sent: a load
		// balancer's TCP health check, no failure of anyone's TLS.
		// Counted apart and not logged, where it was counted and logged
		// as a refused handshake (found by a probe).
		s.tls.failures.WithLabelValues(tlsFailClosed).Inc()
		return false
	}
	s.tls.failures.WithLabelValues(reason).Inc()
	if n, ok := s.tls.logLimit.allow(); ok {
		s.log.Warn("client TLS handshake failed; connection closed", "client", tc.RemoteAddr().String(),
			"reason", reason, "err", err, "similar_failures_not_logged", n)
	}
	return false
}

// rejectTLS tells a TLS client over max_clients why it is closed, which
// needs a handshake; it runs on a goroutine of its own so the accept loop
// does not wait for it.
//
// Each waits for the client's handshake, holding a descriptor and a
// goroutine: at most maxTLSRejecting do at once, for at most
// tlsRejectTimeout, and the rest are closed without a word. Otherwise a
// flood of silent connections to the TLS port, each refused over
// max_clients, held one descriptor each for handshake_timeout (300
// connections held 300 descriptors, found by review), until accept and
// the upstream dials failed for want of descriptors.
func rejectTLS(tc *tls.Conn, timeout time.Duration) {
	tc.SetDeadline(time.Now().Add(timeout))
	if _, err := tc.Write(maxClientsReply); err != nil {
		// The handshake or the write failed: no close_notify for a peer
		// that is not reading (closeTLS).
		tc.NetConn().Close()
		return
	}
	tc.Close()
}

const (
	maxTLSRejecting  = 64
	tlsRejectTimeout = time.Second
)

// closeTLS closes a TLS client's connection. tls.Conn.Close first sends a
// close_notify alert, waiting up to 5 s for the socket to take it; after a
// write to the client failed (it stopped reading, or its deadline passed)
// that wait is for nothing, so the socket is closed without it.
func closeTLS(tc *tls.Conn, writeFailed bool) error {
	if writeFailed {
		return tc.NetConn().Close()
	}
	return tc.Close()
}

// logLimiter lets one log line through per second and counts the rest.
type logLimiter struct {
	next       atomic.Int64 // unix nanoseconds before which lines are suppressed
	suppressed atomic.Int64
}

// allow reports whether a line may be logged now, and how many were
// suppressed since the last one that was.
func (l *logLimiter) allow() (suppressed int64, ok bool) {
	now := time.Now().UnixNano()
	next := l.next.Load()
	if now < next || !l.next.CompareAndSwap(next, now+int64(time.Second)) {
		l.suppressed.Add(1)
		return 0, false
	}
	return l.suppressed.Swap(0), true
}

// socketOf returns the TCP connection under a client's connection, TLS or
// not, PROXY protocol or not, for what looks at the socket without reading it (its descriptor,
// whether the peer is gone). Reading it directly would bypass TLS.
func socketOf(nc net.Conn) net.Conn {
	if cc, ok := nc.(*clientConn); ok {
		nc = cc.Conn
	}
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn()
	}
	if pc, ok := nc.(*proxiedConn); ok {
		nc = pc.Conn
	}
	return nc
}

// tlsClientGone is clientGone for a TLS client: whether its socket has
// seen the peer's FIN or a reset.
func tlsClientGone(nc net.Conn) bool {
	sc, ok := socketOf(nc).(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	gone := false
	rc.Control(func(fd uintptr) { gone = peerClosed(fd) })
	return gone
}

// isTLS reports whether a client connected through the TLS listener.
func isTLS(nc net.Conn) bool {
	if cc, ok := nc.(*clientConn); ok {
		nc = cc.Conn
	}
	_, ok := nc.(*tls.Conn)
	return ok
}
