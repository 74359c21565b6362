package proxy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/guard"
	"github.com/redproxy/redproxy/internal/localcache"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/resp"
	"github.com/redproxy/redproxy/internal/upstream"
	"github.com/tidwall/redcon"
)

// Session is one client connection. Its goroutine reads a batch of
// requests (everything the client has pipelined so far), answers it, and
// writes all replies with one write before reading again; so a client's
// commands are answered in the order it sent them, and a batch's forwarded
// commands travel to Redis together, in order, on one shared connection.
type Session struct {
	srv *Server
	nc  net.Conn
	rd  *resp.Reader
	id  int64

	// Connection state the shared upstream connections cannot carry. Only
	// the session goroutine writes it, holding mu, so CLIENT LIST from
	// another session can read it under mu.
	mu        sync.Mutex
	db        int
	resp3     bool
	name      string
	libName   string
	libVer    string
	authed    bool
	createdAt time.Time
	lastCmd   atomic.Pointer[commands.Command] // for CLIENT INFO/LIST
	list      listState                        // the rest CLIENT INFO/LIST shows

	// The batch being answered: forwarded commands are collected into one
	// Call; slots remember, for every command, where its reply comes from.
	call      *upstream.Call
	slots     []slot
	local     []byte // replies the proxy built itself, back to back
	out       []byte // what goes to the client at the end of the batch
	quitting  bool
	batchReqs []resp.Request

	// Output limits (limits.go).
	outLimit  int64 // server.client_output_limit
	replySize int64 // recent bytes per upstream reply, to split batches
	outDead   bool  // the client is being closed: produce no more output
	// closeReason is why the proxy closes the client, if it decided to
	// (limits.go); written by the session or its relay goroutines before
	// serve ends.
	closeReason string

	pin   pinState
	abort txAbort
	// relayInMulti: a relayed client has sent MULTI (appendRelayed).
	relayInMulti bool
	block        blockState
	guard        guard.Batch // the guard's decisions for the batch (guard.go)
	// tierWrites are this client's writes whose replies are not in yet; the
	// local tier neither serves nor fills their keys meanwhile (tier.go).
	tierWrites localcache.Writes
	replyOff   bool // CLIENT REPLY OFF
	replySkip  bool // CLIENT REPLY SKIP: mute the next command
	curMute    bool // the command being dispatched gets no reply
	curIndex   int  // index in batchReqs of the command being dispatched

	// upstreamWait adds up the batch's waits for upstream replies, for
	// the slow log; slowExempt marks a batch whose time is the client's
	// own choice (a blocking command, a relay), which is never slow.
	upstreamWait time.Duration
	slowExempt   bool

	interrupted atomic.Bool
}

// slot says where one command's reply comes from.
type slot struct {
	kind   slotKind
	i      int // upstream reply index, or start of a local reply
	end    int // end of a local reply
	metric *metrics.Command
	tx     bool // sent inside MULTI: its reply is +QUEUED or a queue-time error
	exec   bool // EXEC of a transaction: strip the proxy's own commands' results
	mute   bool // CLIENT REPLY OFF/SKIP: consume the reply, do not send it
	info   bool // INFO: append the proxy's section to Redis's reply (info.go)
}

type slotKind uint8

const (
	slotUpstream slotKind = iota // reply i of the batch's Call
	slotLocal                    // local[i:end]
	slotHidden                   // reply i of the Call, which the client must not see (a policy fix-up)
	slotWrapped                  // a command wrapped in MULTI/EXEC with fix-ups: i is its queue reply, end is EXEC's
	slotRefusal                  // reply i of the Call to guard.RefusedInMulti, an error by design: dropped
)

func newSession(s *Server, nc net.Conn) *Session {
	cfg := s.Config()
	cc := &clientConn{Conn: nc, timeout: cfg.Server.ClientWriteTimeout.Duration, srv: s}
	sess := &Session{
		srv:       s,
		nc:        cc,
		rd:        resp.NewReader(cc, s.clientLimits()),
		id:        s.nextID.Add(1),
		call:      upstream.NewCall(),
		createdAt: time.Now(),
		authed:    s.cfg.Upstream.Password == "",
		outLimit:  int64(cfg.Server.ClientOutputLimit),
		replySize: unknownReplySize,
	}
	sess.rd.OnIdle(sess.idle)
	return sess
}

// interrupt asks the session to stop after the batch it is answering; an
// idle session blocked in a read is woken at once.
func (sess *Session) interrupt() {
	sess.interrupted.Store(true)
	sess.nc.SetReadDeadline(time.Now())
}

