package proxy

import (
	"errors"
	"slices"
	"strconv"
	"sync"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/localcache"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/resp"
	"github.com/redproxy/redproxy/internal/stampede"
)

// Writes from relayed clients (rueidis after CLIENT TRACKING ON, a RESP3
// client after SUBSCRIBE) go to Redis on the relay's own connection, yet
// the local tier and the miss holds must hear of them exactly as of any
// other write: marked in flight before they are sent, released once their
// replies have arrived (C1; a held read ends when its key is written).
//
// The relay passes Redis's bytes through unparsed, so the replies are
// counted on the raw stream: a RESP3 stream separates replies from
// out-of-band data (pushes), and a RESP2 stream of a client that is
// neither subscribed nor monitoring holds replies only. Each write's marks
// are released when the stream has carried as many replies as were due up
// to the end of the write's batch (up to its EXEC, inside MULTI); the
// marks are released before the reply reaches the client, so no read
// that starts after the client saw its OK can be served from the tier.
//
// A RESP3 client's (P|S)(UN)SUBSCRIBE is answered with pushes only, or,
// refused (-BUSY, -NOPERM, -CROSSSLOT, an arity error), with one error:
// the counter takes the pushes that confirm it, of its kind and as many
// as it names channels, as its reply (subExpect), so a RESP3 subscriber
// that writes (rueidis multiplexes its subscriptions on the connection it
// tracks keys on) keeps its writes counted.
//
// The same count lets a relay send a write's TTL fix-ups (EXPIRE ... NX,
// which the policy adds on a shared connection too) right behind it:
// their replies are numbered when sent (hide) and cut from the stream
// before the client sees it (feedCut), so a tracking client (rueidis,
// redis-py's client-side caching) gets its keys' TTLs and exactly Redis's
// replies to what it sent.
//
// Once the stream cannot be counted (MONITOR, a RESP2 subscription, a
// subscribe command inside MULTI: see note, Redis Cluster's own sunsubscribe,
// pushes the counter did not expect, or a command that changes the
// protocol or mutes replies: HELLO, RESET, CLIENT REPLY), writes stay
// marked until the relay ends or hands the client back (relayexit.go):
// the written keys
// are not served from the tier meanwhile, and before each chunk is passed
// on a fence is raised for held writes whose keys are not named, and the
// databases of held SWAPDBs are dropped (fenceHeld). At most
// maxHeldRelayWrites are
// kept that way; further writes are refused with an error rather than
// risk a stale read.
const maxHeldRelayWrites = 1024

// relayWrites tracks one relay's writes whose replies are not yet in.
type relayWrites struct {
	sess *Session
	// active: the local tier or miss holds are on, so writes matter.
	active bool
	// fixes: the policy may give a write a TTL fix-up (Policy.FixesTTL),
	// sent behind it on the relay with its reply cut from the stream
	// (hide). counting: replies are counted, for either.
	fixes, counting bool
	// replicaWrote: a command that may write was relayed (session
	// goroutine only). Replica reads hear of it when the relay ends
	// (end): then every reply of the relay is in, and a client handed
	// back to the shared path reads as after a shared-path write.
	replicaWrote bool

	// Session goroutine only.
	resp3 bool
	// dbs are the databases the relay's connection may be in: one, but
	// after an EXEC of a transaction that queued a SELECT, two, since the
	// relay does not read the replies and EXEC may have been aborted
	// (WATCH, a refused command), until a SELECT outside MULTI or a RESET
	// settles it. Writes are marked in each. dbsAtMulti are those when
	// MULTI was sent, which DISCARD restores; selectQueued: the
	// transaction queued a SELECT.
	dbs          []int
	dbsAtMulti   []int
	selectQueued bool
	inMulti      bool
	due          int64        // replies due for everything sent so far
	tx           relayRelease // writes queued in MULTI, released after EXEC
	batch        relayRelease // writes of the batch being built
	// txFix are the fix-ups of the writes queued in the client's MULTI
	// (holdTx), sent behind its EXEC.
	txFix relayTxFixups

	mu        sync.Mutex
	countable bool
	pending   []relayRelease // by due, oldest first
	held      []relayRelease // released when the relay ends
	heldN     int
	// heldFences counts the held writes due a fence (a script naming its
	// keys in ARGV, a transaction, ...): see fenceHeld.
	heldFences int
	// heldSwaps are the databases the held writes may swap (SWAPDB, a
	// script that may run it; -1: every one), each once: see fenceHeld.
	heldSwaps []int
	subs      []subExpect // noted, not yet taken by the reader
	subsOpen  int         // the reader's unsettled ones, as of its last chunk
	// hidden are the numbers of the replies to cut (fix-ups), noted, not
	// yet taken by the reader; hiddenOpen the reader's, as of its last
	// chunk.
	hidden     []int64
	hiddenOpen int
	// ownHidden are those of hidden that are the proxy's own commands (a
	// CLIENT CACHING sent again, an EXEC refusal's DISCARD), not fix-ups.
	ownHidden []int64

	// Reader goroutine only.
	counter replyCounter
}

