package proxy

import "github.com/redproxy/redproxy/internal/commands"

// Seams of the data path. Each feature owns one file that fills in its
// hooks; NewServer builds the features, in one list, and the session calls
// them in this order for every command:
//
//	prepareBatch  once per batch, before any command (guard: decide the batch)
//	guardStep     refuse, rewrite, or add fix-ups          (guard.go)
//	tierStep      answer from the local tier               (tier.go)
//	flightStep    join a coalesced fetch                   (flight.go)
//
// A step returns true when it has recorded the command's reply slot itself.
//
// Three events fan out to the features that keep state across a command's
// trip, below: writeForwarded, batchFlushed and sessionClosed. Each calls
// the local tier, then stampede protection. Neither depends on the other
// having run first (the tier's marks and the miss holds' pending writes are
// separate); the order is fixed so that it is the same in all three, and
// the same as for relayed writes (relayhooks.go, which keeps its own
// per-feature fan-out because those writes complete later).

// writeForwarded is called for every write before it is sent upstream.
func (sess *Session) writeForwarded(cmd *commands.Command, args [][]byte) {
	switch {
	case sess.srv.router != nil:
		sess.clusterWrote(cmd, args)
	case sess.srv.routes != nil:
		sess.routeWriteForwarded(cmd, args)
	default:
		sess.wroteMoves = sess.backend().Moves() + 1
	}
	sess.tierWriteForwarded(cmd, args)
	sess.flightWriteForwarded(cmd, args)
	sess.replicaWriteForwarded()
}

// batchFlushed is called when every reply of the batch has arrived.
func (sess *Session) batchFlushed() {
	if sess.srv.router != nil && sess.wroteSlot > 0 && sess.wroteMoves == 0 {
		sess.clusterWriteAnswered()
	}
	sess.tierBatchFlushed()
	sess.flightBatchFlushed()
	sess.replicaBatchFlushed()
}

// sessionClosed is called once when the client's connection ends.
func (sess *Session) sessionClosed() {
	sess.tierSessionClosed()
	sess.flightSessionClosed()
}
