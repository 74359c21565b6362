package proxy

import (
	"bytes"
	"sync"

	"github.com/redproxy/redproxy/internal/namespace"
	"github.com/redproxy/redproxy/internal/resp"
	"github.com/tidwall/redcon"
)

// nsState is the session's namespace (internal/namespace): the key prefix
// every command of the client is confined to. The client's requests are
// rewritten when their batch is read, before the guard, the local tier,
// cluster slotting and Redis see them, so all of those work on the real
// (prefixed) key names; only the client's user ACL judges the client's own
// names (orig). A session without a namespace has w == nil and pays one
// nil check per batch.
type nsState struct {
	// listener is the namespace the client's listener gives it
	// (setNamespace); user is its proxy user's, which wins when set.
	listener *namespace.Namespace
	w        *namespace.Rewriter // the namespace in force; nil: none
	// b is the batch's scratch, there exactly when w is: a session
	// without a namespace (most of them, idle ones included) does not
	// carry it.
	b *nsBatch
}

type nsBatch struct {
	// notes and orig are, per request of the batch, the outcome of its
	// rewriting and the client's own request.
	notes []namespace.Result
	orig  []resp.Request
	// scratch holds one stripped reply until it is copied out.
	scratch []byte
	// tx is, for the client's open transaction, where EXEC's reply names
	// keys: one entry per queued command whose reply does (nsQueued),
	// until the transaction ends (nsTxEnd). It outlives batches: EXEC may
	// come in a later one.
	tx []namespace.TxStrip
}

// namespaces shares one Namespace per prefix between sessions: it is
// immutable, and the prefixes come from the configuration.
var namespaces sync.Map // prefix -> *namespace.Namespace

func namespaceFor(prefix string) (*namespace.Namespace, error) {
	if v, ok := namespaces.Load(prefix); ok {
		return v.(*namespace.Namespace), nil
	}
	ns, err := namespace.New(prefix)
	if err != nil {
		return nil, err
	}
	v, _ := namespaces.LoadOrStore(prefix, ns)
	return v.(*namespace.Namespace), nil
}

// setNamespace is the one place a client gets a namespace from its
// listener ([[server.listeners]] namespace): call it when the connection
// is accepted, before its first batch. "" is none. A proxy user's own
// namespace ([[users]] namespace), once the client authenticates as that
// user, takes precedence; RESET or AUTH as a user without one brings the
// listener's back.
func (sess *Session) setNamespace(prefix string) error {
	var ns *namespace.Namespace
	if prefix != "" {
		var err error
		if ns, err = namespaceFor(prefix); err != nil {
			return err
		}
	}
	sess.ns.listener = ns
	sess.applyNamespace()
	return nil
}

// effectiveNamespace is the namespace the client's commands are confined
// to: its user's if it has one, else its listener's.
func (sess *Session) effectiveNamespace() *namespace.Namespace {
	if u := sess.user; u != nil && u.Namespace != "" {
		// Validated with the configuration (auth.Validate).
		if ns, err := namespaceFor(u.Namespace); err == nil {
			return ns
		}
	}
	return sess.ns.listener
}

// lockedNamespace is effectiveNamespace for another session's goroutine:
// the user changes under mu (setUser); the listener's namespace is set
// before the session is listed.
func (sess *Session) lockedNamespace() *namespace.Namespace {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	return sess.effectiveNamespace()
}