// maxOpenSubscribes bounds the subscribe commands a relay keeps expecting
// at once (a client pipelining them faster than Redis answers); past it
// the stream is no longer counted.
const maxOpenSubscribes = 4096

type relayRelease struct {
	due    int64
	tier   []localcache.Writes
	flight []stampede.Writes
	n      int
}

func (r *relayRelease) empty() bool { return r.n == 0 }

// fences is how many of r's tier writes are due a fence.
func (r *relayRelease) fences() int {
	n := 0
	for i := range r.tier {
		if r.tier[i].Fenced() {
			n++
		}
	}
	return n
}

// swaps adds the databases r's tier writes may swap to dbs, each once
// (-1, every database, stands for all).
func (r *relayRelease) swaps(dbs []int) []int {
	for i := range r.tier {
		for _, db := range r.tier[i].Swapped() {
			switch {
			case slices.Contains(dbs, -1), slices.Contains(dbs, db):
			case db == -1:
				dbs = append(dbs[:0], -1)
			default:
				dbs = append(dbs, db)
			}
		}
	}
	return dbs
}

func (r *relayRelease) add(o relayRelease) {
	r.tier = append(r.tier, o.tier...)
	r.flight = append(r.flight, o.flight...)
	r.n += o.n
}

func newRelayWrites(sess *Session, kind relayKind) *relayWrites {
	fs := sess.srv.flight.Load()
	active := sess.srv.tier != nil || fs != nil && fs.TracksWrites()
	fixes := sess.srv.guard != nil && sess.srv.guard.Policy().FixesTTL()
	// With proxy users an EXEC their ACL refuses is answered with a reply
	// cut from the stream too (appendRelayExecRefused), and on a tracking
	// relay a CLIENT CACHING sent again (keepCaching).
	counting := active || fixes || sess.srv.usersOn() || kind == relayTracking
	return &relayWrites{sess: sess, active: active, fixes: fixes, counting: counting, countable: counting, resp3: sess.resp3, dbs: []int{sess.db}}
}

// relayTxFixups are the fix-ups of the writes a relayed client queued in
// its MULTI. Queued with them, Redis would answer QUEUED for each and put
// their replies inside EXEC's; so they are sent right behind the EXEC
// instead, as ordinary hidden replies (hide). Run there, a fix-up gives
// its key the rule's default TTL, NX, even when the EXEC was aborted
// (WATCH, a queue-time error) and the write did not run: a key the rule
// requires a TTL on gets one, which the rule asks anyway. Not when the
// transaction queued a command that moves keys or the connection
// (blocked, movesKeys): after EXEC the connection's database, and the
// keys in it, depend on whether EXEC ran, and a renamed key would not be
// the one the fix-up names.
type relayTxFixups struct {
	fixups  [][]byte // copies
	records []relayRecord
	blocked bool
}

// holdTx keeps the fix-ups of a write queued in the client's MULTI, and its
// violations, for endTx; false when none can be sent (the policy fixes
// nothing, or the stream is no longer counted).
func (rw *relayWrites) holdTx(fixups [][]byte, recs []relayRecord) bool {
	rw.mu.Lock()
	countable := rw.countable
	rw.mu.Unlock()
	if !rw.fixes || !countable || len(rw.txFix.fixups)+len(fixups) > maxHiddenReplies {
		// Past maxHiddenReplies endTx could not send them anyway.
		return false
	}
	for _, f := range fixups {
		rw.txFix.fixups = append(rw.txFix.fixups, append([]byte(nil), f...))
	}
	rw.txFix.records = append(rw.txFix.records, recs...)
	return true
}

