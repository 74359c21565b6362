package proxy

import (
	"errors"
	"time"

	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/namespace"
	"github.com/redproxy/redproxy/internal/resp"
	"github.com/redproxy/redproxy/internal/stampede"
	"github.com/redproxy/redproxy/internal/upstream"
)

// A direct reply: when a batch is one plain forwarded command (what a
// client sends at redis-benchmark's default -P 1), the pipe's reader
// writes the reply to the client's socket itself as it completes the Call,
// and the session goes back to reading the client without waiting for it.
// That saves the session one park and one wake-up per request, which on a
// core shared with Redis was most of what redproxy spent above twemproxy
// (bench/README.md, "Direct replies").
//
// Order is kept because the session waits for a direct reply (waitDirect)
// before it answers or forwards anything else of the client's, and before
// it parks or ends: a client that pipelines behind a lone command finds its
// next batch waiting there. The reader never waits for a client: when the
// client's socket cannot take the whole reply at once, the rest is written
// by a goroutine of its own under the client write timeout.
//
// Only the plainest batches go direct (directable): nothing local in the
// batch, no reply to transform (namespaces, INFO, RESP3, MULTI, CLIENT
// REPLY), no bookkeeping that must run when the reply is in (the local
// tier's and stampede protection's pending writes, read-your-writes on
// replicas, the mirror), a bare socket on Linux (rawio). Everything else is
// answered by flush as before.
type directReply struct {
	sess  *Session
	cc    *clientConn
	spare *upstream.Call // the session's Call while call is in flight
	// In flight, set by the session before the Send and read by the reader
	// after it (the pipe's lock orders them); written back by the reader
	// before it signals written, and read by the session after.
	call     *upstream.Call
	cmd      []byte // the command, copied: the session reuses its read buffer meanwhile
	metric   *metrics.Command
	start    time.Time // the batch's start
	sent     time.Time // when the Call was sent
	took     time.Duration
	overflow bool  // the reply exceeded the output limit: the client is being closed
	failed   error // writing the reply to the client failed
	rest     []byte
	errBuf   []byte
	written  chan struct{} // one token per reply, once it is written or given up
	onDone   func(*upstream.Call)
	finishFn func()
	// lead is stampede protection's fetch for a lone read that is sent
	// as this direct reply (flightStep): ended by whoever has the reply,
	// the reader (done) or, when the read did not go direct, flush.
	lead stampede.Lead
}

// errLeadDropped ends a stampede lead whose read was never sent: its key's
// next readers fetch for themselves.
var errLeadDropped = errors.New("redproxy: read dropped before it was sent")

// maxDirectCommand is the largest command sent as a direct reply: the
// command is copied, which a saved wake-up pays for only when it is small.
const maxDirectCommand = 16 << 10

// directable reports whether flush may send the batch's Call as a direct
// reply (see directReply).
func (sess *Session) directable() bool {
	if sess.call.Len() != 1 || len(sess.slots) != 1 || len(sess.call.Part(0)) > maxDirectCommand {
		return false // too big to be worth copying (sendDirect)
	}
	sl := &sess.slots[0]
	if sl.kind != slotUpstream || sl.mute || sl.tx || sl.exec || sl.info || sl.held || sl.strip != namespace.StripNone {
		return false
	}
	return sess.directSession()
}

// directLead reports whether the lone read r may lead a fetch of stampede
// protection that goes as a direct reply: whether, once forwarded, the
// batch will be directable.
func (sess *Session) directLead(r *request) bool {
	return sess.call.Len() == 0 && len(sess.slots) == 0 && len(r.Raw) <= maxDirectCommand && !sess.curMute &&
		sess.curStrip == namespace.StripNone && sess.pin.pipe == nil && sess.srv.routes == nil && sess.srv.router == nil &&
		sess.directSession()
}

// directSession holds the conditions of directable that are about the
// session and its batch rather than the forwarded command.
func (sess *Session) directSession() bool {
	// A batch of one request has one flush, at its end: nothing of the
	// batch is answered after the direct reply.
	if len(sess.batchReqs) != 1 || len(sess.out) != 0 || len(sess.local) != 0 {
		return false
	}
	if sess.resp3 || sess.ns.w != nil || sess.srv.replicas != nil || sess.pin.cluster || sess.outDead {
		return false
	}
	if sess.tierWrites.Pending() || sess.flightWrites.Pending() || sess.reads.wrote {
		return false
	}
	if sess.mirrorS != nil && len(sess.mirrorS.marks) > 0 || testHookReply.Load() != nil {
		return false
	}
	cc, ok := sess.nc.(*clientConn)
	return ok && cc.Conn != nil && cc.rawSock().w != nil
}