func (sess *Session) serve() {
	reason := metrics.CloseClient
	defer func() {
		// One reason per connection: the proxy's own decision to close
		// (output limit, write timeout) explains the failed write or read
		// that followed it.
		if r := sess.closedFor(); r != "" && reason != metrics.ClosePanic {
			reason = r
		}
		sess.srv.metrics.ClientClosed(reason)
	}()
	defer func() {
		// A bug handling one client must not take the proxy and every
		// other client down with it.
		if r := recover(); r != nil {
			reason = metrics.ClosePanic
			sess.srv.log.Error("BUG: panic while serving a client; connection closed", "client", sess.nc.RemoteAddr().String(), "panic", r, "stack", string(debug.Stack()))
		}
	}()
	defer sess.nc.Close()
	defer sess.sessionClosed()
	defer sess.unpin(false)
	idle := sess.srv.Config().Server.IdleTimeout.Duration
	for {
		if sess.interrupted.Load() {
			reason = sess.interruptReason()
			return
		}
		if idle > 0 {
			sess.nc.SetReadDeadline(time.Now().Add(idle))
		}
		reqs, err := sess.rd.ReadBatch()
		if len(reqs) > 0 {
			sess.srv.metrics.BatchRequests.Observe(float64(len(reqs)))
			sess.serveBatch(reqs)
		}
		if err != nil {
			var pe *resp.ProtocolError
			switch {
			case errors.As(err, &pe):
				// As Redis does: say why, then close, because the rest of
				// the stream can no longer be framed.
				reason = metrics.CloseProtocolError
				sess.srv.metrics.ProtocolErrors.Inc()
				sess.out = redcon.AppendError(sess.out, "ERR "+pe.Error())
				sess.srv.log.Debug("closing client after protocol error", "client", sess.nc.RemoteAddr().String(), "err", pe.Msg)
			case sess.interrupted.Load():
				reason = sess.interruptReason()
			case errors.Is(err, os.ErrDeadlineExceeded):
				reason = metrics.CloseIdleTimeout
			case errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed), errors.Is(err, syscall.ECONNRESET):
				// The client closed (a reset: it closed with replies unread).
			default:
				reason = metrics.CloseReadError
				sess.srv.log.Debug("client read failed", "client", sess.nc.RemoteAddr().String(), "err", err)
			}
		}
		if len(sess.out) > 0 && !sess.outDead {
			if !sess.writeOut(sess.out) {
				if err == nil {
					reason = metrics.CloseWriteError
				}
				return
			}
			if cap(sess.out) > 1<<20 {
				sess.out = nil
			}
		}
		if err != nil {
			return
		}
		if sess.quitting {
			reason = sess.quitReason()
			return
		}
	}
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

// quitReason says why a session that stopped reading ends: QUIT, or the
// end of a relay or a blocking command whose client went away (or was
// interrupted).
func (sess *Session) quitReason() string {
	if sess.interrupted.Load() {
		return sess.interruptReason()
	}
	if c := sess.lastCmd.Load(); c != nil && c.Name == "quit" {
		return metrics.CloseQuit
	}
	return metrics.CloseClient
}

// serveBatch answers every request of one batch and appends the replies to
// sess.out in request order.
func (sess *Session) serveBatch(reqs []resp.Request) {
	start := time.Now()
	sess.batchReqs = reqs
	sess.list.active.Store(start.UnixNano())
	sess.prepareBatch(reqs)
	for i := range reqs {
		if i > 0 && !sess.guard.Joined(i) && sess.outputDue() {
			// Answer what the batch owes before forwarding more of it;
			// but never between a write and the later command its TTL
			// was trusted from (guard.Batch.Joined).
			sess.flush(start)
		}
		if sess.quitting {
			break
		}
		sess.dispatch(i, &reqs[i])
	}
	sess.flush(start)
	if took := time.Since(start); took >= sess.srv.slow.threshold && !sess.slowExempt {
		sess.noteSlow(reqs, start, took)
	}
	sess.upstreamWait, sess.slowExempt = 0, false
}

