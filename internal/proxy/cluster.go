package proxy

import (
	"bytes"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/redproxy/redproxy/internal/cluster"
	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/namespace"
	"github.com/redproxy/redproxy/internal/resp"
	"github.com/redproxy/redproxy/internal/route"
	"github.com/redproxy/redproxy/internal/upstream"
)

// newRouter builds the router of upstream.mode = "cluster". The session
// hands it whole batches (flush); which node a command goes to, and how
// split commands come back together, is the router's business.
func newRouter(s *Server, cfg *config.Config) *cluster.Router {
	return cluster.New(cluster.Options{
		Seeds:   cfg.Upstream.Seeds,
		Backend: s.backendOptions(cfg, ""),
		Tables:  s.tableInForce,
		Logger:  s.log,
		// Seeds found silent are not waited for again (Options.UpstreamSilent).
		NoStartWait: s.startSilent,
		OnMap:       s.followCluster,
	})
}

// followCluster keeps the proxy's own connections in cluster mode (the
// admin backend: SCRIPT KILL, SHUTDOWN, the server whose command table and
// version the proxy follows) on a primary of the map m, one the cluster
// has not flagged as failed (adminTarget). They are pointed
// at a node once, at the start: with no map then (every seed down or
// silent) that is the first seed, and a cluster that came up without it,
// or a node that left the map since, left them dialling an address that
// never answers, and the command table the built-in one for good (found
// by review, 2026-12-06).
//
// The move runs on a goroutine of its own: OnMap must not block, and a
// Switch waits for the new connections' first dials. It takes reloadMu, as
// Reload and a Sentinel failover do, so that it neither undoes a reload
// (the options it switches to are the snapshot in force) nor switches
// after Shutdown began (draining): Shutdown takes reloadMu after setting
// draining, and closes the backend after that.
func (s *Server) followCluster(m *cluster.Map) {
	b := s.clusterAdmin.Load() // nil until NewServer made it: the map of New's own refresh
	to := adminTarget(m, b)
	if to == "" {
		return
	}
	if !s.adminMoving.CompareAndSwap(false, true) {
		return // one move at a time; the next map looks again
	}
	go func() {
		defer s.adminMoving.Store(false)
		s.reloadMu.Lock()
		defer s.reloadMu.Unlock()
		from := b.Addr()
		if s.draining.Load() || adminTarget(m, b) == "" {
			return
		}
		s.log.Info("cluster: the proxy's own connections move to a primary of the slot map",
			"from", from, "to", to, "from_failed", m.Failed(from))
		b.Switch(s.mainBackendOptions(s.Config(), to))
	}()
}

// adminTarget is the primary of m the admin backend b should move to, or ""
// to stay: it stays on a primary of the map the cluster has not flagged as
// failed, and moves to the first such primary otherwise. A failed primary
// keeps its slots while no replica takes over (none, or
// cluster-require-full-coverage no keeps the rest serving), and the
// backend would keep dialling it.
func adminTarget(m *cluster.Map, b *upstream.Backend) string {
	if b == nil {
		return ""
	}
	from, live := b.Addr(), m.LivePrimaries()
	switch primaries := m.Primaries(); {
	case slices.Contains(live, from):
		return ""
	case len(live) > 0:
		return live[0]
	case len(primaries) > 0 && !slices.Contains(primaries, from):
		// Every primary flagged: one of the map is still better than an
		// address that is not in it.
		return primaries[0]
	}
	return ""
}

// Router is the cluster router, or nil in standalone mode.
func (s *Server) Router() *cluster.Router { return s.router }

var (
	errClusterSelect = []byte("-ERR SELECT is not allowed in cluster mode\r\n")
	errNestedMulti   = []byte("-ERR MULTI calls can not be nested\r\n")
	emptyExec        = []byte("*0\r\n")
)

// maxClusterQueued caps the commands a cluster-mode MULTI holds before it
// has a node (clusterMulti): keyless commands only, so a client needs no
// more than a handful, and a client that sends more gets its transaction
// failed rather than the proxy's memory.
const (
	maxClusterQueued      = 256
	maxClusterQueuedBytes = 1 << 20
)

// maxHeldTx caps a transaction held whole until EXEC (routes): real
// transactions of thousands of small commands fit, and a client queueing
// more gets its transaction failed (EXECABORT) rather than the proxy's
// memory.
const (
	maxHeldTx      = 8192
	maxHeldTxBytes = 8 << 20
)

