package proxy

import (
	"bytes"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/guard"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/resp"
	"github.com/redproxy/redproxy/internal/upstream"
	"github.com/tidwall/redcon"
)

// Connection state that shared connections cannot carry is handled in one
// of three ways:
//
//   - pinned: MULTI and WATCH take a dedicated pipelined connection from a
//     pool for the transaction's life; every command of the client goes
//     there until EXEC, DISCARD, UNWATCH or RESET ends it. A connection is
//     reused only if its state is known to be clean, otherwise closed.
//   - borrowed: a blocking command (BLPOP, XREAD BLOCK, WAIT, ...) runs on a
//     dedicated connection with no proxy timeout; if the client goes away
//     while blocked, that connection is closed so the pop cannot take an
//     element nobody receives.
//   - relayed: SUBSCRIBE and friends, MONITOR, CLIENT TRACKING ON and
//     CLIENT NO-TOUCH ON turn the client into a raw byte relay to a
//     dedicated connection for the rest of its life, with a bounded output
//     queue that cuts off a client that stops reading.

// pinState is the session's transaction state.
type pinState struct {
	pipe     *upstream.Pipe
	db       int
	resp3    bool
	inMulti  bool
	watching bool
	dirty    bool // the connection's state differs from a fresh one

	// Positions, in the transaction's queue, of commands the proxy added
	// (policy fix-ups); their results are removed from EXEC's reply.
	txPos    int
	txHidden []int
	// Writes queued in MULTI take effect at EXEC; the write hooks hear of
	// them then, not when they are queued.
	txWrites []txWrite
	txSelect int  // a SELECT queued in MULTI, applied when EXEC runs (-1: none)
	execRan  bool // the last EXEC ran its commands (not aborted)
}

type txWrite struct {
	cmd  *commands.Command
	args [][]byte
}

var queued = []byte("+QUEUED\r\n")

// cmdWaitMarker is the write that WAIT and WAITAOF wait for on a dedicated
// connection (see blocking).
var cmdWaitMarker = []byte("*3\r\n$7\r\nPUBLISH\r\n$22\r\n__redproxy__:wait-mark\r\n$0\r\n\r\n")

