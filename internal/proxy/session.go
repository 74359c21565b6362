package proxy

import (
	"bytes"
	"errors"
	"log/slog"
	"net"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/guard"
	"github.com/redproxy/redproxy/internal/localcache"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/namespace"
	"github.com/redproxy/redproxy/internal/resp"
	"github.com/redproxy/redproxy/internal/stampede"
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
	nc  net.Conn // &conn, or a test's own connection
	// conn is the client's connection, in the Session's allocation: an
	// idle client keeps both, and a separate 64-byte object would sit
	// among the many short-lived ones of net's, leaving holes once they
	// are freed.
	conn clientConn
	rd   *resp.Reader
	id   int64

	// Connection state the shared upstream connections cannot carry. Only
	// the session goroutine writes it, holding mu, so CLIENT LIST from
	// another session can read it under mu.
	mu        sync.Mutex
	db        int
	resp3     bool
	authed    bool
	name      string
	libName   string
	libVer    string
	user      *auth.User                       // the proxy user after AUTH (users.go); nil: none
	createdAt int64                            // when the client connected, Unix ns
	lastCmd   atomic.Pointer[commands.Command] // for CLIENT INFO/LIST
	list      listState                        // the rest CLIENT INFO/LIST shows

	// sessionBatch is what only a session being served needs: nil while
	// it is parked (park.go), so that an idle client does not carry it.
	*sessionBatch

	// Output limits (limits.go).
	outLimit  int64 // server.client_output_limit
	replySize int64 // recent bytes per upstream reply, to split batches
	// closeReason is why the session ends, recorded once (close.go) by
	// the session or its relay goroutines; log is its logger, built on
	// first use.
	closeReason atomic.Pointer[string]
	log         atomic.Pointer[slog.Logger]

	// relayNode is, in cluster mode, the node a relayed client's
	// connection is on (relayBackend); "" otherwise.
	relayNode string
	// wroteSlot is, in cluster mode, 1 + the slot of the client's last
	// write, where its WAIT goes (clusterWaitBackend); 0: none yet.
	// (An int32, so that wroteMoves shares its word.)
	wroteSlot int32
	// wroteMoves is, outside cluster mode, 1 + the session's backend's
	// Moves() when the client's last write was forwarded; 0: none yet.
	// In cluster mode it is the owner of wroteSlot when the write's reply
	// came (Router.OwnerTag, batchFlushed); 0: not known. With routes it
	// is the same for the upstream of the client's last write, and for
	// the one upstream it wrote to that of each (routeSession.moves). A
	// WAIT after the backend moved to another server (a Sentinel
	// failover), or the slot to another node, answers 0 (waitAfterMove).
	wroteMoves uint32
	block      blockState
	replyOff   bool // CLIENT REPLY OFF
	replySkip  bool // CLIENT REPLY SKIP: mute the next command
	// relayInMulti: a relayed client has sent MULTI (appendRelayed).
	relayInMulti bool
	// scriptDebug: the client asked for the Lua debugger (SCRIPT DEBUG
	// YES or SYNC, refused), which on Redis would run its next EVAL in a
	// debugging session; until SCRIPT DEBUG NO or that EVAL it is refused
	// as Redis would be in that mode (scriptDebugStep).
	scriptDebug bool
	interrupted atomic.Bool
	park        sessionPark // parking while idle (park.go)

	route routeSession // with routes (routes.go)
	// reads is where the client's reads may go with replica reads on
	// (replicas.go).
	reads replicaReads
	// creads is the same per shard in cluster mode, made on first use
	// (clusterreplicas.go).
	creads *clusterReads

	ns nsState // the key prefix the client is confined to (namespace.go)
	// listener is the client listener the client came through
	// (listeners.go); set before the session starts, then only read. Its
	// namespace is in ns (namespace.go).
	listener *listener
}

