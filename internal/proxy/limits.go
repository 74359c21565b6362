package proxy

import (
	"crypto/tls"
	"errors"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redproxy/redproxy/internal/bufpool"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/rawio"
	"github.com/redproxy/redproxy/internal/upstream"
)

// What one client can make the proxy hold for it is bounded here:
//
//   - Replies. A batch's upstream replies are held in its Call until the
//     whole Call is answered; the Call keeps at most client_output_limit
//     minus what is already waiting for the client, and drops the rest as
//     it arrives (the shared connection's reader cannot stop). A client
//     whose replies overflow is closed (reason output_limit) without
//     anything more being sent to Redis for it.
//   - Replies are not held twice: the output buffer is written out as it
//     passes outSpill, and a reply larger than that is written straight
//     from the Call.
//   - Commands in flight. Redis computes every reply of what it is sent,
//     whether or not the client will ever take it, and a pipeline of big
//     replies stalls Redis for everyone (16 KB of GETs of a 1 MB value
//     keep Redis 7 busy for seconds). So before each command of a batch the
//     session estimates the output the batch already owes (replies built
//     locally, replies not yet written, and the forwarded commands at the
//     client's recent largest reply size, assumed large until seen); past
//     callOutput (or half the limit) it answers what it has before
//     forwarding more. A client that reads its replies is served in several
//     round trips instead of being cut off; one that does not read stops
//     being forwarded anything once its socket is full.
//   - Writes. Every write to a client has client_write_timeout per
//     writeChunk, from when the client's socket is found full (a write
//     the socket takes at once sets no deadline); a client that takes none
//     of its replies for that long is closed (reason write_timeout), so a
//     stalled reader holds neither memory nor a session forever, while a
//     slow but reading one is not.

// outSpill is how much output a session gathers before writing it, when a
// batch's replies are large: small batches still go out in one write.
const outSpill = 256 << 10

// writeChunk is the unit of progress the write timeout applies to.
const writeChunk = 256 << 10

// callOutput is the output a batch may owe before the session answers it
// and forwards the rest: replies of a few MB per round trip keep a
// client's throughput while the proxy holds little for it.
const callOutput = 4 << 20

// unknownReplySize is the reply size assumed for a client whose replies
// have not been seen yet: a new client's first deep pipeline is forwarded
// in parts (4, 16, 64, ... commands) as its replies prove small, rather
// than all at once.
const unknownReplySize = 1 << 20

// idleKeep is how much of each per-batch buffer (output, local replies,
// upstream replies) a client keeps while idle. Up to it, a client at -P 1
// reuses its buffers from request to request; beyond it, they are given
// back when the client goes idle, so a client that once fetched a large
// value does not hold that much for as long as it stays connected.
const idleKeep = 64 << 10

// idle gives back per-batch buffers that grew past idleKeep. The Reader
// calls it (on the session goroutine, from ReadBatch) when the client has
// nothing more to send; no batch is in progress then.
func (sess *Session) idle() {
	// Both are the session's alone between batches (a waiter of a shared
	// fetch got its copy before the leader's read returned), so a large
	// one goes back to bufpool, where stampede protection's fetch takes
	// its next large buffer.
	if cap(sess.out) > idleKeep {
		bufpool.Put(sess.out)
		sess.out = nil
	}
	if cap(sess.local) > idleKeep {
		bufpool.Put(sess.local)
		sess.local = nil
	}
	sess.call.Trim(idleKeep)
	sess.guard.Trim()
}

// clientConn is a client's connection with a deadline on every write.
type clientConn struct {
	// Conn is nil while the session is parked with its socket detached
	// (park.go); then parked holds the socket. Both change only under
	// sess.mu, by the session's goroutine, so another goroutine reaching
	// the connection (interrupt, kill, CLIENT LIST and KILL) holds sess.mu.
	net.Conn
	parked  detachedSocket
	timeout time.Duration
	sess    *Session
	// flags holds connTimedOut, connWriteFailed and connReaderDone in one
	// word: three atomic.Bools took 8 bytes more, and with them the
	// Session (which holds its clientConn) outgrew its 448-byte size
	// class (TestSessionFitsItsSizeClass).
	flags atomic.Uint32
	// sock is how Conn is written with raw system calls (rawio), made on
	// the first write to each Conn (it changes when a parked session
	// resumes); its w is nil for a Conn that is not a bare socket.
	sock atomic.Pointer[rawSocket]
}

// clientConn.flags.
const (
	// connTimedOut makes a client logged once, whichever of its writers
	// (session, relay) hit the deadline.
	connTimedOut uint32 = 1 << iota
	// connWriteFailed: a write to the client failed, so Close sends
	// nothing more to it (closeTLS).
	connWriteFailed
	// connReaderDone: the session's Reader has let go of the socket
	// (resp.Reader.Close), so Close need not wait for it.
	connReaderDone
)

// setFlag sets f and says whether this call set it.
func (c *clientConn) setFlag(f uint32) bool { return c.flags.Or(f)&f == 0 }

func (c *clientConn) hasFlag(f uint32) bool { return c.flags.Load()&f != 0 }