// dispatchPinned handles a command while the client holds a pinned
// connection. It reports true when it handled the command.
func (sess *Session) dispatchPinned(i int, cmd *commands.Command, req *resp.Request, m *metrics.Command) bool {
	pin := &sess.pin
	if !pin.pipe.Up() {
		// The connection and its MULTI/WATCH state are gone; say so once
		// and continue as a fresh client.
		sess.flush(time.Now())
		sess.unpin(false)
		sess.replyLocal(m, []byte("-ERR redproxy: upstream connection lost; the transaction was aborted\r\n"))
		return true
	}
	name := ""
	if cmd != nil {
		name = cmd.Name
	}
	switch name {
	case "exec":
		if pin.inMulti {
			for _, w := range pin.txWrites {
				sess.writeForwarded(w.cmd, w.args)
			}
			sess.slots = append(sess.slots, slot{kind: slotUpstream, i: sess.call.Len(), metric: m, exec: true})
			sess.call.Add(req.Raw)
			sess.flush(time.Now())
			if pin.txSelect >= 0 && pin.execRan {
				sess.mu.Lock()
				sess.db = pin.txSelect
				sess.mu.Unlock()
			}
			sess.unpin(true)
			return true
		}
	case "discard":
		if pin.inMulti {
			sess.forward(req.Raw, m)
			sess.flush(time.Now())
			sess.unpin(true)
			return true
		}
	case "multi":
		if !pin.inMulti {
			pin.inMulti = true
			pin.txPos, pin.txHidden, pin.txWrites, pin.txSelect = 0, pin.txHidden[:0], pin.txWrites[:0], -1
		}
		sess.forward(req.Raw, m)
		return true
	case "unwatch":
		if !pin.inMulti {
			sess.forward(req.Raw, m)
			sess.flush(time.Now())
			sess.unpin(true)
			return true
		}
	case "quit":
		sess.replyLocal(m, ok)
		sess.quitting = true
		return true
	case "reset":
		sess.flush(time.Now())
		sess.unpin(false)
		return false // the ordinary RESET handling finishes the job
	case "select":
		if len(req.Args) != 2 {
			break // Redis answers the arity error
		}
		if pin.inMulti {
			// Takes effect at EXEC, on this connection, which is then no
			// longer a clean DB-0 connection for the pool.
			if db, err := strconv.Atoi(string(req.Args[1])); err == nil && db >= 0 && db < sess.srv.cfg.Upstream.Databases {
				pin.txSelect = db
			}
			pin.dirty = true
			break
		}
		{
			pin.dirty = true
			db, err := strconv.Atoi(string(req.Args[1]))
			if err == nil && db >= 0 && db < sess.srv.cfg.Upstream.Databases {
				sess.forward(req.Raw, m)
				sess.flush(time.Now())
				sess.mu.Lock()
				sess.db = db
				sess.mu.Unlock()
				return true
			}
			return false
		}
	}
	if !pin.inMulti {
		// WATCH without MULTI: an ordinary client on its own connection.
		// Proxy-answered commands are still answered here, blocking ones
		// wait on this connection with no proxy timeout.
		if cmd != nil && cmd.IsBlocking(req.Args) {
			sess.blocking(cmd, req, m)
			return true
		}
		if name == "hello" {
			// Switching protocol would leave the pinned connection speaking
			// the old one; refusing keeps the WATCH intact.
			sess.replyLocal(m, []byte("-ERR redproxy: HELLO while WATCH is active is not supported; UNWATCH first\r\n"))
			return true
		}
		if cmd != nil && name != "watch" && (isProxyAnswered(cmd) || cmd.Parent != nil || cmd.Flags&(commands.ConnState|commands.PubSub) != 0) {
			if sess.special(cmd, req, m) {
				return true
			}
		}
		if name == "watch" {
			pin.watching = true
		}
		if sess.guardStep(i, cmd, req, m) {
			return true
		}
		if mayWrite(cmd) {
			sess.writeForwarded(cmd, req.Args)
		}
		sess.forward(req.Raw, m)
		return true
	}
	// Inside MULTI everything is queued by Redis, PING and ECHO included.
	if cmd != nil && cmd.Flags&(commands.ConnState|commands.PubSub) != 0 && !cmd.Is(commands.Write) {
		switch name {
		case "watch", "select", "client|setname", "client|setinfo", "readonly", "readwrite", "asking", "publish", "spublish", "pubsub":
			pin.dirty = pin.dirty || name != "watch"
		default:
			if cmd.Flags&commands.ConnState != 0 || isSubscribe(name) {
				// Run at EXEC, these would change the connection under the
				// proxy's feet (protocol, subscriptions, reply mode); refuse
				// and make EXEC fail, as a queue-time error would.
				sess.forwardHidden(guard.RefusedInMulti)
				sess.replyLocal(m, []byte("-ERR redproxy: '"+strings.ToUpper(strings.ReplaceAll(name, "|", " "))+"' inside MULTI is not supported\r\n"))
				return true
			}
		}
	}
	if sess.guardStep(i, cmd, req, m) {
		return true
	}
	if mayWrite(cmd) {
		pin.txWrites = append(pin.txWrites, txWrite{cmd: cmd, args: copyArgs(req.Args)})
	}
	sess.slots = append(sess.slots, slot{kind: slotUpstream, i: sess.call.Len(), metric: m, tx: true})
	sess.call.Add(req.Raw)
	return true
}

// pinFor starts pinning for MULTI or WATCH.
func (sess *Session) pinFor(cmd *commands.Command, req *resp.Request, m *metrics.Command) {
	sess.flush(time.Now())
	p, err := sess.srv.backend.AcquirePipe(sess.db, sess.resp3)
	if err != nil {
		sess.replyLocal(m, errorReply(err))
		return
	}
	sess.pin = pinState{pipe: p, db: sess.db, resp3: sess.resp3, txHidden: sess.pin.txHidden[:0], txWrites: sess.pin.txWrites[:0], txSelect: -1}
	if cmd.Name == "multi" {
		sess.pin.inMulti = true
	} else {
		sess.pin.watching = true
	}
	sess.forward(req.Raw, m)
}