// sessionBatch is the part of a session that holds the batch being
// answered and the state of a pinned or queued transaction. A session parks
// only with all of it at its zero value (parkable): its buffers given back,
// nothing pinned, no transaction open, no write reply due. So a parked
// session drops it and a resumed one starts from a fresh one, and what an
// idle client costs is the rest of the Session.
type sessionBatch struct {
	// relayTrack is what Redis holds of a tracking relay's CLIENT
	// TRACKING mode and CLIENT CACHING flag (keepCaching); here, not in
	// Session, which must stay in its size class (a relay never parks, so
	// its sessionBatch stays).
	relayTrack trackingState
	// cmds is the command set the batch is looked up in: the server's,
	// taken at the start of each batch read (serveBatch, a relay's reads),
	// so that a batch's commands and their handlers come from one table
	// even while a new one is swapped in (cmdtable.go). Here rather than
	// in Session, which must fit its size class (session_size_internal_test.go).
	cmds *commandSet
	// The batch being answered: forwarded commands are collected into one
	// Call; slots remember, for every command, where its reply comes from.
	call      *upstream.Call
	direct    *directReply // a lone command the pipe's reader answers (direct.go); nil until one
	slots     []slot
	local     []byte // replies the proxy built itself, back to back
	out       []byte // what goes to the client at the end of the batch
	batchReqs []resp.Request
	quitting  bool
	outDead   bool // the client is being closed: produce no more output (limits.go)
	curMute   bool // the command being dispatched gets no reply
	// curStrip: where the reply of the command being dispatched names
	// keys (namespace.go).
	curStrip namespace.Strip
	// slowExempt marks a batch whose time is the client's own choice (a
	// blocking command, a relay), which is never slow; upstreamWait adds
	// up the batch's waits for upstream replies, for the slow log.
	slowExempt   bool
	upstreamWait time.Duration
	cur          request   // the command being dispatched (classify)
	lastClass    classMemo // what classify found for the command before

	pin   pinState
	abort txAbort
	// watchRefused: the last flush let the pin go because Redis refused
	// the WATCH that took it (not lost: pinWatch tells them apart).
	watchRefused bool
	// cmulti is a MULTI in cluster mode that has no node yet (cluster.go).
	cmulti clusterMulti

	// guard is the guard's decisions for the batch (guard.go). Held by
	// value: besides the allocation saved, it puts sessionBatch in the
	// 640-byte size class, away from the runtime's goroutine records (480
	// bytes), which are never freed: a parked client's sessionBatch would
	// otherwise leave a hole between them that the heap cannot give back.
	guard guard.Batch
	// tierWrites are this client's writes whose replies are not in yet; the
	// local tier neither serves nor fills their keys meanwhile (tier.go).
	tierWrites localcache.Writes
	// flightWrites are this client's writes of keys under a miss hold or
	// early refresh rule whose replies are not in yet (flight.go).
	flightWrites stampede.Writes

	aclKeys []commands.KeyRef // scratch for the ACL's key checks
	mirrorS *mirrorState      // the batch's commands for the mirror (mirror.go); nil until one
	// aclDeny is sess.aclRefuses, made once: the guard's look-ahead asks it
	// which writes of a batch the user's ACL refuses (prepareBatch).
	aclDeny func(i int, cmd *commands.Command, args [][]byte) bool
	// protoErrAnswered: a relay ended on the client's protocol error and
	// wrote the error itself, after the replies that went before it. Here,
	// not in Session, which must stay in its size class (a relayed client
	// never parks, so this state is never dropped under it).
	protoErrAnswered bool
	// relayTx is what a relayed client's MULTI queued that its CLIENT
	// LIST line shows (relayStateStep); here for the same reason.
	relayTx relayTxState
	// resumed is the batch a relay held when it handed the client back to
	// the shared connections (relayexit.go), served before the next read.
	resumed []resp.Request
	// routeKeyPos is the routes' scratch for key positions (routes.go),
	// here and not in routeSession to leave Session room for what the
	// client wrote where (routeSession.wrote).
	routeKeyPos []int
}

// newSessionBatch is a session's batch state when it starts or resumes.
func newSessionBatch(cmds *commandSet) *sessionBatch {
	return &sessionBatch{call: upstream.NewCall(), cmds: cmds}
}

// slot says where one command's reply comes from.
type slot struct {
	kind   slotKind
	i      int // upstream reply index, or start of a local reply
	end    int // end of a local reply
	metric *metrics.Command
	tx     bool            // sent inside MULTI: its reply is +QUEUED or a queue-time error
	exec   bool            // EXEC of a transaction: strip the proxy's own commands' results
	mute   bool            // CLIENT REPLY OFF/SKIP: consume the reply, do not send it
	info   bool            // INFO: Redis's reply is rewritten (info.go withProxyInfo)
	infoPx bool            // INFO: with the proxy's section appended
	held   bool            // the replay of a held command (cluster.go), whose latency its +QUEUED counted
	opens  bool            // the WATCH that took the pin: lost unanswered or refused, it leaves the client unpinned (flush); in cluster mode openHeld answers a redirection of it (pinWatch)
	watch  bool            // a later WATCH on the pin: answered +OK, the pin holds what it watches
	multi  bool            // the MULTI that opens the client's transaction: its reply says whether Redis opened it (pinState.txOpened)
	own    bool            // slotHidden: the proxy's own bookkeeping (a held MULTI, a pin's CLIENT SETNAME, DISCARD, UNWATCH), not a policy fix-up: its failure is none of the policy's (forwardOwn)
	selDB  int             // a SELECT under WATCH, on the pinned connection: 1 + its database, which the session takes if Redis answers +OK (pinnedSelect)
	strip  namespace.Strip // namespace: where the reply names keys to strip
	part   bool            // slotWrapped: a part of a split command that more parts follow; its reply is merged into the last part's (forwardWithFixups)
}

type slotKind uint8

const (
	slotUpstream slotKind = iota // reply i of the batch's Call
	slotLocal                    // local[i:end]
	slotHidden                   // reply i of the Call, which the client must not see (a policy fix-up, or the proxy's own: slot.own)
	slotWrapped                  // a command wrapped in MULTI/EXEC with fix-ups: i is its queue reply, end is EXEC's
	slotRefusal                  // reply i of the Call to guard.RefusedInMulti, an error by design: dropped
)

