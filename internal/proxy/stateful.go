package proxy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/localcache"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/rawio"
	"github.com/redproxy/redproxy/internal/resp"
	"github.com/redproxy/redproxy/internal/route"
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
//     dedicated connection for the rest of its life (a subscriber
//     that unsubscribes from everything comes back: relayexit.go), with a
//     bounded output queue that cuts off a client that stops reading.

// pinState is the session's transaction state.
type pinState struct {
	pipe *upstream.Pipe
	// backend is where pipe came from and goes back to: the client's
	// backend, or in cluster mode the node owning the transaction's slot.
	backend *upstream.Backend
	// addr is backend's address when the pipe was taken: a reload or a
	// Sentinel failover that moves backend leaves the pipe on addr.
	addr string
	// cluster: pinned in cluster mode, where every key of the transaction
	// must hash to slot (-1: none seen yet) and a MOVED or ASK from the
	// node fails the transaction (clusterPinned, clusterPinnedReply).
	cluster  bool
	slot     int
	db       int
	resp3    bool
	inMulti  bool
	watching bool
	dirty    bool // the connection's state differs from a fresh one
	named    bool // it carries the client's name, to be undone before reuse
	// txOpened: Redis answered the client's MULTI +OK, so what follows
	// is queued there, not run (txDefers). inMulti is set when MULTI is
	// sent: an upstream user without +multi answers -NOPERM and runs
	// what follows at once (found by review).
	txOpened bool

	// Positions, in the transaction's queue, of commands the proxy added
	// (policy fix-ups); their results are removed from EXEC's reply.
	txPos    int
	txHidden []int
	// txMetrics are the queued commands' metrics in queue order (nil for
	// the proxy's own): errors in EXEC's reply are counted against them,
	// as Redis counts each failed command (found by a probe: WRONGTYPE
	// inside EXEC counted nowhere).
	txMetrics []*metrics.Command
	// Writes queued in MULTI take effect at EXEC; the write hooks hear of
	// them then, not when they are queued.
	txWrites []txWrite
	txSelect int    // a SELECT queued in MULTI, applied when EXEC runs (-1: none)
	txName   string // a CLIENT SETNAME's name queued in MULTI (txNamed), the client's when EXEC runs
	txNamed  bool
	execRan  bool // the last EXEC ran its commands (not aborted)
	// txSelected: a SELECT, valid or not, is queued in this MULTI, so
	// the writes after it may run in another database than the one they
	// are marked in (tierWriteForwarded).
	txSelected bool
	// redirected is the error a command sent outside MULTI was answered
	// in place of the node's MOVED or ASK (clusterPinnedReply): the slot
	// has left the node, what the WATCH guards is no longer there, and
	// the client was told the transaction will fail, so EXEC must.
	redirected []byte
	// txOpen: TTL requirements the policy left to the rest of the
	// transaction (guard.go); nil until one.
	txOpen *txOpenTTL
	// With routes: the keys the client WATCHed on this connection (copies)
	// and the route table in force at the first WATCH, which placed it on
	// slot's upstream. A reload that moves one of them elsewhere makes
	// EXEC answer the null of a failed WATCH (watchMoved).
	watchKeys   [][]byte
	watchRoutes *route.Table
}

// txAbort is the state of a client whose transaction the proxy could not
// carry: the pinned connection holding its WATCH or MULTI was lost (a Redis
// timeout, CLIENT KILL, a failover), or its MULTI was refused (max_pinned,
// a failed dial). The client may already have sent, in the same write, the
// commands meant for the transaction; none of them may run on a shared
// connection, unguarded by the WATCH and outside MULTI, where a client that
// retries on EXEC's failure would apply them twice. So until the
// transaction ends every command fails with reason:
//
//   - EXEC answers EXECABORT, as Redis does for a transaction with a
//     queue-time error, and ends the state;
//   - DISCARD after MULTI answers +OK and ends it;
//   - UNWATCH before MULTI answers +OK and ends it (after MULTI Redis would
//     queue it, so it fails like any other command);
//   - RESET ends it and QUIT closes, as always;
//   - MULTI answers +OK and marks the transaction as opened (a second
//     one: Redis's nesting error).
type txAbort struct {
	reason []byte // the error reply; nil when no transaction is aborted
	multi  bool   // the client has sent MULTI
	// batchOnly: the state ends with the client's batch unless MULTI
	// came in it (pinWatch, a WATCH lost before its reply).
	batchOnly bool
}

var (
	errTxConnLost = []byte("-ERR redproxy: transaction aborted: its upstream connection was lost; EXEC, DISCARD or UNWATCH ends it\r\n")
	errExecAbort  = []byte("-EXECABORT Transaction discarded because of previous errors.\r\n")
	errExecArity  = []byte("-EXECABORT Transaction discarded because of: wrong number of arguments for 'exec' command\r\n")
)

// watchFailed ends a WATCH that got no connection (err) as one whose
// connection was lost before its reply (pinWatch, flush): the rest of the
// client's write fails, and a MULTI in it aborts the transaction. A client
// that pipelines WATCH ... EXEC reads the WATCH's error only after
// sending the rest; run, it committed unguarded (found by a probe: WATCH,
// MULTI, SET, EXEC in one write to a frozen Redis answered the WATCH
// "upstream reply timeout" and EXEC [OK]). A client that sent the WATCH
// alone is told before it has anything to guard, and its next write is
// served as usual.
func (sess *Session) watchFailed(err error) {
	sess.abort = txAbort{reason: txAbortReason(err), batchOnly: true}
}

// txAbortReason is the reply to the commands of a transaction whose
// connection could not be had for err: Redis's own reply where the
// handshake met a state of Redis (-LOADING, -BUSY) that Redis would have
// answered each queued command with, else the proxy's error naming err.
func txAbortReason(err error) []byte {
	if r := handshakeStateReply(err); r != nil {
		return r
	}
	msg := strings.TrimPrefix(strings.TrimPrefix(err.Error(), "ERR "), "redproxy: ")
	return redcon.AppendError(nil, "ERR redproxy: transaction aborted: "+msg+"; EXEC or DISCARD ends it")
}

// abortedStep answers a command of a client in the txAbort state. It
// reports false for the commands handled as usual (RESET, QUIT).
func (sess *Session) abortedStep(r *request) bool {
	ab := &sess.abort
	m := r.m
	if r.wrongArity() {
		// Refused before it runs, as in dispatchPinned: "DISCARD x" or
		// "UNWATCH x" must not end the aborted transaction (what followed
		// ran outside it), nor "MULTI x" open one (found by review).
		if r.name == "exec" {
			*ab = txAbort{}
			sess.replyLocal(m, errExecArity)
			return true
		}
		sess.replyLocal(m, errArity(r.name))
		return true
	}
	switch r.name {
	case "reset", "quit":
		return false
	case "exec":
		*ab = txAbort{}
		sess.replyLocal(m, errExecAbort)
		return true
	case "discard":
		if ab.multi {
			*ab = txAbort{}
			sess.replyLocal(m, ok)
			return true
		}
	case "unwatch":
		if !ab.multi {
			*ab = txAbort{}
			sess.replyLocal(m, ok)
			return true
		}
	case "multi":
		// As Redis answers MULTI: +OK opens the transaction, whose
		// commands then fail with the reason (see pinForOn); a second one
		// is refused and leaves it open.
		if ab.multi {
			sess.replyLocal(m, errNestedMulti)
		} else {
			ab.multi = true
			sess.replyLocal(m, ok)
		}
		return true
	}
	sess.replyLocal(m, ab.reason)
	return true
}

type txWrite struct {
	cmd  *commands.Command
	args [][]byte
}

var queued = []byte("+QUEUED\r\n")

var (
	cmdReplyOff  = resp.AppendCommandStrings(nil, "CLIENT", "REPLY", "OFF")
	cmdReplySkip = resp.AppendCommandStrings(nil, "CLIENT", "REPLY", "SKIP")
	cmdClearName = resp.AppendCommandStrings(nil, "CLIENT", "SETNAME", "")
	cmdDiscard   = resp.AppendCommandStrings(nil, "DISCARD")
)

// The writes WAIT and WAITAOF wait for on a dedicated connection (see
// blocking), as markForWait takes them. Redis 7's SPUBLISH is
// replicated in standalone mode like PUBLISH, but no PSUBSCRIBE pattern
// matches a shard channel, so a client's PSUBSCRIBE * does not see the
// proxy's marker; PUBLISH serves Redis before 7 (waitMarkers).
var (
	waitMarkersSharded = [][]byte{resp.AppendCommandStrings(nil, "SPUBLISH", "__redproxy__:wait-mark", "")}
	waitMarkersClassic = [][]byte{resp.AppendCommandStrings(nil, "PUBLISH", "__redproxy__:wait-mark", "")}
)

// dispatchPinned handles a command while the client holds a pinned
// connection. It reports true when it handled the command; false sends it
// on through the ordinary dispatch (RESET, once the connection is given
// back).
func (sess *Session) dispatchPinned(r *request) bool {
	pin := &sess.pin
	if !pin.pipe.Up() {
		// The connection and its MULTI/WATCH state are gone: what follows
		// up to the transaction's end must fail (see txAbort).
		sess.flush(time.Now())
		sess.abort = txAbort{reason: errTxConnLost, multi: pin.inMulti}
		sess.unpin(false)
		return sess.abortedStep(r)
	}
	if r.wrongArity() {
		// Redis refuses a command of the wrong arity before it runs, so
		// it must neither end nor start anything here: given to its
		// handler, "RESET x" unpinned the client (what it sent next ran
		// outside its MULTI) and "MULTI x" under WATCH opened a
		// transaction Redis never opened (both found by the differential
		// test). Redis answers the error; inside MULTI it also fails EXEC.
		if r.name == "exec" {
			// Except EXEC: Redis aborts the transaction and drops the
			// WATCH for it (EXECABORT), so the connection is clean.
			return sess.endPin(r)
		}
		sess.forward(r.Raw, r.m)
		return true
	}
	if pin.inMulti && pin.txOpen != nil && len(pin.txOpen.due) > 0 {
		sess.fixDue() // before anything of this batch (guard.go)
	}
	if r.entry != nil && r.entry.pinned != nil && r.entry.pinned(sess, r) {
		return true
	}
	switch {
	case pin.pipe == nil:
		return false
	case pin.inMulti:
		sess.queueInMulti(r)
	default:
		sess.dispatchWatched(r)
	}
	return true
}

// The pinnedCommands handlers (dispatch.go): transaction boundaries and
// the commands whose effect moves to the pinned connection.

func pinnedExec(sess *Session, r *request) bool {
	pin := &sess.pin
	if !pin.inMulti {
		return false
	}
	if sess.execOpenTTL(r) {
		return true
	}
	if pin.watching && (pin.redirected != nil || !pin.cluster && pin.backend.Addr() != pin.addr) {
		return sess.execMovedWatch(r)
	}
	for _, w := range pin.txWrites {
		sess.writeForwarded(w.cmd, w.args)
	}
	sess.slots = append(sess.slots, slot{kind: slotUpstream, i: sess.call.Len(), metric: r.m, exec: true, mute: sess.curMute})
	sess.call.Add(r.Raw)
	sess.mirrorExecQueued() // mirror.go
	sess.unnamePin()
	sess.flush(time.Now())
	if pin.execRan && (pin.txSelect >= 0 || pin.txNamed) {
		sess.mu.Lock()
		if pin.txSelect >= 0 {
			sess.db = pin.txSelect
		}
		if pin.txNamed {
			sess.name = pin.txName
		}
		sess.mu.Unlock()
	}
	sess.unpin(true)
	return true
}

// execMovedWatch answers the EXEC of a transaction under WATCH whose
// upstream a reload (or a Sentinel failover) moved since the WATCH: its
// pinned connection is still on the old upstream, where EXEC would commit
// after the reload returned while every read goes to the new one (found
// by review). The transaction is discarded there and EXEC answers a null
// reply, as for a WATCH that failed: the keys it guarded are no longer
// the ones reads see, and a client retries, on the new upstream. (With
// routes a held transaction whose keys moved answers the same,
// reroutedHeld.) A MULTI without WATCH has no such answer and commits
// where it was opened (README "Reloading").
//
// In cluster mode the same goes for a transaction under WATCH whose node
// answered MOVED or ASK to a command before MULTI (pinState.redirected):
// its slot left the node, and the client was told the transaction will
// fail. A transaction with a keyed command fails there anyway (EXECABORT);
// one of keyless commands only would have run, on a node that no longer
// holds what the WATCH guarded.
func (sess *Session) execMovedWatch(r *request) bool {
	null := []byte("*-1\r\n")
	if sess.resp3 {
		null = []byte("_\r\n")
	}
	sess.discardPin(cmdDiscard, r.m, null)
	return true
}

// discardPin ends the client's pinned transaction or WATCH on Redis with
// end (DISCARD or UNWATCH), whose reply the client does not see, answers
// reply in place of the client's EXEC, and gives the clean connection back.
func (sess *Session) discardPin(end []byte, m *metrics.Command, reply []byte) {
	sess.slots = append(sess.slots, slot{kind: slotHidden, i: sess.call.Len(), own: true})
	sess.call.Add(end)
	sess.replyLocal(m, reply)
	sess.unnamePin()
	sess.flush(time.Now())
	sess.unpin(true)
}

// pinnedDiscard ends a transaction (inside MULTI) and pinnedUnwatch a
// WATCH (outside it); either way the clean connection goes back. With an
// argument Redis refuses either (wrong arity) and the MULTI or WATCH goes
// on, so the pin must too: released, the connection took the client's
// transaction to the next client that borrowed it (found by review).
func pinnedDiscard(sess *Session, r *request) bool {
	return sess.pin.inMulti && len(r.Args) == 1 && sess.endPin(r)
}

func pinnedUnwatch(sess *Session, r *request) bool {
	return !sess.pin.inMulti && len(r.Args) == 1 && sess.endPin(r)
}