// dispatch decides where one command goes. It is the seam where the guard,
// policy, stampede and local-tier steps sit between client and Redis.
func (sess *Session) dispatch(i int, req *resp.Request) {
	args := req.Args
	cmd := sess.srv.table.Lookup(args)
	sess.lastCmd.Store(cmd)
	m := sess.metricFor(cmd)
	m.Calls.Inc()
	sess.curIndex = i
	sess.curMute = sess.replyOff || sess.replySkip
	sess.replySkip = false
	if !sess.authed && !isAuthExempt(cmd) {
		sess.replyLocal(m, errNoAuth)
		return
	}
	if sess.abort.reason != nil && sess.abortedStep(cmd, m) {
		return
	}
	// A refusal comes first, so that commands the proxy handles itself
	// (MONITOR, SUBSCRIBE, blocking commands, transactions) are refused
	// like any other.
	if sess.guardRefused(i, m) {
		return
	}
	if sess.srv.router != nil && sess.clusterStep(cmd, req, m) {
		return
	}
	if sess.pin.pipe != nil && sess.dispatchPinned(i, cmd, req, m) {
		return
	}
	// Subcommands (CLIENT ..., CONFIG ...) are rare enough to always take
	// the slow path, which sorts out the few the proxy must answer.
	if cmd != nil && (cmd.Flags&(commands.ConnState|commands.PubSub|commands.Blocking|commands.AllowBusy) != 0 || cmd.Parent != nil || isProxyAnswered(cmd) || cmd.IsBlocking(args)) {
		if sess.special(cmd, req, m) {
			return
		}
	}
	if sess.guardStep(i, cmd, req, m) {
		return
	}
	if sess.pin.pipe == nil && sess.srv.router == nil {
		if sess.tierStep(cmd, req, m) {
			return
		}
		if sess.flightStep(cmd, req, m, len(sess.batchReqs) == 1) {
			return
		}
	}
	if mayWrite(cmd) {
		sess.writeForwarded(cmd, req.Args)
	}
	sess.forward(req.Raw, m)
}

// forward adds a command to the batch's upstream Call.
func (sess *Session) forward(raw []byte, m *metrics.Command) {
	sess.slots = append(sess.slots, slot{kind: slotUpstream, i: sess.call.Len(), metric: m, mute: sess.curMute, tx: sess.pin.inMulti})
	sess.call.Add(raw)
}

// forwardHidden adds a command whose reply is dropped: a fix-up the proxy
// adds after a client's command, on the same connection, right behind it.
func (sess *Session) forwardHidden(raw []byte) {
	sess.slots = append(sess.slots, slot{kind: slotHidden, i: sess.call.Len(), tx: sess.pin.inMulti})
	sess.call.Add(raw)
}

// forwardRefusal queues guard.RefusedInMulti in place of a command refused
// inside MULTI, so that Redis fails the client's EXEC with EXECABORT. Its
// error reply is the point, so it is dropped and never counted as a failed
// fix-up.
func (sess *Session) forwardRefusal() {
	sess.slots = append(sess.slots, slot{kind: slotRefusal, i: sess.call.Len(), tx: sess.pin.inMulti})
	sess.call.Add(guard.RefusedInMulti)
}

// forwardWithFixups sends a client's command followed by fix-ups (policy's
// EXPIRE ... NX) whose replies the client never sees. Outside a
// transaction the three travel as MULTI/command/fix-ups/EXEC in one Call on
// one shared connection, so they run atomically; the client gets its
// command's own reply (its queue-time error, or the first element of EXEC).
func (sess *Session) forwardWithFixups(raw []byte, fixups [][]byte, m *metrics.Command) {
	if sess.pin.pipe != nil {
		// Inside the client's MULTI the fix-ups are queued right behind the
		// command and their results are cut from EXEC's reply; under WATCH
		// a MULTI of our own would consume the client's WATCH, so they just
		// follow the command on the same connection.
		sess.forward(raw, m)
		for _, f := range fixups {
			sess.forwardHidden(f)
		}
		return
	}
	sess.forwardHidden(cmdMulti)
	first := sess.call.Len()
	sess.call.Add(raw)
	for _, f := range fixups {
		sess.forwardHidden(f)
	}
	sess.slots = append(sess.slots, slot{kind: slotWrapped, i: first, end: sess.call.Len(), metric: m, mute: sess.curMute})
	sess.call.Add(cmdExec)
}

var (
	cmdMulti = []byte("*1\r\n$5\r\nMULTI\r\n")
	cmdExec  = []byte("*1\r\n$4\r\nEXEC\r\n")
)

// pendingUpstream reports whether this batch has commands waiting to be
// sent. A reply served without Redis (a local-tier hit) is only correct if
// nothing of this client's is still to run before it.
func (sess *Session) pendingUpstream() bool { return sess.call.Len() > 0 }

// replyLocal records a reply built by the proxy.
func (sess *Session) replyLocal(m *metrics.Command, reply []byte) {
	start := len(sess.local)
	sess.local = append(sess.local, reply...)
	sess.slots = append(sess.slots, slot{kind: slotLocal, i: start, end: len(sess.local), metric: m, mute: sess.curMute})
}

// localBuf returns the buffer to build a local reply in; finishLocal then
// records it. This avoids a copy for replies built piecewise.
func (sess *Session) localBuf() ([]byte, int) { return sess.local, len(sess.local) }

func (sess *Session) finishLocal(m *metrics.Command, buf []byte, start int) {
	sess.local = buf
	sess.slots = append(sess.slots, slot{kind: slotLocal, i: start, end: len(buf), metric: m, mute: sess.curMute})
}

