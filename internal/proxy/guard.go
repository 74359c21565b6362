package proxy

import (
	"bytes"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redproxy/redproxy/internal/cluster"
	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/guard"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/resp"
)

// serverGuard is the guard's part of a Server.
type serverGuard struct {
	*guard.Guard
	// user is who every session is, for the policy's scopes: clients
	// authenticate as the upstream's user or not at all (NOAUTH stops them
	// before the guard).
	user string
}

func initGuard(s *Server) error {
	o := guard.Options{Logger: s.log, Registerer: s.metrics.Registry}
	if rs := s.routes; rs != nil {
		// Violations count under their key's upstream, as the stampede and
		// local tier counters do.
		o.Upstreams = s.cfg.RoutedUpstreams()
		o.UpstreamOf = func(key []byte) int {
			up, _ := rs.table.Load().Key(key)
			return up
		}
	}
	g, err := guard.New(s.cfg.Policy, o)
	if err != nil {
		return err
	}
	user := s.cfg.Upstream.Username
	if user == "" {
		user = "default"
	}
	s.guard = &serverGuard{Guard: g, user: user}
	return nil
}

// Guard returns the policy guard, for --policy-mode, reloads and the admin
// endpoints.
func (s *Server) Guard() *guard.Guard { return s.guard.Guard }

// guardBatch returns the session's guard state.
func (sess *Session) guardBatch() *guard.Batch { return &sess.guard }

// prepareBatch lets the guard see the whole batch before any command runs,
// so a write followed by its own EXPIRE in the same batch passes untouched.
func (sess *Session) prepareBatch(reqs []resp.Request) {
	sg := sess.srv.guard
	// A later EXPIRE the user's ACL refuses (aclRefused, in dispatch) will
	// not run: the look-ahead must not count on it for a write's TTL.
	var denied func(int, *commands.Command, [][]byte) bool
	if sess.user != nil {
		if sess.aclDeny == nil {
			sess.aclDeny = sess.aclRefuses
		}
		denied = sess.aclDeny
	}
	// Scopes select on the listener's name (config.Config.ClientListeners).
	b := sess.guardBatch()
	tx := sess.pin.txOpen
	if tx == nil || len(tx.open) == 0 || !sess.pin.inMulti && !sess.cmulti.open {
		b.Prepare(sg.Policy(), sess.cmds.table, reqs, sess.userName(), sess.listenerName(), denied)
		return
	}
	tx.keys = tx.keys[:0]
	for i := range tx.open {
		tx.keys = append(tx.keys, tx.open[i].v.Key)
	}
	tx.settled = slices.Grow(tx.settled[:0], len(tx.open))[:len(tx.open)]
	clear(tx.settled) // what the last batch settled is no answer for this one (found by review)
	closed := b.PrepareTx(sg.Policy(), sess.cmds.table, reqs, sess.userName(), sess.listenerName(), denied, tx.keys, tx.settled)
	sess.settleOpen(closed)
}

// txOpenTTL is what the policy left open in the client's transaction on
// its pinned connection: TTL requirements of writes queued in it that a
// later batch of it may still meet (policy.Decision.Open), as when a
// MULTI is typed command by command. A boundary (a SELECT, EXEC...) in a
// later batch closes them (closeOpen): the fix-ups of those with a
// default are sent then, before anything of that batch (fixDue), the rest
// recorded, and a refused one discards the transaction at EXEC
// (execOpenTTL). Behind a pointer in pinState: few transactions ever
// need it.
type txOpenTTL struct {
	open []openTTL // a later request of the transaction may settle these
	due  []openTTL // closed with a fix-up not sent yet (fixDue)
	// refusal is EXEC's answer once a boundary closed a refused
	// requirement (closeOpen); nil while none was.
	refusal []byte
	// keys and settled are CheckTx's question and answer for open,
	// reused.
	keys    [][]byte
	settled []bool
	// unkept is the decision of the request being dispatched whose open
	// requirements guardRecord left to the transaction, until deferOpen
	// keeps them; a step that answers the request without keeping it (a
	// CROSSSLOT, a held transaction's refusal, a node that cannot be
	// reached) leaves them to recordUnkept. Not cleared by reset.
	unkept *policy.Decision
}

