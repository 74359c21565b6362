package proxy

import (
	"errors"
	"sync"

	"github.com/redproxy/redproxy/internal/bufpool"
	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/stampede"
	"github.com/redproxy/redproxy/internal/upstream"
)

// Stampede protection (coalescing, miss holds, early refresh) lives in
// internal/stampede behind stampede.Protection; this file wires it to the
// session: which reads may go there, its way upstream, and the write
// hooks. Each session keeps its own writes in flight (Session.flightWrites).

func initFlight(s *Server) error {
	m := stampede.NewMetrics
	if s.routes != nil {
		m = s.routes.stampedeMetrics
	}
	s.flight.Store(s.newFlight(s.cfg.Stampede, m(s.metrics.Registry)))
	return nil
}

// newFlight builds stampede protection for c. A reload builds a new one
// with the same metrics.
func (s *Server) newFlight(c stampede.Config, m *stampede.Metrics) *stampede.Protection {
	return stampede.New(c, s.cmdSet().table, m, s.fetch)
}

// fetchCalls are the Calls of stampede protection's fetches.
var fetchCalls = sync.Pool{New: func() any { return upstream.NewCall() }}

// fetch is stampede protection's way upstream (a stampede.Fetcher): cmd
// and then go on a Call of their own, so a shared fetch depends neither on the
// leader's connection nor on its batch, to a shared connection of the
// upstream in force now (in cluster mode, of the key's node). The replies are appended to dst (a lone read's:
// the leader's output of local replies; the group copies them for waiters).
func (s *Server) fetch(db int, resp3 bool, cmd, then, dst []byte) ([]byte, error) {
	c := fetchCalls.Get().(*upstream.Call)
	defer func() {
		c.Reset()
		fetchCalls.Put(c)
	}()
	// Fetches are coalescable reads, and PTTL: Redis answers them during
	// CLIENT PAUSE WRITE.
	c.AddRead(cmd)
	if then != nil {
		c.AddRead(then)
	}
	// The replies go to clients, none of which may be sent more than
	// client_output_limit: a longer reply is dropped as it arrives, not
	// kept whole for clients that would be closed for it (flightStep).
	c.SetReplyLimit(int(s.Config().Server.ClientOutputLimit))
	switch {
	case s.routes != nil:
		s.routedFetch(c, db, resp3, cmd)
	case s.router != nil:
		// To the node of the key's slot, following MOVED and ASK as any
		// read does. A cluster has database 0 only: SELECT of another
		// is refused (clusterStep), so db is 0 here.
		s.router.Do(c, resp3)
	default:
		s.backend.Pool(db, resp3).Do(c)
	}
	for i := range c.Len() {
		r, err := c.Reply(i)
		if err != nil {
			return nil, err
		}
		if n := len(dst) + len(r); n > cap(dst) && n > idleKeep {
			// A large value: a buffer from bufpool, which Session.idle
			// gives back (a RESP3 client reading 100 KB values at -P 1
			// made and dropped one per read). The old one is left to the
			// collector: what else points into it is not known here.
			dst = append(bufpool.Get(n)[:0], dst...)
		}
		dst = append(dst, r...)
	}
	return dst, nil
}

// flightStep lets a read that is the only command in its batch join a
// coalesced fetch or a miss hold. A coalesced read runs at the fetch's
// time, possibly on another connection, so any other command of the same
// batch could be reordered around it (see package stampede).
func (sess *Session) flightStep(r *request) bool {
	fs := sess.srv.flight.Load()
	// The session does not call this in MULTI, under WATCH or when relayed;
	// the pin check is a second line of defence.
	if fs == nil || len(sess.batchReqs) != 1 || sess.pin.pipe != nil || r.cmd == nil || r.blocking {
		return false
	}
	if sess.curMute {
		// CLIENT REPLY OFF or SKIP: the client never sees this read's
		// nil, so it must not become a miss hold's filler (every other
		// reader then waited the hold's timeout out, found by review),
		// and has nothing to gain from a shared fetch.
		return false
	}
	if sess.replicaCandidate(r) {
		return false // a replica may answer it (replicas.go); fetches go to the primary
	}
	if sess.srv.routes != nil {
		if _, _, cross := sess.routeKeys(r); cross != nil {
			// Keys on two upstreams, or a read routes refuse: the flush
			// splits or refuses it (route.Plan); a fetch would have sent
			// it whole to the default upstream (found by review).
			return false
		}
	}
	if sess.directLead(r) {
		if l, ok := fs.Begin(r.cmd, r.Args, r.Raw, sess.db, sess.resp3); ok {
			// The read leads its fetch, forwarded as a direct reply: the
			// pipe's reader ends the lead as it writes the reply
			// (direct.go), and this goroutine goes back to reading.
			sess.directState().lead = l
			return false
		}
	}
	// The reply lands in the batch's local replies without a copy of its own.
	buf, start := sess.localBuf()
	// sess.left lets a read held by a miss hold give up when its client
	// leaves, as a blocking command does (Session.blocking).
	out, handled, err := fs.Read(r.cmd, r.Args, r.Raw, sess.db, sess.resp3, sess.id, sess.left, buf)
	switch {
	case !handled:
		return false // go upstream with the rest of the data path
	case err != nil:
		sess.flightFailed(r, err)
	default:
		sess.finishLocal(r.m, out, start)
		sess.mirrorNote(r)
	}
	return true
}

// flightFailed answers a read stampede protection took (flightStep, and
// tierHeldFill for the tier's fills) and could not answer with a reply.
func (sess *Session) flightFailed(r *request, err error) {
	switch {
	case errors.Is(err, stampede.ErrClientGone):
		// Nobody to answer: end the session now, as blocking does,
		// rather than when the hold would have ended.
		sess.closing(metrics.CloseClient) // or the interruption's reason
		sess.quitting = true
	case errors.Is(err, upstream.ErrOutputLimit):
		// The reply was longer than the output limit (fetch): the
		// client is closed, as for a reply of its own Call.
		sess.overLimit()
	default:
		sess.replyLocal(r.m, errorReply(err))
	}
}

// flightWriteForwarded remembers writes of keys under a hold or early
// refresh rule: when their replies are in, holds end and δ is sampled.
func (sess *Session) flightWriteForwarded(cmd *commands.Command, args [][]byte) {
	if fs := sess.srv.flight.Load(); fs != nil {
		fs.WriteStart(&sess.flightWrites, sess.db, cmd, args)
	}
}

// flightWriteRefused is told of a write the proxy refused: the holds and
// early refreshes this client fills on its keys end with the batch.
func (sess *Session) flightWriteRefused(cmd *commands.Command, args [][]byte) {
	if fs := sess.srv.flight.Load(); fs != nil && mayWrite(cmd) {
		fs.WriteRefused(&sess.flightWrites, sess.db, cmd, args, sess.id)
	}
}

// flightBatchFlushed tells the rules about the writes whose replies are
// now in: only then may held reads fetch again and see them.
func (sess *Session) flightBatchFlushed() {
	if sess.flightWrites.Pending() {
		sess.flightWrites.Done()
	}
}

// flightSessionClosed ends the holds and early refreshes this client was
// filling: it will not write them now, and its waiters must not wait for
// the timeout.
func (sess *Session) flightSessionClosed() {
	if fs := sess.srv.flight.Load(); fs != nil {
		fs.ClientClosed(&sess.flightWrites, sess.id)
	}
}