func (sess *Session) endPin(r *request) bool {
	sess.forward(r.Raw, r.m)
	sess.unnamePin()
	sess.flush(time.Now())
	sess.unpin(true)
	return true
}

func pinnedMulti(sess *Session, r *request) bool {
	pin := &sess.pin
	if !pin.inMulti {
		pin.inMulti = true
		pin.txPos, pin.txHidden, pin.txWrites, pin.txSelect, pin.txSelected = 0, pin.txHidden[:0], pin.txWrites[:0], -1, false
		clear(pin.txMetrics)
		pin.txMetrics = pin.txMetrics[:0]
		pin.txName, pin.txNamed = "", false
		if pin.txOpen != nil {
			pin.txOpen.reset()
		}
		sess.list.multi.Store(1)
		pin.txOpened = false
		sess.forward(r.Raw, r.m)
		sess.slots[len(sess.slots)-1].multi = true
		return true
	}
	sess.forward(r.Raw, r.m) // nested: Redis refuses it, the transaction goes on
	return true
}

// pinnedReset gives the connection back; the ordinary RESET handling
// finishes the job.
func pinnedReset(sess *Session, _ *request) bool {
	sess.flush(time.Now())
	sess.unpin(false)
	return false
}

func pinnedSelect(sess *Session, r *request) bool {
	pin := &sess.pin
	if len(r.Args) != 2 {
		return false // Redis answers the arity error
	}
	n, isInt := resp.ParseInt(r.Args[1])
	db := int(n)
	// Parsed as Redis does: "SELECT 01" under WATCH was refused by Redis
	// but moved the session to database 1 for what followed.
	valid := isInt && db >= 0 && db < sess.srv.cfg.Upstream.Databases
	// Either way the connection is no longer a clean DB-0 connection for
	// the pool.
	pin.dirty = true
	if pin.inMulti {
		// Takes effect at EXEC, on this connection.
		pin.txSelected = true
		if valid {
			pin.txSelect = db
		}
		return false
	}
	if !valid {
		return false
	}
	// The session moves to db only if Redis did: a SELECT sent behind a
	// WATCH whose connection was lost before either was answered fails,
	// and the client, told so, goes on in its database (found by reading
	// back 286f33e, which leaves such a client unpinned).
	sess.forward(r.Raw, r.m)
	sess.slots[len(sess.slots)-1].selDB = db + 1
	sess.flush(time.Now())
	return true
}

// dispatchWatched handles a command of a client holding a WATCH, before
// MULTI: an ordinary client on its own connection. Proxy-answered commands
// are still answered here, blocking ones wait on this connection with no
// proxy timeout.
func (sess *Session) dispatchWatched(r *request) {
	if r.blocking {
		sess.blocking(r)
		return
	}
	if r.name == "hello" {
		// Switching protocol would leave the pinned connection speaking
		// the old one; refusing keeps the WATCH intact.
		sess.replyLocal(r.m, []byte("-ERR redproxy: HELLO while WATCH is active is not supported; UNWATCH first\r\n"))
		return
	}
	if what := relayStarter(r.name, r.Args); what != "" {
		// A relay is a connection of its own: the WATCH would be left
		// behind and a later EXEC would run unchecked.
		sess.replyLocal(r.m, []byte("-ERR redproxy: "+what+" while WATCH is active is not supported; UNWATCH first\r\n"))
		return
	}
	if r.entry != nil && r.entry.watched && sess.answer(r) {
		return
	}
	if r.name == "watch" {
		sess.pin.watching = true
	}
	if sess.guardStep(r) {
		return
	}
	sess.forwardCommand(r)
	if r.name == "watch" && len(sess.slots) > 0 {
		sess.slots[len(sess.slots)-1].watch = true
	}
}

// queueInMulti sends a command inside the client's MULTI: everything is
// queued by Redis, PING and ECHO included, except what would name other
// clients or change the connection under the proxy's feet.
func (sess *Session) queueInMulti(r *request) {
	pin := &sess.pin
	name := r.name
	if namesConnections(name) {
		// CLIENT ID, INFO and LIST answer as outside MULTI, at EXEC: the
		// proxy's answer now, queued as a script that returns it, as on a
		// relay (appendRelayAnswer). CLIENT KILL and UNBLOCK are refused.
		script, ok := sess.identityInMulti(r)
		if !ok {
			sess.refuseInMulti(name, r.m)
			return
		}
		sess.slots = append(sess.slots, slot{kind: slotUpstream, i: sess.call.Len(), metric: r.m, tx: true, mute: sess.curMute})
		sess.call.Add(script)
		sess.list.multi.Add(1)
		return
	}
	sess.txNameStep(name)
	if cmd := r.cmd; cmd != nil && cmd.Flags&(commands.ConnState|commands.PubSub) != 0 && !cmd.Is(commands.Write) {
		switch name {
		case "watch", "unwatch", "discard", "select", "client|setname", "client|setinfo", "readonly", "readwrite", "asking", "publish", "spublish", "pubsub":
			// Queued as on Redis; WATCH is refused by Redis inside MULTI
			// and UNWATCH run by EXEC leaves nothing behind.
			pin.dirty = pin.dirty || name != "watch" && name != "unwatch"
		default:
			if cmd.Flags&commands.ConnState != 0 || isSubscribe(name) {
				// Run at EXEC, these would change the connection under the
				// proxy's feet (protocol, subscriptions, reply mode); refuse
				// and make EXEC fail, as a queue-time error would.
				sess.refuseInMulti(name, r.m)
				return
			}
		}
	}
	if sess.guardStep(r) {
		return
	}
	if mayWrite(r.cmd) {
		pin.txWrites = append(pin.txWrites, txWrite{cmd: r.cmd, args: txWriteArgs(r.cmd, r.Args)})
	}
	sess.slots = append(sess.slots, slot{kind: slotUpstream, i: sess.call.Len(), metric: r.m, tx: true, mute: sess.curMute, strip: sess.curStrip})
	sess.call.Add(r.Raw)
	sess.list.multi.Add(1)
	sess.mirrorNote(r) // kept for EXEC (mirror.go)
}

// namesConnections reports whether the CLIENT subcommand name names or
// describes client connections: the proxy answers it for its own clients,
// and run by EXEC on the client's pinned connection it would name or
// describe the proxy's connections to Redis instead. CLIENT KILL and
// UNBLOCK take proxy clients' IDs and addresses; CLIENT ID, INFO and LIST
// would answer the Redis ID of the pinned connection (found by review:
// an ID learnt so can be another proxy client's, whom a later CLIENT KILL
// ID would reach) and list the proxy's upstream connections, with other
// namespaces' client names and last commands. Inside MULTI, pinned or
// held (cluster mode, routes), ID, INFO and LIST are queued as a script
// returning the proxy's answer (identityInMulti); KILL and UNBLOCK are
// refused, and EXEC aborts, as for a queue-time error.
func namesConnections(name string) bool {
	switch name {
	case "client|unblock", "client|kill", "client|id", "client|info", "client|list":
		return true
	}
	return false
}

// identityInMulti is what a MULTI queues for r, one of the commands
// namesConnections names: for CLIENT ID, INFO and LIST the script that
// returns the proxy's answer (appendProxyAnswer); ok is false for the
// others, which are refused.
func (sess *Session) identityInMulti(r *request) (script []byte, ok bool) {
	switch r.name {
	case "client|id", "client|info", "client|list":
		return sess.appendProxyAnswer(nil, r.cmd, r.Args, r.Raw)
	}
	return nil, false
}

// pinnedClientSetname notes the name a CLIENT SETNAME queued in MULTI
// gives the client when EXEC runs it (pinnedExec); it is queued as
// usual. Found by review: Redis renamed the pinned connection while the
// proxy's record of the client's name, which CLIENT GETNAME, LIST and
// INFO answer, kept the old one.
func pinnedClientSetname(sess *Session, r *request) bool {
	if pin := &sess.pin; pin.inMulti && len(r.Args) == 3 && validClientName(r.Args[2]) {
		pin.txName, pin.txNamed = string(r.Args[2]), true
	}
	return false
}

// txNameStep comes before a command named name is queued in the client's
// transaction on its pinned connection. The connection carries the
// proxy's name (upstream.PinnedName), which EXEC would answer to CLIENT
// GETNAME of a client that has none (found by the differential test): it
// is cleared just before, inside the transaction (its result is cut from
// EXEC's reply), and set back before the connection is reused
// (unnamePin). A name the client sets in the transaction is its own.
func (sess *Session) txNameStep(name string) {
	pin := &sess.pin
	switch {
	case name == "client|getname" && !pin.named:
		sess.forwardOwn(cmdClearName)
		pin.named = true
	case name == "client|setname":
		pin.named = true
	}
}

// refuseInMulti refuses a command inside MULTI and makes EXEC fail, as a
// queue-time error would.
func (sess *Session) refuseInMulti(name string, m *metrics.Command) {
	sess.forwardRefusal()
	sess.replyLocal(m, errInMulti(name))
}

// errInMulti is the refusal of command name (table name, "client|list"
// for CLIENT LIST) inside MULTI.
func errInMulti(name string) []byte {
	return []byte("-ERR redproxy: '" + strings.ToUpper(strings.ReplaceAll(name, "|", " ")) + "' inside MULTI is not supported\r\n")
}

// namePin gives the pinned connection the client's name, behind what is
// queued for it, so Redis's CLIENT LIST and SLOWLOG show whose it is. An
// empty name gives it back its own. Only outside MULTI.
func (sess *Session) namePin(name string) {
	if name == "" {
		name = upstream.PinnedName
	}
	sess.slots = append(sess.slots, slot{kind: slotHidden, i: sess.call.Len(), own: true})
	sess.call.Add(resp.AppendCommandStrings(nil, "CLIENT", "SETNAME", name))
	sess.pin.named = name != upstream.PinnedName
}

// unnamePin undoes namePin before the connection goes back to the pool.
func (sess *Session) unnamePin() {
	if sess.pin.named {
		sess.namePin("")
	}
}

// pinFor starts pinning for MULTI or WATCH.
func (sess *Session) pinFor(r *request) { sess.pinForOn(r, sess.backend(), -1) }

// pinOn takes a dedicated connection from b for the client's transaction;
// keySlot is the slot of its keys in cluster mode (-1: none yet).
func (sess *Session) pinOn(b *upstream.Backend, keySlot int) error {
	sess.flush(time.Now())
	// Read before the pipe is taken: if the address moves in between,
	// a WATCH on the new one is taken for one on the old (its EXEC
	// fails, pinnedExec), never the other way round.
	addr := b.Addr()
	p, err := b.AcquirePipeFor(sess.db, sess.resp3, sess.left)
	if err != nil {
		return err
	}
	sess.pin = pinState{pipe: p, backend: b, addr: addr, cluster: sess.srv.router != nil, slot: keySlot, db: sess.db, resp3: sess.resp3, txHidden: sess.pin.txHidden[:0], txWrites: sess.pin.txWrites[:0], txMetrics: sess.pin.txMetrics[:0], txSelect: -1, txOpen: sess.pin.txOpen}
	if sess.name != "" {
		sess.namePin(sess.name)
	}
	return nil
}

// pinForOn starts pinning for MULTI or WATCH on a connection of b.
func (sess *Session) pinForOn(r *request, b *upstream.Backend, keySlot int) {
	cmd, m := r.cmd, r.m
	if err := sess.pinOn(b, keySlot); err != nil {
		if cmd.Name == "multi" {
			// What the client queues next must not run (see txAbort). The
			// MULTI itself is answered +OK, as Redis always answers a
			// first MULTI, and the failure comes with each queued command
			// and EXEC's EXECABORT, the shape of Redis's queue-time
			// errors: a client that stops reading at an error from MULTI
			// (go-redis's TxPipelined) left the replies of the rest of its
			// write unread, and a client keeping that connection (go-redis
			// Conn) read every later reply one behind (found by a probe:
			// a GET answered "OK").
			sess.abort = txAbort{reason: txAbortReason(err), multi: true}
			sess.replyLocal(m, ok)
			return
		}
		sess.replyLocal(m, errorReply(err))
		sess.watchFailed(err)
		return
	}
	if cmd.Name == "multi" {
		sess.pin.inMulti = true
		sess.list.multi.Store(1)
	} else {
		sess.pin.watching = true
	}
	sess.forward(r.Raw, m)
	sess.slots[len(sess.slots)-1].multi = cmd.Name == "multi"
	sess.slots[len(sess.slots)-1].opens = cmd.Name != "multi"
}

// unpin gives the pinned connection back; clean says the transaction ended
// normally (EXEC, DISCARD, UNWATCH all clear MULTI and WATCH state).
func (sess *Session) unpin(clean bool) {
	pin := &sess.pin
	if pin.pipe == nil {
		return
	}
	pin.backend.ReleasePipe(pin.pipe, pin.db, pin.resp3, clean && !pin.dirty && !pin.named)
	sess.list.multi.Store(0)
	sess.nsTxEnd()
	sess.mirrorTxEnded() // mirror.go
	clear(pin.txWrites)
	sess.recordOpenLeft() // guard.go
	clear(pin.txMetrics)
	*pin = pinState{txHidden: pin.txHidden[:0], txWrites: pin.txWrites[:0], txMetrics: pin.txMetrics[:0], txOpen: pin.txOpen}
}

// noteQueued is called by flush for every reply to a command sent inside
// MULTI, in order, to track positions in the transaction's queue; a hidden
// one's refusal is reported as a failed fix-up if it is one (fixup).
func (sess *Session) noteQueued(reply []byte, hidden, fixup bool, m *metrics.Command) {
	if !bytes.Equal(reply, queued) {
		if fixup {
			sess.hiddenFailed(reply, nil)
		}
		return // refused at queue time; not part of the transaction
	}
	if hidden {
		sess.pin.txHidden = append(sess.pin.txHidden, sess.pin.txPos)
		m = nil
	}
	sess.pin.txMetrics = append(sess.pin.txMetrics, m)
	sess.pin.txPos++
}