// applyNamespace puts the effective namespace in force after the user or
// listener changed. The requests of the batch after the one being
// answered (an AUTH) were rewritten for the previous namespace, so they
// are rewritten again from the client's own bytes, and the guard decides
// on them again (also when the namespace stays: the scope may not).
func (sess *Session) applyNamespace() {
	want := sess.effectiveNamespace()
	var cur *namespace.Namespace
	if sess.ns.w != nil {
		cur = sess.ns.w.Namespace()
	}
	if want == cur {
		// The same namespace, but the user (and so the policy's scope)
		// may have changed: the rest of the batch is decided again. A
		// SET and a DBSIZE pipelined behind AUTH escaped the new user's
		// scope (found by review). authenticate flushed what came before.
		if sess.cur.Request != nil && sess.cur.i+1 < len(sess.batchReqs) {
			sess.prepareBatch(sess.batchReqs)
		}
		return
	}
	reqs := sess.batchReqs
	from := sess.cur.i + 1
	if sess.cur.Request == nil || from > len(reqs) {
		from = len(reqs)
	}
	if sess.ns.w != nil {
		for i := from; i < len(reqs) && i < len(sess.ns.b.orig); i++ {
			reqs[i] = sess.ns.b.orig[i]
		}
	}
	if want == nil {
		sess.ns.w, sess.ns.b = nil, nil
	} else {
		if sess.ns.w == nil {
			sess.ns.b = &nsBatch{}
			// Earlier requests of the batch were not rewritten: their
			// own bytes are what the client sent.
			sess.ns.b.orig = append(sess.ns.b.orig[:0], reqs...)
			sess.ns.b.notes = append(sess.ns.b.notes[:0], make([]namespace.Result, len(reqs))...)
		}
		// A fresh rewriter: the earlier requests' rewritten bytes (still
		// referenced by the batch) stay where they are.
		sess.ns.w = namespace.NewRewriter(want)
		for i := from; i < len(reqs); i++ {
			sess.ns.b.notes[i] = sess.nsRewrite(&reqs[i])
		}
	}
	if from < len(reqs) {
		sess.prepareBatch(reqs)
	}
}

// nsRewriteBatch rewrites a batch's requests in place, remembering the
// client's own, before anything else looks at them.
func (sess *Session) nsRewriteBatch(reqs []resp.Request) {
	sess.ns.w.Reset()
	st := sess.ns.b
	st.orig = append(st.orig[:0], reqs...)
	if cap(st.notes) < len(reqs) {
		st.notes = make([]namespace.Result, len(reqs))
	}
	st.notes = st.notes[:len(reqs)]
	for i := range reqs {
		st.notes[i] = sess.nsRewrite(&reqs[i])
	}
}

func (sess *Session) nsRewrite(req *resp.Request) namespace.Result {
	cmd := sess.cmds.table.Lookup(req.Args)
	args, res := sess.ns.w.Rewrite(cmd, req.Args)
	if res.Action == namespace.Forward && !sameArgs(args, req.Args) {
		req.Args = args
		req.Raw = sess.ns.w.Encode(args)
	}
	return res
}

func sameArgs(a, b [][]byte) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// clientArgs are request i's arguments as the client sent them, which its
// user's ACL judges (key patterns name the client's keys, not the prefixed
// ones).
func (sess *Session) clientArgs(i int, args [][]byte) [][]byte {
	if sess.ns.w != nil && i < len(sess.ns.b.orig) {
		return sess.ns.b.orig[i].Args
	}
	return args
}

// nsStep answers what a namespace changes about request r: a refusal, or
// FLUSHDB and RANDOMKEY run as scripts confined to the namespace; a
// command whose reply names keys has them stripped (curStrip), inside
// MULTI from its element of EXEC's reply (nsQueued). It reports whether
// it answered r.
func (sess *Session) nsStep(r *request) bool {
	if r.i >= len(sess.ns.b.notes) {
		return false
	}
	res := sess.ns.b.notes[r.i]
	ns := sess.ns.w.Namespace()
	msg := res.Err
	switch {
	case res.Action == namespace.Refuse:
	case res.Action != namespace.Forward && sess.srv.router != nil:
		msg = namespace.RefusalError(r.name, "cannot be confined to a namespace in cluster mode")
	case res.Action != namespace.Forward && sess.srv.routes != nil && !sess.pin.inMulti && !sess.cmulti.open:
		// Its script would run on the default upstream only: FLUSHDB would
		// leave the namespace's keys on the others, RANDOMKEY never name
		// them.
		msg = namespace.RefusalError(r.name, "would run on one upstream only, and with routes the namespace's keys live on several")
	case res.Action != namespace.Forward && sess.srv.routes != nil && (sess.pin.inMulti || sess.cmulti.open):
		// With routes both fan out, which a transaction cannot: the
		// routes' own refusal answers (routeStep), never the script run
		// at once, outside the transaction.
		return false
	case res.Action == namespace.FlushDB:
		switch {
		case !mayWrite(r.cmd):
		case sess.pin.inMulti:
			// It takes effect at EXEC, where the write hooks hear of it
			// (pinnedExec), as of the transaction's other writes
			// (queueInMulti): told now, the local tier would fill the
			// namespace's keys again before EXEC deletes them.
			sess.pin.txWrites = append(sess.pin.txWrites, txWrite{cmd: r.cmd, args: txWriteArgs(r.cmd, r.Args)})
		default:
			sess.writeForwarded(r.cmd, r.Args)
		}
		sess.forward(ns.FlushDBCommand(), r.m)
		return true
	case res.Action == namespace.RandomKey:
		sess.curStrip = res.Strip
		sess.forward(ns.RandomKeyCommand(), r.m)
		return true
	default:
		sess.curStrip = res.Strip
		return false
	}
	sess.refusedInMulti()
	b, start := sess.localBuf()
	sess.finishLocal(r.m, redcon.AppendError(b, msg), start)
	return true
}