var (
	errClusterHeldFull = []byte("-ERR redproxy: too many keyless commands queued before the transaction's first key\r\n")
	errHeldTxFull      = []byte("-ERR redproxy: transaction too long: more than 8192 commands or 8 MiB queued before EXEC; it is discarded at EXEC\r\n")
	errWatchInMulti    = []byte("-ERR WATCH inside MULTI is not allowed\r\n")
	cmdUnwatch         = []byte("*1\r\n$7\r\nUNWATCH\r\n")
)

// clusterMulti is a MULTI the proxy holds instead of sending it (see
// heldPlacer): in cluster mode until the transaction's first keyed
// command gives it a node, with routes until EXEC. The proxy answers
// MULTI and +QUEUED itself and keeps the commands; they are replayed on a
// pinned connection of the target, after MULTI, with their replies muted.
type clusterMulti struct {
	open   bool
	failed bool // a queue-time error: EXEC answers EXECABORT
	// watched: opened while the client holds a WATCH (routes), whose
	// pinned connection is the transaction's target.
	watched bool
	// watchLost: a reload moved the WATCH's keys before a command was
	// queued (routes): EXEC answers the null of a failed WATCH, so
	// nothing queued from then on is kept.
	watchLost bool
	// target is where the keys of the commands held so far live (routes;
	// -1: no keyed command yet).
	target int
	queued []clusterQueued
	size   int
	// routes is the route table in force when the MULTI was held (routes
	// only): a reload before EXEC may have moved its keys (reroutedHeld).
	routes *route.Table
}

type clusterQueued struct {
	raw []byte // as it is sent: the guard's rewrite applied
	m   *metrics.Command
	cmd *commands.Command
	// fixups are the guard's TTL fix-ups, queued right behind raw; their
	// results are cut from EXEC's reply, as for a pinned transaction.
	fixups [][]byte
	// closed are the fix-ups of TTL requirements that earlier writes of
	// the transaction left open and the next command closed (heldFixDue),
	// sent right behind fixups.
	closed [][]byte
	strip  namespace.Strip // where its result in EXEC's reply names keys (namespace.go)
}

// clusterStep answers, in cluster mode, the commands that cannot go
// through the router as they are: SELECT of another database, the
// commands of a transaction (pinned on the node owning its slot), blocking
// commands (borrowing a connection on the node owning their slot), and the
// relays whose node depends on their arguments (cluster_relay.go).
func (sess *Session) clusterStep(r *request) bool {
	if sess.cmulti.open {
		return sess.queueHeld(r, clusterPlacer{})
	}
	cmd, args, m := r.cmd, r.Args, r.m
	if cmd == nil {
		return false
	}
	if cmd.Name == "select" && len(args) == 2 {
		// Also while pinned: the node would refuse it, but the session
		// would take note of the database (pinnedSelect).
		// An index outside a C int is refused as such first, as Redis
		// does (cmdSelect).
		if db, isInt := resp.ParseInt(args[1]); isInt && db != 0 && db == int64(int32(db)) {
			sess.refusedInMulti()
			sess.replyLocal(m, errClusterSelect)
			return true
		}
	}
	if sess.pin.pipe != nil {
		return sess.clusterPinned(r)
	}
	if sess.openHeld(r, clusterPlacer{}) {
		return true
	}
	switch cmd.Name {
	case "ssubscribe":
		// The relay goes to the node of the channels' slot, which must
		// be one (cluster_relay.go).
		if _, keyed, same := sess.keySlot(r); keyed && !same {
			sess.replyLocal(m, cluster.CrossSlot())
			return true
		}
		return false
	case "client|tracking", "client|no-touch":
		if len(args) > 2 && strings.EqualFold(string(args[2]), "on") {
			sess.replyLocal(m, errClusterTracking(cmd.Name))
			return true
		}
		return false
	}
	if r.blocking {
		// blocking borrows a connection on the node of the keys'
		// slot (dedicatedBackend); a keyless one (WAIT) has no node.
		_, keyed, same := sess.keySlot(r)
		switch {
		case !keyed && (cmd.Name == "wait" || cmd.Name == "waitaof"):
			return false // on the node of the client's last write
		case !keyed:
			sess.replyLocal(m, errClusterUnsupported(cmd.Name))
			return true
		case !same:
			sess.replyLocal(m, cluster.CrossSlot())
			return true
		}
	}
	return false
}

// keySlot is the slot of r's keys; keyed is false for a command without
// keys, same is false when they do not all hash to one slot.
func (sess *Session) keySlot(r *request) (keySlot int, keyed, same bool) {
	var buf [8]int
	keys := cluster.SlotArgs(r.cmd, r.Args, buf[:0])
	if len(keys) == 0 {
		return -1, false, true
	}
	keySlot = cluster.Slot(r.Args[keys[0]])
	for _, k := range keys[1:] {
		if cluster.Slot(r.Args[k]) != keySlot {
			return keySlot, true, false
		}
	}
	return keySlot, true, true
}

