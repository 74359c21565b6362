package proxy

import (
	"bytes"
	"math/bits"
	"strings"
	"time"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/resp"
	"github.com/redproxy/redproxy/internal/route"
	"github.com/redproxy/redproxy/internal/upstream"
)

// WAIT and WAITAOF with routes. On Redis they wait for every earlier write
// of the connection; through the proxy a client's writes went to the
// upstreams their keys route to, so the proxy waits on each of them
// (routeSession.wrote: every upstream the client has written to since it
// connected) and answers for the least replicated: a write is on N
// replicas only if every upstream's share of it is. Asked of [upstream]
// alone, as before, a WAIT after a write routed elsewhere answered with
// the replicas of a server that never saw the write.
//
// Writes are noted where their upstream is decided: routedDo for the
// shared connections (a split or fanned-out write on every upstream of
// its parts), writeForwarded for the pinned connection (WATCH, a held
// transaction at EXEC) and blocking commands, relayWrites.note for a
// relay's. A client that wrote to one upstream waits there as a client
// without routes waits on [upstream] (blocking, routeBlockingBackend);
// one that wrote nowhere, on [upstream].

// routeWrote notes that a write of the client's goes to upstream up.
func (sess *Session) routeWrote(up int) {
	rs := &sess.route
	bit := uint64(1) << up
	moves := sess.routeMoves(up) + 1
	if rs.moves == nil {
		if rs.wrote&^bit == 0 {
			rs.wrote = bit
			sess.wroteMoves = moves
			return
		}
		// A second upstream: each one's moves from now on.
		all := make([]uint32, len(sess.srv.routes.targets))
		all[bits.TrailingZeros64(rs.wrote)] = sess.wroteMoves
		rs.moves = &all
	}
	rs.wrote |= bit
	(*rs.moves)[up] = moves
	sess.wroteMoves = moves // nonzero: something was written (waitAfterMove)
}

// routeMoves is how often upstream up's connections of the client moved
// to another server (a Sentinel failover; for [upstream], a reload too).
func (sess *Session) routeMoves(up int) uint32 {
	if sess.srv.routes.targets[up].router != nil {
		return 0 // a cluster: no dedicated connection, WAIT answers why (backendFor)
	}
	b, _ := sess.backendFor(up)
	return b.Moves()
}

// routeWritesMoved reports whether an upstream the client wrote to has
// moved to another server since the client's last write to it: the
// server WAIT would ask never had that write (waitAfterMove).
func (sess *Session) routeWritesMoved() bool {
	rs := &sess.route
	if rs.moves == nil {
		return rs.wrote != 0 && sess.wroteMoves != sess.routeMoves(bits.TrailingZeros64(rs.wrote))+1
	}
	for w := rs.wrote; w != 0; w &= w - 1 {
		up := bits.TrailingZeros64(w)
		if (*rs.moves)[up] != sess.routeMoves(up)+1 {
			return true
		}
	}
	return false
}

// routeWriteForwarded notes a write on a dedicated connection
// (writeForwarded): the pinned one is on the transaction's upstream, a
// blocking command's on its keys'. A write on the shared connections is
// noted by routedDo, with the routes it is sent by.
func (sess *Session) routeWriteForwarded(cmd *commands.Command, args [][]byte) {
	switch {
	case sess.pin.pipe != nil:
		// (A pin with no upstream is [upstream]'s: pinFor.)
		sess.routeWrote(max(sess.pin.slot, route.Default))
	case sess.cur.blocking:
		up, _, err := sess.srv.routes.table.Load().Keys(cmd, args, &sess.routeKeyPos)
		if err == nil {
			sess.routeWrote(up)
		}
	}
}

// waitsOnSeveral reports whether WAIT or WAITAOF must wait on other
// upstreams than the one connection blocking would run it on: the client
// wrote to two upstreams or more, or under WATCH to another upstream than
// the pinned connection's.
func (sess *Session) waitsOnSeveral(cmd *commands.Command) bool {
	if sess.srv.routes == nil || cmd.Name != "wait" && cmd.Name != "waitaof" {
		return false
	}
	wrote := sess.route.wrote
	if sess.pin.pipe != nil {
		return wrote&^(uint64(1)<<max(sess.pin.slot, route.Default)) != 0
	}
	return wrote&(wrote-1) != 0
}

// upstreamWait is one upstream's part of a WAIT on several.
type upstreamWait struct {
	backend *upstream.Backend
	pipe    *upstream.Pipe
	call    *upstream.Call
	sent    bool
	dirty   bool // its state is not known to be clean: not to be reused
}