// countExecErrors counts each error in EXEC's reply against the queued
// command it answers.
func (sess *Session) countExecErrors(exec []byte) {
	ms := sess.pin.txMetrics
	execElements(exec, func(i int, elem []byte) {
		if i < len(ms) && ms[i] != nil && resp.IsError(elem) {
			ms[i].Errors.Inc()
		}
	})
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
		push, k, err := resp.ScanElement(reply[pos:])
		if err != nil || k == 0 {
			return dst // cannot happen for a reply the pipe framed
		}
		// A push frame Redis wrote inside the reply goes to the client
		// where it was, as Redis sent it.
		dst = append(dst, reply[pos:pos+push]...)
		pos += push
		if h < len(hidden) && hidden[h] == i {
			h++
		} else {
			dst = append(dst, reply[pos:pos+k]...)
		}
		pos += k
	}
	return dst
}

// txWriteArgs is what a queued write keeps until EXEC for the write hooks
// (pinnedExec): its keys and its short arguments (SWAPDB's numbers, COPY's
// DB, the keywords and counts key positions are found by), not its values.
// A copy of every argument kept a second copy of the queue, which Redis
// holds too: a client that queued 160 MB in MULTI and never sent EXEC grew
// the proxy's heap by 160 MB (found by review). A long argument that is
// not a key is kept empty: no keyword or count is that long, so cmd.Keys
// finds the same positions in what is kept.
func txWriteArgs(cmd *commands.Command, args [][]byte) [][]byte {
	var buf [8]int
	var keys []int
	if cmd != nil { // unknown: no keys the hooks could use
		keys = cmd.Keys(args, buf[:0])
	}
	out := make([][]byte, len(args))
	for i, a := range args {
		if len(a) > maxKeptTxArg && !slices.Contains(keys, i) {
			if i == 1 && cmd != nil && cmd.Name == "eval" && localcache.MentionsSwapDB(a) {
				// The one thing the tier looks for in a script's text
				// (localcache/scripts.go): it is handled as a SWAPDB.
				out[i] = []byte("swapdb")
			}
			continue
		}
		out[i] = append([]byte(nil), a...)
	}
	return out
}

const maxKeptTxArg = 64

func errorReply(err error) []byte { return appendErrorReply(nil, err) }

// appendErrorReply appends the reply for err, a failure to reach Redis:
// Redis's own refusal where a connection's handshake met a state of Redis
// that the client's command would have met too (-BUSY, -LOADING:
// upstream.HandshakeRefusal.StateReply), else "ERR " and the error.
func appendErrorReply(b []byte, err error) []byte {
	if r := handshakeStateReply(err); r != nil {
		return append(b, r...)
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "ERR ") {
		msg = "ERR " + msg
	}
	return redcon.AppendError(b, msg)
}

// handshakeStateReply is Redis's own reply where err is a connection's
// handshake meeting a state of Redis (-BUSY, -LOADING) that the client's
// command would have met too; nil otherwise.
func handshakeStateReply(err error) []byte {
	var refusal *upstream.HandshakeRefusal
	if errors.As(err, &refusal) {
		return refusal.StateReply()
	}
	return nil
}

var (
	waitNone    = []byte(":0\r\n")
	waitAOFNone = []byte("*2\r\n:0\r\n:0\r\n")
)

// waitAfterMove answers WAIT and WAITAOF itself, with no replica (and no
// local fsync), when the client's last write went to a server its backend
// has left since (a Sentinel failover, or a reload to another address),
// and reports whether it did.
//
// Found by review: a SET acknowledged by an isolated old primary (which no
// replica heard any more), then the failover, then the client's WAIT 1 ran
// on the new primary and answered 1, vouching for a write that was on no
// replica and gone from the new primary. On Redis directly the writing
// connection's WAIT answers 0 (or the connection breaks); through the
// proxy the client's connection never broke, so the proxy must say it.
// The answer holds until the client writes again, to the new server.
//
// In cluster mode the same goes for a WAIT after the slot of the client's
// last write changed owner (a failover, a reshard): Redis Cluster's WAIT
// on the new owner counted its replicas, and the old primary, back as one
// of them, took the marker although it had dropped the write in its
// resync (TestClusterWaitAfterFailoverAnswersZero). After a reshard the
// write may well have moved with its key: 0 is "not confirmed".
func (sess *Session) waitAfterMove(cmd *commands.Command, m *metrics.Command) bool {
	if sess.wroteMoves == 0 {
		return false
	}
	var none []byte
	switch cmd.Name {
	case "wait":
		none = waitNone
	case "waitaof":
		none = waitAOFNone
	default:
		return false
	}
	switch r := sess.srv.router; {
	case r != nil:
		if sess.wroteMoves == r.OwnerTag(int(sess.wroteSlot)-1) {
			return false
		}
	case sess.srv.routes != nil:
		if !sess.routeWritesMoved() {
			return false
		}
	case sess.wroteMoves == sess.backend().Moves()+1:
		return false
	}
	sess.replyLocal(m, none)
	return true
}

// blocking runs a blocking command on a dedicated connection, after
// everything the client sent before it has been answered, with the
// command's own timeout (possibly for ever) plus dead_timeout for Redis to
// answer.
func (sess *Session) blocking(r *request) {
	cmd, m := r.cmd, r.m
	sess.slowExempt = true
	// The command's latency runs from here to its reply, block included,
	// as redproxy_command_duration_seconds says: timed from the final
	// flush, a BLPOP answered after 0.5 s was observed as under a
	// microsecond (found by a probe).
	began := time.Now()
	sess.flush(began)
	if mayWrite(cmd) {
		sess.writeForwarded(cmd, r.Args)
	}
	if sess.waitAfterMove(cmd, m) {
		return
	}
	if sess.waitsOnSeveral(cmd) {
		sess.waitEveryUpstream(r)
		return
	}
	pipe, b := sess.pin.pipe, sess.pin.backend
	borrowed := false
	// The upstream's moves before the connection is taken: a reload that
	// moves it after that cuts a connection taken before (below).
	var moves uint32
	if pipe != nil {
		moves = b.Moves()
	} else {
		var p *upstream.Pipe
		var err error
		b, err = sess.dedicatedBackend(r)
		if err == nil {
			moves = b.Moves()
			p, err = b.AcquirePipeFor(sess.db, sess.resp3, sess.left)
		}
		if err != nil {
			sess.replyLocal(m, errorReply(err))
			return
		}
		pipe, borrowed = p, true
	}
	// Other clients' CLIENT UNBLOCK names this client by its proxy id and
	// needs the connection's Redis id; without it, UNBLOCK answers 0.
	rid, _ := b.PipeID(pipe)
	// A borrowed connection is the client's own while it blocks: it
	// carries the client's name, and its own again afterwards.
	named := borrowed && sess.name != ""
	// The guard's rewrite and TTL fix-ups apply to blocking writes too
	// (BLMOVE's destination); fix-ups follow on the same connection.
	raw, args := r.Raw, r.Args
	var fixups [][]byte
	if d := sess.guard.Decision(r.i); d != nil { // recorded by dispatch
		if d.Args != nil {
			raw, args = sess.guard.Encode(d.Args), d.Args
		}
		if len(d.Expires) > 0 {
			fixups = sess.guard.Fixups(d.Expires)
		}
	}
	var markers [][]byte
	if cmd.Name == "wait" || cmd.Name == "waitaof" {
		// Redis waits for the calling connection's last write to reach the
		// replicas (or the AOF). The client's writes went over other
		// connections, so first make this connection's last write one that
		// Redis propagates after all of them: a publish to a proxy channel.
		if sess.srv.router == nil {
			markers = sess.srv.waitMarkers()
		} else if borrowed {
			// (A pinned connection under WATCH carries the client's
			// writes itself; a MULTI of the marker's would end the WATCH.)
			markers = sess.clusterWaitMarker()
		}
	}
	call := sess.call
	if len(markers) > 0 {
		if refused := sess.markForWait(call, pipe, markers); refused != nil {
			if borrowed {
				b.ReleasePipe(pipe, sess.db, sess.resp3, false)
			}
			sess.replyLocal(m, refused)
			return
		}
	}
	first := sess.fillBlockedCall(call, named, raw)
	sess.block.set(rid, pipe, b)
	if err := pipe.Send(call); err != nil {
		sess.block.set(0, nil, nil)
		if borrowed {
			b.ReleasePipe(pipe, sess.db, sess.resp3, false)
		}
		sess.replyLocal(m, errorReply(err))
		call.Reset()
		return
	}
	sess.sendEarlierReplies()
	// Redis answers a blocking command by its timeout; one it has not
	// answered dead_timeout after that is frozen or stuck, as a shared
	// connection's request unanswered for dead_timeout is, and the client
	// is told so rather than left waiting on it (found by review: BLPOP 1
	// answered 51 s later, after a 50 s SIGSTOP, where a GET failed at
	// 30 s). Not for a timeout of 0, which waits for ever on Redis too.
	var overdue <-chan time.Time
	if d, ok := cmd.BlockTimeout(args); ok && d > 0 {
		t := time.NewTimer(d + sess.srv.Config().Upstream.DeadTimeout.Duration)
		defer t.Stop()
		overdue = t.C
	}
	// The client's leaving is seen at once where its socket can be
	// watched (watchHangup), and by the 50 ms check otherwise; the check
	// also sees an interruption (CLIENT KILL, shutdown), and a reload
	// that moved the upstream to another server.
	hangup, unwatch := sess.watchHangup()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	moved := false    // cut for a reload's move, with nothing popped
	cutAfter := false // a pinned connection's pop answered before a move's cut
	// leftNow: the client's hang-up was seen, or it has left by now.
	leftNow := func() bool {
		select {
		case <-hangup:
			return true
		default:
			return sess.left()
		}
	}
	for done := false; !done; {
		left := false
		select {
		case <-call.Done():
			// Answered, perhaps with what was pushed just after the
			// client left, before the hang-up was seen: Redis, which
			// sees the close first, would not have popped it.
			done = true
			left = leftNow()
		case <-hangup:
			left, hangup = true, nil
		case <-overdue:
			// Cut as a lost connection: whether the command ran is
			// unknown, so the client's connection closes (below).
			overdue = nil
			pipe.AbandonAsync()
		case <-tick.C:
			left = sess.left()
			if !left && b.Moves() != moves {
				moves = b.Moves()
				if b.DialledBefore(pipe) {
					// A reload moved the upstream to another server:
					// blocked on the old one, the client would wait for
					// pushes that now go to the new one, forever with a
					// timeout of 0. Cut as a failover cuts it: the
					// client's connection closes (below), and its
					// library reconnects and blocks again where the
					// pushes go. But the old server is up, and may have
					// popped for the client in the moment before: the
					// block is ended as for a client that left, and
					// what Redis popped is the client's reply. Closed at
					// once, the connection dropped it, an acknowledged
					// push lost (found by a probe: 2 and 4 in about
					// 2,100 over 100 reloads between two addresses of
					// one Redis). An UNBLOCK's own answer (null: nothing
					// popped) is not passed on: a BLPOP 0 never
					// answers null.
					//
					// WAIT and WAITAOF answer an UNBLOCK with their count
					// so far, which a WAIT n 0 never answers below n: cut
					// too (found by review). A pinned connection (under
					// WATCH) stays on the old server: the pop is
					// answered, and then the client's connection closed,
					// as before (its EXEC would fail anyway).
					if !sess.interrupted.Load() && sess.endBlock(call, pipe, b, rid) {
						reply, err := call.Reply(first)
						if err == nil && (resp.IsNull(reply) || cmd.Name == "wait" || cmd.Name == "waitaof") {
							moved = true
						} else if !borrowed {
							cutAfter = true
						}
						done = true
						// A client that left meanwhile has what was
						// popped put back (below), as one that leaves
						// while blocked (found by review).
						left = leftNow()
					} else {
						pipe.AbandonAsync()
					}
				}
			}
		}
		if left {
			// End the block before closing the connection, and read what
			// Redis answers: its timeout's reply, or what it popped in the
			// moment between the client's leaving and this (a push right
			// behind it), which is put back (requeue.go). Closed at once,
			// the connection left Redis to pop for nobody until it read
			// the close; half-closed, Redis could drop a reply it had not
			// written yet when it read the end (found measuring: 22 and
			// 11 pushes in 40 lost). So CLIENT UNBLOCK of the connection,
			// half-closing only where Redis refuses that (the upstream
			// user's ACL), waited for dead_timeout at most (a frozen
			// Redis), and for killWait at most for an interruption
			// (CLIENT KILL, shutdown), so that a frozen Redis does not
			// hold the exit long: closed at once, the connection lost a
			// reply Redis had sent, BLMOVE's destination its TTL fix-up
			// (found in CI). (Done is signalled once: received once.)
			if !done {
				done = sess.endBlock(call, pipe, b, rid)
			}
			pipe.Close()
			if !done {
				<-call.Done()
			}
			if reply, err := call.Reply(first); err == nil {
				sess.leftBlockRan(b, cmd.Name, args, reply, fixups) // requeue.go
			}
			sess.block.set(0, nil, nil)
			if !borrowed {
				sess.unpin(false)
			} else {
				b.ReleasePipe(pipe, sess.db, sess.resp3, false)
			}
			sess.closing(metrics.CloseClient) // or the interruption's reason
			sess.quitting = true
			call.Reset()
			unwatch()
			return
		}
	}
	unwatch()
	// No UNBLOCK aims at the connection from now on; one already sent
	// holds mu until Redis has answered it, waited for below, where the
	// connection could go to another client.
	sess.block.id.Store(0)
	reply, err := call.Reply(first)
	if err == nil && !moved {
		sess.mirrorBlocked(r.name, args, reply, fixups) // mirror.go
	}
	if moved || dedicatedLost(err) {
		// The connection went while the command was in Redis (a restart,
		// a failover, CLIENT KILL): whether it ran is unknown. Closed with
		// no reply, as Redis's end would close the client, so that the
		// library resends it (upstreamlost.go). The replies to what the
		// client sent before it went out when it was sent (or go out
		// before the close).
		sess.block.set(0, nil, nil) // after any UNBLOCK aimed at the connection
		if borrowed {
			b.ReleasePipe(pipe, sess.db, sess.resp3, false)
		} else {
			sess.unpin(false)
		}
		call.Reset()
		sess.closeUpstreamLost()
		return
	}
	if err != nil {
		reply = errorReply(err)
	} else if sess.srv.router != nil {
		reply = sess.clusterBlockedReply(reply, b, borrowed)
	}
	sess.replyLocal(m, sess.nsStripped(sess.curStrip, reply))
	if errors.Is(err, upstream.ErrOutputLimit) {
		sess.overLimit() // as for a reply of the client's batch
	}
	clean := err == nil && (!named || namedBack(call, first))
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
	sess.unblocked()
	if borrowed {
		b.ReleasePipe(pipe, sess.db, sess.resp3, clean)
	}
	if cutAfter {
		sess.unpin(false)
		sess.closeUpstreamLost()
	}
	sess.flush(began)
}