// nsStripped returns reply with the namespace's prefix taken off where
// kind says keys are, in a buffer valid until the next call.
func (sess *Session) nsStripped(kind namespace.Strip, reply []byte) []byte {
	if kind == namespace.StripNone || sess.ns.w == nil {
		return reply
	}
	sess.ns.b.scratch = sess.ns.w.Namespace().StripReply(sess.ns.b.scratch[:0], kind, reply)
	if cap(sess.ns.b.scratch) > 64<<10 {
		out := sess.ns.b.scratch
		sess.ns.b.scratch = nil
		return out
	}
	return sess.ns.b.scratch
}

// nsQueued notes, for a command queued in the client's MULTI whose reply
// names keys, where its result will be in EXEC's reply: its position in
// the transaction's queue, which noteQueued is about to count it at. A
// command Redis refused at queue time is not in EXEC's reply (and Redis
// then fails EXEC anyway).
func (sess *Session) nsQueued(reply []byte, kind namespace.Strip) {
	if sess.ns.b == nil || !bytes.Equal(reply, queued) {
		return
	}
	sess.ns.b.tx = append(sess.ns.b.tx, namespace.TxStrip{Pos: sess.pin.txPos, Kind: kind})
}

// nsExec returns EXEC's reply with each queued command's key names
// stripped in its own element, in a buffer valid until the next call;
// stripExec then cuts the results of the proxy's own commands, which the
// strips' positions count too.
func (sess *Session) nsExec(reply []byte) []byte {
	if sess.ns.b == nil || len(sess.ns.b.tx) == 0 || sess.ns.w == nil {
		return reply
	}
	sess.ns.b.scratch = sess.ns.w.Namespace().StripExec(sess.ns.b.scratch[:0], reply, sess.ns.b.tx)
	if cap(sess.ns.b.scratch) > 64<<10 {
		out := sess.ns.b.scratch
		sess.ns.b.scratch = nil
		return out
	}
	return sess.ns.b.scratch
}

// nsTxEnd forgets the transaction's strips: it ended (EXEC, DISCARD,
// RESET, its connection lost), and the next one counts from zero.
func (sess *Session) nsTxEnd() {
	switch b := sess.ns.b; {
	case b == nil:
	case cap(b.tx) > maxKeptTxStrips:
		b.tx = nil // one huge transaction does not pin its memory
	default:
		b.tx = b.tx[:0]
	}
}

// maxKeptTxStrips bounds the strips kept for the next transaction.
const maxKeptTxStrips = 256

// nsRelayRefusal is why request i of a relayed (subscribed) client cannot
// run in its namespace, or "": a raw relay cannot strip key names from a
// command's reply, nor run FLUSHDB or RANDOMKEY as scripts.
func (sess *Session) nsRelayRefusal(i int) string {
	if sess.ns.w == nil || i >= len(sess.ns.b.notes) {
		return ""
	}
	res := sess.ns.b.notes[i]
	switch {
	case res.Action == namespace.Refuse:
		return res.Err
	case res.Action != namespace.Forward || (res.Strip != namespace.StripNone && res.Strip != namespace.StripGroupError):
		// (A NOGROUP error on a relay keeps the prefix: its replies are
		// forwarded raw, and the command's others name no key.)
		return "ERR redproxy: this command is not supported on a subscribed connection in a namespace"
	}
	return ""
}

// nsRelayFilter returns the filter for what Redis sends a relayed client
// in a namespace, or nil.
func (sess *Session) nsRelayFilter(limit int64) *namespace.PubSubFilter {
	if sess.ns.w == nil {
		return nil
	}
	return namespace.NewPubSubFilter(sess.ns.w.Namespace(), int(min(limit, 1<<30)))
}

// nsBatchDone drops what the batch's rewriting holds once it was answered.
func (sess *Session) nsBatchDone() {
	clear(sess.ns.b.orig)
	sess.ns.b.orig = sess.ns.b.orig[:0]
}