func newSession(s *Server, nc net.Conn) *Session {
	cfg := s.Config()
	sess := &Session{
		srv:          s,
		id:           s.nextID.Add(1),
		sessionBatch: newSessionBatch(s.cmdSet()),
		createdAt:    time.Now().UnixNano(),
		authed:       !s.needsAuth(),
		outLimit:     int64(cfg.Server.ClientOutputLimit),
		replySize:    unknownReplySize,
	}
	cc := &sess.conn
	cc.Conn, cc.timeout, cc.sess = nc, cfg.Server.ClientWriteTimeout.Duration, sess
	sess.nc = cc
	sess.rd = sess.newReader()
	sess.park.idle = cfg.Server.IdleTimeout.Duration
	return sess
}

// newReader returns a Reader of the client's requests: at the start, and
// when a parked session resumes (park.go).
func (sess *Session) newReader() *resp.Reader {
	rd := resp.NewReader(sess.nc, sess.srv.clientLimits())
	rd.OnIdle(sess.idle)
	rd.SetUnauthenticated(!sess.authed)
	rd.SetBatchCap(&sess.srv.batchLoad.cap)
	return rd
}

// interrupt asks the session to stop after the batch it is answering; an
// idle session blocked in a read is woken at once, a parked one resumed.
func (sess *Session) interrupt() {
	sess.interrupted.Store(true)
	sess.mu.Lock() // the connection may be parking or resuming (park.go)
	if cc, ok := sess.nc.(*clientConn); !ok || cc.Conn != nil {
		sess.nc.SetReadDeadline(time.Now())
	}
	sess.mu.Unlock()
	sess.wake()
}

// serve serves the client until its connection ends, then tells the
// server; or until it parks (park.go), and then a later goroutine calls
// serve again.
func (sess *Session) serve() {
	if sess.run() {
		return
	}
	sess.srv.sessionEnded(sess)
}

// run is the session's loop: read a batch, answer it, write the replies.
// It reports whether the session parked; only otherwise do the deferred
// clean-ups run.
func (sess *Session) run() (parked bool) {
	defer func() {
		if parked {
			return
		}
		// Outside the recover below, which records a panic's reason for
		// ended to count: a bug in ending a session must not take the
		// proxy down either.
		defer func() {
			if r := recover(); r != nil {
				sess.srv.log.Error("BUG: panic while ending a client session", "client_id", sess.id, "panic", r, "stack", string(debug.Stack()))
			}
		}()
		sess.ended()
	}()
	defer func() {
		if parked {
			return
		}
		// A bug handling one client must not take the proxy and every
		// other client down with it.
		if r := recover(); r != nil {
			reason := metrics.ClosePanic
			sess.closeReason.Store(&reason)
			sess.logger().Error("BUG: panic while serving a client; connection closed", "panic", r, "stack", string(debug.Stack()))
		}
	}()
	defer func() {
		if !parked {
			sess.rd.Close() // it may hold the socket (resp.Reader.reads)
			sess.nc.(*clientConn).closeOwn()
		}
	}()
	defer func() {
		if !parked {
			sess.sessionClosed()
		}
	}()
	defer func() {
		if !parked {
			sess.unpin(false)
			sess.recordOpenLeft() // a transaction the proxy held (cluster.go)
		}
	}()
	// First of all on the way out: the pipe's reader may still be writing
	// a direct reply to the socket the other steps close.
	defer func() {
		if !parked {
			sess.waitDirect()
			sess.endLead(nil, errLeadDropped) // a panic between the read's Begin and its flush
		}
	}()
	idle := sess.park.idle
	for {
		if sess.interrupted.Load() {
			sess.closing(sess.interruptReason())
			return false
		}
		var reqs []resp.Request
		var err error
		var received uint64
		parkable, fromReader := false, false
		if sess.resumed != nil {
			// Read already, by a relay that has left (relayexit.go).
			reqs, sess.resumed = sess.resumed, nil
		} else {
			sess.readDeadline(idle)
			parkable = sess.parkable()
			if parkable {
				sess.park.state.Store(parkWaiting)
			}
			// A session that may park is looked at by the sweeper within
			// idle_park_after, and a client gone while parked is noticed;
			// any other (also every one when idle_park_after is 0, where
			// only pressure parks) reads again before it waits
			// (SetReadFirst).
			sess.rd.SetReadFirst(!parkable || sess.srv.Config().Server.IdleParkAfter.Duration <= 0)
			received = sess.rd.Received()
			reqs, err = sess.rd.ReadBatch()
			fromReader = true
		}
		if parkable && !sess.park.state.CompareAndSwap(parkWaiting, parkBusy) {
			// The sweeper asked this idle session to park (park.go). A
			// parked session keeps no Call and its socket may change.
			sess.waitDirect()
			if sess.quitting {
				return false // its direct reply failed: end it, never park it
			}
			parked, retry := sess.answerPark(len(reqs), err, idle)
			if parked {
				return true
			}
			if retry {
				continue
			}
		}
		if fromReader && idle > 0 && sess.sendingAtDeadline(len(reqs), err, received) {
			continue // the wait starts again, with a new idle_timeout
		}
		if len(reqs) > 0 {
			sess.srv.metrics.BatchRequests.Observe(float64(len(reqs)))
			sess.serveBatch(reqs, fromReader && err == nil)
		}
		if err != nil {
			sess.readEnded(err)
			var pe *resp.ProtocolError
			if errors.As(err, &pe) && !sess.protoErrAnswered {
				// As Redis does: say why, then close, because the rest of
				// the stream can no longer be framed.
				sess.srv.metrics.ProtocolErrors.Inc()
				sess.out = redcon.AppendError(sess.out, "ERR "+pe.Error())
			}
		}
		if len(sess.out) > 0 {
			sess.waitDirect() // its reply goes first
		}
		if len(sess.out) > 0 && !sess.outDead {
			if !sess.writeOut(sess.out) {
				return false
			}
			if cap(sess.out) > 1<<20 {
				sess.out = nil
			}
		}
		if err != nil || sess.quitting {
			// Whatever set quitting recorded why.
			return false
		}
	}
}