// endBlock ends the blocked command of call on pipe, whose Redis id is
// rid (0: not known), for a client that left, and reports whether call
// got its answer: from CLIENT UNBLOCK of the connection, or else from
// half-closing it. It waits for Redis up to dead_timeout, as for any
// request (a Redis past reply_timeout is slow, not gone), and no more
// than killWait once the session is interrupted (CLIENT KILL, shutdown).
func (sess *Session) endBlock(call *upstream.Call, pipe *upstream.Pipe, b *upstream.Backend, rid int64) bool {
	wait := time.NewTimer(sess.srv.Config().Upstream.DeadTimeout.Duration)
	defer wait.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var interruptedAt time.Time
	waitFor := func(ch <-chan bool) (ok, answered bool) {
		for {
			select {
			case ok = <-ch:
				return ok, false
			case <-call.Done():
				return false, true
			case <-wait.C:
				return false, false
			case <-tick.C:
				if !sess.interrupted.Load() {
					continue
				}
				if interruptedAt.IsZero() {
					interruptedAt = time.Now()
				}
				if time.Since(interruptedAt) >= killWait {
					return false, false
				}
			}
		}
	}
	if rid != 0 {
		stop := make(chan struct{})
		defer close(stop)
		unblocked := make(chan bool, 1)
		go func() { unblocked <- unblockLeft(b, pipe, rid, stop) }()
		ok, answered := waitFor(unblocked)
		if answered {
			return true
		}
		if ok {
			_, answered = waitFor(nil)
			return answered
		}
		if !wait.Stop() || !interruptedAt.IsZero() && time.Since(interruptedAt) >= killWait {
			return false // the time is up: closed without a reply
		}
		wait.Reset(sess.srv.Config().Upstream.DeadTimeout.Duration)
	}
	if !pipe.CloseWrite() {
		return false
	}
	_, answered := waitFor(nil)
	return answered
}

// unblockLeft sends CLIENT UNBLOCK rid about pipe's connection until Redis
// unblocks it (:1) or stop is closed, and reports whether Redis did. A :0
// (not blocked) is asked again: the command was answered meanwhile, and
// the caller stops this on its reply; or Redis has not read it yet, the
// UNBLOCK on its own connection having overtaken it (found by a probe: a
// client that sent BLPOP 0 and hung up at once left it blocked, and its
// connection held, until dead_timeout, 2 to 7 clients in 300; taking :0
// for an answer made the caller wait for one). A dial or a read that fails is
// tried again: Redis stalled (DEBUG SLEEP, a long fork) answers nothing,
// and half-closing the blocked connection then, as the first version did,
// let Redis pop a push that arrived meanwhile for the connection, then
// drop the reply when it read the end (found by review: 4 of 5 pushes
// lost across a 3 s stall). Left open, the connection gets the reply,
// which the proxy puts back (requeue.go). Any other failure is final: an
// error reply (the upstream user may not UNBLOCK), a refused handshake (a
// rotated password: retried, it dialled Redis 20 times a second until
// dead_timeout, found by review), a refused gate (ErrUnblockUngated: a
// bare UNBLOCK could crash a paused Redis); the caller half-closes.
func unblockLeft(b *upstream.Backend, pipe *upstream.Pipe, rid int64, stop <-chan struct{}) bool {
	retry := time.NewTimer(0)
	defer retry.Stop()
	for {
		select {
		case <-stop:
			return false
		case <-retry.C:
		}
		un, err := b.UnblockBeside(pipe, rid, "", nil, false)
		switch {
		case err == nil && string(un) == ":0\r\n":
			retry.Reset(unblockAgain)
			continue
		case err == nil:
			return string(un) == ":1\r\n"
		case !errors.Is(err, upstream.ErrUnavailable) && !errors.Is(err, upstream.ErrTimeout) &&
			!errors.Is(err, upstream.ErrConnLost) && !errors.Is(err, upstream.ErrNoReply):
			return false
		}
		retry.Reset(50 * time.Millisecond)
	}
}

// unblockAgain is how soon CLIENT UNBLOCK is sent again after a :0 (see
// unblockLeft): the blocked command is at most a write away from Redis.
const unblockAgain = 5 * time.Millisecond

// waitMarkers is the standalone wait marker: SPUBLISH where the command
// table has it and Redis never refused it (markForWait).
func (s *Server) waitMarkers() [][]byte {
	if s.waitShardedMark.Load() {
		return waitMarkersSharded
	}
	return waitMarkersClassic
}

// markForWait sends markers, the write WAIT is to count from, on pipe
// ahead of the WAIT, using call, and waits for their replies. It returns
// nil once Redis took them, else what the client gets instead of WAIT's
// answer: WAIT's count would take none of the client's writes into
// account (Redis counted from whatever the connection wrote last). An
// SPUBLISH Redis refuses (unknown before Redis 7, or an upstream user
// allowed PUBLISH only) is sent again as a PUBLISH, and so is every later
// WAIT's marker (found by review: with +publish -spublish every WAIT was
// refused, and the embedded store's first). In its own round trip rather
// than in WAIT's write, so that a refusal costs no WAIT.
func (sess *Session) markForWait(call *upstream.Call, pipe *upstream.Pipe, markers [][]byte) []byte {
	s := sess.srv
	for {
		call.Reset()
		for _, mark := range markers {
			call.Add(mark)
		}
		if err := pipe.Send(call); err != nil {
			call.Reset()
			return errorReply(err)
		}
		call.Wait()
		last, err := call.Reply(len(markers) - 1) // a transaction's: EXEC's
		if err != nil {
			call.Reset()
			return errorReply(err)
		}
		if !resp.IsError(last) {
			call.Reset()
			return nil
		}
		if len(markers) == 1 && bytes.Equal(markers[0], waitMarkersSharded[0]) {
			if s.waitShardedMark.CompareAndSwap(true, false) {
				s.log.Warn("Redis refused SPUBLISH; WAIT's marker is a PUBLISH from now on, which PSUBSCRIBE * subscribers see", "reply", trimErr(last))
			}
			markers = waitMarkersClassic
			continue
		}
		msg := trimErr(last)
		call.Reset()
		return []byte("-ERR redproxy: Redis refused the write of the proxy's that WAIT counts from (" + msg + ")\r\n")
	}
}

// fillBlockedCall makes call (reset first) a blocking command's trip on a
// connection of the client's own, borrowed or pinned: raw, without the
// proxy's reply timeout (the command's own applies). Named, the
// connection carries the client's name around it, as Redis would show the
// client blocked there, and its own again after (namedBack). It returns
// the index of raw's reply.
func (sess *Session) fillBlockedCall(call *upstream.Call, named bool, raw []byte) (first int) {
	call.Reset()
	call.NoTimeout = true
	call.SetReplyLimit(sess.replyLimit())
	if named {
		call.Add(resp.AppendCommandStrings(nil, "CLIENT", "SETNAME", sess.name))
		first++
	}
	call.Add(raw)
	if named {
		call.Add(resp.AppendCommandStrings(nil, "CLIENT", "SETNAME", upstream.PinnedName))
	}
	return first
}

// namedBack reports whether a named call of fillBlockedCall gave its
// connection its own name back: one that did not is not to be reused.
func namedBack(call *upstream.Call, first int) bool {
	r, err := call.Reply(first + 1)
	return err == nil && bytes.Equal(r, ok)
}

// sendEarlierReplies writes the replies to what the client sent before
// its blocking command now, once that command is sent, as Redis would
// send them, not when the block ends. A write that fails leaves them to
// the flush after the block, which meets the same error.
func (sess *Session) sendEarlierReplies() {
	if len(sess.out) > 0 {
		if _, err := sess.nc.Write(sess.out); err == nil {
			sess.out = sess.out[:0]
		}
	}
}

// unblocked forgets the connection(s) the client was blocked on, once its
// reply is recorded. Another client's UNBLOCK waiting for Redis's answer
// holds mu, which may take as long as Redis takes (paused, busy): the
// reply Redis already gave this client goes out first, as Redis would not
// hold it for another client's command.
func (sess *Session) unblocked() {
	if !sess.block.mu.TryLock() {
		sess.flush(time.Now())
		if len(sess.out) > 0 {
			sess.writeOut(sess.out)
		}
		sess.block.mu.Lock()
	}
	sess.block.pipe, sess.block.backend, sess.block.more = nil, nil, nil
	sess.block.mu.Unlock()
}

// blockState says which dedicated connection the client is blocked on, for
// CLIENT UNBLOCK from other clients.
type blockState struct {
	// mu is held by an UNBLOCK aimed at id until Redis has answered it, so
	// the connection cannot be reused by another client meanwhile: the
	// blocked client takes mu to clear pipe before giving it back (after
	// passing on its reply when an UNBLOCK holds mu: never hold mu across
	// a write to a client). id alone may be cleared without mu.
	mu      sync.Mutex
	id      atomic.Int64      // Redis's id of the connection; 0: not blocked
	pipe    *upstream.Pipe    // the connection, under mu
	backend *upstream.Backend // where pipe came from, under mu
	// more are, for a WAIT on several upstreams (waitEveryUpstream), the
	// connections of the others, under mu; nil otherwise.
	more *[]blockedConn
}

// blockedConn is one more connection a client is blocked on.
type blockedConn struct {
	id      int64
	pipe    *upstream.Pipe
	backend *upstream.Backend
}

func (b *blockState) set(id int64, pipe *upstream.Pipe, from *upstream.Backend) {
	b.setEvery(id, pipe, from, nil)
}

func (b *blockState) setEvery(id int64, pipe *upstream.Pipe, from *upstream.Backend, more *[]blockedConn) {
	b.mu.Lock()
	b.id.Store(id)
	b.pipe, b.backend, b.more = pipe, from, more
	b.mu.Unlock()
}

// unblock implements CLIENT UNBLOCK id [TIMEOUT|ERROR] for the proxy's
// clients (clientUnblock). Answered in order with what came before: the
// client's earlier commands reach Redis, and their replies the client,
// before the UNBLOCK is sent. Flushed before the target's lock is taken,
// not under it: the flush may wait client_write_timeout per chunk on a
// client that does not read, and the blocked client, answered by Redis
// meanwhile, takes that lock before it can pass its reply on (found by
// review: one client's full socket withheld another's reply).
func (sess *Session) unblock(args [][]byte, m *metrics.Command) bool {
	if len(args) > 4 {
		return false // Redis answers the syntax error
	}
	sess.flush(time.Now())
	sess.replyLocal(m, sess.srv.clientUnblock(sess, args))
	return true
}

// clientUnblock answers CLIENT UNBLOCK id [TIMEOUT|ERROR] (args from
// CLIENT, at most 4) sent by self. A blocked client's command runs on a
// dedicated connection, so its proxy id is translated to that connection's
// Redis id and the command sent there; a relayed client (tracking,
// pub/sub) blocks on its relay's connection, whose id its handshake
// learnt. An id of no blocked client answers 0, as on Redis.
func (s *Server) clientUnblock(self *Session, args [][]byte) []byte {
	var mode string
	if len(args) == 4 {
		mode = strings.ToUpper(string(args[3]))
		if mode != "TIMEOUT" && mode != "ERROR" {
			return []byte("-ERR CLIENT UNBLOCK reason should be TIMEOUT or ERROR\r\n")
		}
	}
	id, isInt := resp.ParseInt(args[2])
	if !isInt {
		return errNotInteger
	}
	target := s.sessionByID(id)
	if target == nil || target == self {
		return zero
	}
	// Held until Redis has answered, so that the target's connection
	// cannot go to another client meanwhile. The UNBLOCK goes to the
	// server that connection is on, which after a reload switched the
	// upstream is not the one this client's commands go to: there the id
	// names some other connection.
	target.block.mu.Lock()
	defer target.block.mu.Unlock()
	rid := target.block.id.Load()
	if rid == 0 {
		// Not blocked on a connection the proxy lent it; perhaps on its
		// relay's, which is never reused, so its id names no one else.
		// Redis answers 0 if the relayed client is not blocked.
		b, nc := s.relayOf(target)
		if b == nil {
			return zero
		}
		reply, err := b.UnblockRelay(nc, mode, self.backendBeside(b), true)
		if errors.Is(err, upstream.ErrRelayGone) {
			return zero // its relay just ended, or Redis refused it CLIENT ID
		}
		if err != nil {
			return errorReply(err)
		}
		return reply
	}
	unblockOn := func(rid int64, b *upstream.Backend, p *upstream.Pipe) []byte {
		reply, err := b.UnblockBeside(p, rid, mode, self.backendBeside(b), true)
		if err != nil {
			reply = errorReply(err)
		}
		return reply
	}
	reply := unblockOn(rid, target.block.backend, target.block.pipe)
	if more := target.block.more; more != nil {
		// A WAIT on several upstreams: the client is unblocked when all
		// of them are, and it was blocked if any part still was: a part
		// answered already makes its upstream say 0, another's 1 is the
		// answer (found by review: :0 for a WAIT the UNBLOCK ended).
		for _, c := range *more {
			if c.id != 0 {
				if r := unblockOn(c.id, c.backend, c.pipe); !bytes.Equal(reply, one) && bytes.Equal(r, one) {
					reply = r
				}
			}
		}
	}
	return reply
}