// endTx ends the client's transaction: by EXEC (exec), its held fix-ups
// are appended to out, behind the EXEC, when their replies can be cut; the
// violations are recorded, fixed only if they were sent.
func (rw *relayWrites) endTx(out []byte, exec bool) []byte {
	tf := &rw.txFix
	if len(tf.records) == 0 && len(tf.fixups) == 0 {
		tf.blocked = false
		return out
	}
	sent := exec && !tf.blocked && rw.hide(len(tf.fixups))
	if sent {
		for _, f := range tf.fixups {
			out = append(out, f...)
		}
	}
	rw.recordTx(sent)
	return out
}

// recordTx records the held violations, and forgets what was held.
func (rw *relayWrites) recordTx(sent bool) {
	tf := &rw.txFix
	sess := rw.sess
	for i := range tf.records {
		r := &tf.records[i]
		if r.bySend && !sent {
			r.v.Outcome = policy.Reported
		}
		sess.srv.guard.Record(&r.v, sess.nc.RemoteAddr(), sess.userName())
	}
	clear(tf.fixups)
	clear(tf.records)
	*tf = relayTxFixups{fixups: tf.fixups[:0], records: tf.records[:0]}
}

// maxHiddenReplies bounds the fix-up replies a relay has outstanding at
// once (a client pipelining writes faster than Redis answers); past it a
// write's fix-up is not sent and its violation is reported instead.
const maxHiddenReplies = 1 << 16

// hide notes that n fix-ups follow the request just noted, whose replies
// the reader must cut from the stream before the client sees it, and
// reports whether they may be sent. Only while the stream is counted,
// outside the client's MULTI (there Redis would answer QUEUED and put the
// fix-ups' replies inside EXEC's: see relayTxFixups), and at most
// maxHiddenReplies at once.
func (rw *relayWrites) hide(n int) bool {
	if !rw.fixes {
		return false
	}
	return rw.hideNext(n, false)
}

// hideNext cuts the replies of the next n commands sent outside a
// transaction, the policy's fix-ups or (own) the proxy's bookkeeping,
// whose refusal is no failed fix-up; false when it cannot (inside MULTI,
// or the stream is not counted), and then they must not be sent.
func (rw *relayWrites) hideNext(n int, own bool) bool {
	if rw.inMulti || rw.sess.relayInMulti || n == 0 {
		return false
	}
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if !rw.countable || len(rw.hidden)+rw.hiddenOpen+n > maxHiddenReplies {
		return false
	}
	for k := range int64(n) {
		rw.hidden = append(rw.hidden, rw.due+k)
		if own {
			rw.ownHidden = append(rw.ownHidden, rw.due+k)
		}
	}
	rw.due += int64(n)
	return true
}

// hideNoted cuts the reply of the command just noted, which is sent as
// something else whose reply the client must not see, and counts one more
// reply for what is sent behind it in its place (appendRelayExecRefused).
// False when the stream is not counted.
func (rw *relayWrites) hideNoted() bool {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if !rw.countable || len(rw.hidden)+rw.hiddenOpen >= maxHiddenReplies {
		return false
	}
	rw.hidden = append(rw.hidden, rw.due-1)
	rw.ownHidden = append(rw.ownHidden, rw.due-1)
	rw.due++
	return true
}

// errHeldWrites refuses a write the relay could no longer track.
const errHeldWrites = "ERR redproxy: too many writes on a relayed connection (MONITOR, pub/sub or tracking, or one that stayed relayed after unsubscribing); write on another connection"