// clusterPinned checks a command of a client holding a pinned connection
// in cluster mode: its keys must hash to the transaction's slot, as Redis
// Cluster requires of every command of a transaction, and a command that
// concerns the whole keyspace cannot run on one node. A refused command
// inside MULTI makes EXEC fail, as a queue-time error does.
func (sess *Session) clusterPinned(r *request) bool {
	pin := &sess.pin
	if r.wrongArity() {
		// Redis checks arity before slots: dispatchPinned refuses it
		// with the arity error, not a cross-slot one.
		return false
	}
	var reply []byte
	if cluster.Whole(r.name) {
		reply = errClusterInTx(r.name)
	} else {
		keySlot, keyed, same := sess.keySlot(r)
		if !keyed {
			return false
		}
		if same && (pin.slot < 0 || keySlot == pin.slot) {
			pin.slot = keySlot
			return false
		}
		reply = cluster.CrossSlot()
	}
	sess.refusedInMulti()
	sess.replyLocal(r.m, reply)
	return true
}

// A MULTI is held by the proxy instead of being sent, in cluster mode and
// with routes, because its target (the node owning its slot, the
// upstream its keys route to) is known only from its commands' keys:
//
//   - in cluster mode until its first keyed command, which places it: the
//     proxy answers +QUEUED for the keyless commands before it, holds them
//     (capped), and replays MULTI and them on that command's node, where
//     the rest of the transaction then goes as it comes (as a Redis
//     Cluster client would open it on the node of its first key);
//   - with routes until EXEC, so that a transaction whose keys route to
//     two upstreams fails before anything of it is sent: every command is
//     checked as it comes (as Redis checks at queue time) and answered
//     +QUEUED, and EXEC sends MULTI, the commands and EXEC in one write on
//     a pinned connection of the one upstream all their keys route to.
//
// heldPlacer is what differs between the two modes.
type heldPlacer interface {
	// wholeRefusal refuses a command concerning the whole keyspace
	// (every node or upstream), which no single target can run; nil: not
	// such a command.
	wholeRefusal(name string) []byte
	// target is where r's keys live; refusal, when they live in several.
	target(sess *Session, r *request) (target int, keyed bool, refusal []byte)
	// backend is target's connections for the client.
	backend(sess *Session, target int) (*upstream.Backend, error)
	// keyless is the target of a transaction with no keyed command.
	keyless() int
	// stateRefusal refuses a command changing connection state, which
	// cannot be held: run at EXEC it would change a connection of the
	// proxy's (protocol, name, subscriptions).
	stateRefusal(name string) []byte
	// toExec: the transaction is held until EXEC (routes), not placed at
	// its first keyed command.
	toExec() bool
	// elsewhere refuses a command whose keys live on target got while the
	// transaction's are on want (toExec only).
	elsewhere(sess *Session, name string, got, want int) []byte
	// full is the refusal of a command beyond the caps on what is held.
	full(count, size int) []byte
}

type clusterPlacer struct{}

func (clusterPlacer) wholeRefusal(name string) []byte {
	if cluster.Whole(name) {
		return errClusterInTx(name)
	}
	return nil
}

func (clusterPlacer) target(sess *Session, r *request) (int, bool, []byte) {
	keySlot, keyed, same := sess.keySlot(r)
	if keyed && !same {
		return keySlot, keyed, cluster.CrossSlot()
	}
	return keySlot, keyed, nil
}

func (clusterPlacer) backend(sess *Session, keySlot int) (*upstream.Backend, error) {
	return sess.srv.router.BackendFor(keySlot)
}

func (clusterPlacer) keyless() int { return -1 } // any primary runs them

func (clusterPlacer) stateRefusal(name string) []byte { return errClusterInTx(name) }

func (clusterPlacer) toExec() bool { return false }

func (clusterPlacer) elsewhere(*Session, string, int, int) []byte { return cluster.CrossSlot() }

func (clusterPlacer) full(count, size int) []byte {
	if count >= maxClusterQueued || size > maxClusterQueuedBytes {
		return errClusterHeldFull
	}
	return nil
}