// backendBeside returns the pools sess's own commands use on the upstream
// whose pools b are (b itself, or those of another upstream credential
// there), so that a command sess sends about a connection of b's (CLIENT
// UNBLOCK) runs with sess's Redis rights, as on Redis. Before, it ran with
// those of the client it named: a user Redis forbids CLIENT UNBLOCK
// unblocked others, and an admin could not unblock a restricted user's
// client (found by review). nil when b is not a standalone upstream's
// (a cluster node's or a replica's: no per-user credentials there).
func (sess *Session) backendBeside(b *upstream.Backend) *upstream.Backend {
	srv := sess.srv
	if srv.routes != nil {
		for i, t := range srv.routes.targets {
			if t.backend == b || t.backend != nil && credentialPools(t.users, b) {
				mine, err := sess.backendFor(i)
				if err != nil {
					return nil
				}
				return mine
			}
		}
		return nil
	}
	if b == srv.backend || srv.users != nil && credentialPools(srv.users.backends, b) {
		return sess.backend()
	}
	return nil
}

// credentialPools reports whether b is one of pools.
func credentialPools(pools map[auth.Credential]*upstream.Backend, b *upstream.Backend) bool {
	for _, p := range pools {
		if p == b {
			return true
		}
	}
	return false
}

// relayUpstream is a relayed client's connection to Redis.
type relayUpstream struct {
	b  *upstream.Backend
	nc net.Conn
}

// setRelay records sess's relay connection for the time it relays
// (b nil: the relay ended).
func (s *Server) setRelay(sess *Session, b *upstream.Backend, nc net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b == nil {
		delete(s.relays, sess)
		return
	}
	if s.relays == nil {
		s.relays = make(map[*Session]relayUpstream)
	}
	s.relays[sess] = relayUpstream{b, nc}
}

// relayOf returns sess's relay connection, if it relays.
func (s *Server) relayOf(sess *Session) (*upstream.Backend, net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.relays[sess]
	return r.b, r.nc
}

// left reports whether a client waiting on something else than its socket
// (a blocking command, a read held by a miss hold) should be dropped: it
// was interrupted (CLIENT KILL, shutdown) or closed its side. Its waiters
// ask every 50 ms.
func (sess *Session) left() bool { return sess.interrupted.Load() || clientGone(sess.nc) }

// clientGone reports whether the client closed its side, without consuming
// anything it may have pipelined after the blocking command.
func clientGone(nc net.Conn) bool {
	if isTLS(nc) {
		return tlsClientGone(nc)
	}
	sc, ok := socketOf(nc).(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	gone := false
	// Control, not Read: the session's Reader may hold the socket's read
	// side between batches (resp.Reader.reads), and a peek needs no wait.
	rc.Control(func(fd uintptr) {
		// A client that pipelined more after the blocking command and
		// then closed has data before its FIN, which the peek sees
		// first; Redis reads on to the end and frees it (found by
		// review: the next push was popped for a closed socket).
		gone = rawio.PeerGoneFD(fd) || peerClosed(fd)
	})
	return gone
}

// relayKind says why a client became a relay, which decides its output cap.
type relayKind uint8

const (
	relayPubSub relayKind = iota
	relayMonitor
	relayTracking
	// relayPlain: a pub/sub or tracking relay whose connection the client
	// RESET, so neither subscribed nor tracking, until it subscribes or
	// turns tracking on again (relayStateStep). A relay stays for good
	// after RESET; CLIENT LIST showed it a subscriber, and CLIENT KILL
	// TYPE pubsub killed it (found by a probe).
	relayPlain
)

// startRelay turns the rest of the client's life into a raw relay to a
// dedicated connection, or for a subscriber until it has unsubscribed
// from everything (relayexit.go). reqs are the client's requests from the
// one that started it to the end of the batch; they are sent first.
func (sess *Session) startRelay(kind relayKind, r *request) bool {
	reqs, m := sess.batchReqs[r.i:], r.m
	sess.slowExempt = true
	sess.flush(time.Now())
	if kind == relayMonitor && sess.srv.router != nil {
		return sess.clusterMonitor(r)
	}
	b, err := sess.relayBackend(r)
	var up net.Conn
	if err == nil {
		up, err = b.AcquireConnFor(sess.db, sess.resp3, sess.name, sess.left)
	}
	if err != nil {
		// Answered: the command must not also go to a shared connection,
		// which it would turn into a subscriber (or worse, in RESP3, make
		// it answer with a push the pipe drops, shifting later replies).
		sess.replyLocal(m, errorReply(err))
		if upstreamDown(err) {
			// Then closed, as Redis being down would close it: the library
			// reconnects and subscribes again (upstreamlost.go).
			sess.closeUpstreamLost()
		}
		return true
	}
	if sess.pin.pipe != nil {
		sess.unpin(false)
	}
	sess.list.relay.Store(uint32(kind) + 1)
	limit := int64(sess.srv.Config().Server.PubSubOutputLimit)
	if kind == relayTracking {
		limit = int64(sess.srv.Config().Server.ClientOutputLimit)
	}
	// Whatever the session has still to write goes first.
	if len(sess.out) > 0 {
		if _, err := sess.nc.Write(sess.out); err != nil {
			b.ReleaseConn(up)
			sess.closing(metrics.CloseWriteError)
			sess.quitting = true
			return true
		}
		sess.out = sess.out[:0]
	}
	// The starting command was checked already; the rest of its batch has
	// its guard decisions at the following indices.
	var first []byte
	if sess.replyOff {
		// See relay: Redis mutes the client's own connection.
		first = append(first, cmdReplyOff...)
	} else if sess.curMute {
		// CLIENT REPLY SKIP just before the starting command, which
		// dispatch took for it: on Redis it mutes that command's reply
		// (MONITOR's or CLIENT TRACKING ON's +OK; not SUBSCRIBE's
		// confirmations, pushes Redis never mutes). Carried over like
		// REPLY OFF, Redis's relay connection does the same (found by
		// review: the +OK reached the client).
		first = append(first, cmdReplySkip...)
	}
	sess.srv.setRelay(sess, b, up)
	held := sess.relay(kind, up, reqs, r.i, first, limit)
	sess.srv.setRelay(sess, nil, nil)
	b.ReleaseConn(up)
	if held == nil {
		sess.quitting = true // relay recorded why
		return true
	}
	// Left (relayexit.go): the rest of this batch went to the relay; the
	// batch the relay held is served next, on the shared connections.
	sess.list.relay.Store(0)
	sess.relayNode, sess.relayInMulti = "", false
	sess.route.relay = route.Default
	sess.resumed = held
	return true
}

// relayStarter names cmd, as the client would write it, if it turns the
// client into a relay (see proxyCommands); otherwise it returns "".
func relayStarter(name string, args [][]byte) string {
	switch name {
	case "subscribe", "psubscribe", "ssubscribe", "monitor":
		return strings.ToUpper(name)
	case "client|tracking", "client|no-touch":
		if len(args) > 2 && strings.EqualFold(string(args[2]), "on") {
			return strings.ToUpper(strings.ReplaceAll(name, "|", " "))
		}
	}
	return ""
}

// errTrackingRedirect refuses CLIENT TRACKING ON ... REDIRECT <id>: the id
// is a proxy client id, which on Redis names some unrelated connection
// that would then receive this client's invalidations.
const errTrackingRedirect = "ERR redproxy: CLIENT TRACKING REDIRECT is not supported; proxy client IDs are not Redis connection IDs (use RESP3 tracking, without REDIRECT)"

// trackingRedirect reports whether args are CLIENT TRACKING with the
// REDIRECT option, ON or OFF: Redis checks the id in either case, and
// proxy ids mean nothing there (OFF with it was answered +OK, found by
// review).
func trackingRedirect(args [][]byte) bool {
	if len(args) < 4 || !strings.EqualFold(string(args[0]), "client") || !strings.EqualFold(string(args[1]), "tracking") {
		return false
	}
	for i := 3; i < len(args); i++ {
		switch strings.ToLower(string(args[i])) {
		case "redirect":
			return true
		case "prefix":
			i++ // its value, which may be the word "redirect"
		}
	}
	return false
}

// relay copies bytes both ways until either side closes. Upstream bytes
// are queued for the client in a bounded queue: a client that stops
// reading while Redis keeps publishing is cut off at limit, so the proxy's
// memory stays bounded and other clients are unaffected. reqs are the
// requests sent first, behind first (the command that started the relay
// and the rest of its batch), base the index of the first of them in the
// batch.
//
// server.idle_timeout: as in Redis, pub/sub and MONITOR clients are never
// closed for idleness; a tracking client is idle only when nothing moves
// in either direction.
//
// A pub/sub relay may also end by handing the client back to the
// shared connections once it has unsubscribed from everything
// (relayexit.go): relay then returns the client's batch it held meanwhile,
// not yet served; otherwise nil.
func (sess *Session) relay(kind relayKind, up net.Conn, reqs []resp.Request, base int, first []byte, limit int64) (held []resp.Request) {
	rw := newRelayWrites(sess, kind)
	sess.relayTrack = trackingState{}
	if len(reqs) > 0 {
		sess.relayTrack.note(reqs[0].Args) // forwarded as sent (startRelay)
	}
	defer rw.end()
	ex := sess.newRelayExit(kind)
	// A relay never parks, so nothing else would notice a FIN that came
	// with the client's last bytes (resp.Reader.SetReadFirst): a subscriber
	// that sent UNSUBSCRIBE or PING and closed kept its relay, and its
	// Redis connection, open (found while testing half-closes).
	sess.rd.SetReadFirst(true)
	// mayMute: the client's replies may be muted (CLIENT REPLY OFF or
	// SKIP), so an error it is sent may not reach it (see noteReplyMode).
	mayMute := sess.replyOff
	if sess.replyOff {
		// CLIENT REPLY OFF is the session's (local.go): the relay's
		// connection, dialled without it, answered every command of a
		// muted subscriber, so startRelay mutes it first. Then nothing
		// is left to count replies by, nor to answer the exit question:
		// the relay stays for good, as after a CLIENT REPLY sent here.
		rw.uncountable()
		if ex != nil {
			ex.stayForGood()
		}
	} else if sess.curMute {
		// A CLIENT REPLY SKIP carried over (startRelay): the starting
		// command's reply may be missing from the stream, so replies
		// cannot be counted, as after a CLIENT REPLY sent here. The skip
		// ends with that command; the exit question is answered.
		rw.uncountable()
	}
	var protoErr *resp.ProtocolError
	var halfClosed bool
	// subscribed: a tracking relay (RESP3) whose client subscribed is in
	// Redis's pub/sub class: never idle, and the pub/sub output limits
	// (found by a probe: closed for idleness, no soft limit).
	var subscribed atomic.Bool
	for k := range reqs {
		d := sess.guard.Decision(base + k)
		args := reqs[k].Args
		if d != nil && d.Args != nil {
			args = d.Args
		}
		cmd := sess.cmds.table.Lookup(reqs[k].Args)
		sess.noteLastCmd(cmd)
		if k > 0 {
			// The first was counted by dispatch, which started the relay;
			// the rest of its batch, and what comes on the relay, were
			// counted nowhere (found by a probe: a tracking client's
			// GETs were missing from redproxy_commands_total).
			sess.metricFor(cmd).Calls.Inc()
		}
		if kind == relayTracking && subscribes(cmd) {
			subscribed.Store(true)
		}
		rw.note(cmd, args, d != nil && d.Refuse != nil)
		if k == 0 {
			first = append(first, reqs[0].Raw...) // checked by startRelay
		} else {
			first = sess.appendRelayed(first, base+k, &reqs[k], d, rw)
		}
		mayMute = relayMayMute(mayMute, cmd, args, sess.resp3 || kind != relayPubSub)
		if ex != nil {
			ex.note(cmd)
		}
		if sess.quitting {
			break // killed itself (CLIENT KILL): nothing after it runs
		}
	}
	rw.sending()
	idle := sess.srv.Config().Server.IdleTimeout.Duration
	var ending atomic.Bool
	wake := func() {
		if ending.Load() || sess.interrupted.Load() {
			sess.nc.SetReadDeadline(time.Now())
		}
	}
	active := func() {
		if idle > 0 && kind == relayTracking && !subscribed.Load() {
			sess.nc.SetReadDeadline(time.Now().Add(idle))
			wake() // an end or interrupt that raced the refresh is not lost
		}
	}
	if idle > 0 && (kind != relayTracking || subscribed.Load()) {
		sess.nc.SetReadDeadline(time.Time{})
		wake()
	}
	q := newOutQueue(limit)
	pubsubClass := func() {
		// Redis's pubsub class; MONITOR and tracking connections are of
		// its normal class, which has no soft limit by default.
		srv := sess.srv.Config().Server
		q.setClass(int64(srv.PubSubOutputLimit), int64(srv.PubSubOutputSoftLimit), srv.PubSubOutputSoftTime.Duration)
	}
	if kind == relayPubSub || subscribed.Load() {
		pubsubClass()
	}
	filter := sess.nsRelayFilter(limit)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // Redis -> queue
		defer wg.Done()
		defer q.close()
		if ex != nil {
			defer close(ex.readerDone)
		}
		buf := make([]byte, 32<<10)
		for {
			n, err := up.Read(buf)
			// Copy: queueing buf[:n] of a fresh 32 KB buffer per read would
			// keep 32 KB alive per small message, far beyond the limit.
			chunk := buf[:n]
			if n > 0 {
				// Writes whose replies this completes are released before
				// the client can see the replies; the fix-ups' replies are
				// cut.
				var cerr error
				if chunk, cerr = rw.received(chunk); cerr != nil {
					sess.closeFor(metrics.CloseUpstreamLost, "relayed stream from Redis lost count of the replies", "err", cerr)
					sess.nc.Close()
					up.Close()
					return
				}
			}
			found, answer := false, answerNone
			if ex != nil && len(chunk) > 0 {
				var ferr error
				if chunk, found, answer, ferr = ex.received(chunk); ferr != nil {
					sess.closeFor(metrics.CloseUpstreamLost, "relayed stream from Redis is not RESP", "err", ferr)
					sess.nc.Close()
					up.Close()
					return
				}
			}
			if filter != nil && len(chunk) > 0 {
				// The namespace's view: channel names without the prefix,
				// other namespaces' keyevent notifications dropped.
				var ferr error
				if chunk, ferr = filter.Filter(nil, chunk); ferr != nil {
					sess.closeFor(metrics.CloseOutputLimit, "relayed output exceeds its limit", "limit_bytes", limit, "err", ferr)
					sess.nc.Close()
					up.Close()
					return
				}
			}
			if len(chunk) > 0 && !q.push(append([]byte(nil), chunk...)) {
				if hard, soft, softFor, bySoft := q.limits(); bySoft {
					sess.closeFor(metrics.CloseOutputLimit, "subscriber stayed behind by more than its soft limit",
						"soft_limit_bytes", soft, "for", softFor)
				} else {
					sess.closeFor(metrics.CloseOutputLimit, "relayed output exceeds its limit", "limit_bytes", hard)
				}
				sess.nc.Close()
				up.Close()
				return
			}
			if found {
				// Only now: what went before the answers is queued.
				ex.result <- answer
				if answer == answerUnsubscribed {
					return // the relay leaves
				}
			}
			if err != nil {
				// Unless the client's side ended first (and closed up),
				// Redis closed the relay's connection.
				sess.closing(metrics.CloseUpstreamLost)
				ending.Store(true)
				wake() // the client reader
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
				sess.closing(metrics.CloseWriteError)
				up.Close()
				return
			}
			active()
		}
	}()
	// client -> Redis, on the session goroutine.
	if len(first) > 0 {
		if _, err := up.Write(first); err != nil {
			up.Close()
		}
	}
reading:
	for {
		if sess.quitting {
			// Killed itself in the first batch: as below, what it sent is
			// answered, then the connection closes.
			halfClosed = true
			break
		}
		active()
		received := sess.rd.Received()
		all, err := sess.rd.ReadBatch()
		if idle > 0 && kind == relayTracking && !ending.Load() && sess.sendingAtDeadline(len(all), err, received) {
			continue // the client is sending: activity (as Session.run's wait, found by review)
		}
		sess.cmds = sess.srv.cmdSet() // a relay's batches follow the table too (cmdtable.go)
		// A subscriber's batch is sent in segments, each ending at an
		// unsubscribe (relayExit.segment): what the client sent behind its
		// last one is held and served on the shared connections, as Redis
		// serves it to a client no longer subscribed.
		for start := 0; start < len(all) || start == 0; {
			reqs := all[start:]
			if ex != nil && err == nil {
				reqs = reqs[:ex.segment(sess.cmds.table, reqs)]
			}
			clientLeft := false
			if ex != nil && len(reqs) > 0 && err == nil && ex.wantsToLeave() {
				rw.asked(2) // the question's two commands
				switch ex.ask(sess, up) {
				case relayLeaves:
					up.Close()
					wg.Wait()
					if sess.closedFor() == "" {
						return all[start:]
					}
					// The client's side failed while the replies were passed on.
				case relayEnds:
					sess.closing(metrics.CloseUpstreamLost) // unless the client's end or the reader's recorded why
				case relayClientLeft:
					reqs, clientLeft = all[start:], true
				}
				if sess.closedFor() != "" && !clientLeft {
					break reading
				}
			}
			var out []byte
			if len(reqs) > 0 {
				if sess.ns.w != nil {
					sess.nsRewriteBatch(reqs)
				}
				sess.prepareBatch(reqs)
			}
			for k := range reqs {
				d := sess.guard.Decision(k)
				args := reqs[k].Args
				if d != nil && d.Args != nil {
					args = d.Args
				}
				cmd := sess.cmds.table.Lookup(reqs[k].Args)
				sess.noteLastCmd(cmd) // before the proxy's CLIENT INFO answer is made
				sess.metricFor(cmd).Calls.Inc()
				if kind == relayTracking && subscribes(cmd) && !subscribed.Swap(true) {
					pubsubClass()
					if idle > 0 {
						sess.nc.SetReadDeadline(time.Time{})
						wake()
					}
				}
				if ex != nil {
					ex.note(cmd)
				}
				if !rw.note(cmd, args, d != nil && d.Refuse != nil) {
					if mayMute {
						// The refusal would be muted like any reply, and
						// the write lost without a word: close the client
						// instead, once Redis has run and answered what it
						// sent before (the drain below, as after a
						// half-close), so that it sees the failure (found
						// by review).
						if len(out) > 0 {
							up.Write(out)
						}
						sess.closeFor(metrics.CloseHeldWrites, "more writes than a relay can track, with replies muted", "held_writes", maxHeldRelayWrites)
						halfClosed = true
						break reading
					}
					out = appendErrorScript(out, errHeldWrites)
					continue
				}
				out = sess.appendRelayed(out, k, &reqs[k], d, rw)
				mayMute = relayMayMute(mayMute, cmd, args, sess.resp3 || kind != relayPubSub)
				if sess.quitting {
					break // killed itself: Redis reads nothing after it
				}
			}
			rw.sending()
			if len(out) > 0 {
				if _, werr := up.Write(out); werr != nil {
					sess.closing(metrics.CloseUpstreamLost)
					break reading
				}
			}
			if clientLeft || sess.quitting {
				halfClosed = true
				break reading
			}
			start += len(reqs)
			if start == len(all) {
				break
			}
		}
		if err != nil {
			sess.readEnded(err)
			errors.As(err, &protoErr)
			halfClosed = errors.Is(err, io.EOF) && !sess.interrupted.Load()
			break
		}
	}
	if protoErr != nil || halfClosed {
		// As Redis: every reply to what came before (then, after a
		// protocol error, the error), then the close. Redis answers the
		// commands it was sent and ends the connection when it reads the
		// half-close, so the reader delivers up to that end; closing at
		// once lost those replies (for a client that sent its last
		// commands and half-closed while Redis was busy: found by review).
		// A client that closed for good fails the first write, which
		// closes up.
		if cw, ok := up.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
			bound := time.AfterFunc(relayDrainWait, func() { up.Close() })
			wg.Wait()
			bound.Stop()
		}
	}
	up.Close()
	wg.Wait()
	if protoErr != nil {
		sess.srv.metrics.ProtocolErrors.Inc()
		sess.nc.Write(redcon.AppendError(nil, "ERR "+protoErr.Error()))
		sess.protoErrAnswered = true
	}
	return nil
}