// sendingAtDeadline reports whether a read that returned got requests and
// err ended at the idle_timeout deadline while part of a request came
// (the Reader's Received moved from received): the client is sending (a
// large value over a slow link, a request in small pieces), and Redis's
// timeout counts every byte read as activity (found by a probe: a 16 MB
// SET sent at 2 MB/s was cut at 5 s, where Redis with timeout 5 answered
// +OK). Not when an interruption (CLIENT KILL, shutdown) moved the
// deadline.
func (sess *Session) sendingAtDeadline(got int, err error, received uint64) bool {
	return got == 0 && errors.Is(err, os.ErrDeadlineExceeded) && !sess.interrupted.Load() && sess.rd.Received() != received
}

// lookAheadBytes bounds how far past a batch's first byte the look-ahead
// reads for a write's TTL (Session.extendBatch); a pipeline longer than
// that is decided in parts, as before.
const lookAheadBytes = 1 << 20

// lookAheadRequests is how many requests one look-ahead pass may add to
// a batch past its cap (resp.DefaultMaxBatch): a write and the EXPIRE
// after it on either side of the cap were decided apart (found by a
// probe: INCR as the 1,024th request and EXPIRE NX as the 1,025th got the
// rule's default and :0, where Redis answers :1). Small, so that a pass
// ends soon after the cut it was for, where the batch's new end is
// likely not another cut.
const lookAheadRequests = 64

// maxLookAheadPasses bounds how often one batch is extended and decided
// again: a client that trickles a request per write, each ending with the
// start of the next, would otherwise have the whole batch re-parsed and
// re-decided once per request (found by review). A pipeline read in 16 KB
// and then doubling reads reaches lookAheadBytes in fewer.
const maxLookAheadPasses = 16

// lookAheadWait bounds the wait for more of the client's bytes: the rest
// of a request cut by a read comes at once from a client in mid-write,
// and a read that merely filled the buffer may have left nothing.
const (
	lookAheadWaitPartial = 200 * time.Millisecond
	lookAheadWaitFull    = 2 * time.Millisecond
)

// extendBatch reads on past the batch for the look-ahead
// (resp.Reader.Extend); a nil reqs leaves the batch as it is.
func (sess *Session) extendBatch() (reqs []resp.Request, grew bool) {
	wait := lookAheadWaitFull
	if sess.rd.Buffered() {
		wait = lookAheadWaitPartial
	}
	sess.nc.SetReadDeadline(time.Now().Add(wait))
	extra := lookAheadRequests
	if sess.srv.batchLoad.cap.Load() > 0 {
		extra = 0 // loaded: every client's batches stay small (batchLoad)
	}
	reqs, grew = sess.rd.Extend(lookAheadBytes, extra)
	// The session's own deadline again at once: a relay that the batch
	// starts reads the socket before the loop sets it. Unless interrupt
	// (shutdown, CLIENT KILL) set one meanwhile, which this would erase:
	// a relay with no idle timeout then waited for its client past the
	// shutdown timeout (found by review).
	sess.park.clearDead = true
	sess.readDeadline(sess.park.idle)
	if sess.interrupted.Load() {
		sess.nc.SetReadDeadline(time.Now())
	}
	return reqs, grew
}