// openHeld starts what cluster mode and routes do instead of sending
// MULTI or WATCH: MULTI opens a held transaction (answered here); WATCH
// pins a connection on its keys' target and is sent there. With routes a
// MULTI under WATCH is held too, its target the WATCH's. It reports
// whether it answered r.
func (sess *Session) openHeld(r *request, p heldPlacer) bool {
	m := r.m
	switch r.name {
	case "multi":
		if len(r.Args) != 1 {
			return false // the arity error
		}
		cm := clusterMulti{open: true, target: -1, queued: sess.cmulti.queued[:0]}
		if sess.srv.routes != nil {
			cm.routes = sess.srv.routes.table.Load()
		}
		if sess.pin.pipe != nil {
			if sess.pin.inMulti || !p.toExec() {
				return false // the pinned connection's MULTI
			}
			cm.watched, cm.target = true, sess.pin.slot
		}
		sess.cmulti = cm
		sess.list.multi.Store(1)
		sess.replyLocal(m, ok)
		return true
	case "watch":
		if sess.pin.pipe != nil {
			return false
		}
		target, keyed, refusal := p.target(sess, r)
		switch {
		case !keyed:
			return false // the arity error
		case refusal != nil:
			sess.replyLocal(m, refusal)
			return true
		}
		return sess.pinWatch(r, p, target)
	}
	return false
}

// pinWatch pins a connection on target for the WATCH r, which starts the
// client's transaction, and sends the WATCH there.
//
// In cluster mode the node may answer MOVED or ASK: the proxy's map was
// stale (a reshard between two refreshes). Redis refused that WATCH, so it
// watches nothing, and the pin is given back clean: kept, every WATCH the
// client retried went to the same old node and failed the same way until
// UNWATCH, EXEC or DISCARD, and its other commands were held to the old
// slot (CROSSSLOT) (found by review). A MOVED has updated the map
// (Router.Redirected), so the WATCH is sent once more, pinned on the
// slot's new owner, and the client sees it succeed; an ASK (the slot is
// being migrated) leaves the map as it was, and the client gets the error,
// with nothing pinned, to retry once the migration ends. For that the
// WATCH must be answered before anything the client sent behind it goes
// on the pin: in cluster mode it is sent at once, on its own, and a client
// that pipelines WATCH with what follows pays one round trip more.
func (sess *Session) pinWatch(r *request, p heldPlacer, target int) bool {
	b, err := p.backend(sess, target)
	for tries := 0; ; tries++ {
		if err != nil {
			sess.replyLocal(r.m, errorReply(err))
			sess.watchFailed(err)
			return true
		}
		sess.pinForOn(r, b, target)
		if !sess.pin.cluster || sess.pin.pipe == nil {
			return true // routes, or answered (no connection)
		}
		sess.flush(time.Now()) // the WATCH's slot says opens (pinForOn)
		if sess.pin.pipe == nil && sess.watchRefused {
			// Redis refused the WATCH (-CLUSTERDOWN, -NOPERM): it watches
			// nothing, and the client has its reply. What follows runs as
			// on Redis, where it would have run after the refusal too
			// (a queued command refused in turn aborts EXEC there and
			// here). Taken for a lost WATCH, the rest of the write failed
			// with "its upstream connection was lost" (found by a probe).
			return true
		}
		if sess.pin.pipe == nil {
			// The WATCH's connection was lost before its reply, and flush
			// let the pin go (a client told of a failed WATCH has nothing
			// to guard). Sent alone, unlike on a standalone upstream,
			// where what followed it in the client's write went on the
			// same connection and failed with it; so the rest of this
			// write fails here, and with MULTI in it the transaction
			// stays aborted until EXEC or DISCARD (found by review: a
			// MULTI, INCR, EXEC behind it committed unguarded).
			sess.abort = txAbort{reason: errTxConnLost, batchOnly: true}
			return true
		}
		refused := sess.pin.redirected
		if refused == nil {
			return true // watching on the slot's owner, or answered by it
		}
		from := b.Addr()
		sess.unpin(true)
		if tries == 0 {
			if b, err = p.backend(sess, target); err == nil && b.Addr() != from {
				continue
			}
		}
		// An ASK, or moved on again: the error says to retry.
		sess.replyLocal(r.m, refused)
		return true
	}
}

