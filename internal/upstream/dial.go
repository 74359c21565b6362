package upstream

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redproxy/redproxy/internal/resp"
)

// Dial opens a connection to Redis and runs the handshake: HELLO (with AUTH
// for RESP3) or AUTH, SELECT, CLIENT SETNAME, then opt.Handshake. The whole
// handshake is one write and must finish within DialTimeout.
func Dial(opt Options) (net.Conn, error) {
	nc, _, err := dial(opt, false)
	return nc, err
}

// dial is Dial; with wantID it also returns the connection's Redis id,
// from HELLO's reply (RESP3) or a CLIENT ID in the same handshake (RESP2),
// 0 when Redis refuses that (an ACL without client|id), idAfterBusy when
// Redis answered -BUSY (a script ran): the id only lets other clients'
// CLIENT UNBLOCK reach the connection.
func dial(opt Options, wantID bool) (net.Conn, int64, error) {
	opt.defaults()
	// Keepalive bounds how long a connection whose peer vanished without a
	// word (host gone, middlebox dropped the flow) can look open while it
	// waits for a reply the health probe says Redis is busy computing.
	d := net.Dialer{Timeout: opt.DialTimeout, KeepAliveConfig: net.KeepAliveConfig{
		Enable: true, Idle: 15 * time.Second, Interval: 5 * time.Second, Count: 3,
	}}
	ctx := context.Background()
	if opt.cancel != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		go func() {
			select {
			case <-opt.cancel:
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	nc, err := DialConnContext(ctx, &d, opt.Addr, opt.TLS)
	if err != nil {
		return nil, 0, err
	}
	// The handshake's reads and writes end with the dial's cancellation:
	// closing the connection under them (a deadline would be overwritten
	// by the handshake's own).
	unwatch := context.AfterFunc(ctx, func() { nc.Close() })
	id, err := handshake(nc, opt, wantID)
	if !unwatch() && err == nil {
		// Cancelled as the handshake ended: the connection is closed.
		err = ErrClosed
	}
	if err != nil {
		nc.Close()
		var ne net.Error
		if opt.handshakeTimeout > 0 && errors.As(err, &ne) && ne.Timeout() {
			// A patient handshake (a dedicated connection, a command sent
			// alone) that Redis did not answer in DeadTimeout: as a
			// reply past it, not Go's "read tcp ...: i/o timeout" (found
			// by a probe, WATCH on a frozen Redis).
			return nil, 0, ErrTimeout
		}
		// Only when the connection was closed or refused under the first
		// command, not for a server that answered (a replica refused for
		// WantPrimary got the hint too: found by a probe).
		if c := opt.TLS; c != nil && len(c.Certificates) == 0 && c.GetClientCertificate == nil && !errors.Is(err, ErrHandshake) &&
			!errors.Is(err, ErrClosed) && (PeerClosed(err) || strings.Contains(err.Error(), "remote error: tls:")) {
			// With TLS 1.3 the client's handshake ends before Redis has
			// checked for a client certificate; its refusal only shows as
			// the connection closing under the first command.
			return nil, 0, fmt.Errorf("%w (the connection closed right after the TLS handshake: if Redis requires client certificates, set upstream.tls.cert_file and key_file)", err)
		}
		if opt.TLS == nil && !errors.Is(err, ErrHandshake) && !errors.Is(err, ErrClosed) && PeerClosed(err) {
			// A Redis that speaks only TLS on the port reads the first
			// command as a bad ClientHello and closes: said as a bare
			// "connection reset by peer", where the opposite mistake was
			// named (found by a probe).
			return nil, 0, fmt.Errorf("%w (the connection closed under the first command: if that port speaks TLS, set [upstream.tls])", err)
		}
		return nil, 0, err
	}
	return nc, id, nil
}

// DialConn connects to addr with d and, when tlsConf is not nil, runs the
// TLS handshake within d's timeout and deadline. It is the one place a
// connection to a Redis is opened, so that every dial (pipes, dedicated
// connections, probes, the local tier's tracking connections, and any
// mode that dials other nodes: sentinels, cluster nodes) speaks TLS alike.
// Without a server name in tlsConf, the host of addr is verified.
func DialConn(d *net.Dialer, addr string, tlsConf *tls.Config) (net.Conn, error) {
	return DialConnContext(context.Background(), d, addr, tlsConf)
}

// DialConnContext is DialConn, ended early when ctx is.
func DialConnContext(ctx context.Context, d *net.Dialer, addr string, tlsConf *tls.Config) (net.Conn, error) {
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	if tlsConf == nil {
		return nc, nil
	}
	if tlsConf.ServerName == "" && !tlsConf.InsecureSkipVerify {
		host, _, _ := net.SplitHostPort(addr)
		tlsConf = tlsConf.Clone()
		tlsConf.ServerName = host
	}
	deadline := d.Deadline
	if d.Timeout > 0 && (deadline.IsZero() || time.Now().Add(d.Timeout).Before(deadline)) {
		deadline = time.Now().Add(d.Timeout)
	}
	if !deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	tc := tls.Client(nc, tlsConf)
	if err := tc.HandshakeContext(ctx); err != nil {
		nc.Close()
		if errors.Is(err, context.DeadlineExceeded) {
			// A plaintext Redis reads the ClientHello as the start of a
			// command and waits for the rest.
			return nil, fmt.Errorf("%w with %s: no TLS answer in time (does that port speak TLS?): %w", ErrTLSHandshake, addr, err)
		}
		return nil, fmt.Errorf("%w with %s: %w", ErrTLSHandshake, addr, err)
	}
	return tc, nil
}

// PeerClosed reports whether err, from a connection's read or write, says
// the other side closed or reset it.
func PeerClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// ErrTLSHandshake wraps a failed TLS handshake with Redis: a certificate
// that does not verify, a Redis without TLS on that port, or a refused
// client certificate.
var ErrTLSHandshake = errors.New("TLS handshake failed")

func handshake(nc net.Conn, opt Options, wantID bool) (id int64, err error) {
	var cmds [][]string
	if opt.RESP3 {
		hello := []string{"HELLO", "3"}
		if opt.Password != "" {
			user := opt.Username
			if user == "" {
				user = "default"
			}
			hello = append(hello, "AUTH", user, opt.Password)
		}
		cmds = append(cmds, hello)
	} else if opt.Password != "" {
		if opt.Username != "" {
			cmds = append(cmds, []string{"AUTH", opt.Username, opt.Password})
		} else {
			cmds = append(cmds, []string{"AUTH", opt.Password})
		}
	}
	// HELLO's reply says the server's role; RESP2 asks it only for that,
	// and ignores a refusal (Redis before 6 has no HELLO).
	roleAt, roleOptional := -1, false
	if opt.WantPrimary {
		roleAt = 0
		if !opt.RESP3 {
			roleAt, roleOptional = len(cmds), true
			cmds = append(cmds, []string{"HELLO", "2"})
		}
	}
	if opt.DB != 0 {
		cmds = append(cmds, []string{"SELECT", strconv.Itoa(opt.DB)})
	}
	setName := -1
	if opt.Name != "" {
		setName = len(cmds)
		cmds = append(cmds, []string{"CLIENT", "SETNAME", opt.Name})
	}
	cmds = append(cmds, opt.Handshake...)
	// HELLO's reply carries the id; only a RESP2 connection asks for it,
	// which an upstream user without client|id leaves in Redis's ACL LOG
	// on every dial.
	askID := -1
	if wantID && !opt.RESP3 {
		askID = len(cmds)
		cmds = append(cmds, []string{"CLIENT", "ID"})
	}
	if len(cmds) == 0 {
		return 0, nil
	}
	var out []byte
	for _, c := range cmds {
		out = resp.AppendCommandStrings(out, c...)
	}
	nc.SetDeadline(time.Now().Add(max(opt.DialTimeout, opt.handshakeTimeout)))
	defer nc.SetDeadline(time.Time{})
	if _, err := nc.Write(out); err != nil {
		return 0, err
	}
	var buf []byte
	for i := range cmds {
		var reply []byte
		if reply, buf, err = readReply(nc, buf, maxHandshakeReply); err != nil {
			return 0, err
		}
		if i == askID {
			// An error reply is 0, not a failed dial. -BUSY says nothing
			// of the ACL: the id can be looked up once the script ends.
			id, _ = resp.Integer(reply)
			if bytes.HasPrefix(reply, busyPrefix) {
				id = idAfterBusy
			}
			continue
		}
		if wantID && opt.RESP3 && i == 0 {
			id = resp.HelloID(reply)
		}
		if opt.OnVersion != nil && (opt.RESP3 && i == 0 || i == roleAt && !opt.RESP3) {
			if v := resp.HelloVersion(reply); v != "" {
				opt.OnVersion(v)
			}
		}
		if i == roleAt {
			if resp.IsError(reply) && roleOptional {
				continue
			}
			if role, _, ok := resp.ServerRole(reply); ok && role != "master" {
				if opt.OnReadOnly != nil {
					opt.OnReadOnly()
				}
				return 0, fmt.Errorf("%w: HELLO says role %q", ErrNotPrimary, role)
			}
		}
		if resp.IsError(reply) && !(i == setName && bytes.HasPrefix(reply, busyPrefix)) {
			// The name is only for operators; a Redis that refuses it
			// because a script runs (-BUSY) must not keep the proxy from
			// reconnecting. Any other refusal (-ERR max number of clients
			// reached, sent before Redis closes the connection) fails the
			// dial: the connection is unusable.
			return 0, &HandshakeRefusal{Cmd: cmds[i][0], Reply: bytes.Clone(reply)}
		}
	}
	return id, nil
}

var busyPrefix = []byte("-BUSY")

// idAfterBusy is dial's id for a RESP2 connection whose CLIENT ID Redis
// answered -BUSY: a relay dialled while a script ran would otherwise keep
// id 0, unreachable by CLIENT UNBLOCK, for its whole life.
const idAfterBusy = -1

// maxHandshakeReply caps what a handshake reads: HELLO's map is the
// largest reply, a few hundred bytes.
const maxHandshakeReply = 64 << 10

// readReply reads from nc, after what buf already holds, until buf starts
// with one whole reply other than a RESP3 push, and returns that reply and
// what follows it. More than max bytes without a whole reply is
// resp.ErrProtocol; a read error before a whole reply is returned as is.
// It is for the short exchanges on connections of their own (handshakes,
// probes, one-off commands), not the pipes' reply path.
func readReply(nc net.Conn, buf []byte, max int) (reply, rest []byte, err error) {
	var tmp [4096]byte
	for {
		for {
			n, err := resp.ScanReply(buf)
			if err != nil {
				return nil, buf, err
			}
			if n == 0 {
				break
			}
			if resp.IsPush(buf[:n]) {
				buf = buf[n:]
				continue
			}
			return buf[:n], buf[n:], nil
		}
		if len(buf) > max {
			return nil, buf, resp.ErrProtocol
		}
		k, err := nc.Read(tmp[:])
		buf = append(buf, tmp[:k]...)
		if k == 0 && err != nil {
			return nil, buf, err
		}
	}
}

// ErrHandshake wraps an error reply to a handshake command (bad password,
// unknown DB, ...). It is not retried faster than the reconnect backoff.
var ErrHandshake = errors.New("handshake refused")

// HandshakeRefusal is ErrHandshake with the command Redis refused and
// its reply.
type HandshakeRefusal struct {
	Cmd   string
	Reply []byte // as Redis sent it
}

func (e *HandshakeRefusal) Error() string {
	return e.Cmd + ": " + ErrHandshake.Error() + ": " + trimReply(e.Reply)
}

func (e *HandshakeRefusal) Is(target error) bool { return target == ErrHandshake }

// StateReply is the refusal when it says what state Redis is in (a
// script running past busy-reply-threshold, loading its dataset, a
// replica whose link is down), and nil for any other: the client's own
// command would have met the same state, and on Redis directly gets that
// reply. Answered "upstream unavailable: SELECT: handshake refused:
// -BUSY ...", a client that retries on -BUSY did not know it (found by a
// probe: a GET in a database the proxy had no connection to yet, during
// a long script).
func (e *HandshakeRefusal) StateReply() []byte {
	for _, p := range stateRefusals {
		if bytes.HasPrefix(e.Reply, p) {
			return e.Reply
		}
	}
	return nil
}

var stateRefusals = [][]byte{[]byte("-BUSY "), []byte("-LOADING "), []byte("-MASTERDOWN ")}

// ClientLimit reports whether Redis refused the connection for its
// maxclients: it sends the error on accept and closes, so the first
// handshake command reads it.
func (e *HandshakeRefusal) ClientLimit() bool {
	return bytes.HasPrefix(e.Reply, clientLimitReply)
}

var clientLimitReply = []byte("-ERR max number of clients reached")

// ErrNotPrimary wraps a dial refused because the server said it is a
// replica where Options.WantPrimary asked for a primary.
var ErrNotPrimary = errors.New("server is not a primary")

func trimReply(b []byte) string {
	if len(b) > 200 {
		b = b[:200]
	}
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return string(b)
}