// serveBatch answers every request of one batch and appends the replies to
// sess.out in request order. extendable: reqs is what the Reader last
// returned, and nothing has read the connection since.
func (sess *Session) serveBatch(reqs []resp.Request, extendable bool) {
	sess.srv.batchLoad.enter()
	defer sess.srv.batchLoad.leave()
	sess.waitDirect()
	start := time.Now()
	at := batchStart{sess.user, sess.db} // for the slow log: this goroutine alone writes them
	sess.cmds = sess.srv.cmdSet()
	for pass := 0; ; pass++ {
		sess.batchReqs = reqs
		sess.list.active.Store(start.UnixNano())
		if sess.ns.w != nil {
			sess.nsRewriteBatch(reqs)
		}
		sess.prepareBatch(reqs)
		if !extendable || pass == maxLookAheadPasses || !sess.guard.CutOff() || sess.interrupted.Load() {
			break
		}
		// A write would get a fix-up or a refusal because the batch ended
		// before the EXPIRE the client sent after it in the same write
		// (found by a user's trial: INCR and EXPIRE NX 16 KB into a
		// pipeline left a limiter's key with the rule's default of an
		// hour). Take what follows and decide again.
		more, grew := sess.extendBatch()
		if more == nil {
			break
		}
		reqs = more
		// The wait was the client's, not the proxy's: the slow log and
		// the latency metrics start from here.
		start = time.Now()
		if !grew {
			extendable = false // parsed anew, nothing added: decide once more, then go
		}
	}
	for i := range reqs {
		if i > 0 && !sess.guard.Joined(i) && sess.outputDue() {
			// Answer what the batch owes before forwarding more of it;
			// but never between a write and the later command its TTL
			// was trusted from (guard.Batch.Joined).
			sess.flush(start)
		}
		if sess.quitting || sess.resumed != nil {
			break // a relay that left has taken the rest of the batch
		}
		sess.dispatch(i, &reqs[i])
	}
	sess.flush(start)
	if sess.abort.batchOnly && !sess.abort.multi {
		sess.abort = txAbort{} // pinWatch: the lost WATCH's batch is over
	}
	sess.endLead(nil, errLeadDropped) // normally nothing: flush has sent the read or ended its lead
	// A batch whose reply went direct is timed by the pipe's reader
	// (direct.go); asking first spares a lone read a clock read (about
	// 50 ns here, 1 % of a GET at -P 1).
	if !sess.directInFlight() {
		if took := time.Since(start); took >= sess.srv.slow.threshold && !sess.slowExempt {
			sess.noteSlow(reqs, start, took, sess.upstreamWait, at)
		}
	}
	sess.upstreamWait, sess.slowExempt = 0, false
	sess.cur = request{} // holds nothing of the batch while the client idles
	if sess.ns.w != nil {
		sess.nsBatchDone()
	}
}

// noteLastCmd records cmd as the client's last command, for CLIENT INFO
// and LIST, in dispatch and on a relay. Stored only when it changes: the
// session's goroutine is its only writer, and the store (a pointer, with
// the GC's write barrier) was 2 % of the proxy's CPU on pipelines of one
// command.
func (sess *Session) noteLastCmd(cmd *commands.Command) {
	if sess.lastCmd.Load() != cmd {
		sess.lastCmd.Store(cmd)
	}
}

// dispatch decides where one command goes. It is the seam where the guard,
// policy, stampede and local-tier steps sit between client and Redis; the
// command is classified once (classify) and the steps share that.
func (sess *Session) dispatch(i int, req *resp.Request) {
	r := sess.classify(i, req)
	sess.noteLastCmd(r.cmd)
	r.m.Calls.Inc()
	sess.curMute = sess.replyOff || sess.replySkip
	sess.replySkip = false
	sess.curStrip = namespace.StripNone
	if sess.crossProtocolStep(r) {
		return
	}
	if sess.nulNameStep(r) {
		return
	}
	if !sess.authed && !isAuthExempt(r.cmd) {
		sess.replyLocal(r.m, noAuthReply(r))
		return
	}
	if sess.abort.reason != nil && sess.abortedStep(r) {
		return
	}
	if sess.aclRefused(r) {
		return
	}
	// The guard's violations are recorded and its refusal answered first,
	// so that commands the proxy handles itself (MONITOR, SUBSCRIBE,
	// blocking commands, transactions) are reported and refused like any
	// other.
	if sess.guardRecord(r) {
		return
	}
	if tx := sess.pin.txOpen; tx != nil && tx.unkept != nil {
		defer sess.recordUnkept() // guard.go
	}
	if sess.scriptDebug && sess.scriptDebugStep(r) {
		return
	}
	if t := sess.srv.tier; t != nil && r.cmd != nil && r.cmd.Flags&commands.CatScripting != 0 {
		// Before EVALSHA or FCALL can run what it loads
		// (localcache/scripts.go).
		t.cache.NoteScript(r.cmd, r.Args)
	}
	if sess.ns.w != nil && sess.nsStep(r) {
		return
	}
	if sess.srv.router != nil && sess.clusterStep(r) {
		return
	}
	if sess.srv.routes != nil && sess.routeStep(r) {
		return
	}
	if sess.pin.pipe != nil && sess.dispatchPinned(r) {
		return
	}
	if r.entry != nil && r.entry.answer != nil && sess.answer(r) {
		return
	}
	if sess.guardStep(r) {
		return
	}
	if sess.pin.pipe == nil && sess.sharesUpstream() && (sess.tierStep(r) || sess.flightStep(r)) {
		return
	}
	sess.forwardCommand(r)
}

// forwardCommand adds the client's command, unchanged, to the batch's
// upstream Call, telling the write hooks first if it may write.
func (sess *Session) forwardCommand(r *request) {
	if mayWrite(r.cmd) {
		sess.writeForwarded(r.cmd, r.Args)
	}
	sess.replicaForwarded(r)
	sess.slots = append(sess.slots, sess.upstreamSlot(r.m))
	if readDuringPause(r.cmd) {
		sess.call.AddRead(r.Raw)
	} else {
		sess.call.Add(r.Raw)
	}
	sess.mirrorNote(r)
}