// unpin gives the pinned connection back; clean says the transaction ended
// normally (EXEC, DISCARD, UNWATCH all clear MULTI and WATCH state).
func (sess *Session) unpin(clean bool) {
	pin := &sess.pin
	if pin.pipe == nil {
		return
	}
	sess.srv.backend.ReleasePipe(pin.pipe, pin.db, pin.resp3, clean && !pin.dirty)
	clear(pin.txWrites)
	*pin = pinState{txHidden: pin.txHidden[:0], txWrites: pin.txWrites[:0]}
}

// noteQueued is called by flush for every reply to a command sent inside
// MULTI, in order, to track positions in the transaction's queue.
func (sess *Session) noteQueued(reply []byte, hidden bool) {
	if !bytes.Equal(reply, queued) {
		if hidden {
			sess.hiddenFailed(reply, nil)
		}
		return // refused at queue time; not part of the transaction
	}
	if hidden {
		sess.pin.txHidden = append(sess.pin.txHidden, sess.pin.txPos)
	}
	sess.pin.txPos++
}

// stripExec removes the results of proxy-added commands from EXEC's reply.
func stripExec(reply []byte, hidden []int, dst []byte) []byte {
	if len(hidden) == 0 || len(reply) == 0 || (reply[0] != '*') {
		return append(dst, reply...)
	}
	nl := bytes.IndexByte(reply, '\n')
	n, err := strconv.Atoi(string(reply[1 : nl-1]))
	if err != nil || n < 0 {
		return append(dst, reply...)
	}
	dst = redcon.AppendArray(dst, n-len(hidden))
	pos := nl + 1
	h := 0
	for i := 0; i < n; i++ {
		k, err := resp.ScanReply(reply[pos:])
		if err != nil || k == 0 {
			return dst // cannot happen for a reply the pipe framed
		}
		if h < len(hidden) && hidden[h] == i {
			h++
		} else {
			dst = append(dst, reply[pos:pos+k]...)
		}
		pos += k
	}
	return dst
}

func copyArgs(args [][]byte) [][]byte {
	out := make([][]byte, len(args))
	for i, a := range args {
		out[i] = append([]byte(nil), a...)
	}
	return out
}

func errorReply(err error) []byte {
	msg := err.Error()
	if !strings.HasPrefix(msg, "ERR ") {
		msg = "ERR " + msg
	}
	return redcon.AppendError(nil, msg)
}