// queueHeld handles a command of a held MULTI (see heldPlacer); true when
// it was answered.
func (sess *Session) queueHeld(r *request, p heldPlacer) bool {
	cm := &sess.cmulti
	m := r.m
	if tx := sess.pin.txOpen; tx != nil && len(tx.due) > 0 {
		sess.heldFixDue() // before anything of this batch (guard.go)
	}
	if r.wrongArity() {
		// Refused before it runs, as on Redis: "DISCARD x" or "RESET x"
		// must not end the transaction (what follows would run outside
		// it), and EXEC with arguments aborts it (see dispatchPinned).
		if r.name == "exec" {
			sess.endHeld()
			sess.replyLocal(m, errExecArity)
			return true
		}
		cm.failed = true
		sess.replyLocal(m, errArity(r.name))
		return true
	}
	switch r.name {
	case "exec":
		switch {
		case cm.failed:
			sess.endHeld()
			sess.replyLocal(m, errExecAbort)
			return true
		case cm.watchLost:
			sess.endHeld()
			sess.replyLocal(m, failedWatch(sess.resp3))
			return true
		case len(cm.queued) == 0 && !cm.watched:
			sess.endHeld()
			sess.replyLocal(m, emptyExec)
			return true
		}
		if cm.routes != nil {
			// Routes: a reload since the MULTI, or since the WATCH under
			// it, may have moved its keys.
			if reply := sess.reroutedHeld(); reply != nil {
				sess.endHeld()
				sess.replyLocal(m, reply)
				return true
			}
		}
		if reply := sess.closeAtExec(true); reply != nil {
			sess.endHeld()
			sess.replyLocal(m, reply)
			return true
		}
		target := cm.target
		if target < 0 {
			target = p.keyless()
		}
		return sess.placeHeld(r, target, p)
	case "discard":
		sess.endHeld()
		sess.replyLocal(m, ok)
		return true
	case "multi":
		sess.replyLocal(m, errNestedMulti)
		return true
	case "reset", "quit":
		sess.endClusterMulti()
		return false
	}
	fail := func(reply []byte) bool {
		cm.failed = true
		sess.replyLocal(m, reply)
		return true
	}
	cmd := r.cmd
	switch {
	case cmd == nil:
		return fail(errUnknownCommand(r.Args))
	case r.name == "watch":
		// Redis answers WATCH inside MULTI at once with an error that,
		// unlike a queue-time error, leaves the transaction to run (found
		// by review: the held transaction aborted).
		sess.replyLocal(m, errWatchInMulti)
		return true
	case namesConnections(r.name):
		// See queueInMulti: CLIENT ID, INFO and LIST are held as a script
		// returning the proxy's answer (keyless: any node or upstream
		// runs it); KILL and UNBLOCK are refused.
		script, ok := sess.identityInMulti(r)
		switch {
		case !ok:
			return fail(errInMulti(r.name))
		case cm.failed:
			sess.replyLocal(m, queued)
			return true
		}
		if reply := sess.heldOverCap(p, len(script)); reply != nil {
			return fail(reply)
		}
		sess.hold(clusterQueued{raw: script, m: m, cmd: cmd})
		return true
	}
	if refusal := p.wholeRefusal(r.name); refusal != nil {
		return fail(refusal)
	}
	target, keyed, refusal := p.target(sess, r)
	if refusal == nil && keyed && p.toExec() && cm.target >= 0 && target != cm.target && sess.srv.routes != nil && !cm.watchLost {
		// A reload since the WATCH moved its keys: EXEC answers the null
		// of a failed WATCH (reroutedHeld), and a client retries. Refused
		// here as on another upstream, the command made EXEC answer
		// EXECABORT, which a WATCH loop (go-redis's Watch) takes for an
		// error, not a retry (found by a probe: 81 of 94 transactions
		// whose WATCH a reload moved). A reload since the MULTI places
		// what is held again, as EXEC would, before comparing.
		if reply := sess.reroutedHeld(); reply != nil && cm.watched && bytes.Equal(reply, failedWatch(sess.resp3)) {
			cm.watchLost = true
		}
	}
	switch {
	case refusal != nil:
		return fail(refusal)
	case keyed && p.toExec() && cm.target >= 0 && target != cm.target && !cm.watchLost:
		return fail(p.elsewhere(sess, r.name, target, cm.target))
	case cm.failed, cm.watchLost:
		// EXEC fails anyway; nothing is kept.
		sess.replyLocal(m, queued)
		return true
	case keyed && !p.toExec():
		if sess.placeHeld(r, target, p) {
			return true
		}
		// Placed: from here on it is the pinned transaction's command,
		// whose open requirements wait only in a transaction Redis
		// opened (txDefers): flushed, the MULTI placeHeld sent is
		// answered first. Taken as opened, a write after a MULTI an
		// upstream ACL refused ran at once without its TTL (found by
		// review).
		if tx := sess.pin.txOpen; tx != nil && tx.unkept != nil {
			sess.flush(time.Now())
		}
		return false
	case keyed:
		cm.target = target
	}
	if !keyed && r.name != "unwatch" && (cmd.Flags&commands.ConnState != 0 || isSubscribe(r.name)) {
		// See queueInMulti. (PUBLISH and PUBSUB's subcommands, named
		// "pubsub|numsub" and so on, change nothing and are held.)
		return fail(p.stateRefusal(r.name))
	}
	// The guard's decision is the batch's: what it rewrites or adds is
	// kept now, as the pinned path would send it (guardStep).
	raw := r.Raw
	var fixups [][]byte
	d := sess.guard.Decision(r.i) // recorded by dispatch
	deferred := d != nil && sess.txDefers(d)
	if d != nil && (!deferred || !d.AllOpen()) {
		if d.Args != nil {
			raw = sess.guard.Encode(d.Args)
		}
		if len(d.Expires) > 0 {
			for _, f := range sess.guard.FixupsIn(d.Expires, sess.db, sess.srv.cfg.Upstream.Databases) {
				fixups = append(fixups, append([]byte(nil), f...))
			}
		}
	}
	if reply := sess.heldOverCap(p, len(raw)); reply != nil {
		return fail(reply)
	}
	if deferred {
		sess.deferOpen(d)
	}
	sess.hold(clusterQueued{raw: append([]byte(nil), raw...), m: m, cmd: cmd, fixups: fixups, strip: sess.curStrip})
	return true
}