// readDuringPause reports whether Redis answers cmd while CLIENT PAUSE
// WRITE holds writes: its table flags it readonly, and neither write nor
// blocking. PFCOUNT is left out: it may rewrite its key's encoding, and
// Redis from 7.2 pauses it.
func readDuringPause(cmd *commands.Command) bool {
	return cmd != nil && cmd.Flags&(commands.ReadOnly|commands.Write|commands.Blocking) == commands.ReadOnly && cmd.Name != "pfcount"
}

// forward adds a command to the batch's upstream Call.
func (sess *Session) forward(raw []byte, m *metrics.Command) {
	sess.slots = append(sess.slots, sess.upstreamSlot(m))
	sess.call.Add(raw)
}

// upstreamSlot is the slot of the command about to be added to the Call.
func (sess *Session) upstreamSlot(m *metrics.Command) slot {
	return slot{kind: slotUpstream, i: sess.call.Len(), metric: m, mute: sess.curMute, tx: sess.pin.inMulti, strip: sess.curStrip}
}

// forwardHidden adds a command whose reply is dropped: a fix-up the proxy
// adds after a client's command, on the same connection, right behind it.
func (sess *Session) forwardHidden(raw []byte) {
	sess.slots = append(sess.slots, slot{kind: slotHidden, i: sess.call.Len(), tx: sess.pin.inMulti})
	sess.call.Add(raw)
}

// forwardOwn is forwardHidden for a command of the proxy's own
// bookkeeping on the client's connection, no policy fix-up: one that
// failed was counted and logged as a failed TTL fix-up, with the policy
// off too (found by a fault probe).
func (sess *Session) forwardOwn(raw []byte) {
	sess.forwardHidden(raw)
	sess.slots[len(sess.slots)-1].own = true
}

// forwardRefusal queues guard.RefusedInMulti in place of a command refused
// inside MULTI, so that Redis fails the client's EXEC with EXECABORT. Its
// error reply is the point, so it is dropped and never counted as a failed
// fix-up.
func (sess *Session) forwardRefusal() {
	sess.slots = append(sess.slots, slot{kind: slotRefusal, i: sess.call.Len(), tx: sess.pin.inMulti})
	sess.call.Add(guard.RefusedInMulti)
}

// refusedInMulti makes the client's EXEC fail, as a queue-time error does,
// when the proxy refused a command inside its MULTI; outside MULTI it does
// nothing.
func (sess *Session) refusedInMulti() {
	switch {
	case sess.pin.inMulti:
		sess.forwardRefusal()
	case sess.cmulti.open:
		sess.cmulti.failed = true // a cluster MULTI with no node yet
	}
}

// forwardWithFixups sends a client's command followed by fix-ups (policy's
// EXPIRE ... NX) whose replies the client never sees. Outside a
// transaction the three travel as MULTI/command/fix-ups/EXEC in one Call on
// one shared connection, so they run atomically; the client gets its
// command's own reply (its queue-time error, or the first element of EXEC).
//
// A command split over several nodes or upstreams (parts, see splitWrite)
// cannot be in one MULTI: each part goes in its own, with its keys'
// fix-ups, to its node; the client gets one reply, the first part's error
// or the last part's (slot.part). Each part is atomic with its fix-ups;
// the parts are not one transaction, as the split command itself is not.
func (sess *Session) forwardWithFixups(raw []byte, fixups [][]byte, m *metrics.Command, parts []writePart) {
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
	if parts == nil {
		sess.forwardWrapped(raw, fixups, m, false)
		return
	}
	for i, p := range parts {
		sess.forwardWrapped(resp.AppendCommand(nil, p.args...), p.fixups, m, i < len(parts)-1)
	}
}