// relayMayMute follows whether a relayed client's replies may be muted
// after cmd: CLIENT REPLY OFF or SKIP may mute them (SKIP only the next,
// taken as muting until ON, which errs on the side of muting), ON
// unmutes them where Redis accepts it: on a RESP2 connection that may
// still be subscribed, Redis refuses CLIENT REPLY and the mode stays.
// Erring towards muted only closes a client that could have read a
// refusal; erring the other way lost writes without a word.
func relayMayMute(muted bool, cmd *commands.Command, args [][]byte, onAccepted bool) bool {
	if cmd == nil || cmd.Name != "client|reply" || len(args) != 3 {
		return muted
	}
	switch strings.ToLower(string(args[2])) {
	case "off", "skip":
		return true
	case "on":
		return muted && !onAccepted
	}
	return muted
}

// relayDrainWait bounds how long a relay ending on a client's protocol
// error or half-close waits for Redis's replies to what the client sent
// before it (a script may hold Redis); then the connection is closed as it
// is.
const relayDrainWait = 2 * time.Second

// appendRelayed appends what to send upstream for one request of a relayed
// client: the request, the guard's rewrite of it, or, for a refusal, a
// script that makes Redis answer with the refusal's text, so the error
// reaches the client in order with every other reply on the raw stream.
// A write's TTL fix-ups follow it where rw can cut their replies from the
// stream (relayWrites.hide: a counted stream; not for a key in another
// database), inside the client's MULTI behind its EXEC (relayTxFixups);
// elsewhere the violation is reported, not fixed (recordRelayed), and the
// keyspace audit finds keys left without a TTL.
//
// Inside the client's MULTI a refusal is sent as a command Redis rejects at
// queue time, so that EXEC fails with EXECABORT as it does for a refusal
// on a shared connection: a script would be queued and EXEC would run the
// rest of the transaction.
//
// i is r's index in its batch (for the namespace's notes).
func (sess *Session) appendRelayed(out []byte, i int, r *resp.Request, d *policy.Decision, rw *relayWrites) []byte {
	if b, done := sess.appendRelayExecRefused(out, i, r, rw); done {
		sess.relayTrack.caching = false // ended by the EXEC on Redis
		return b
	}
	inMulti := sess.relayInMulti
	start := len(out)
	out = sess.appendRelayedCmd(out, i, r, d, rw)
	if !inMulti && !sess.relayInMulti {
		out = sess.keepCaching(out, out[start:], r, rw)
	} else {
		// Redis keeps the flag through MULTI and ends it with the
		// transaction (EXEC and DISCARD are no CLIENT subcommands).
		sess.relayTrack.caching = false
	}
	if rw != nil && inMulti {
		switch {
		case sess.relayInMulti && movesKeys(sess.cmds.table.Lookup(r.Args)):
			rw.txFix.blocked = true
		case !sess.relayInMulti:
			// The transaction ended here, as Redis takes this command.
			out = rw.endTx(out, txStepOf(r.Args) == txExec)
		}
	}
	return out
}

// keepCaching keeps a tracking relay's CLIENT CACHING in force as Redis
// would, for the client's command r outside MULTI, sent as sent. Redis
// ends the CACHING flag after the next command but a CLIENT subcommand;
// where the proxy sends a script in a CLIENT subcommand's place (its
// answer to CLIENT ID, INFO, LIST or KILL, a refusal), the script ended
// it, and the read behind it was tracked against OPTIN, or not tracked
// against OPTOUT (found by a probe: after CLIENT CACHING yes, CLIENT ID,
// GET k, another client's SET k sent no invalidation). So the CACHING is
// sent again behind the script, its reply cut from the stream; where the
// stream is no longer counted it is not (then the flag is lost, as
// before).
func (sess *Session) keepCaching(out, sent []byte, r *resp.Request, rw *relayWrites) []byte {
	ts := &sess.relayTrack
	if len(r.Args) < 2 || !strings.EqualFold(string(r.Args[0]), "client") {
		ts.caching = false
		return out
	}
	if bytes.Equal(sent, r.Raw) {
		ts.note(r.Args)
		return out
	}
	// A CACHING Redis takes in the mode in force: one the client sent that
	// Redis refused (CACHING no under OPTIN) left the flag as it was, and
	// sent again it would be refused again (found by review).
	if again := ts.again(); again != nil && rw != nil && rw.hideNext(1, true) {
		out = append(out, again...)
	}
	return out
}

// trackingState is what Redis holds of a tracking relay's tracking mode
// and CACHING flag, followed through the CLIENT TRACKING and CLIENT
// CACHING commands the relay forwarded as the client sent them, as Redis
// 7 takes them (clientCommand, enableTracking): a command Redis refuses
// changes nothing.
type trackingState struct {
	on, bcast bool
	mode      byte // 'i': OPTIN, 'o': OPTOUT, 0: neither
	caching   bool // the CACHING flag
}

var (
	cmdCachingYes = resp.AppendCommandStrings(nil, "CLIENT", "CACHING", "yes")
	cmdCachingNo  = resp.AppendCommandStrings(nil, "CLIENT", "CACHING", "no")
)

// again is the CLIENT CACHING that sets the flag again in the mode in
// force, or nil when the flag is off or no mode takes one.
func (ts *trackingState) again() []byte {
	switch {
	case !ts.on || !ts.caching:
		return nil
	case ts.mode == 'i':
		return cmdCachingYes
	case ts.mode == 'o':
		return cmdCachingNo
	}
	return nil
}

// note follows a CLIENT subcommand Redis was sent as the client sent it.
// The flag itself outlives TRACKING OFF and ON, as on Redis, until a
// command other than CLIENT's.
func (ts *trackingState) note(args [][]byte) {
	if len(args) < 3 || !strings.EqualFold(string(args[0]), "client") {
		return
	}
	switch strings.ToLower(string(args[1])) {
	case "caching":
		if len(args) != 3 || !ts.on {
			return
		}
		switch v := strings.ToLower(string(args[2])); {
		case v == "yes" && ts.mode == 'i', v == "no" && ts.mode == 'o':
			ts.caching = true
		}
	case "tracking":
		o, ok := trackingOptions(args)
		if !ok || trackingRedirect(args) {
			return // refused by Redis, or by the proxy before it
		}
		if strings.EqualFold(string(args[2]), "off") {
			ts.on, ts.bcast, ts.mode = false, false, 0
			return
		}
		switch {
		case o.optin && o.optout, o.bcast && (o.optin || o.optout), o.prefix && !o.bcast,
			ts.on && ts.bcast != o.bcast,
			ts.on && (o.optin && ts.mode == 'o' || o.optout && ts.mode == 'i'):
			return // Redis refuses these
		}
		ts.on, ts.bcast, ts.mode = true, o.bcast, 0
		if o.optin {
			ts.mode = 'i'
		} else if o.optout {
			ts.mode = 'o'
		}
	}
}