// note is called for every request of a relayed client before it is sent,
// with the arguments that will be sent (refused: a refusal is sent
// instead). It marks the request's writes in flight and counts the
// replies due. It returns false when the request must be refused.
func (rw *relayWrites) note(cmd *commands.Command, args [][]byte, refused bool) bool {
	if !refused && (cmd == nil || mayWrite(cmd)) {
		// Read-your-writes counts it as a shared-path write, which a
		// command the table does not know may be (replicaForwarded).
		rw.replicaWrote = true
		if rw.sess.srv.routes != nil {
			rw.sess.routeWrote(rw.sess.route.relay) // a WAIT after the relay waits there too
		}
	}
	if !rw.counting {
		return true
	}
	name := ""
	if cmd != nil {
		name = cmd.Name
	}
	replies := int64(1)
	// As Redis takes them (txStepOf): "DISCARD x" inside MULTI leaves the
	// transaction queued, and releasing its writes' marks there would let
	// a read fill the tier before a later EXEC ran them.
	step := txStepOf(args)
	switch {
	case refused:
	case step == txReset:
		// Redis leaves MULTI and goes back to DB 0. What was queued never
		// runs; its marks are released with this batch.
		rw.uncountable()
		rw.dbs = append(rw.dbs[:0], 0)
		rw.endMulti()
	case name == "monitor", name == "hello", name == "client|reply":
		rw.uncountable()
	case isSubscribe(name):
		sharded := name == "ssubscribe" || name == "sunsubscribe"
		switch {
		case !rw.resp3, rw.inMulti, sharded && rw.sess.srv.router != nil:
			// RESP2: the subscribed stream holds messages shaped as
			// replies. In MULTI: the confirming pushes come inside
			// EXEC's array, as its elements.
			// Sharded, on a cluster: Redis sends sunsubscribe pushes of
			// its own when a slot moves, which a refused SUNSUBSCRIBE's
			// confirmation could not be told from. A refused subscribe
			// counted as no reply made a later write's marks go one
			// reply early (found by review: a stale tier hit after the
			// write's OK).
			rw.uncountable()
		default:
			rw.expect(name, len(args)-1)
		}
	case name == "select" && len(args) == 2:
		if n, isInt := resp.ParseInt(args[1]); isInt && n >= 0 && n < int64(rw.sess.srv.Config().Upstream.Databases) {
			db := int(n)
			// Inside MULTI, the commands queued after it run in db if
			// EXEC runs them.
			rw.dbs = append(rw.dbs[:0], db)
			rw.selectQueued = rw.selectQueued || rw.inMulti
		}
	case step == txOpen:
		if !rw.inMulti {
			rw.dbsAtMulti = append(rw.dbsAtMulti[:0], rw.dbs...)
			rw.selectQueued = false
		}
		rw.inMulti = true
	case step == txDiscard && rw.inMulti:
		rw.dbs = append(rw.dbs[:0], rw.dbsAtMulti...)
		rw.endMulti()
	case step == txExec && rw.inMulti:
		if rw.selectQueued {
			// Run: the SELECT's database; aborted: the one before MULTI.
			for _, db := range rw.dbsAtMulti {
				if !slices.Contains(rw.dbs, db) {
					rw.dbs = append(rw.dbs, db)
				}
			}
		}
		rw.endMulti()
	}
	rw.due += replies
	if t := rw.sess.srv.tier; t != nil && !refused && cmd != nil && cmd.Flags&commands.CatScripting != 0 {
		t.cache.NoteScript(cmd, args)
	}
	if refused || !mayWrite(cmd) || !rw.active {
		return true
	}
	rw.mu.Lock()
	full := !rw.countable && rw.heldN+rw.batch.n+rw.tx.n >= maxHeldRelayWrites
	rw.mu.Unlock()
	if full {
		return false
	}
	w := rw.start(cmd, args)
	if rw.inMulti {
		rw.tx.add(w)
	} else {
		rw.batch.add(w)
	}
	return true
}

// expect notes a RESP3 (P|S)(UN)SUBSCRIBE naming channels channels (none:
// every one of its kind) as the next reply.
func (rw *relayWrites) expect(kind string, channels int) {
	if channels == 0 && !isUnsubscribe(kind) {
		channels = 1 // refused for its arity: never confirmed
	}
	rw.mu.Lock()
	countable, full := rw.countable, rw.subsOpen+len(rw.subs) >= maxOpenSubscribes
	if countable && !full {
		rw.subs = append(rw.subs, subExpect{slot: rw.due, kind: kind, left: channels})
	}
	rw.mu.Unlock()
	if countable && full {
		rw.uncountable()
	}
}

// asked counts n replies to commands the relay sent itself (relayexit.go).
func (rw *relayWrites) asked(n int64) { rw.due += n }

// endMulti ends a transaction: its writes are released with the batch.
func (rw *relayWrites) endMulti() {
	rw.inMulti, rw.selectQueued = false, false
	rw.batch.add(rw.tx)
	rw.tx = relayRelease{}
}

// start runs the write hooks for one write and takes its marks.
func (rw *relayWrites) start(cmd *commands.Command, args [][]byte) relayRelease {
	sess := rw.sess
	var w relayRelease
	for _, db := range rw.dbs {
		if t := sess.srv.tier; t != nil {
			var tw localcache.Writes
			t.cache.WriteStart(&tw, db, cmd, args, rw.inMulti)
			w.tier = append(w.tier, tw)
		}
		if fs := sess.srv.flight.Load(); fs != nil && fs.TracksWrites() {
			var fw stampede.Writes
			fs.WriteStart(&fw, db, cmd, args)
			w.flight = append(w.flight, fw)
		}
	}
	w.n = 1
	return w
}