// forwardWrapped sends raw and its fix-ups in a MULTI of the proxy's own;
// part: more parts of the same client command follow (forwardWithFixups).
func (sess *Session) forwardWrapped(raw []byte, fixups [][]byte, m *metrics.Command, part bool) {
	sess.forwardHidden(cmdMulti)
	first := sess.call.Len()
	sess.call.Add(raw)
	for _, f := range fixups {
		sess.forwardHidden(f)
	}
	sess.slots = append(sess.slots, slot{kind: slotWrapped, i: first, end: sess.call.Len(), metric: m, mute: sess.curMute, part: part})
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
	sess.waitDirect() // whatever this answers goes after it
	if len(sess.slots) == 0 {
		return
	}
	call := sess.call
	now := time.Now()
	overflowed := false
	if call.Len() > 0 {
		call.SetReplyLimit(sess.replyLimit())
		sess.reads.answered = false // set by the replica paths below
		sent := now
		if sess.pin.pipe != nil {
			if err := sess.pin.pipe.Send(call); err != nil {
				call.Fail(err)
			} else {
				call.Wait()
			}
		} else if sess.srv.router != nil {
			sess.clusterDo(call) // to primaries, or replicas for reads (clusterreplicas.go)
		} else if sess.srv.routes != nil {
			sess.routedDo(call)
		} else if !sess.directable() {
			sess.sendUpstream(call, sess.backend()) // the primary, or a replica for reads (replicas.go)
		} else if sess.sendDirect(call, sess.slots[0].metric, start, sent) {
			// The pipe's reader answers the client (direct.go).
			clear(sess.slots)
			sess.slots = sess.slots[:0]
			return
		}
		sess.endLead(call, nil) // a lone read that leads a fetch but did not go direct
		now = time.Now()
		sess.upstreamWait += now.Sub(sent)
		if call.Overflowed() {
			overflowed = true // answered up to its first dropped reply, then closed (below)
		} else {
			sess.noteReplySize(call)
		}
	}
	// Every reply of the batch is in (or failed): the writes' marks are
	// released and a fence, if one is due, raised now, before any reply
	// is handed out. emit writes the output to the client as soon as it
	// passes outSpill, so a write's reply may reach the client inside the
	// loop below; a fence raised after it let another client that had
	// seen a script's OK read the tier's value from before the script
	// until the invalidation came (seen in the differential test's long
	// runs, reproduced by TestTierFenceIsUpBeforeTheScriptsReplyIsWritten).
	sess.batchFlushed()
	if !sess.outDead && int64(len(sess.out)+len(sess.local)) > sess.outLimit {
		// Replies the proxy built itself (local-tier hits, coalesced
		// reads' followers) count against the limit as Redis's do; the
		// Call's limit left room for them, so only they can be over it.
		// They were not held to it (found by review: followers of a 1 MB
		// read got it whole under a 256 KB limit, their leader closed).
		sess.overLimit()
	}
	elapsed := now.Sub(start).Seconds()
	var lat latencyRun
	var partErr []byte // the first error among a split command's parts so far
	sawPart := false   // a part of a split command was seen, its last not yet
	watchLost := false
	watchRefused := false // the WATCH that took the pin, and none after it, was refused
	for _, sl := range sess.slots {
		if overflowed && !sess.outDead && sl.kind != slotLocal && sl.kind != slotRefusal {
			last := sl.i // the slot's last reply in the Call
			if sl.kind == slotWrapped {
				last = sl.end // its EXEC's, which carries its reply
			}
			if last >= call.Dropped() {
				// The replies before the first one dropped for the
				// limit are the client's, and it is closed after them
				// (found by a probe: four pipelined 20 MB reads on a new
				// connection got nothing, though three fit in the
				// limit; Redis sends all four).
				sess.overLimitAfterOwed()
			}
		}
		var reply []byte
		switch sl.kind {
		case slotRefusal:
			continue
		case slotHidden:
			r, err := call.Reply(sl.i)
			if sl.multi {
				// The MULTI of a transaction the proxy held (placeHeld).
				sess.pin.txOpened = err == nil && string(r) == "+OK\r\n"
			}
			if sl.tx && err == nil {
				sess.noteQueued(r, true, !sl.own, nil)
			} else if !sl.own && (err != nil || resp.IsError(r)) && !errors.Is(err, upstream.ErrOutputLimit) {
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
			if sl.part || sawPart {
				// The parts of a split command answer once: the first
				// part's error, else the last part's reply.
				if partErr == nil && resp.IsError(r) {
					partErr = r
				}
				if sl.part {
					sawPart = true
					continue
				}
				if partErr != nil {
					r = partErr
				}
				partErr, sawPart = nil, false
			}
			reply = r
		case slotLocal:
			reply = sess.local[sl.i:sl.end]
		case slotUpstream:
			r, err := call.Reply(sl.i)
			if err != nil {
				if !sl.mute && !sess.outDead {
					if sl.multi && !errors.Is(err, upstream.ErrOutputLimit) {
						// The MULTI's connection was lost (or closed as
						// late) before its reply, taking the transaction
						// with it. Answered +OK, as Redis answers MULTI,
						// the failure comes with the commands after it
						// and EXEC, as for a MULTI that got no connection
						// (pinForOn): an error here left a client that
						// stops reading at MULTI's error a reply behind.
						sess.out = append(sess.out, ok...)
					} else {
						sess.out = appendErrorReply(sess.out, err)
					}
				}
				watchLost = watchLost || sl.opens
				sl.metric.Errors.Inc()
				if !sl.held {
					lat.note(sl.metric, elapsed)
				}
				continue
			}
			reply = r
			if sl.multi {
				sess.pin.txOpened = string(r) == "+OK\r\n"
			}
			if sl.selDB > 0 && string(r) == "+OK\r\n" {
				sess.mu.Lock()
				sess.db = sl.selDB - 1
				sess.mu.Unlock()
			}
			if sess.pin.cluster && resp.IsError(r) {
				reply = sess.clusterPinnedReply(r, sl.exec, sl.tx)
				if sl.opens && sess.pin.redirected != nil {
					continue // pinWatch answers it, or sends it again elsewhere
				}
			}
			if sl.opens || sl.watch {
				watchRefused = sl.opens && resp.IsError(r) || watchRefused && resp.IsError(r)
			}
			if sl.tx {
				if sl.strip != namespace.StripNone {
					sess.nsQueued(r, sl.strip)
				}
				sess.noteQueued(r, false, false, sl.metric)
			} else if sl.info {
				reply = sess.withProxyInfo(r, sl.infoPx)
			} else if sl.strip != namespace.StripNone {
				reply = sess.nsStripped(sl.strip, reply)
			}
			if h := testHookReply.Load(); h != nil {
				reply = (*h)(sess.id, reply)
			}
		}
		if resp.IsError(reply) {
			sl.metric.Errors.Inc()
		}
		if !sl.held {
			lat.note(sl.metric, elapsed)
		}
		if sl.exec {
			sess.pin.execRan = len(reply) > 1 && reply[0] == '*' && reply[1] != '-'
			sess.txFixupResults(reply, sess.pin.txHidden)
			sess.countExecErrors(reply)
		}
		switch {
		case sl.mute:
		case sl.exec:
			if !sess.outDead {
				sess.out = stripExec(sess.nsExec(reply), sess.pin.txHidden, sess.out)
			}
		default:
			sess.emit(reply)
		}
	}
	lat.flush(elapsed)
	if overflowed && !sess.outDead {
		sess.overLimitAfterOwed()
	}
	sess.watchRefused = false
	if (watchLost || watchRefused) && !sess.pin.inMulti {
		sess.watchRefused = !watchLost
		// The WATCH that took the pin got an error in place of its reply:
		// its connection was lost, with whatever it watched. The client
		// was told so before it had anything to guard, as for a WATCH
		// refused at max_pinned, and everything it sent behind the WATCH
		// went on that connection and failed too. Kept, the pin put the
		// client in txAbort at its next command, which only UNWATCH, EXEC
		// or DISCARD ends, and a client whose WATCH failed sends none of
		// them (go-redis sends UNWATCH only after a WATCH that succeeded):
		// found by review, one CLIENT KILL on Redis left such a go-redis
		// connection failing every command. Under MULTI the abort stays:
		// the client may queue more behind it (txAbort).
		//
		// Refused by Redis (-CLUSTERDOWN, -NOPERM, -BUSY, ...), the WATCH
		// left no state there either. Kept, the pin held a dedicated
		// connection for as long as the client stayed (max_pinned then
		// refused others), and in cluster mode bound every later command
		// to the WATCH's slot (-CROSSSLOT; found by the cluster soak,
		// after failovers).
		sess.unpin(false)
	}
	if sess.mirrorS != nil && len(sess.mirrorS.marks) > 0 {
		sess.mirrorFlushed(call)
	}
	clear(sess.slots)
	sess.slots = sess.slots[:0]
	sess.local = sess.local[:0]
	call.Reset()
}

// latencyRun adds up a batch's consecutive replies of one command, whose
// latencies are all the batch's, into one observation of the histogram.
type latencyRun struct {
	m *metrics.Command
	n uint64
}

func (r *latencyRun) note(m *metrics.Command, elapsed float64) {
	if m != r.m {
		r.flush(elapsed)
		r.m = m
	}
	r.n++
}

func (r *latencyRun) flush(elapsed float64) {
	if r.n > 0 {
		r.m.Latency.ObserveN(elapsed, r.n)
		r.n = 0
	}
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

// noAuthReply is Redis's refusal of r from a client that has not
// authenticated: Redis looks the command (and a container's subcommand) up
// and checks its arity first, and refuses EXEC with an EXECABORT (found by
// review: the proxy answered NOAUTH to all). A command the proxy's table
// does not know is answered as unknown, which Redis would only say of one
// it does not know either.
func noAuthReply(r *request) []byte {
	switch {
	case r.cmd == nil:
		return errUnknownCommand(r.Args)
	case r.cmd.Subcommands != nil: // a container Lookup found no subcommand of
		if len(r.Args) < 2 {
			return errArity(r.cmd.Name)
		}
		return []byte("-" + unknownSubcommandMsg(r.Args) + "\r\n")
	case r.wrongArity():
		if r.cmd.Name == "exec" {
			return errExecArity
		}
		return errArity(r.cmd.Name)
	case r.cmd.Name == "exec":
		return errExecNoAuth
	}
	return errNoAuth
}

var errExecNoAuth = []byte("-EXECABORT Transaction discarded because of: NOAUTH Authentication required.\r\n")

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
// may write any key, so they count as writes. So does DEBUG, flagged as
// neither: DEBUG RELOAD and LOADAOF replace the whole dataset, and the
// local tier flushes on them (its other subcommands change nothing there;
// the mirror leaves DEBUG out, mirrorsAsWrite).
func mayWrite(cmd *commands.Command) bool {
	if cmd == nil {
		return false
	}
	if cmd.Flags&commands.Write != 0 || cmd.Name == "debug" {
		return true
	}
	return cmd.Parent == nil && cmd.Flags&commands.CatScripting != 0 && cmd.Flags&commands.ReadOnly == 0
}