// blocking runs a blocking command on a dedicated connection with no proxy
// timeout (the command's own timeout, possibly forever, applies), after
// everything the client sent before it has been answered.
func (sess *Session) blocking(cmd *commands.Command, req *resp.Request, m *metrics.Command) {
	sess.flush(time.Now())
	if mayWrite(cmd) {
		sess.writeForwarded(cmd, req.Args)
	}
	pipe := sess.pin.pipe
	borrowed := false
	if pipe == nil {
		p, err := sess.srv.backend.AcquirePipe(sess.db, sess.resp3)
		if err != nil {
			sess.replyLocal(m, errorReply(err))
			return
		}
		pipe, borrowed = p, true
	}
	// The guard's rewrite and TTL fix-ups apply to blocking writes too
	// (BLMOVE's destination); fix-ups follow on the same connection.
	raw := req.Raw
	var fixups [][]byte
	if d := sess.guard.Decision(sess.curIndex); d != nil {
		sess.recordViolations(d)
		if d.Args != nil {
			raw = sess.guard.Encode(d.Args)
		}
		if len(d.Expires) > 0 {
			fixups = sess.guard.Fixups(d.Expires)
		}
	}
	call := sess.call
	call.Reset()
	call.NoTimeout = true
	first := 0
	if cmd.Name == "wait" || cmd.Name == "waitaof" {
		// Redis waits for the calling connection's last write to reach the
		// replicas (or the AOF). The client's writes went over other
		// connections, so first make this connection's last write one that
		// Redis propagates after all of them: a PUBLISH to a proxy channel.
		call.Add(cmdWaitMarker)
		first = 1
	}
	call.Add(raw)
	if err := pipe.Send(call); err != nil {
		if borrowed {
			sess.srv.backend.ReleasePipe(pipe, sess.db, sess.resp3, false)
		}
		sess.replyLocal(m, errorReply(err))
		call.Reset()
		return
	}
	// Replies to what came before the blocking command go out now, as
	// Redis would send them, not when the block ends.
	if len(sess.out) > 0 {
		if _, err := sess.nc.Write(sess.out); err == nil {
			sess.out = sess.out[:0]
		}
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for done := false; !done; {
		select {
		case <-call.Done():
			done = true
		case <-tick.C:
			if sess.interrupted.Load() || clientGone(sess.nc) {
				// Closing the connection makes Redis drop the blocked client,
				// so it cannot pop an element that would reach nobody.
				pipe.Close()
				<-call.Done()
				if !borrowed {
					sess.unpin(false)
				} else {
					sess.srv.backend.ReleasePipe(pipe, sess.db, sess.resp3, false)
				}
				sess.quitting = true
				call.Reset()
				return
			}
		}
	}
	reply, err := call.Reply(first)
	if err != nil {
		reply = errorReply(err)
	}
	sess.replyLocal(m, reply)
	call.Reset()
	if err == nil && len(fixups) > 0 {
		for _, f := range fixups {
			call.Add(f)
		}
		if serr := pipe.Send(call); serr == nil {
			call.Wait()
		}
		for i := range fixups {
			if r, ferr := call.Reply(i); ferr != nil || resp.IsError(r) {
				sess.hiddenFailed(r, ferr)
			}
		}
		call.Reset()
	}
	if borrowed {
		sess.srv.backend.ReleasePipe(pipe, sess.db, sess.resp3, err == nil)
	}
	sess.flush(time.Now())
}

// clientGone reports whether the client closed its side, without consuming
// anything it may have pipelined after the blocking command.
func clientGone(nc net.Conn) bool {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	gone := false
	var buf [1]byte
	rc.Read(func(fd uintptr) bool {
		n, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		gone = n == 0 && err == nil || err != nil && !errors.Is(err, syscall.EAGAIN) && !errors.Is(err, syscall.EINTR)
		return true
	})
	return gone
}

// relayKind says why a client became a relay, which decides its output cap.
type relayKind uint8

const (
	relayPubSub relayKind = iota
	relayMonitor
	relayTracking
)

// startRelay turns the rest of the client's life into a raw relay to a
// dedicated connection. reqs are the client's requests from the one that
// started it to the end of the batch; they are sent first.
func (sess *Session) startRelay(kind relayKind, reqs []resp.Request, m *metrics.Command) bool {
	sess.flush(time.Now())
	up, err := sess.srv.backend.AcquireConn(sess.db, sess.resp3)
	if err != nil {
		sess.replyLocal(m, errorReply(err))
		return false
	}
	if sess.pin.pipe != nil {
		sess.unpin(false)
	}
	limit := int64(sess.srv.Config().Server.PubSubOutputLimit)
	if kind == relayTracking {
		limit = int64(sess.srv.Config().Server.ClientOutputLimit)
	}
	// Whatever the session has still to write goes first.
	if len(sess.out) > 0 {
		if _, err := sess.nc.Write(sess.out); err != nil {
			sess.srv.backend.ReleaseConn(up)
			sess.quitting = true
			return true
		}
		sess.out = sess.out[:0]
	}
	// The starting command was checked already; the rest of its batch has
	// its guard decisions at the following indices.
	first := append([]byte(nil), reqs[0].Raw...)
	for k := 1; k < len(reqs); k++ {
		first = sess.appendRelayed(first, &reqs[k], sess.guard.Decision(sess.curIndex+k))
	}
	sess.relay(up, first, limit)
	sess.srv.backend.ReleaseConn(up)
	sess.quitting = true
	return true
}

// relay copies bytes both ways until either side closes. Upstream bytes
// are queued for the client in a bounded queue: a client that stops
// reading while Redis keeps publishing is cut off at limit, so the proxy's
// memory stays bounded and other clients are unaffected.
func (sess *Session) relay(up net.Conn, first []byte, limit int64) {
	q := newOutQueue(limit)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // Redis -> queue
		defer wg.Done()
		defer q.close()
		buf := make([]byte, 32<<10)
		for {
			n, err := up.Read(buf)
			// Copy: queueing buf[:n] of a fresh 32 KB buffer per read would
			// keep 32 KB alive per small message, far beyond the limit.
			if n > 0 && !q.push(append([]byte(nil), buf[:n]...)) {
				sess.srv.metrics.SlowConsumers.Inc()
				sess.srv.log.Warn("closing a client that stopped reading its relayed output", "client", sess.nc.RemoteAddr().String(), "limit_bytes", limit)
				sess.nc.Close()
				up.Close()
				return
			}
			if err != nil {
				sess.nc.SetReadDeadline(time.Now()) // wake the client reader
				return
			}
		}
	}()
	go func() { // queue -> client
		defer wg.Done()
		for {
			chunk, ok := q.pop()
			if !ok {
				return
			}
			if _, err := sess.nc.Write(chunk); err != nil {
				up.Close()
				return
			}
		}
	}()
	// client -> Redis, on the session goroutine.
	if len(first) > 0 {
		if _, err := up.Write(first); err != nil {
			up.Close()
		}
	}
	for {
		reqs, err := sess.rd.ReadBatch()
		var out []byte
		if len(reqs) > 0 {
			sess.prepareBatch(reqs)
		}
		for k := range reqs {
			out = sess.appendRelayed(out, &reqs[k], sess.guard.Decision(k))
		}
		if len(out) > 0 {
			if _, werr := up.Write(out); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	up.Close()
	wg.Wait()
}

// appendRelayed appends what to send upstream for one request of a relayed
// client: the request, the guard's rewrite of it, or, for a refusal, a
// script that makes Redis answer with the refusal's text, so the error
// reaches the client in order with every other reply on the raw stream.
// TTL fix-ups are not added on a relay: their replies would reach the
// client; the keyspace audit finds keys left without a TTL.
func (sess *Session) appendRelayed(out []byte, r *resp.Request, d *policy.Decision) []byte {
	if d == nil || len(d.Violations) == 0 && d.Args == nil {
		return append(out, r.Raw...)
	}
	sess.recordViolations(d)
	switch {
	case d.Refuse != nil:
		out = redcon.AppendArray(out, 4)
		out = redcon.AppendBulkString(out, "EVAL")
		out = redcon.AppendBulkString(out, "return redis.error_reply(ARGV[1])")
		out = redcon.AppendBulkString(out, "0")
		return redcon.AppendBulkString(out, d.Refuse.Msg)
	case d.Args != nil:
		return append(out, sess.guard.Encode(d.Args)...)
	}
	return append(out, r.Raw...)
}

// outQueue is a byte queue with a hard cap.
type outQueue struct {
	mu     sync.Mutex
	cond   *sync.Cond
	chunks [][]byte
	size   int64
	limit  int64
	closed bool
}

func newOutQueue(limit int64) *outQueue {
	q := &outQueue{limit: limit}
	q.cond = sync.NewCond(&q.mu)
	return q
}

// push queues b; it reports false when the cap would be exceeded.
func (q *outQueue) push(b []byte) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.limit > 0 && q.size+int64(len(b)) > q.limit {
		q.closed = true
		q.cond.Broadcast()
		return false
	}
	q.chunks = append(q.chunks, b)
	q.size += int64(len(b))
	q.cond.Signal()
	return true
}

// pop returns everything queued, joined, or false once closed and empty.
func (q *outQueue) pop() ([]byte, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.chunks) == 0 && !q.closed {
		q.cond.Wait()
	}
	if len(q.chunks) == 0 {
		return nil, false
	}
	var out []byte
	if len(q.chunks) == 1 {
		out = q.chunks[0]
	} else {
		for _, c := range q.chunks {
			out = append(out, c...)
		}
	}
	clear(q.chunks)
	q.chunks = q.chunks[:0]
	q.size = 0
	return out, true
}

func (q *outQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.cond.Broadcast()
	q.mu.Unlock()
}