// openTTL is one open requirement: its violation (whose Key is a copy)
// and, for one fixed under enforce, its fix-ups (keys copied too).
type openTTL struct {
	v   policy.Violation
	fix []policy.Expire
}

// settleOpen drops the requirements the batch just prepared settles, and
// closes the rest if it has a boundary. Preparing a batch again (the
// look-ahead's Extend) finds nothing more to close, and settles the same
// or more, so it may run twice.
func (sess *Session) settleOpen(closed bool) {
	tx := sess.pin.txOpen
	kept := tx.open[:0]
	for j := range tx.open {
		switch {
		case tx.settled[j]:
		case closed:
			sess.closeOpen(&tx.open[j])
		default:
			kept = append(kept, tx.open[j])
		}
	}
	clear(tx.open[len(kept):])
	tx.open = kept
}

// closeOpen deals with a requirement nothing can settle any more: its
// fix-up waits in due for fixDue; any other is recorded now, and the
// first refused one gives EXEC its answer. Nothing else is kept, so what
// a transaction holds stays bounded however many writes and boundaries a
// client types (at most maxOpenTTL open, and one batch's fix-ups).
func (sess *Session) closeOpen(o *openTTL) {
	tx := sess.pin.txOpen
	if o.fix != nil {
		tx.due = append(tx.due, *o)
		return
	}
	sess.srv.guard.Record(&o.v, sess.nc.RemoteAddr(), sess.userName())
	if o.v.Outcome == policy.Refused && tx.refusal == nil {
		tx.refusal = appendExecAbort(nil, o.v.Message())
	}
}

func (tx *txOpenTTL) reset() {
	clear(tx.open)
	clear(tx.due)
	clear(tx.keys)
	tx.open, tx.due, tx.keys, tx.refusal = tx.open[:0], tx.due[:0], tx.keys[:0], nil
}

// txDefers reports whether d's open TTL requirements wait for the rest of
// the client's transaction instead of refusing (or reporting) the write
// now: the client is in MULTI on its pinned connection, where the write
// is queued, or in a MULTI the proxy holds (cluster mode before its first
// keyed command, routes until EXEC: cluster.go), where it is kept.
//
// In cluster mode the write that places a held transaction is decided
// held (guardRecord) and then pinned (guardStep), after queueHeld has
// flushed to learn whether Redis opened the MULTI placeHeld sent; where
// the two differ, what guardStep did not keep is recorded by
// recordUnkept.
func (sess *Session) txDefers(d *policy.Decision) bool {
	pin := &sess.pin
	return len(d.Open) > 0 && (sess.cmulti.open || sess.pinnedMulti() && pin.txOpened) &&
		(pin.txOpen == nil || len(pin.txOpen.open)+len(d.Open) <= maxOpenTTL)
}

// pinnedMulti reports whether the client is in MULTI on its pinned
// connection, where open requirements may wait. With routes a MULTI is
// only ever pinned at its EXEC, which closes them all.
func (sess *Session) pinnedMulti() bool {
	return sess.pin.inMulti && sess.pin.pipe != nil && sess.srv.routes == nil
}

// maxOpenTTL bounds the requirements a transaction keeps open: each later
// batch checks every open one, so a client queuing thousands of writes
// without their TTLs made each command cost more than the last (found by
// review: 125 µs a round trip at the start of 40,000, 490 µs at the end).
// Past it a write is fixed or refused at once, as in a single batch. Only
// open ones count, which fixDue never changes: guardRecord and guardStep
// must decide alike for one request, fixDue running between them.
const maxOpenTTL = 128