// rawSocket is a client's Conn and its raw writer.
type rawSocket struct {
	conn net.Conn
	w    *rawio.Writer
}

// writeTimed writes b to the client's socket within the write timeout: on
// a bare socket with raw write(2) calls (see rawio for why), setting the
// deadline only if the socket is full (rawio.Writer.WriteWithin), else
// through the Conn with the deadline set first.
func (c *clientConn) writeTimed(b []byte) (int, error) {
	sock := c.rawSock()
	if sock.w != nil {
		return sock.w.WriteWithin(b, c.timeout)
	}
	if c.timeout > 0 {
		c.Conn.SetWriteDeadline(time.Now().Add(c.timeout))
	}
	return c.Conn.Write(b)
}

// tryWrite writes what the client's socket takes of b at once, without
// waiting: full reports that it took less because it is full. ok is false
// when the Conn is not a bare socket (TLS), which tryWrite cannot write.
func (c *clientConn) tryWrite(b []byte) (n int, full, ok bool, err error) {
	sock := c.rawSock()
	if sock.w == nil {
		return 0, false, false, nil
	}
	n, full, err = sock.w.TryWrite(b)
	if err != nil {
		c.setFlag(connWriteFailed)
	}
	return n, full, true, err
}

// rawSock is the Conn's raw writer, made on first use for each Conn (the
// Conn changes when a parked session resumes, which no other writer of the
// client outlives: relays end first, and a direct reply is waited for).
func (c *clientConn) rawSock() *rawSocket {
	sock := c.sock.Load()
	if sock == nil || sock.conn != c.Conn {
		sock = &rawSocket{conn: c.Conn, w: rawio.NewWriter(c.Conn)}
		c.sock.Store(sock)
	}
	return sock
}

// Close closes the client's connection; a TLS one without waiting to send
// close_notify to a client that stopped taking what is written to it.
func (c *clientConn) Close() error {
	if c.Conn == nil {
		c.parked.closed = true // closed when the session resumes
		return nil
	}
	return c.close(c.Conn)
}

func (c *clientConn) close(conn net.Conn) error {
	if tc, ok := conn.(*tls.Conn); ok {
		return closeTLS(tc, c.hasFlag(connWriteFailed))
	}
	if c.hasFlag(connReaderDone) {
		return conn.Close()
	}
	// Closed by someone else than the session ending (a kill, shutdown, a
	// relay): the session's Reader may hold the socket's read side while
	// the session answers a batch (resp.Reader.reads), and net.Conn.Close
	// waits for every holder to let go, which the session does when it
	// ends. So end the connection at once with shutdown(2), which is what
	// the client and any read or write on the socket see, and let the
	// close finish without waiting for the session to notice.
	if sc, ok := conn.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			rc.Control(func(fd uintptr) { syscall.Shutdown(int(fd), syscall.SHUT_RDWR) })
		}
	}
	go conn.Close()
	return nil
}

// closeForced closes conn for someone else than its session. On TLS it
// closes the socket under the TLS layer: tls.Conn.Close first sends a
// close_notify alert, which a client that stopped reading makes wait up to
// 5 s, and a Close made while another is in that wait returns at once
// without closing anything. So a session ending by itself towards such a
// client held a shutdown 5 s past its deadline (the session's own Close
// was waiting, and the shutdown's Close could not cut it short). A client
// killed or cut off sees its connection end as a TCP one would.
func (c *clientConn) closeForced(conn net.Conn) error {
	if tc, ok := conn.(*tls.Conn); ok {
		return tc.NetConn().Close()
	}
	return c.close(conn)
}

// closeOwn closes the connection as its session ends, after the session's
// Reader let go of it.
func (c *clientConn) closeOwn() error {
	c.setFlag(connReaderDone)
	return c.Close()
}

func (c *clientConn) Write(b []byte) (int, error) {
	if c.timeout <= 0 {
		n, err := c.writeTimed(b)
		if err != nil {
			c.setFlag(connWriteFailed)
		}
		return n, err
	}
	written := 0
	for written < len(b) {
		n, err := c.writeTimed(b[written:min(len(b), written+writeChunk)])
		written += n
		if err != nil {
			c.setFlag(connWriteFailed)
			if errors.Is(err, os.ErrDeadlineExceeded) && c.setFlag(connTimedOut) {
				c.sess.closeFor(metrics.CloseWriteTimeout, "client took none of its replies within server.client_write_timeout", "timeout", c.timeout)
			}
			return written, err
		}
	}
	return written, nil
}

// RemoteAddr is the client's address, also while its socket is detached;
// never nil (an empty address for a socket whose peer is gone), because
// CLIENT LIST, the slow log and the logs name every client.
func (c *clientConn) RemoteAddr() net.Addr {
	if c.Conn == nil {
		return socketAddr(c.parked.fd, syscall.Getpeername)
	}
	if a := c.Conn.RemoteAddr(); a != nil {
		return a
	}
	return &net.TCPAddr{}
}

// LocalAddr is the proxy's end, also while the socket is detached.
func (c *clientConn) LocalAddr() net.Addr {
	if c.Conn == nil {
		return socketAddr(c.parked.fd, syscall.Getsockname)
	}
	return c.Conn.LocalAddr()
}