// sending is called once a batch's requests have been noted, before they
// are written to Redis.
func (rw *relayWrites) sending() {
	if rw.batch.empty() {
		return
	}
	r := rw.batch
	rw.batch = relayRelease{}
	r.due = rw.due
	rw.mu.Lock()
	if rw.countable {
		rw.pending = append(rw.pending, r)
	} else {
		rw.held = append(rw.held, r)
		rw.heldN += r.n
		rw.heldFences += r.fences()
		rw.heldSwaps = r.swaps(rw.heldSwaps)
	}
	rw.mu.Unlock()
}

func (rw *relayWrites) uncountable() {
	rw.mu.Lock()
	if rw.countable {
		rw.countable = false
		for _, r := range rw.pending {
			rw.heldN += r.n
			rw.heldFences += r.fences()
			rw.heldSwaps = r.swaps(rw.heldSwaps)
		}
		rw.held = append(rw.held, rw.pending...)
		rw.pending = nil
	}
	rw.mu.Unlock()
}

// errFixupReplyLost: the stream stopped being RESP the counter follows
// while a fix-up's reply was still to be cut from it, so which reply is
// the client's can no longer be told; the client is closed rather than
// given a reply that is not its own.
var errFixupReplyLost = errors.New("relayed stream lost count with a TTL fix-up's reply still to remove")

// received is called by the relay's reader with every chunk Redis sent,
// before it is passed on to the client. It returns the chunk without the
// replies to the fix-ups (hide), in b's storage.
//
// Once the stream is no longer counted (uncountable: a HELLO, RESET,
// CLIENT REPLY, MONITOR, ... was sent), replies are still counted up to
// the last fix-up's: every fix-up was sent while the stream was counted,
// so before the command that ended the count, and so is its reply. The
// rest of the stream, which may be what the counter cannot follow (RESP2
// after HELLO 2, MONITOR's feed), is passed on unread.
func (rw *relayWrites) received(b []byte) ([]byte, error) {
	if !rw.counting {
		return b, nil
	}
	defer rw.fenceHeld()
	c := &rw.counter
	rw.mu.Lock()
	countable, waiting := rw.countable, len(rw.pending) > 0
	hiding := len(rw.hidden) > 0 || len(c.hide) > 0 || c.hiding
	if countable || hiding {
		// Noted before they were sent, so before any byte of their answers.
		c.subs = append(c.subs, rw.subs...)
		rw.subs = rw.subs[:0]
		c.hide = append(c.hide, rw.hidden...)
		rw.hidden = rw.hidden[:0]
		c.own = append(c.own, rw.ownHidden...)
		rw.ownHidden = rw.ownHidden[:0]
	}
	rw.mu.Unlock()
	if !countable && !hiding {
		return b, nil
	}
	b, ok := c.feedCut(b, !countable)
	rw.mu.Lock()
	rw.subsOpen, rw.hiddenOpen = len(c.subs), len(c.hide)
	rw.mu.Unlock()
	for i, f := range c.failed {
		// The write ran; its fix-up did not (an upstream ACL without
		// EXPIRE, a script that started between them: -BUSY). Counted and
		// logged as a failed fix-up in a client's own MULTI is.
		rw.sess.hiddenFailed(f, nil)
		c.failed[i] = nil
	}
	c.failed = c.failed[:0]
	if !ok {
		rw.uncountable()
		rw.mu.Lock()
		late := len(rw.hidden) > 0 // noted before uncountable took effect
		rw.mu.Unlock()
		if len(c.hide) > 0 || c.hiding || late {
			return b, errFixupReplyLost
		}
		return b, nil
	}
	if !countable || !waiting {
		return b, nil
	}
	var done []relayRelease
	rw.mu.Lock()
	for len(rw.pending) > 0 && rw.pending[0].due <= rw.counter.got {
		done = append(done, rw.pending[0])
		rw.pending = rw.pending[1:]
	}
	rw.mu.Unlock()
	for i := range done {
		rw.release(&done[i])
	}
	return b, nil
}