// heldOverCap empties the held transaction and returns the refusal EXEC
// will answer when a command of n more bytes would take it past its caps
// (heldPlacer.full); nil when the command fits.
func (sess *Session) heldOverCap(p heldPlacer, n int) []byte {
	cm := &sess.cmulti
	reply := p.full(len(cm.queued), cm.size+n)
	if reply != nil {
		clear(cm.queued)
		cm.queued, cm.size = cm.queued[:0], 0
	}
	return reply
}

// hold keeps q in the held transaction and answers QUEUED.
func (sess *Session) hold(q clusterQueued) {
	cm := &sess.cmulti
	cm.queued = append(cm.queued, q)
	cm.size += len(q.raw)
	sess.list.multi.Add(1)
	sess.replyLocal(q.m, queued)
}

// placeHeld pins the transaction on target (unless it is under a WATCH,
// pinned already) and replays there MULTI and the commands held so far;
// r (EXEC, or in cluster mode the first keyed command) then goes on to
// the ordinary pinned handling, in the same write. When no connection
// can be had, the transaction fails as a refused MULTI does (txAbort).
func (sess *Session) placeHeld(r *request, target int, p heldPlacer) bool {
	cm := &sess.cmulti
	if cm.watched && (sess.pin.pipe == nil || !sess.pin.pipe.Up()) {
		// The WATCH's connection is gone, and with it what it guarded.
		sess.endClusterMulti()
		sess.unpin(false)
		sess.replyLocal(r.m, errExecAbort)
		return true
	}
	if sess.pin.pipe == nil {
		b, err := p.backend(sess, target)
		if err == nil {
			err = sess.pinOn(b, target)
		}
		if err != nil {
			sess.endClusterMulti()
			sess.abort = txAbort{reason: txAbortReason(err), multi: true}
			sess.replyLocal(r.m, errorReply(err))
			if r.name == "exec" {
				sess.abort = txAbort{}
			}
			return true
		}
	}
	pin := &sess.pin
	sess.forwardOwn(cmdMulti)
	sess.slots[len(sess.slots)-1].multi = true // its answer sets txOpened
	pin.inMulti = true
	pin.txPos, pin.txHidden, pin.txWrites, pin.txSelect, pin.txSelected = 0, pin.txHidden[:0], pin.txWrites[:0], -1, false
	clear(pin.txMetrics)
	pin.txMetrics = pin.txMetrics[:0]
	pin.txName, pin.txNamed = "", false
	for _, q := range cm.queued {
		// Answered +QUEUED already: the replay's replies are muted, but
		// count in the transaction's queue like the client's own, and its
		// writes reach the write hooks at EXEC (pinnedExec).
		sess.txNameStep(q.cmd.Name)
		pin.txSelected = pin.txSelected || q.cmd.Name == "select"
		sess.slots = append(sess.slots, slot{kind: slotUpstream, i: sess.call.Len(), metric: q.m, tx: true, mute: true, held: true, strip: q.strip})
		sess.call.Add(q.raw)
		for _, f := range q.fixups {
			sess.forwardHidden(f)
		}
		if sess.srv.mirror != nil {
			sess.mirrorQueuedCmd(q.cmd.Name, q.cmd) // kept for EXEC (mirror.go)
		}
		for _, f := range q.closed {
			sess.forwardHidden(f)
			sess.mirrorQueuedFixup(f)
		}
		if mayWrite(q.cmd) {
			if args, err := resp.SplitCommand(q.raw, nil); err == nil {
				pin.txWrites = append(pin.txWrites, txWrite{cmd: q.cmd, args: args})
			}
		}
	}
	clear(cm.queued)
	*cm = clusterMulti{queued: cm.queued[:0]}
	return false
}