// appendRelayExecRefused handles an EXEC the client's user may not run on
// a relay as execRefused does elsewhere, and reports whether it did: Redis
// discards the transaction and any WATCH and answers EXECABORT quoting the
// refusal. Refused as any other command (appendQueueRefusal inside MULTI),
// the transaction stayed open and the client's next commands were queued
// where Redis runs them (found by review). So the relay sends DISCARD (or
// UNWATCH outside MULTI), cuts its reply, and sends the script answering
// EXECABORT. Only where replies are counted and scripts run; elsewhere the
// EXEC is refused as before.
func (sess *Session) appendRelayExecRefused(out []byte, i int, r *resp.Request, rw *relayWrites) ([]byte, bool) {
	if rw == nil || txStepOf(r.Args) != txExec || !sess.srv.usersOn() || !sess.relayRunsScripts() {
		return out, false
	}
	args := sess.clientArgs(i, r.Args)
	cmd := sess.cmds.table.Lookup(args)
	if sess.aclCheck(cmd, args) == auth.Allowed || !rw.hideNoted() {
		return out, false
	}
	msg := sess.aclDenied(cmd, args)
	end := cmdUnwatch
	if sess.relayInMulti {
		end = cmdDiscard
	}
	out = append(out, end...)
	out = appendErrorScript(out, execAbortPrefix+strings.TrimPrefix(msg, "-"))
	if sess.relayInMulti {
		sess.relayInMulti = false
		sess.relayTx = relayTxState{}
		out = rw.endTx(out, false)
	}
	return out, true
}

// movesKeys reports whether cmd may leave the connection in another
// database, or move a key elsewhere: queued in a transaction, it keeps the
// transaction's fix-ups from being sent behind EXEC (relayWrites.endTx).
// They would run in a database EXEC may not have left the connection in,
// or on a key a later command of the transaction renamed or copied, whose
// new name the policy took to inherit the fix-up's TTL ("MULTI, SADD tmp,
// RENAME tmp final, EXEC": queued right behind the SADD, as on a shared
// connection, the fix-up's TTL goes with the rename).
func movesKeys(cmd *commands.Command) bool {
	if cmd == nil {
		return false
	}
	switch cmd.Name {
	case "select", "swapdb", "move", "rename", "renamenx", "copy":
		return true
	}
	return false
}

// appendRelayedCmd is appendRelayed for the command alone.
func (sess *Session) appendRelayedCmd(out []byte, i int, r *resp.Request, d *policy.Decision, rw *relayWrites) []byte {
	refuse := appendErrorScript
	if sess.relayInMulti || !sess.relayRunsScripts() {
		refuse = appendQueueRefusal
	}
	if trackingRedirect(r.Args) {
		return refuse(out, errTrackingRedirect)
	}
	if msg := sess.relayDenied(sess.clientArgs(i, r.Args), r.Args); msg != "" {
		return refuse(out, msg)
	}
	if b, done := sess.appendRelayAuth(out, r.Args, refuse); done {
		return b
	}
	if msg := sess.nsRelayRefusal(i); msg != "" {
		return refuse(out, msg)
	}
	if msg := sess.relayMisrouted(r.Args); msg != "" {
		// Unknown to Redis, so refused in order in any context, even
		// RESP2's subscribed one (where a script would not run).
		return appendQueueRefusal(out, msg)
	}
	// The proxy's own CLIENT KILL, done when read and answered in order
	// by a script, as CLIENT ID is (appendRelayAnswer), where Redis runs
	// scripts and not inside MULTI. Killing this client itself ends the
	// relay once Redis has answered what came before (relay: quitting),
	// as Redis closes a client after the reply to the CLIENT KILL that
	// killed it.
	killHere := len(r.Args) > 2 && strings.EqualFold(string(r.Args[0]), "client") && strings.EqualFold(string(r.Args[1]), "kill") &&
		!sess.relayInMulti && sess.relayRunsScripts()
	if len(r.Args) > 1 && strings.EqualFold(string(r.Args[0]), "client") && !killHere {
		// Proxy client ids and addresses cannot be translated in flight
		// on a relay; forwarded, they would name unrelated Redis
		// connections. CLIENT UNBLOCK is not done when read either, as
		// KILL is: it would act before the commands sent ahead of it have
		// run ("LPUSH q job, CLIENT UNBLOCK worker" in one write left the
		// worker with a timeout and the job in the list; found by review),
		// and waiting for their replies needs the relay's reply count,
		// which not every relay keeps.
		for _, sub := range [...]string{"UNBLOCK", "KILL"} {
			if strings.EqualFold(string(r.Args[1]), sub) {
				return refuse(out, "ERR redproxy: CLIENT "+sub+" is not supported on a connection in subscribed, tracking or MONITOR mode")
			}
		}
	}
	if d != nil && d.Refuse != nil {
		sess.recordViolations(d)
		return refuse(out, d.Refuse.Message())
	}
	if killHere {
		// After the guard's refusal: a policy that denies CLIENT KILL
		// holds on a relay too.
		args := sess.clientArgs(i, r.Args)
		if b, done := appendAnswerScript(out, sess.srv.clientKill(sess, args[2:])); done {
			return b
		}
		return appendErrorScript(out, "ERR redproxy: CLIENT KILL's answer could not be sent on this connection")
	}
	if b, done := sess.appendRelayAnswer(out, sess.clientArgs(i, r.Args), r.Raw); done {
		if sess.relayInMulti {
			// Queued as a script: counted in multi= as Redis counts the
			// CLIENT command (found by a probe), after its own answer,
			// which counts those queued before it.
			sess.list.multi.Add(1)
		}
		return b
	}
	sess.relayStateStep(sess.clientArgs(i, r.Args))
	// The differential test's seed 1796408348893467102: after "MULTI x"
	// the proxy refused the client's AUTH as inside MULTI (txStepOf).
	// CLIENT LIST's x flag and multi= follow a relayed transaction too.
	switch step := txStepOf(r.Args); {
	case step == txOpen:
		if !sess.relayInMulti {
			sess.list.multi.Store(1)
		}
		sess.relayInMulti = true
	case step == txExec || step == txDiscard || step == txReset:
		sess.relayInMulti = false
		sess.list.multi.Store(0)
	case sess.relayInMulti:
		sess.list.multi.Add(1)
	}
	if sess.srv.mirror != nil && sess.relayRunsScripts() {
		// Forwarded, and Redis runs it (not a MONITOR or RESP2
		// subscribed connection, where it refuses every write).
		sess.mirrorSkipRelayed(sess.cmds.table.Lookup(r.Args))
	}
	if d == nil || len(d.Violations) == 0 && d.Args == nil {
		return append(out, r.Raw...)
	}
	if d.Args != nil {
		out = append(out, sess.guard.Encode(d.Args)...)
	} else {
		out = append(out, r.Raw...)
	}
	var fixups [][]byte
	if rw != nil && len(d.Expires) > 0 {
		// db -1: a fix-up for a key in another database (COPY ... DB n)
		// is left out; it would need SELECTs in the relay's database,
		// which the relay does not always know (relayWrites.dbs).
		fixups = sess.guard.FixupsIn(d.Expires, -1, 0)
		if sess.relayInMulti && len(fixups) > 0 && rw.holdTx(fixups, sess.relayRecords(d)) {
			return out // recorded when the transaction ends
		}
		if !rw.hide(len(fixups)) {
			fixups = nil
		}
	}
	sess.recordRelayed(d, fixups != nil)
	for _, f := range fixups {
		out = append(out, f...)
	}
	return out
}

// relayRecord is a violation of a write queued in a relayed client's
// MULTI, recorded when the transaction ends: bySend, it is fixed if the
// transaction's fix-ups are sent behind its EXEC, else reported.
type relayRecord struct {
	v      policy.Violation
	bySend bool
}

// relayRecords returns d's violations to record at the end of the
// transaction (relayWrites.endTx).
func (sess *Session) relayRecords(d *policy.Decision) []relayRecord {
	recs := make([]relayRecord, 0, len(d.Violations))
	for _, v := range d.Violations {
		r := relayRecord{v: v}
		if v.Outcome == policy.Fixed && v.Rule == policy.RuleTTL && fixedByExpire(d.Expires, v.Key, false) {
			r.bySend = fixedByExpire(d.Expires, v.Key, true)
			if !r.bySend {
				r.v.Outcome = policy.Reported
			}
		}
		recs = append(recs, r)
	}
	return recs
}

// appendRelayAnswer appends, for a command the proxy answers about its
// own clients (CLIENT ID, INFO, LIST) or keeps for itself (CLIENT
// SETINFO's lib-name and lib-ver, which its CLIENT LIST shows), what makes Redis answer the proxy's own reply in order on the relay's
// stream, and reports whether it did; otherwise the command is forwarded
// as any other.
//
// Forwarded, these answered for the relay's Redis connection (found by
// review): CLIENT ID changed from the client's proxy id to the relay's
// Redis id, which names nothing the proxy knows (CLIENT KILL ID of it
// answered 0), and CLIENT LIST listed the proxy's upstream connections.
// On a connection where Redis runs scripts (tracking, RESP3 subscribed)
// the proxy's reply is computed by its own handler now and sent as a
// script that returns it (appendAnswerScript); inside MULTI Redis queues
// the script like the command, and EXEC carries the reply. Where Redis
// runs no script: in RESP2's subscribed mode the command is forwarded, so
// that Redis answers its own "only (P|S)SUBSCRIBE ... are allowed" error,
// as it would to the client directly (CLIENT LIST in a namespace is
// refused, as before); in MONITOR mode, where Redis would answer for its
// own connection, CLIENT ID, INFO and LIST are refused. CLIENT SETINFO is
// forwarded there, as before, and not seen by the proxy's CLIENT LIST.
func (sess *Session) appendRelayAnswer(out []byte, args [][]byte, raw []byte) ([]byte, bool) {
	if len(args) < 2 || !strings.EqualFold(string(args[0]), "client") {
		return out, false
	}
	cmd := sess.cmds.table.Lookup(args)
	if cmd == nil || !cmd.ArityOK(len(args)) {
		return out, false // forwarded: Redis answers the error
	}
	switch cmd.Name {
	case "client|id", "client|info", "client|list", "client|setinfo":
	default:
		return out, false
	}
	if !sess.relayRunsScripts() {
		switch {
		case cmd.Name == "client|setinfo":
			return out, false
		case relayKind(sess.list.relayOf()-1) == relayMonitor || cmd.Name == "client|list" && sess.ns.w != nil:
			return appendQueueRefusal(out, "ERR redproxy: "+strings.ToUpper(strings.ReplaceAll(cmd.Name, "|", " "))+" is not supported on a connection in MONITOR mode or RESP2 subscribed mode"), true
		}
		return out, false
	}
	return sess.appendProxyAnswer(out, cmd, args, raw)
}

// appendProxyAnswer appends a script that makes Redis answer what the
// proxy's own handler answers cmd with args now (appendAnswerScript),
// and reports whether it did.
func (sess *Session) appendProxyAnswer(out []byte, cmd *commands.Command, args [][]byte, raw []byte) ([]byte, bool) {
	e := sess.cmds.handlers[cmd]
	if e == nil || e.answer == nil {
		return out, false
	}
	// The handler records its reply as the session's next local reply;
	// it is taken back out, so the relay's flush-free path sees nothing.
	local, slots := len(sess.local), len(sess.slots)
	e.answer(sess, &request{Request: &resp.Request{Raw: raw, Args: args}, cmd: cmd, name: cmd.Name})
	var reply []byte
	if len(sess.slots) == slots+1 && sess.slots[slots].kind == slotLocal {
		reply = sess.local[sess.slots[slots].i:sess.slots[slots].end]
	}
	b, done := appendAnswerScript(out, reply)
	clear(sess.slots[slots:])
	sess.local, sess.slots = sess.local[:local], sess.slots[:slots]
	return b, done
}

// txStep is what a command does to the client's transaction on Redis, as
// Redis takes it: "MULTI x", "DISCARD x" and "RESET x" are refused for
// their arity and open or end nothing, but "EXEC x", refused too, discards
// the transaction. The relay's write tracking (relayWrites.note), its
// MULTI state (appendRelayed) and its CLIENT LIST state (relayStateStep)
// each follow it; written out in each, they drifted apart (27b9980).
type txStep uint8

const (
	txNone    txStep = iota
	txOpen           // MULTI: opens one (inside one, Redis refuses it)
	txExec           // EXEC: runs what was queued, unless aborted
	txDiscard        // DISCARD, or EXEC with arguments
	txReset          // RESET: discards, and resets the connection
)

func txStepOf(args [][]byte) txStep {
	if len(args) == 0 {
		return txNone
	}
	bare := len(args) == 1
	switch name := args[0]; {
	case bare && strings.EqualFold(string(name), "multi"):
		return txOpen
	case strings.EqualFold(string(name), "exec"):
		if bare {
			return txExec
		}
		return txDiscard
	case bare && strings.EqualFold(string(name), "discard"):
		return txDiscard
	case bare && strings.EqualFold(string(name), "reset"):
		return txReset
	}
	return txNone
}

// relayTxState is what a relayed client's MULTI queued that changes what
// the proxy's CLIENT LIST shows of it (relayStateStep), applied at EXEC.
type relayTxState struct {
	selected, named bool
	// refused: a command Redis refuses for its arity was queued, so EXEC
	// aborts the transaction.
	refused bool
	db      int
	name    string
}