// txOpenedKnown makes sure, for a write the policy left open in the
// client's MULTI, that Redis's answer to the MULTI is in: sent in the
// same batch (MULTI and the write in one write), it is not until the
// batch so far is flushed. Not where the write is joined to what came
// before it (guard.Batch.Joined): that must reach Redis in one part.
func (sess *Session) txOpenedKnown(r *request, d *policy.Decision) {
	if len(d.Open) > 0 && sess.pinnedMulti() && !sess.pin.txOpened && !sess.guard.Joined(r.i) {
		sess.flush(time.Now())
	}
}

// deferOpen keeps d's open requirements for the rest of the transaction.
func (sess *Session) deferOpen(d *policy.Decision) {
	pin := &sess.pin
	if pin.txOpen == nil {
		pin.txOpen = new(txOpenTTL)
	}
	pin.txOpen.unkept = nil
	for _, o := range d.Open {
		e := openTTL{v: d.Violations[o.V]}
		for _, f := range o.Fix {
			f.Key = slices.Clone(f.Key) // it aliased the client's read buffer
			e.fix = append(e.fix, f)
		}
		pin.txOpen.open = append(pin.txOpen.open, e)
	}
}

// fixDue queues, inside the client's MULTI, the fix-ups of requirements a
// boundary of this batch closed, before anything else of the batch: they
// run right after their writes' stretch of the transaction, in its
// database, before the SELECT, MOVE or EXEC that ends it. (Queued just
// before EXEC instead, behind a SELECT or a COPY ... DB, they ran in
// another database: TestTxFixup*.) Each is recorded now, as fixed.
func (sess *Session) fixDue() {
	tx := sess.pin.txOpen
	for j := range tx.due {
		o := &tx.due[j]
		for _, f := range sess.guard.Fixups(o.fix) {
			sess.forwardHidden(f)
			sess.mirrorQueuedFixup(f) // mirror.go
		}
		sess.srv.guard.Record(&o.v, sess.nc.RemoteAddr(), sess.userName())
	}
	clear(tx.due)
	tx.due = tx.due[:0]
}

// heldFixDue is fixDue for a transaction the proxy holds (cluster.go):
// the fix-ups go behind the last command held so far, so that placeHeld
// sends them before anything of this batch, as fixDue would. With
// nothing held (what opened them was not kept: the transaction fails at
// EXEC), they are only recorded.
func (sess *Session) heldFixDue() {
	tx, cm := sess.pin.txOpen, &sess.cmulti
	for j := range tx.due {
		o := &tx.due[j]
		if n := len(cm.queued); n > 0 && !cm.failed {
			q := &cm.queued[n-1]
			for _, f := range sess.guard.Fixups(o.fix) {
				q.closed = append(q.closed, slices.Clone(f))
			}
		}
		sess.srv.guard.Record(&o.v, sess.nc.RemoteAddr(), sess.userName())
	}
	clear(tx.due)
	tx.due = tx.due[:0]
}

// closeAtExec closes, at EXEC, every requirement still open: unless one
// was refused, the fix-ups are queued (behind the last command held, for
// a held transaction: nothing of it has been sent, so a refusal needs no
// DISCARD; else fixDue), and everything is recorded. It returns EXEC's
// refusal; nil when EXEC goes ahead.
func (sess *Session) closeAtExec(held bool) []byte {
	tx := sess.pin.txOpen
	if tx == nil || len(tx.open)+len(tx.due) == 0 && tx.refusal == nil {
		return nil
	}
	for j := range tx.open {
		sess.closeOpen(&tx.open[j])
	}
	clear(tx.open)
	tx.open = tx.open[:0]
	reply := tx.refusal
	switch {
	case reply != nil:
	case held:
		sess.heldFixDue()
	default:
		sess.fixDue()
	}
	sess.recordOpenLeft()
	return reply
}

