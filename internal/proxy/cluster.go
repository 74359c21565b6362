package proxy

import (
	"bytes"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/redproxy/redproxy/internal/cluster"
	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/namespace"
	"github.com/redproxy/redproxy/internal/resp"
	"github.com/redproxy/redproxy/internal/upstream"
)

// newRouter builds the router of upstream.mode = "cluster". The session
// hands it whole batches (flush); which node a command goes to, and how
// split commands come back together, is the router's business.
func newRouter(s *Server, cfg *config.Config) *cluster.Router {
	return cluster.New(cluster.Options{
		Seeds:   cfg.Upstream.Seeds,
		Backend: s.backendOptions(cfg, ""),
		Table:   s.table,
		Logger:  s.log,
	})
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

// clusterMulti is a MULTI in cluster mode before the transaction has a
// node. The node is the owner of the slot of the first keyed command, so
// until one comes the proxy answers MULTI and queues keyless commands
// itself; the first keyed command (or EXEC) pins a connection on the node,
// where MULTI and the queued commands are replayed before it.
type clusterMulti struct {
	open   bool
	failed bool // a queue-time error: EXEC answers EXECABORT
	queued []clusterQueued
	size   int
}

type clusterQueued struct {
	raw   []byte
	m     *metrics.Command
	strip namespace.Strip // where its result in EXEC's reply names keys (namespace.go)
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
		if db, err := strconv.Atoi(string(args[1])); err == nil && db != 0 {
			sess.refusedInMulti()
			sess.replyLocal(m, errClusterSelect)
			return true
		}
	}
	if sess.pin.pipe != nil {
		return sess.clusterPinned(r)
	}
	switch cmd.Name {
	case "multi":
		if len(args) != 1 {
			return false // the arity error
		}
		sess.cmulti = clusterMulti{open: true, queued: sess.cmulti.queued[:0]}
		sess.list.multi.Store(1)
		sess.replyLocal(m, ok)
		return true
	case "watch":
		keySlot, keyed, same := sess.keySlot(r)
		switch {
		case !keyed:
			return false // the arity error
		case !same:
			sess.replyLocal(m, cluster.CrossSlot())
			return true
		}
		b, err := sess.srv.router.BackendFor(keySlot)
		if err != nil {
			sess.replyLocal(m, errorReply(err))
			return true
		}
		sess.pinForOn(r, b, keySlot)
		return true
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

// A MULTI without WATCH has no node (cluster mode) or upstream (routes)
// until its first keyed command: the proxy answers +QUEUED for the
// keyless commands before it, holds them (capped), and replays MULTI and
// them where that command's keys live. heldPlacer is what differs
// between the two modes: where keys live, and what cannot be held.
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

// queueHeld handles a command of a MULTI that has no target yet (see
// heldPlacer); true when it was answered.
func (sess *Session) queueHeld(r *request, p heldPlacer) bool {
	cm := &sess.cmulti
	m := r.m
	switch r.name {
	case "exec":
		switch {
		case cm.failed:
			sess.endClusterMulti()
			sess.replyLocal(m, errExecAbort)
			return true
		case len(cm.queued) == 0:
			sess.endClusterMulti()
			sess.replyLocal(m, emptyExec)
			return true
		}
		return sess.placeHeld(r, p.keyless(), p)
	case "discard":
		sess.endClusterMulti()
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
	case !cmd.ArityOK(len(r.Args)) && cmd.Subcommands == nil:
		return fail(errArity(r.name))
	}
	if refusal := p.wholeRefusal(r.name); refusal != nil {
		return fail(refusal)
	}
	target, keyed, refusal := p.target(sess, r)
	switch {
	case refusal != nil:
		return fail(refusal)
	case cm.failed:
		// EXEC fails anyway; nothing is kept.
		sess.replyLocal(m, queued)
		return true
	case keyed:
		return sess.placeHeld(r, target, p)
	}
	if cmd.Flags&(commands.ConnState|commands.PubSub) != 0 && r.name != "unwatch" && r.name != "publish" && r.name != "pubsub" {
		// See queueInMulti.
		return fail(p.stateRefusal(r.name))
	}
	raw := r.Raw
	if d := sess.guard.Decision(r.i); d != nil && d.Args != nil {
		raw = sess.guard.Encode(d.Args)
	}
	if len(cm.queued) >= maxClusterQueued || cm.size+len(raw) > maxClusterQueuedBytes {
		return fail([]byte("-ERR redproxy: too many keyless commands queued before the transaction's first key\r\n"))
	}
	cm.queued = append(cm.queued, clusterQueued{raw: append([]byte(nil), raw...), m: m, strip: sess.curStrip})
	cm.size += len(raw)
	sess.list.multi.Add(1)
	sess.replyLocal(m, queued)
	return true
}

// placeHeld pins the transaction on target and replays there MULTI and
// the commands held so far; r then goes on to the ordinary pinned
// handling. When no connection can be had, the transaction fails as a
// refused MULTI does (txAbort).
func (sess *Session) placeHeld(r *request, target int, p heldPlacer) bool {
	cm := &sess.cmulti
	b, err := p.backend(sess, target)
	if err == nil {
		err = sess.pinOn(b, target)
	}
	if err != nil {
		sess.endClusterMulti()
		sess.abort = txAbort{reason: errTxMultiRefused, multi: true}
		sess.replyLocal(r.m, errorReply(err))
		if r.name == "exec" {
			sess.abort = txAbort{}
		}
		return true
	}
	sess.forwardHidden(cmdMulti)
	sess.pin.inMulti = true
	for _, q := range cm.queued {
		// Answered +QUEUED already: the replay's replies are muted, but
		// count in the transaction's queue like the client's own.
		sess.slots = append(sess.slots, slot{kind: slotUpstream, i: sess.call.Len(), metric: q.m, tx: true, mute: true, strip: q.strip})
		sess.call.Add(q.raw)
	}
	clear(cm.queued)
	*cm = clusterMulti{queued: cm.queued[:0]}
	return false
}

// endClusterMulti forgets a MULTI that has no node.
func (sess *Session) endClusterMulti() {
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
		keySlot = sess.wroteSlot - 1 // WAIT, WAITAOF; -1: any primary
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
		sess.wroteSlot = cluster.Slot(args[keys[len(keys)-1]]) + 1
	}
}

// clusterWaitMarker is, for WAIT and WAITAOF on node b in cluster mode,
// the write that makes the waiting connection's replication offset cover
// every write the node took before it (see blocking): in cluster mode
// Redis does not replicate PUBLISH, so the marker writes and deletes a key
// of the proxy's in the slot of the client's last write, in one
// transaction, which replicates as one entry and leaves nothing behind.
func (sess *Session) clusterWaitMarker() [][]byte {
	slot := sess.wroteSlot - 1
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
// the transaction).
func (sess *Session) clusterPinnedReply(reply []byte, exec bool) []byte {
	moved, ok := sess.srv.router.Redirected(reply, sess.pin.backend.Addr())
	if !ok {
		return reply
	}
	if exec {
		return []byte("-EXECABORT Transaction discarded because slot " + strconv.Itoa(moved) + " moved to another node during it; retry the transaction\r\n")
	}
	if bytes.HasPrefix(reply, []byte("-ASK ")) {
		// The slot is being migrated and this key has left the node
		// already. Replaying the transaction on the importing node with
		// ASKING is not done: its other keys may still be here, where
		// the importing node would see them missing (docs/COMPATIBILITY.md).
		return []byte("-ERR redproxy: slot " + strconv.Itoa(moved) + " is being migrated and this key already left the transaction's node, so the transaction will fail; retry it once the migration ends\r\n")
	}
	return []byte("-ERR redproxy: slot " + strconv.Itoa(moved) + " moved to another node during the transaction, which will fail; retry the transaction\r\n")
}

// clusterBlockedReply does the same for a blocking command's reply: a
// MOVED or ASK means it did not run, so the client may simply send it
// again, and TRYAGAIN (Redis Cluster's own word for it) says so.
func (sess *Session) clusterBlockedReply(reply []byte, from *upstream.Backend, borrowed bool) []byte {
	if !resp.IsError(reply) {
		return reply
	}
	if !borrowed {
		return sess.clusterPinnedReply(reply, false)
	}
	moved, ok := sess.srv.router.Redirected(reply, from.Addr())
	if !ok {
		return reply
	}
	return []byte("-TRYAGAIN redproxy: slot " + strconv.Itoa(moved) + " moved to another node; retry the command\r\n")
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

// errUnknownCommand is Redis's reply to a command it does not know.
func errUnknownCommand(args [][]byte) []byte {
	clean := func(b []byte) string {
		if len(b) > 128 {
			b = b[:128]
		}
		return strings.Map(func(c rune) rune {
			if c == '\r' || c == '\n' {
				return ' '
			}
			return c
		}, string(b))
	}
	var sb strings.Builder
	sb.WriteString("-ERR unknown command '")
	if len(args) > 0 {
		sb.WriteString(clean(args[0]))
	}
	sb.WriteString("', with args beginning with: ")
	for i, a := range args {
		if i == 0 {
			continue
		}
		if sb.Len() > 1024 {
			break
		}
		sb.WriteString("'" + clean(a) + "' ")
	}
	sb.WriteString("\r\n")
	return []byte(sb.String())
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
}