// fenceHeld raises the tier's fence before a chunk of an uncounted stream
// is passed on, while writes due a fence are held. Their marks keep the
// keys they name from being served, but a script naming its keys in ARGV
// marks nothing, and its reply (in this chunk or a later one: the stream
// cannot say which) reaches the client with no fence raised: until the
// invalidations came, another client could read such a key's old value
// from the tier after the relayed client had the script's OK (found by
// TestTierFenceForAnUncountedRelaysScript). A fence raised before each
// chunk is one raised after the write ran and before its reply is seen.
// It runs after received's own checks, so a write moved to held while they
// ran (uncountable, from the session) is covered too.
//
// A held SWAPDB (or a script that may run one) needs more: Redis sends no
// invalidation for it, so the fence drops nothing, and what a fill read
// from either database between the flush at WriteStart and the swap stays
// in the tier until WriteDone drops it again, which for a held write is
// when the relay ends: served after the client's OK for as long as the
// relay stays open (found by review,
// TestTierRelayedSwapDBLeavesNoPreSwapFill). So the databases of held
// swaps are also dropped before each chunk: once the chunk carrying the
// SWAPDB's reply arrived, the swap has run, so the drop before it is
// passed on removes every pre-swap fill, and fills sent after it read the
// swapped databases. That costs those databases their hits for as long as
// the relay stays open uncounted, which is rare (MONITOR, RESP2
// subscribers, CLIENT REPLY, ...) and simpler than holding their reads and
// fills off in the tier until the relay ends, which would cost the same.
func (rw *relayWrites) fenceHeld() {
	var buf [4]int
	rw.mu.Lock()
	fence := !rw.countable && rw.heldFences > 0
	swaps := buf[:0]
	if !rw.countable {
		swaps = append(swaps, rw.heldSwaps...)
	}
	rw.mu.Unlock()
	t := rw.sess.srv.tier
	if t == nil {
		return
	}
	for _, db := range swaps {
		t.cache.FlushSwapped(db)
	}
	if fence {
		t.cache.Fence()
	}
}

// end releases everything still marked: the relay's connection is closed.
// A relay that carried a write makes the client's reads wait for a poll
// started after now, as after a shared-path batch with a write
// (replicaRelayWrote): a subscriber that unsubscribed from everything is
// handed back to the shared path, where its reads go to replicas again
// (found by review: its GET right after UNSUBSCRIBE was read from a
// replica that had not applied the SET it made while subscribed).
func (rw *relayWrites) end() {
	if len(rw.txFix.records) > 0 {
		rw.recordTx(false) // the transaction never ended
	}
	if rw.replicaWrote {
		rw.replicaWrote = false
		rw.sess.replicaRelayWrote()
	}
	rw.mu.Lock()
	rest := append(rw.pending, rw.held...)
	rest = append(rest, rw.batch, rw.tx)
	rw.pending, rw.held = nil, nil
	rw.mu.Unlock()
	for i := range rest {
		rw.release(&rest[i])
	}
}

func (rw *relayWrites) release(r *relayRelease) {
	srv := rw.sess.srv
	if srv.tier != nil {
		for i := range r.tier {
			srv.tier.cache.WriteDone(&r.tier[i])
		}
	}
	for i := range r.flight {
		r.flight[i].Done()
	}
}

// replyCounter counts the top-level replies in a RESP stream fed in
// arbitrary pieces, without buffering them: pushes ('>') are not replies,
// but those confirming an expected subscribe command (subs) stand for its
// reply.
type replyCounter struct {
	// stack holds, per open aggregate, the elements it still needs.
	stack []openAggregate
	push  bool  // the top-level frame being read is a push
	skip  int64 // payload bytes (with CRLF) of a bulk still to skip
	line  []byte
	got   int64 // replies counted so far
	lost  bool  // the stream no longer matches what was expected

	// hide are the numbers of the replies to cut (fix-ups), ascending;
	// hiding: the reply being read is hide[0]'s; hid: it just ended.
	// failed are the errors cut (their first 64 bytes), for the caller.
	hide   []int64
	hiding bool
	hid    bool
	failed [][]byte
	// own are those of hide whose errors are not a fix-up's failure
	// (relayWrites.ownHidden): not put in failed.
	own []int64

	// Of the top-level push being read: its length, its first element
	// (the kind, when a short bulk string) and its third (a count).
	pushLen  int64
	kind     []byte
	kindLeft int64 // bytes of the kind still to copy from a bulk
	count    int64
	hasCount bool

	subs   []subExpect // oldest first
	counts pubsubCounts
}

// openAggregate is an aggregate the counter is inside of. Redis 7.0
// writes some pushes to a client inside the client's own reply (a keyspace
// notification of a key MGET found expired, ZPOPMIN's, a message the client
// published to itself in MULTI, inside EXEC's reply), where the reply's
// length does not count them (found by review: counted as an element,
// they ended the reply early and released a later write's marks before
// its reply). inside marks such a push: out of band, like any push.
type openAggregate struct {
	left   int64
	inside bool
}