// recordUnkept records the open violations of the request just
// dispatched if no step kept them (txOpenTTL.unkept): guardRecord left
// them to the transaction, and the request was answered some other way,
// so no later step will (found by review: a write refused CROSSSLOT in a
// cluster transaction went unrecorded).
func (sess *Session) recordUnkept() {
	tx := sess.pin.txOpen
	if tx == nil || tx.unkept == nil {
		return
	}
	d := tx.unkept
	tx.unkept = nil
	for _, o := range d.Open {
		sess.srv.guard.Record(&d.Violations[o.V], sess.nc.RemoteAddr(), sess.userName())
	}
}

// recordOpenLeft records the requirements a transaction still holds when
// it ends other than by EXEC (DISCARD, RESET, a lost connection, the
// client gone), as each would have been recorded at its write: the same
// transaction sent in one write is recorded whatever ends it, and under
// enforce a fix already queued was recorded when queued (fixDue), so
// report mode must not leave out what enforce counts (found by review).
func (sess *Session) recordOpenLeft() {
	tx := sess.pin.txOpen
	if tx == nil {
		return
	}
	sg := sess.srv.guard
	for _, list := range [2][]openTTL{tx.due, tx.open} {
		for j := range list {
			sg.Record(&list[j].v, sess.nc.RemoteAddr(), sess.userName())
		}
	}
	tx.reset()
}

// execOpenTTL is EXEC of a transaction whose writes left TTL requirements
// open: EXEC closes them, so fix-ups are queued before it (fixDue), and
// the rest recorded now, as they would have been at the write; if one is
// refused the transaction is discarded on Redis and EXEC answers
// EXECABORT with its message, as for a queue-time error. It reports
// false when EXEC goes ahead.
func (sess *Session) execOpenTTL(r *request) bool {
	reply := sess.closeAtExec(false)
	if reply == nil {
		return false
	}
	sess.discardPin(cmdDiscard, r.m, reply)
	return true
}

// appendExecAbort is EXEC's answer to a transaction the policy refused:
// Redis's form for an error found at EXEC ("EXECABORT Transaction
// discarded because of: ..."), with the policy's message after it.
func appendExecAbort(dst []byte, msg string) []byte {
	return guard.AppendError(dst, "EXECABORT Transaction discarded because of: "+strings.TrimPrefix(msg, "ERR "))
}

// guardStep applies the guard's decision for request i: a refusal is
// answered here; a rewrite or a TTL fix-up is forwarded here; a command only
// reported goes on unchanged.
func (sess *Session) guardStep(r *request) bool {
	cmd, m := r.cmd, r.m
	b := sess.guardBatch()
	d := b.Decision(r.i)
	if d == nil {
		return false
	}
	// Recorded already (guardRecord), but for open requirements that wait
	// for the transaction's end.
	deferred := sess.txDefers(d)
	if d.Refuse != nil && !deferred {
		sess.refuse(d, m)
		sess.flightWriteRefused(cmd, r.Args)
		return true
	}
	if deferred {
		sess.deferOpen(d)
		if d.AllOpen() {
			return false // queued as sent: its fixes wait (fixDue)
		}
	}
	if d.Args == nil && len(d.Expires) == 0 {
		return false // only reported
	}
	raw, args := r.Raw, r.Args
	if d.Args != nil {
		args = d.Args
		raw = b.Encode(args)
	}
	if mayWrite(cmd) {
		if sess.pin.inMulti {
			// Queued: it takes effect at EXEC, where the write hooks hear
			// of it (pinnedExec).
			sess.pin.txWrites = append(sess.pin.txWrites, txWrite{cmd: cmd, args: txWriteArgs(cmd, args)})
		} else {
			sess.writeForwarded(cmd, args)
		}
	}
	var fixups [][]byte
	if len(d.Expires) > 0 {
		fixups = b.FixupsIn(d.Expires, sess.fixupDB(), sess.srv.cfg.Upstream.Databases)
	}
	if len(fixups) > 0 {
		sess.forwardWithFixups(raw, fixups, m, sess.splitWrite(cmd, args, fixups))
	} else {
		sess.forward(raw, m)
	}
	sess.mirrorNote(r)
	return true
}