// sendDirect sends call as a direct reply and reports true, or reports
// false with the error on call when it could not be sent (flush answers
// it then, as for any Call).
func (sess *Session) sendDirect(call *upstream.Call, m *metrics.Command, start, sent time.Time) bool {
	d := sess.directState()
	d.cc = sess.nc.(*clientConn)
	d.cmd = call.CopyParts(d.cmd[:0])
	d.metric, d.start, d.sent = m, start, sent
	d.took, d.overflow, d.failed = 0, false, nil
	d.call = call
	call.SetOnDone(d.onDone)
	if err := sess.backend().Pool(sess.db, sess.resp3).Send(call); err != nil {
		call.SetOnDone(nil)
		call.Fail(err)
		d.call = nil
		return false
	}
	if d.spare == nil {
		d.spare = upstream.NewCall()
	}
	sess.call, d.spare = d.spare, nil
	sess.srv.metrics.DirectReplies.Inc()
	return true
}

// directState returns the session's direct-reply state, made on first use.
func (sess *Session) directState() *directReply {
	d := sess.direct
	if d == nil {
		d = &directReply{sess: sess, written: make(chan struct{}, 1)}
		d.onDone, d.finishFn = d.done, d.finish
		sess.direct = d
	}
	return d
}

// endLead ends the lead of a read that did not go direct, with call's
// reply once it is in, or with err when the read was never sent.
func (sess *Session) endLead(call *upstream.Call, err error) {
	if sess.sessionBatch == nil {
		return // parked: no batch, so no lead (as in directInFlight)
	}
	d := sess.direct
	// d.call first: while a direct reply is in flight, the lead is the
	// reader's.
	if d == nil || d.call != nil || !d.lead.Active() {
		return
	}
	var r []byte
	if err == nil {
		r, err = call.Reply(0)
	}
	d.lead.End(r, err)
}

// done runs on the pipe's reader as the Call completes: it accounts for
// the reply and writes it, or hands the rest to finish when the client's
// socket is full.
func (d *directReply) done(c *upstream.Call) {
	d.took = time.Since(d.start)
	r, err := c.Reply(0)
	if d.lead.Active() {
		// Reads of the key that came meanwhile may fetch now.
		d.lead.End(r, err)
	}
	if err != nil || resp.IsError(r) {
		d.metric.Errors.Inc()
	}
	d.metric.Latency.ObserveN(d.took.Seconds(), 1)
	if c.Overflowed() || errors.Is(err, upstream.ErrOutputLimit) {
		d.overflow = true
		d.sess.closeFor(metrics.CloseOutputLimit, "replies exceed server.client_output_limit", "limit_bytes", c.ReplyLimit())
		d.cc.Close() // the session, blocked reading the client, ends
		d.written <- struct{}{}
		return
	}
	if err != nil {
		d.errBuf = appendErrorReply(d.errBuf[:0], err)
		r = d.errBuf
	}
	if d.took >= d.sess.srv.slow.threshold {
		// Logged here, before the client has the reply, as a batch the
		// session waited for is. The session's db and the command cannot
		// change until it has waited for this reply.
		if args, err := resp.SplitCommand(d.cmd, nil); err == nil && len(args) > 0 {
			d.sess.noteSlow([]resp.Request{{Args: args, Raw: d.cmd}}, d.start, d.took, d.took-d.sent.Sub(d.start), d.sess.lockedBatchStart())
		}
	}
	n, full, _, werr := d.cc.tryWrite(r)
	switch {
	case werr != nil:
		d.fail(werr)
	case full:
		d.rest = r[n:]
		go d.finishFn()
		return
	}
	d.written <- struct{}{}
}

// finish writes what the client's socket did not take at once, waiting
// for room as any write to a client does (server.client_write_timeout).
func (d *directReply) finish() {
	if _, err := d.cc.Write(d.rest); err != nil {
		d.fail(err) // a timeout's reason is recorded by the Write
	}
	d.rest = nil
	d.written <- struct{}{}
}

// fail ends a client whose reply could not be written, at once, as a
// failed writeOut does: the session is blocked reading the client and
// would otherwise learn of it only when the client sent more, which a
// client waiting for the rest of its reply never does; and the rest of
// the stream, after part of a reply, would be out of step.
func (d *directReply) fail(err error) {
	d.failed = err
	d.sess.closing(metrics.CloseWriteError)
	d.cc.Close()
}

// waitDirect waits until the direct reply in flight, if any, is written,
// and finishes it on the session's side. Small enough to inline, so the
// session's paths call it without a check of their own.
func (sess *Session) waitDirect() {
	if sess.directInFlight() {
		sess.finishDirect()
	}
}

// finishDirect is waitDirect's wait: it keeps what the session keeps from
// a reply (its size for the output estimate), or ends a client whose write
// failed or overflowed.
func (sess *Session) finishDirect() {
	d := sess.direct
	call := d.call
	call.Wait()
	<-d.written
	d.call = nil
	switch {
	case d.overflow:
		sess.outDead, sess.quitting = true, true
	case d.failed != nil:
		sess.closing(metrics.CloseWriteError)
		sess.outDead, sess.quitting = true, true
	default:
		sess.noteReplySize(call)
	}
	call.Reset()
	d.spare = call
}

// directInFlight reports whether a direct reply is yet to be waited for.
// A parked session has no batch state, and so nothing in flight.
func (sess *Session) directInFlight() bool {
	return sess.sessionBatch != nil && sess.direct != nil && sess.direct.call != nil
}