// subExpect is a RESP3 (P|S)(UN)SUBSCRIBE whose answer is not all in.
// Redis answers it with one push of its kind per channel it names, or, if
// it names none (an unsubscribe from everything), one per channel of that
// kind the client had, at least one; or, refused, with one error.
type subExpect struct {
	slot int64  // the replies before it
	kind string // its command's name, which its pushes carry
	left int    // pushes still due; 0 at first for "every one"
	seen bool
}

// pubsubCounts follows the client's subscriptions through the counts
// Redis puts in each confirming push: channels and patterns together,
// shard channels on their own.
type pubsubCounts struct{ channels, patterns, shards int64 }

// confirm applies a confirming push of kind carrying count n and returns
// how many subscriptions of its kind the client had before it. A
// subscribe adds one or none (already subscribed), an unsubscribe takes
// one or none: any other count means the stream is not what the counter
// thinks, and ok is false.
func (pc *pubsubCounts) confirm(kind string, n int64) (before int64, ok bool) {
	own, total := &pc.channels, pc.channels+pc.patterns
	switch kind {
	case "psubscribe", "punsubscribe":
		own = &pc.patterns
	case "ssubscribe", "sunsubscribe":
		own, total = &pc.shards, pc.shards
	}
	before = *own
	d := n - total
	if isUnsubscribe(kind) {
		ok = d == 0 || d == -1
	} else {
		ok = d == 0 || d == 1
	}
	*own += d
	return before, ok && *own >= 0
}

// feedCut consumes b, counting the replies it completes (got), and cuts
// the replies numbered in hide out of it, returning what is left (in b's
// storage). With stop it reads no further than the end of the last reply
// to cut, and passes the rest on unread. ok is false for bytes that are not
// RESP the counter understands, or that do not answer the subscribe
// commands as expected (it stays false).
func (c *replyCounter) feedCut(b []byte, stop bool) (_ []byte, ok bool) {
	// b[:w] is kept so far; b[keep:p] is kept unless a cut starts (keep
	// is -1 inside a cut).
	w, keep, p := 0, 0, 0
	if c.hiding {
		keep = -1
	}
	for p < len(b) && !c.lost && !(stop && !c.hiding && len(c.hide) == 0) {
		if c.skip > 0 {
			k := int(min(c.skip, int64(len(b)-p)))
			if c.kindLeft > 0 {
				m := min(int(c.kindLeft), k)
				c.kind = append(c.kind, b[p:p+m]...)
				c.kindLeft -= int64(m)
			}
			c.skip -= int64(k)
			p += k
			if c.skip == 0 {
				c.finish()
			}
		} else {
			if len(c.line) == 0 && len(c.stack) == 0 && !c.hiding && len(c.hide) > 0 && c.hide[0] == c.got && b[p] != '>' {
				// A top-level reply, not a push, whose number is a
				// fix-up's.
				if keep >= 0 {
					w += copy(b[w:], b[keep:p])
				}
				keep, c.hiding = -1, true
			}
			i := p
			for i < len(b) && b[i] != '\n' {
				i++
			}
			if len(c.line) < 64 {
				c.line = append(c.line, b[p:min(i, p+64-len(c.line))]...)
			}
			if i == len(b) {
				p = i
				break
			}
			p = i + 1
			if !c.header() {
				c.lost = true
			}
		}
		if c.hid {
			c.hid, keep = false, p
		}
	}
	switch {
	case keep == w:
		w = len(b) // nothing cut since w: no copy onto itself
	case keep >= 0:
		w += copy(b[w:], b[keep:])
	}
	return b[:w], !c.lost
}

// maxKind is the longest push kind kept: "punsubscribe".
const maxKind = 12