// splitWrite returns the parts of an MSET whose keys the cluster router or
// the routes would send to several nodes or upstreams (nil for any other
// command, or an MSET of one place), with the fix-ups of each part's keys.
// The fix-ups cannot share one MULTI with the whole MSET: a transaction
// stays on one node (or upstream), and one wrapping a split MSET was
// refused CROSSSLOT (or CROSSROUTE) as a whole, nothing written, where the
// same MSET without a TTL rule was split and written (found by a cluster
// probe). Each part goes in a MULTI of its own with its keys' fix-ups
// (forwardWithFixups): a part Redis refuses (-OOM, -TRYAGAIN during a
// migration) aborts its own fix-ups too, which, sent unwrapped behind the
// part, gave a key the client failed to overwrite the rule's TTL (found by
// review). The other commands split are reads and deletes, which need no
// fix-up; a cross-slot write that is not split is refused either way.
func (sess *Session) splitWrite(cmd *commands.Command, args [][]byte, fixups [][]byte) []writePart {
	if cmd == nil || cmd.Name != "mset" || len(args) < 5 || len(args)%2 == 0 {
		return nil
	}
	if sess.srv.router == nil && sess.srv.routes == nil {
		return nil
	}
	var parts []writePart
	index := map[[2]int]int{}
	partOf := func(key []byte) int {
		g := sess.writePlace(key)
		i, ok := index[g]
		if !ok {
			i = len(parts)
			index[g] = i
			parts = append(parts, writePart{args: [][]byte{args[0]}})
		}
		return i
	}
	for i := 1; i+1 < len(args); i += 2 {
		p := &parts[partOf(args[i])]
		p.args = append(p.args, args[i], args[i+1])
	}
	if len(parts) < 2 {
		return nil
	}
	var fargs [][]byte
	for _, f := range fixups {
		var err error
		fargs, err = resp.SplitCommand(f, fargs[:0])
		if err != nil || len(fargs) < 2 {
			return nil // not an EXPIRE of one key: keep the whole in one MULTI
		}
		p := &parts[partOf(fargs[1])]
		p.fixups = append(p.fixups, f)
	}
	return parts
}

// writePart is one node's or upstream's part of a split MSET, with the
// fix-ups of its keys.
type writePart struct {
	args   [][]byte
	fixups [][]byte
}

// writePlace is where key goes: its route's upstream (0 without routes)
// and, on a cluster, its slot (-1 elsewhere).
func (sess *Session) writePlace(key []byte) [2]int {
	if sess.srv.router != nil {
		return [2]int{0, cluster.Slot(key)}
	}
	rs := sess.srv.routes
	up, _ := rs.table.Load().Key(key)
	if up >= 0 && up < len(rs.targets) && rs.targets[up].router != nil {
		return [2]int{up, cluster.Slot(key)}
	}
	return [2]int{up, -1}
}

// fixupDB is the database the command being dispatched runs in, which a
// fix-up in another database must select again after its EXPIRE: inside
// the client's MULTI, the last SELECT it queued (it runs before the
// command, at EXEC), else the session's.
func (sess *Session) fixupDB() int {
	if sess.pin.inMulti && sess.pin.txSelect >= 0 {
		return sess.pin.txSelect
	}
	return sess.db
}