// flush sends the batch's forwarded commands, waits for their replies and
// appends every reply, local or upstream, to the output in request order.
// Commands that change how later commands are routed (SELECT, HELLO, ...)
// call flush before taking effect.
func (sess *Session) flush(start time.Time) {
	if len(sess.slots) == 0 {
		return
	}
	call := sess.call
	now := time.Now()
	if call.Len() > 0 {
		call.SetReplyLimit(sess.replyLimit())
		sent := now
		if sess.pin.pipe != nil {
			if err := sess.pin.pipe.Send(call); err != nil {
				call.Fail(err)
			} else {
				call.Wait()
			}
		} else if sess.srv.router != nil {
			sess.srv.router.Do(call, sess.resp3)
		} else {
			sess.srv.backend.Pool(sess.db, sess.resp3).Do(call)
		}
		now = time.Now()
		sess.upstreamWait += now.Sub(sent)
		if call.Overflowed() {
			sess.overLimit()
		} else {
			sess.noteReplySize(call)
		}
	}
	elapsed := now.Sub(start).Seconds()
	for _, sl := range sess.slots {
		var reply []byte
		switch sl.kind {
		case slotRefusal:
			continue
		case slotHidden:
			r, err := call.Reply(sl.i)
			if sl.tx && err == nil {
				sess.noteQueued(r, true)
			} else if (err != nil || resp.IsError(r)) && !errors.Is(err, upstream.ErrOutputLimit) {
				// (A fix-up whose reply was dropped with the client's ran.)
				sess.hiddenFailed(r, err)
			}
			continue
		case slotWrapped:
			r, err := call.Reply(sl.i)
			if err == nil && !resp.IsError(r) {
				var ex []byte
				if ex, err = call.Reply(sl.end); err == nil {
					r = firstElement(ex)
					sess.wrappedFixupResults(ex)
				}
			}
			if err != nil {
				r = errorReply(err)
			}
			reply = r
		case slotLocal:
			reply = sess.local[sl.i:sl.end]
		case slotUpstream:
			r, err := call.Reply(sl.i)
			if err != nil {
				if !sl.mute && !sess.outDead {
					sess.out = redcon.AppendError(sess.out, "ERR "+err.Error())
				}
				sl.metric.Errors.Inc()
				sl.metric.Latency.Observe(elapsed)
				continue
			}
			reply = r
			if sl.tx {
				sess.noteQueued(r, false)
			} else if sl.info {
				reply = sess.withProxyInfo(r)
			}
			if h := testHookReply.Load(); h != nil {
				reply = (*h)(sess.id, reply)
			}
		}
		if resp.IsError(reply) {
			sl.metric.Errors.Inc()
		}
		sl.metric.Latency.Observe(elapsed)
		if sl.exec {
			sess.pin.execRan = len(reply) > 1 && reply[0] == '*' && reply[1] != '-'
			sess.txFixupResults(reply, sess.pin.txHidden)
		}
		switch {
		case sl.mute:
		case sl.exec:
			if !sess.outDead {
				sess.out = stripExec(reply, sess.pin.txHidden, sess.out)
			}
		default:
			sess.emit(reply)
		}
	}
	clear(sess.slots)
	sess.slots = sess.slots[:0]
	sess.local = sess.local[:0]
	call.Reset()
	sess.batchFlushed()
}

func (sess *Session) metricFor(cmd *commands.Command) *metrics.Command {
	if cmd == nil {
		return sess.srv.metrics.Command("unknown")
	}
	return sess.srv.metrics.Command(cmd.Name)
}

var (
	errNoAuth = []byte("-NOAUTH Authentication required.\r\n")
)

func isAuthExempt(cmd *commands.Command) bool {
	if cmd == nil {
		return false
	}
	switch cmd.Name {
	case "auth", "hello", "quit", "reset":
		return true
	}
	return false
}

// firstElement returns the first element of an array reply, or the reply
// itself when it is not a non-empty array (an error, a null).
func firstElement(reply []byte) []byte {
	if len(reply) < 4 || reply[0] != '*' || reply[1] == '0' || reply[1] == '-' {
		return reply
	}
	nl := bytes.IndexByte(reply, '\n')
	if nl < 0 {
		return reply
	}
	n, err := resp.ScanReply(reply[nl+1:])
	if err != nil || n == 0 {
		return reply
	}
	return reply[nl+1 : nl+1+n]
}

// mayWrite reports whether cmd may write keys, for the write hooks (local
// tier invalidation, stampede hold release). Redis flags scripts and
// functions (EVAL, EVALSHA, FCALL) as neither read-only nor write, yet they
// may write any key, so they count as writes.
func mayWrite(cmd *commands.Command) bool {
	if cmd == nil {
		return false
	}
	if cmd.Flags&commands.Write != 0 {
		return true
	}
	return cmd.Parent == nil && cmd.Flags&commands.CatScripting != 0 && cmd.Flags&commands.ReadOnly == 0
}