// SyscallConn lets clientGone peek at the socket, and lets resp.Reader
// wait for the client's bytes without holding a buffer.
func (c *clientConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, errors.ErrUnsupported
	}
	return sc.SyscallConn()
}

// emit appends one reply to the client's output, writing the output out
// once it passes outSpill; a large reply is written from where it is
// rather than copied, and so is the reply of a batch of one request when
// it is past idleKeep: copied, it would grow the output past what an idle
// client keeps, and a client reading 100 KB values at -P 1 (a RESP3 one,
// which gets no direct reply) had its output made, copied into and
// dropped for every value. Only a batch of one: with more, a reply
// written early no longer counts against client_output_limit with the
// batch's later replies (TestLocalReplyOverOutputLimitCloses: two 160 KB
// tier hits in one batch under a 256 KB limit reached the client).
func (sess *Session) emit(reply []byte) {
	if sess.outDead {
		return
	}
	if len(sess.out) == 0 && len(reply) > idleKeep && len(sess.batchReqs) == 1 {
		sess.writeOut(reply)
		return
	}
	if len(sess.out)+len(reply) < outSpill {
		sess.out = append(sess.out, reply...)
		return
	}
	if len(reply) < outSpill {
		sess.out = append(sess.out, reply...)
		sess.writeOut(sess.out)
		return
	}
	if len(sess.out) > 0 && !sess.writeOut(sess.out) {
		return
	}
	sess.writeOut(reply)
}

// writeOut writes b to the client and empties the output; a failed write
// ends the session after the batch, and nothing more is produced for it.
func (sess *Session) writeOut(b []byte) bool {
	sess.waitDirect() // the pipe's reader may be writing its reply
	_, err := sess.nc.Write(b)
	sess.out = sess.out[:0]
	if err != nil {
		sess.closing(metrics.CloseWriteError)
		sess.outDead = true
		sess.quitting = true
		return false
	}
	return true
}

// outputDue reports whether the batch dispatched so far should be answered
// before more of it is: the output it already owes nears the limit.
func (sess *Session) outputDue() bool {
	if len(sess.slots) == 0 {
		return false
	}
	owed := int64(len(sess.out)+len(sess.local)) + int64(sess.call.Len())*sess.replySize
	return owed >= min(sess.outLimit/2, callOutput)
}

// replyLimit is what the batch's Call may hold: the output limit less what
// is already waiting for the client.
func (sess *Session) replyLimit() int {
	return int(sess.outLimit - int64(len(sess.out)+len(sess.local)))
}

// overLimit closes the client whose replies did not fit its output limit.
func (sess *Session) overLimit() {
	sess.outDead = true
	sess.quitting = true
	sess.out = sess.out[:0]
	sess.closeFor(metrics.CloseOutputLimit, "replies exceed server.client_output_limit", "limit_bytes", sess.outLimit)
}

// overLimitAfterOwed is overLimit for a client owed the replies gathered
// so far, which it gets first. Closed for the limit before they are
// written (the reason, the log), so that a client that does not read them
// is cut at the write timeout, as any client is, counted as output_limit.
func (sess *Session) overLimitAfterOwed() {
	owed := sess.out
	sess.out = nil
	sess.overLimit()
	if len(owed) > 0 {
		sess.writeOut(owed)
	}
}

// noteReplySize updates the client's recent reply size from a Call that
// completed: its largest reply, or a quarter of the previous size if
// larger.
func (sess *Session) noteReplySize(c *upstream.Call) {
	sess.replySize = max(int64(c.MaxReply()), sess.replySize/4)
}

// batchLoad counts the sessions answering a batch at once and, while many
// are, caps every client's next batch at loadedBatch requests instead of
// resp.DefaultMaxBatch. What a session keeps per request of its batch
// (arguments, the guard's and the policy's records: about 300 bytes) is
// kept by every session answering one, so a flood of clients that each
// pipeline thousands of commands and hang up (found by a bad-input
// campaign: heap 6.6 GB at 9,700 such sessions, other clients' requests
// taking seconds) cost 300 KB per session; capped, about 20 KB, which
// with the read buffer is the order of what Redis keeps per client.
// Below the threshold nothing changes: a deep pipeline still goes to
// Redis in batches of up to 1024.
type batchLoad struct {
	busy atomic.Int32
	cap  atomic.Int32 // 0: no cap beyond the Reader's own
	// threshold is loadedSessions, or a test's (SetBatchLoadThreshold).
	threshold atomic.Int32
}

const (
	loadedSessions = 512
	loadedBatch    = 64
)

func (l *batchLoad) enter() {
	n := l.busy.Add(1)
	if t := l.limit(); n > t && l.cap.Load() == 0 {
		l.cap.Store(loadedBatch)
	}
}

func (l *batchLoad) leave() {
	n := l.busy.Add(-1)
	if t := l.limit(); n < t/2 && l.cap.Load() != 0 {
		l.cap.Store(0)
	}
}

func (l *batchLoad) limit() int32 {
	if t := l.threshold.Load(); t > 0 {
		return t
	}
	return loadedSessions
}