// relayStateStep keeps what the proxy's CLIENT LIST shows of a relayed
// client, its name and database, in step with what args, about to be
// forwarded on its relay, do to the relay's connection. Found by review:
// CLIENT SETNAME and SELECT sent on a relay were forwarded but never seen,
// so a client that named itself after CLIENT TRACKING ON (rueidis
// pipelines the two in its handshake) stayed unnamed, in DB 0, in the
// proxy's CLIENT LIST for life.
//
// The relay does not read their replies, so a command counts when sent,
// if Redis accepts it: its arguments are checked as Redis checks them (a
// SELECT's index in range, and 0 in cluster mode; a name without spaces or
// special characters), and neither counts on a RESP2 subscribed
// connection, where Redis refuses both. Inside the client's MULTI they
// count at EXEC (not after a command refused for its arity was queued;
// an EXEC that a WATCH aborts is not told apart); RESET,
// which Redis runs at once even inside MULTI, gives the client DB 0 and
// no name, as on Redis.
func (sess *Session) relayStateStep(args [][]byte) {
	cmd := sess.cmds.table.Lookup(args)
	if cmd == nil {
		return
	}
	tx := &sess.relayTx
	switch txStepOf(args) {
	case txReset:
		*tx = relayTxState{}
		sess.mu.Lock()
		// RESET also ends subscriptions and tracking, and goes back to
		// RESP2: CLIENT INFO showed resp=3 and flags=P after it.
		sess.name, sess.db, sess.resp3 = "", 0, false
		sess.mu.Unlock()
		if k := relayKind(sess.list.relayOf() - 1); k == relayPubSub || k == relayTracking {
			sess.list.relay.Store(uint32(relayPlain) + 1)
		}
		sess.list.setAlso(alsoPubSub|alsoTracking, false)
		return
	case txOpen:
		if !sess.relayInMulti {
			*tx = relayTxState{}
		}
		return
	case txDiscard:
		*tx = relayTxState{}
		return
	case txExec:
		if sess.relayInMulti && !tx.refused {
			sess.mu.Lock()
			if tx.selected {
				sess.db = tx.db
			}
			if tx.named {
				sess.name = tx.name
			}
			sess.mu.Unlock()
		}
		*tx = relayTxState{}
		return
	}
	if !cmd.ArityOK(len(args)) {
		// Redis refuses it; inside MULTI that makes EXEC abort.
		tx.refused = tx.refused || sess.relayInMulti
		return
	}
	switch cmd.Name {
	case "select", "client|setname":
	case "subscribe", "psubscribe", "ssubscribe", "client|tracking", "hello":
		if !sess.relayInMulti {
			sess.relayModeStep(cmd.Name, args)
		}
		return
	default:
		return
	}
	if relayKind(sess.list.relayOf()-1) == relayPubSub && !sess.resp3 {
		return // Redis answers "only (P|S)SUBSCRIBE ... are allowed"
	}
	if cmd.Name == "select" {
		n, isInt := resp.ParseInt(args[1])
		if !isInt || n < 0 || n >= int64(sess.srv.Config().Upstream.Databases) || sess.srv.router != nil && n != 0 {
			return
		}
		if sess.relayInMulti {
			tx.selected, tx.db = true, int(n)
			return
		}
		sess.mu.Lock()
		sess.db = int(n)
		sess.mu.Unlock()
		return
	}
	if !validClientName(args[2]) {
		return
	}
	if sess.relayInMulti {
		tx.named, tx.name = true, string(args[2])
		return
	}
	sess.mu.Lock()
	sess.name = string(args[2])
	sess.mu.Unlock()
}

// relayModeStep follows, for CLIENT INFO and LIST and CLIENT KILL TYPE, a
// relayed command that changes the connection's mode: a subscribe or
// CLIENT TRACKING ON after a RESET (relayPlain) makes the relay a
// subscriber or a tracking one again, and HELLO 2 or 3 changes its
// protocol (HELLO with AUTH never reaches Redis here: appendRelayAuth;
// one with any option but a valid SETNAME is left alone, as Redis may
// refuse it).
func (sess *Session) relayModeStep(name string, args [][]byte) {
	kind := relayKind(sess.list.relayOf() - 1)
	switch name {
	case "subscribe", "psubscribe", "ssubscribe":
		switch kind {
		case relayPlain:
			sess.list.relay.Store(uint32(relayPubSub) + 1)
		case relayTracking:
			sess.list.setAlso(alsoPubSub, true) // stays one, as the relay treats it
		}
	case "client|tracking":
		if len(args) < 3 {
			return
		}
		on := strings.EqualFold(string(args[2]), "on")
		switch {
		case kind == relayPlain && on:
			sess.list.relay.Store(uint32(relayTracking) + 1)
		case kind == relayPubSub && sess.resp3:
			sess.list.setAlso(alsoTracking, on)
		}
	case "hello":
		if len(args) < 2 || kind == relayPubSub && !sess.resp3 {
			return // no change; or refused in RESP2's subscribed mode
		}
		proto, ok := resp.ParseInt(args[1])
		if !ok || proto != 2 && proto != 3 {
			return
		}
		rest := args[2:]
		if len(rest) != 0 && (len(rest) != 2 || !strings.EqualFold(string(rest[0]), "setname") || !validClientName(rest[1])) {
			return
		}
		sess.mu.Lock()
		sess.resp3 = proto == 3
		if len(rest) == 2 {
			sess.name = string(rest[1])
		}
		sess.mu.Unlock()
	}
}

// appendRelayAuth answers AUTH on a relay as on any other connection of
// the proxy's, and refuses HELLO with AUTH there; it reports whether it
// did. It is for the modes without [[users]] (relayDenied refuses both
// with them). Forwarded, AUTH reached Redis (found by review): guesses at
// any Redis user's password ran unlimited and uncounted by the failed-AUTH
// limit, and a right guess made the relay's connection a Redis user the
// proxy never lets a client become. The proxy's answer (authenticate, as
// on a plain connection) goes back as a script that returns it
// (appendAnswerScript); inside the client's MULTI, AUTH is refused as on a
// plain connection (Redis would queue it and run it at EXEC); in MONITOR
// mode, where Redis runs AUTH but no script, it is refused. In RESP2's
// subscribed mode it is forwarded: Redis refuses it there ("only
// (P|S)SUBSCRIBE ... are allowed"), as it would directly.
func (sess *Session) appendRelayAuth(out []byte, args [][]byte, refuse func([]byte, string) []byte) ([]byte, bool) {
	if len(args) == 0 || sess.srv.usersOn() {
		return out, false
	}
	cmd := sess.cmds.table.Lookup(args)
	if cmd == nil {
		return out, false
	}
	switch {
	case cmd.Name == "hello" && helloHasAuth(args):
		return refuse(out, "ERR redproxy: HELLO with AUTH is not supported on a connection in subscribed, tracking or MONITOR mode"), true
	case cmd.Name != "auth" || len(args) < 2 || len(args) > 3:
		return out, false // Redis answers a wrong arity or syntax error without authenticating
	case sess.relayInMulti:
		return appendQueueRefusal(out, "ERR redproxy: 'AUTH' inside MULTI is not supported"), true
	case relayKind(sess.list.relayOf()-1) == relayMonitor:
		return appendQueueRefusal(out, "ERR redproxy: AUTH is not supported on a connection in MONITOR mode"), true
	case !sess.relayRunsScripts():
		return out, false
	}
	var user []byte
	if len(args) == 3 {
		user = args[1]
	}
	reply := sess.authenticate(user, args[len(args)-1])
	if reply == nil {
		reply = ok
	}
	return appendAnswerScript(out, reply)
}

// helloHasAuth reports whether HELLO's arguments carry the AUTH option.
func helloHasAuth(args [][]byte) bool {
	for i := 2; i < len(args); i++ {
		switch {
		case strings.EqualFold(string(args[i]), "auth"):
			return true
		case strings.EqualFold(string(args[i]), "setname"):
			i++ // its value may be any word
		}
	}
	return false
}

// Scripts that make Redis answer a reply of the proxy's (appendAnswerScript).
const (
	scriptInteger  = "return tonumber(ARGV[1])"
	scriptStatus   = "return redis.status_reply(ARGV[1])"
	scriptVerbatim = "return {verbatim_string={format=ARGV[2], string=ARGV[1]}}"
)

// appendAnswerScript appends a script that makes Redis answer reply, one
// reply of the proxy's own: an integer, a status, an error, or a bulk or
// verbatim string, which is returned as a verbatim string (CLIENT INFO
// and LIST, the only strings it is given, are verbatim strings on
// Redis): Redis frames it in the relay connection's protocol, '=' on
// RESP3 and '$' on RESP2, as it frames its own. It reports false for
// anything else.
func appendAnswerScript(out, reply []byte) ([]byte, bool) {
	nl := bytes.Index(reply, []byte("\r\n"))
	if nl < 1 {
		return out, false
	}
	head := string(reply[1:nl])
	switch reply[0] {
	case ':':
		return resp.AppendCommandStrings(out, "EVAL", scriptInteger, "0", head), true
	case '+':
		return resp.AppendCommandStrings(out, "EVAL", scriptStatus, "0", head), true
	case '-':
		return appendErrorScript(out, head), true
	case '$', '=':
		n, err := strconv.Atoi(head)
		body := reply[nl+2:]
		if err != nil || n < 0 || len(body) != n+2 {
			return out, false
		}
		body, format := body[:n], "txt"
		if reply[0] == '=' {
			if n < 4 || body[3] != ':' {
				return out, false
			}
			body, format = body[4:], string(body[:3])
		}
		out = redcon.AppendArray(out, 5)
		out = redcon.AppendBulkString(out, "EVAL")
		out = redcon.AppendBulkString(out, scriptVerbatim)
		out = redcon.AppendBulkString(out, "0")
		out = redcon.AppendBulk(out, body)
		return redcon.AppendBulkString(out, format), true
	}
	return out, false
}

// recordRelayed records d's violations for a request sent on a relay,
// where its rewrite is sent and its TTL fix-ups only when sent (those for
// a key in the client's database): a violation the decision fixes with an
// EXPIRE fix-up not sent is recorded as reported, so that /policy/report
// does not count a key left without its TTL as fixed.
func (sess *Session) recordRelayed(d *policy.Decision, sent bool) {
	if len(d.Expires) == 0 {
		sess.recordViolations(d)
		return
	}
	sg := sess.srv.guard
	for j := range d.Violations {
		v := d.Violations[j]
		if v.Outcome == policy.Fixed && v.Rule == policy.RuleTTL && fixedByExpire(d.Expires, v.Key, false) &&
			!(sent && fixedByExpire(d.Expires, v.Key, true)) {
			v.Outcome = policy.Reported
		}
		sg.Record(&v, sess.nc.RemoteAddr(), sess.userName())
	}
}

// fixedByExpire reports whether one of the fix-ups expires key (with
// sameDB, one in the client's own database).
func fixedByExpire(expires []policy.Expire, key []byte, sameDB bool) bool {
	for _, e := range expires {
		if string(e.Key) == string(key) && (!sameDB || e.DB == nil) {
			return true
		}
	}
	return false
}

// relayRunsScripts reports whether Redis runs a script on this relay's
// connection, so a refusal can be a script answering its text alone. Not
// in MONITOR mode ("Replica can't interact with the keyspace") nor in
// RESP2's subscribed mode ("only (P|S)SUBSCRIBE ... are allowed"), where
// Redis's own error hid the refusal's reason (found by review); there a
// refusal is the unknown command of appendQueueRefusal, which Redis
// refuses in any context, quoting the text.
func (sess *Session) relayRunsScripts() bool {
	switch relayKind(sess.list.relayOf() - 1) {
	case relayMonitor:
		return false
	case relayPubSub:
		return sess.resp3
	}
	return true
}

// appendQueueRefusal appends, for a refusal inside a relayed client's
// MULTI or where no script runs (relayRunsScripts), a command unknown to
// Redis carrying msg (an error text without the leading '-'): Redis
// answers it with an unknown-command error that quotes msg's start, and
// flags the transaction so that EXEC answers EXECABORT.
func appendQueueRefusal(out []byte, msg string) []byte {
	out = redcon.AppendArray(out, 2)
	out = redcon.AppendBulkString(out, "redproxy-refused")
	return redcon.AppendBulkString(out, strings.TrimPrefix(msg, "ERR "))
}

// appendErrorScript appends a script that makes Redis answer with msg, an
// error text without the leading '-'.
func appendErrorScript(out []byte, msg string) []byte {
	return resp.AppendCommandStrings(out, "EVAL", "return redis.error_reply(ARGV[1])", "0", msg)
}

// outQueue is a byte queue with a hard cap and, for a subscriber, a soft
// one (soft, softFor).
type outQueue struct {
	mu     sync.Mutex
	cond   *sync.Cond
	chunks [][]byte
	size   int64
	limit  int64
	closed bool
	// soft, when > 0, closes the queue once what the client has not taken
	// (queued, and the chunk being written to it) has stayed above soft
	// for softFor, as Redis's client-output-buffer-limit pubsub soft limit
	// closes a subscriber that keeps lagging without reaching the hard
	// one (found by a probe: one 12-20 MB behind for 100 s was never
	// closed, where Redis closed it after 60 s). over is when it last went
	// above; writing, the size of the chunk being written.
	soft    int64
	softFor time.Duration
	over    time.Time
	writing int64
	softHit bool // closed by the soft limit
}

// setClass sets the queue's hard limit and its soft limit, for a relay
// that turns out to be of Redis's pub/sub class.
func (q *outQueue) setClass(limit, soft int64, softFor time.Duration) {
	q.mu.Lock()
	q.limit, q.soft, q.softFor = limit, soft, softFor
	q.mu.Unlock()
}

// subscribes reports whether cmd is one that puts a connection in Redis's
// pub/sub class (a subscription).
func subscribes(cmd *commands.Command) bool {
	if cmd == nil {
		return false
	}
	switch cmd.Name {
	case "subscribe", "psubscribe", "ssubscribe":
		return true
	}
	return false
}

// limits are the queue's limits, and whether the soft one closed it.
func (q *outQueue) limits() (hard, soft int64, softFor time.Duration, bySoft bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.limit, q.soft, q.softFor, q.softHit
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
	if q.soft > 0 {
		if q.size+q.writing <= q.soft {
			q.over = time.Time{}
		} else if now := time.Now(); q.over.IsZero() {
			q.over = now
		} else if now.Sub(q.over) >= q.softFor {
			q.closed, q.softHit = true, true
			q.cond.Broadcast()
			return false
		}
	}
	q.cond.Signal()
	return true
}

// pop returns everything queued, joined, or false once closed and empty.
func (q *outQueue) pop() ([]byte, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.writing = 0 // the chunk popped before is written: pop follows its write
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
	q.writing = int64(len(out))
	return out, true
}

func (q *outQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.cond.Broadcast()
	q.mu.Unlock()
}