// waitEveryUpstream runs WAIT or WAITAOF r on every upstream the client
// wrote to, at once, each on a connection borrowed for it behind the
// wait marker (see blocking), and answers the least of their counts:
// WAIT's integer, WAITAOF's [numlocal, numreplicas] element by element.
// An upstream's error is the answer. CLIENT UNBLOCK of the client
// unblocks every one of them (blockState.more).
func (sess *Session) waitEveryUpstream(r *request) {
	m := r.m
	waits := make([]upstreamWait, 0, bits.OnesCount64(sess.route.wrote))
	// release gives the connections back; clean says whether those the
	// WAIT was sent on are as they were (one nothing was sent on is).
	release := func(clean bool) {
		for _, w := range waits {
			w.backend.ReleasePipe(w.pipe, sess.db, sess.resp3, !w.dirty && (clean || !w.sent))
		}
	}
	for ups := sess.route.wrote; ups != 0; ups &= ups - 1 {
		b, err := sess.backendFor(bits.TrailingZeros64(ups))
		var p *upstream.Pipe
		if err == nil {
			p, err = b.AcquirePipeFor(sess.db, sess.resp3, sess.left)
		}
		if err != nil {
			release(true)
			sess.replyLocal(m, errorReply(err))
			return
		}
		waits = append(waits, upstreamWait{backend: b, pipe: p, call: upstream.NewCall()})
	}
	raw := r.Raw
	if d := sess.guard.Decision(r.i); d != nil && d.Args != nil {
		raw = sess.guard.Encode(d.Args)
	}
	// The borrowed connections carry the client's name while it waits, as
	// blocking's does.
	named := sess.name != ""
	var first int
	more := make([]blockedConn, 0, len(waits)-1)
	var id int64
	for i := range waits {
		w := &waits[i]
		if refused := sess.markForWait(w.call, w.pipe, sess.srv.waitMarkers()); refused != nil {
			release(false)
			sess.replyLocal(m, refused)
			return
		}
		first = sess.fillBlockedCall(w.call, named, raw)
		rid, _ := w.backend.PipeID(w.pipe)
		if i == 0 {
			id = rid
		} else {
			more = append(more, blockedConn{id: rid, pipe: w.pipe, backend: w.backend})
		}
	}
	sess.block.setEvery(id, waits[0].pipe, waits[0].backend, &more)
	var sendErr error
	for i := range waits {
		w := &waits[i]
		if err := w.pipe.Send(w.call); err != nil {
			sendErr, w.dirty = err, true
			break
		}
		w.sent = true
	}
	if sendErr == nil {
		sess.sendEarlierReplies()
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	// done says whose Call has completed (its Done taken); lost, that
	// one's connection was lost under its WAIT; refused, the error an
	// upstream answered, which is the WAIT's answer whatever the others
	// count: waiting on for them (a WAIT 1 0 may never end) only kept the
	// client blocked (found by review: a -READONLY upstream and a WAIT
	// 1 0 hung the client).
	done := make([]bool, len(waits))
	lost := false
	var refused []byte
	finished := func(k int) {
		done[k] = true
		reply, err := waits[k].call.Reply(first)
		lost = lost || dedicatedLost(err)
		if refused == nil && err == nil && resp.IsError(reply) {
			refused = bytes.Clone(reply)
		}
	}
	// end closes every connection, which drops the client's WAITs on
	// every upstream, and waits for their Calls.
	end := func() {
		for _, w := range waits {
			w.pipe.Close()
		}
		for k, w := range waits {
			if w.sent && !done[k] {
				<-w.call.Done()
			}
		}
		sess.block.setEvery(0, nil, nil, nil)
		release(false)
	}
	for i := 0; sendErr == nil && i < len(waits) && !lost && refused == nil; {
		if done[i] {
			i++
			continue
		}
		select {
		case <-waits[i].call.Done():
			finished(i)
		case <-tick.C:
			if sess.left() {
				// As blocking does.
				end()
				sess.closing(metrics.CloseClient)
				sess.quitting = true
				return
			}
			// A connection lost on another upstream ends the WAIT now,
			// not when the first one's WAIT is answered.
			for k := i + 1; k < len(waits); k++ {
				if !done[k] {
					select {
					case <-waits[k].call.Done():
						finished(k)
					default:
					}
				}
			}
		}
	}
	if lost {
		// Whether every upstream's WAIT ran is unknown, as on a lost
		// connection to Redis: the client's closes with no reply, as in
		// blocking (upstreamlost.go).
		end()
		sess.closeUpstreamLost()
		return
	}
	if refused != nil {
		// The others' WAITs are dropped with their connections.
		end()
		sess.replyLocal(m, refused)
		return
	}
	if sendErr != nil {
		// Not sent everywhere: the connections that got the WAIT are not
		// clean (it may still be running there), and go.
		for _, w := range waits {
			if w.sent {
				w.pipe.Close()
				<-w.call.Done()
			}
		}
		sess.block.setEvery(0, nil, nil, nil)
		release(false)
		sess.replyLocal(m, errorReply(sendErr))
		return
	}
	sess.block.id.Store(0) // see blocking
	replies := make([][]byte, len(waits))
	var failed []byte
	for i := range waits {
		w := &waits[i]
		reply, err := w.call.Reply(first)
		if err != nil {
			reply = errorReply(err)
			w.dirty = true
		}
		if named && !namedBack(w.call, first) {
			w.dirty = true
		}
		if failed == nil && resp.IsError(reply) {
			failed = reply
		}
		replies[i] = reply
	}
	reply := failed
	if reply == nil {
		reply = resp.MergeMin(replies, func([]byte) []byte {
			return []byte("-ERR redproxy: an upstream answered " + strings.ToUpper(r.name) + " with an unexpected reply\r\n")
		})
	}
	sess.replyLocal(m, reply)
	sess.unblocked()
	release(true)
	sess.flush(time.Now())
}