// header handles one complete header line (the type byte and what follows
// up to CR; a simple value's text beyond 64 bytes is not kept).
func (c *replyCounter) header() bool {
	line := c.line
	c.line = c.line[:0]
	if len(line) > 0 && line[len(line)-1] == '\r' {
		line = line[:len(line)-1]
	}
	if len(line) == 0 {
		return false
	}
	typ := line[0]
	if typ == '-' && c.hiding && len(c.stack) == 0 && !(len(c.own) > 0 && len(c.hide) > 0 && c.own[0] == c.hide[0]) {
		c.failed = append(c.failed, slices.Clone(line))
	}
	elem := int64(-1) // index in the top-level push
	if len(c.stack) == 0 {
		c.push = typ == '>'
	} else if c.push && len(c.stack) == 1 {
		elem = c.pushLen - c.stack[0].left
	}
	switch typ {
	case '+', '-', ':', '_', ',', '#', '(':
		if elem == 2 && typ == ':' {
			n, err := strconv.ParseInt(string(line[1:]), 10, 64)
			c.count, c.hasCount = n, err == nil
		}
		c.finish()
		return true
	case '$', '!', '=':
		size, err := strconv.ParseInt(string(line[1:]), 10, 64)
		if err != nil || size < -1 {
			return false
		}
		if size < 0 {
			c.finish()
			return true
		}
		if elem == 0 && typ == '$' && size <= maxKind {
			c.kindLeft = size
		}
		c.skip = size + 2
		return true
	case '*', '%', '~', '>', '|':
		size, err := strconv.ParseInt(string(line[1:]), 10, 64)
		if err != nil || size < -1 || typ == '|' && size < 0 {
			return false
		}
		if typ == '%' || typ == '|' {
			size *= 2
		}
		if len(c.stack) == 0 && c.push {
			c.pushLen, c.kind, c.kindLeft, c.hasCount = size, c.kind[:0], 0, false
		}
		// An attribute (DEBUG PROTOCOL attrib, a module) comes before the
		// value it describes and is not one itself: like a push inside a
		// reply, it completes nothing. (Found by review: taken as bytes
		// the counter could not follow, it closed a client with a fix-up
		// pending.)
		inside := typ == '>' && len(c.stack) > 0 || typ == '|'
		if size <= 0 {
			if !inside {
				c.finish()
			}
			return true
		}
		c.stack = append(c.stack, openAggregate{left: size, inside: inside})
		return true
	}
	return false
}

// finish completes one element, and with it any aggregate it completes.
func (c *replyCounter) finish() {
	for len(c.stack) > 0 {
		top := &c.stack[len(c.stack)-1]
		top.left--
		if top.left > 0 {
			return
		}
		inside := top.inside
		c.stack = c.stack[:len(c.stack)-1]
		if inside {
			return // not one of the elements of the reply it came in
		}
	}
	c.frame()
}

// frame settles one complete top-level frame: a reply, or a push.
func (c *replyCounter) frame() {
	var head *subExpect
	if len(c.subs) > 0 && c.subs[0].slot == c.got {
		head = &c.subs[0] // everything before it is answered: its turn
	}
	if c.push && c.hiding {
		// A cut began at an attribute, and a push followed it: not a
		// reply Redis sends, and the push must not be cut.
		c.lost = true
		return
	}
	if !c.push {
		switch {
		case c.hiding:
			c.hiding, c.hid = false, true
			if len(c.own) > 0 && c.own[0] == c.hide[0] {
				c.own = c.own[1:]
			}
			c.hide = c.hide[1:]
		case len(c.hide) > 0 && c.hide[0] <= c.got:
			// A fix-up's reply was not recognised where it began.
			c.lost = true
			return
		}
		if head != nil {
			if head.seen {
				// Confirmed in part, then a reply: the counts were wrong.
				c.lost = true
				return
			}
			c.subs = c.subs[1:] // refused: this error is its reply
		}
		c.got++
		return
	}
	kind := confirmingKind(c.kind)
	if kind == "" {
		return // a message, an invalidation: out of band
	}
	if !c.hasCount {
		c.lost = true
		return
	}
	had, ok := c.counts.confirm(kind, c.count)
	if !ok || head == nil || head.kind != kind {
		// Not the answer of the command whose turn it is.
		c.lost = true
		return
	}
	if !head.seen && head.left == 0 {
		head.left = int(max(had, 1))
	}
	head.seen = true
	head.left--
	if head.left > 0 {
		return
	}
	c.subs = c.subs[1:]
	c.got++
}

// confirmingKind returns the subscribe command a push of kind b confirms,
// or "".
func confirmingKind(b []byte) string {
	switch string(b) {
	case "subscribe":
		return "subscribe"
	case "psubscribe":
		return "psubscribe"
	case "ssubscribe":
		return "ssubscribe"
	case "unsubscribe":
		return "unsubscribe"
	case "punsubscribe":
		return "punsubscribe"
	case "sunsubscribe":
		return "sunsubscribe"
	}
	return ""
}