// endHeld forgets a held transaction that EXEC fails or DISCARD ends.
// One held under a WATCH ends the WATCH too, as EXEC and DISCARD do on
// Redis: UNWATCH goes on its connection, which then goes back clean.
func (sess *Session) endHeld() {
	watched := sess.cmulti.watched
	sess.endClusterMulti()
	if !watched || sess.pin.pipe == nil {
		return
	}
	if !sess.pin.pipe.Up() {
		sess.unpin(false)
		return
	}
	sess.forwardOwn(cmdUnwatch)
	sess.unnamePin()
	sess.flush(time.Now())
	sess.unpin(true)
}

// endClusterMulti forgets a held MULTI.
func (sess *Session) endClusterMulti() {
	sess.recordOpenLeft() // a held transaction's (guard.go)
	clear(sess.cmulti.queued)
	sess.cmulti = clusterMulti{queued: sess.cmulti.queued[:0]}
	sess.list.multi.Store(0)
}

// dedicatedBackend is where a blocking command borrows its connection:
// the client's backend, or in cluster mode the node owning the slot of
// its keys (clusterStep checked that they share one).
func (sess *Session) dedicatedBackend(r *request) (*upstream.Backend, error) {
	if sess.srv.routes != nil {
		return sess.routeBlockingBackend(r)
	}
	if sess.srv.router == nil {
		return sess.backend(), nil
	}
	keySlot, keyed, _ := sess.keySlot(r)
	if !keyed {
		keySlot = int(sess.wroteSlot) - 1 // WAIT, WAITAOF; -1: any primary
	}
	return sess.srv.router.BackendFor(keySlot)
}

// clusterWrote notes the slot of a write's last key: WAIT and WAITAOF
// in cluster mode go to the node owning it. Redis Cluster clients do the
// same, sending WAIT on the connection (the node) of the write they want
// replicated; a client whose writes went to several nodes learns about
// the last one only.
func (sess *Session) clusterWrote(cmd *commands.Command, args [][]byte) {
	var buf [8]int
	if keys := cmd.Keys(args, buf[:0]); len(keys) > 0 {
		sess.wroteSlot = int32(cluster.Slot(args[keys[len(keys)-1]]) + 1)
		sess.wroteMoves = 0 // its node is noted when its reply is in
	}
}

// clusterWriteAnswered notes which node owned the slot of the client's
// last write when its reply came in: the node that took it, as a MOVED
// the router followed has updated the map by then. A WAIT after the slot
// changed owner is answered by the proxy (waitAfterMove).
func (sess *Session) clusterWriteAnswered() {
	sess.wroteMoves = sess.srv.router.OwnerTag(int(sess.wroteSlot) - 1)
}

// clusterWaitMarker is, for WAIT and WAITAOF on node b in cluster mode,
// the write that makes the waiting connection's replication offset cover
// every write the node took before it (see blocking): in cluster mode
// Redis does not replicate PUBLISH, so the marker writes and deletes a key
// of the proxy's in the slot of the client's last write, in one
// transaction, which replicates as one entry and leaves nothing behind.
func (sess *Session) clusterWaitMarker() [][]byte {
	slot := int(sess.wroteSlot) - 1
	if slot < 0 {
		return nil // nothing written: WAIT answers at once anyway
	}
	key := cluster.KeyInSlot("__redproxy__:wait-mark:", slot)
	return [][]byte{
		resp.AppendCommandStrings(nil, "MULTI"),
		resp.AppendCommandStrings(nil, "SET", key, ""),
		resp.AppendCommandStrings(nil, "DEL", key),
		resp.AppendCommandStrings(nil, "EXEC"),
	}
}