// guardRecord records request i's violations, if it has any, and answers
// it with the guard's refusal, if it has one; it reports whether it did.
// dispatch calls it once per request, before any other step, so that the
// commands the proxy handles itself (SCRIPT KILL, SHUTDOWN, MONITOR,
// SUBSCRIBE, blocking commands, transactions) are refused like any other
// and, under report mode, reported like any other: the steps that apply a
// decision later (guardStep, blocking, the cluster's MULTI) record nothing.
// A request it did not refuse still goes to guardStep.
func (sess *Session) guardRecord(r *request) bool {
	d := sess.guardBatch().Decision(r.i)
	if d == nil {
		return false
	}
	sess.txOpenedKnown(r, d)
	if sess.txDefers(d) {
		// A later batch of the transaction may still set the TTL: the
		// write is queued (guardStep), its open requirements recorded, or
		// refused, at EXEC (execOpenTTL); or recorded once dispatch is
		// done with it, if nothing kept it (recordUnkept).
		sess.recordOutsideOpen(d)
		if sess.pin.txOpen == nil {
			sess.pin.txOpen = new(txOpenTTL)
		}
		sess.pin.txOpen.unkept = d
		return false
	}
	sess.recordViolations(d)
	if d.Refuse == nil {
		return false
	}
	sess.refuse(d, r.m)
	sess.flightWriteRefused(r.cmd, r.Args)
	return true
}

func (sess *Session) recordViolations(d *policy.Decision) {
	sg := sess.srv.guard
	for j := range d.Violations {
		sg.Record(&d.Violations[j], sess.nc.RemoteAddr(), sess.userName())
	}
}

// recordOutsideOpen records d's violations but its open ones, which are
// recorded when the transaction closes them (fixDue, execOpenTTL).
func (sess *Session) recordOutsideOpen(d *policy.Decision) {
	sg := sess.srv.guard
	for j := range d.Violations {
		if !slices.ContainsFunc(d.Open, func(o policy.OpenTTL) bool { return o.V == j }) {
			sg.Record(&d.Violations[j], sess.nc.RemoteAddr(), sess.userName())
		}
	}
}

// refuse answers with d's refusal. Inside the client's MULTI it also queues
// guard.RefusedInMulti, so the client's EXEC fails with EXECABORT.
func (sess *Session) refuse(d *policy.Decision, m *metrics.Command) {
	sess.refusedInMulti()
	buf, start := sess.localBuf()
	sess.finishLocal(m, guard.AppendRefusal(buf, d.Refuse), start)
}

// hiddenFailed is told when a fix-up the client never sees failed.
func (sess *Session) hiddenFailed(reply []byte, err error) {
	sess.srv.guard.FixupFailed(reply, err, sess.nc.RemoteAddr())
}

// wrappedFixupResults checks the EXEC reply of a command the proxy wrapped
// in MULTI/EXEC with its fix-ups (forwardWithFixups): every element after
// the first, the command's own, is a fix-up's result. A fix-up can be
// queued (+QUEUED) and still fail when EXEC runs it.
func (sess *Session) wrappedFixupResults(exec []byte) {
	execElements(exec, func(i int, elem []byte) {
		if i > 0 && resp.IsError(elem) {
			sess.hiddenFailed(elem, nil)
		}
	})
}

// txFixupResults checks the EXEC reply of the client's own transaction for
// the results of the fix-ups queued in it, at the queue positions hidden
// (ascending).
func (sess *Session) txFixupResults(exec []byte, hidden []int) {
	if len(hidden) == 0 {
		return
	}
	h := 0
	execElements(exec, func(i int, elem []byte) {
		for h < len(hidden) && hidden[h] < i {
			h++
		}
		if h < len(hidden) && hidden[h] == i && resp.IsError(elem) {
			sess.hiddenFailed(elem, nil)
		}
	})
}

// execElements calls fn with each element of an EXEC reply, and not at all
// for an error or a null reply: an aborted transaction ran nothing.
func execElements(reply []byte, fn func(i int, elem []byte)) {
	if len(reply) < 4 || reply[0] != '*' || reply[1] == '-' {
		return
	}
	nl := bytes.IndexByte(reply, '\n')
	if nl < 2 {
		return
	}
	n, err := strconv.Atoi(string(reply[1 : nl-1]))
	if err != nil {
		return
	}
	pos := nl + 1
	for i := 0; i < n; i++ {
		push, k, err := resp.ScanElement(reply[pos:])
		if err != nil || k == 0 {
			return
		}
		pos += push
		fn(i, reply[pos:pos+k])
		pos += k
	}
}