// clusterPinnedReply turns a MOVED or ASK read on a pinned connection into
// an error the client can act on: the transaction cannot follow its slot
// to another node, and Redis has already failed it (a redirected command
// inside MULTI makes EXEC answer EXECABORT; a redirected EXEC discards
// the transaction). A command sent outside MULTI (tx false) under WATCH
// is noted, and fails EXEC (pinState.redirected).
func (sess *Session) clusterPinnedReply(reply []byte, exec, tx bool) []byte {
	moved, ok := sess.srv.router.Redirected(reply, sess.pin.backend.Addr())
	if !ok {
		return reply
	}
	var out []byte
	switch {
	case exec:
		out = []byte("-EXECABORT Transaction discarded because slot " + strconv.Itoa(moved) + " moved to another node during it; retry the transaction\r\n")
	case bytes.HasPrefix(reply, []byte("-ASK ")):
		// The slot is being migrated and this key has left the node
		// already. Replaying the transaction on the importing node with
		// ASKING is not done: its other keys may still be here, where
		// the importing node would see them missing (docs/COMPATIBILITY.md).
		out = []byte("-ERR redproxy: slot " + strconv.Itoa(moved) + " is being migrated and this key already left the transaction's node, so the transaction will fail; retry it once the migration ends\r\n")
	default:
		out = []byte("-ERR redproxy: slot " + strconv.Itoa(moved) + " moved to another node during the transaction, which will fail; retry the transaction\r\n")
	}
	if !exec && !tx {
		sess.pin.redirected = out
	}
	return out
}

// clusterBlockedReply does the same for a blocking command's reply: a
// MOVED or ASK means it did not run, so the client may simply send it
// again, and TRYAGAIN (Redis Cluster's own word for it) says so.
func (sess *Session) clusterBlockedReply(reply []byte, from *upstream.Backend, borrowed bool) []byte {
	if !resp.IsError(reply) {
		return reply
	}
	if !borrowed {
		return sess.clusterPinnedReply(reply, false, false) // under WATCH
	}
	moved, ok := sess.srv.router.Redirected(reply, from.Addr())
	if !ok {
		return reply
	}
	return errClusterRetry(moved)
}

// errClusterRetry answers a command a node refused with MOVED or ASK on a
// connection that cannot follow it: it did not run, and may be sent again.
func errClusterRetry(slot int) []byte {
	return []byte("-TRYAGAIN redproxy: slot " + strconv.Itoa(slot) + " moved to another node; retry the command\r\n")
}

func errClusterUnsupported(name string) []byte {
	return []byte("-ERR redproxy: " + strings.ToUpper(strings.ReplaceAll(name, "|", " ")) + " is not supported in cluster mode yet\r\n")
}

// errClusterTracking refuses CLIENT TRACKING ON and CLIENT NO-TOUCH ON:
// both turn a client into a relay on one connection, and in cluster mode
// the client's keys live on every node, so one node's invalidations (or
// one node's untouched keys) would be a silent fraction of the truth.
func errClusterTracking(name string) []byte {
	return []byte("-ERR redproxy: " + strings.ToUpper(strings.ReplaceAll(name, "|", " ")) +
		" is not supported in cluster mode: it is per connection and node, and the client's keys are on every node\r\n")
}

func errClusterInTx(name string) []byte {
	return []byte("-ERR redproxy: " + strings.ToUpper(strings.ReplaceAll(name, "|", " ")) + " inside a transaction is not supported in cluster mode\r\n")
}

// registerClusterMetrics exposes the redirections the router followed for
// clients: a steady stream means the proxy's map keeps going stale.
func (s *Server) registerClusterMetrics() {
	r := s.router
	for kind, read := range map[string]func() uint64{
		"moved":   func() uint64 { m, _, _ := r.Stats(); return m },
		"ask":     func() uint64 { _, a, _ := r.Stats(); return a },
		"retried": func() uint64 { _, _, t := r.Stats(); return t },
	} {
		s.metrics.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "redproxy_cluster_redirections_total",
			Help:        "Cluster replies the proxy handled for its clients: MOVED and ASK followed, and commands retried after TRYAGAIN, CLUSTERDOWN, NOSCRIPT or an unreachable node.",
			ConstLabels: prometheus.Labels{"kind": kind},
		}, func() float64 { return float64(read()) }))
	}
	s.metrics.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "redproxy_cluster_scan_restarts_total",
		Help: "SCAN walks started again from the node under way because the slot map changed since their cursor was made.",
	}, func() float64 { return float64(r.ScanRestarts()) }))
	s.metrics.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "redproxy_cluster_primaries_failed",
		Help: "Primaries of the slot map the cluster flags as failed (CLUSTER SHARDS): they keep their slots, whose commands fail, until a replica or an operator takes them over.",
	}, func() float64 {
		m := r.Map()
		if m == nil {
			return 0
		}
		return float64(len(m.Primaries()) - len(m.LivePrimaries()))
	}))
}
