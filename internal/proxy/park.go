package proxy

import (
	"errors"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redproxy/redproxy/internal/idlepark"
)

// Parking idle clients (server.idle_park_after, issue 10).
//
// A client's goroutine waiting in ReadBatch costs its stack (4 KB once it
// has served a request) for as long as the client stays connected. A
// client that has been idle for idle_park_after, in a plain state, gives
// its goroutine up: its socket waits in the server's idlepark.Parker, and a
// new goroutine picks the session up when the client sends again. Nothing
// is added per request: the session publishes "waiting, parkable" with one
// atomic store before ReadBatch and takes it back with one CAS after; a
// sweeper ticking in the background asks long-waiting sessions to park by
// moving their read deadline to now, as interrupt does, and the session
// itself, seeing the timeout and the request, parks.
//
// Plain state: the Reader reads the socket directly and holds none of the
// client's bytes (so nothing can be buffered above the socket: not TLS,
// not a PROXY-protocol connection with bytes read past its header), no
// pinned connection (MULTI, WATCH), no aborted transaction, no cluster
// MULTI, no write whose reply is still due. Relays (pub/sub, MONITOR,
// tracking) and blocking commands run inside a batch and never reach
// ReadBatch, so they never park. A client that fills a miss hold may park:
// the hold is keyed by its id, and if it hangs up meanwhile the parked
// socket reports it (EPOLLRDHUP) and the session ends as usual, releasing
// its holds.

// The session's park state, in park.state.
const (
	parkBusy    int32 = iota // serving, or not parkable
	parkWaiting              // in ReadBatch, in a plain state
	parkAsked                // the sweeper moved the read deadline to now
	parkParked               // in the Parker (under the session id); no goroutine
)

// sessionPark is a session's part in parking. It is kept small: every
// connection carries it, and it keeps Session within its allocation size
// class.
type sessionPark struct {
	state atomic.Int32
	// Only the session goroutine (or the one resuming it) writes these.
	keepDue   bool // the next wait continues the current one, with its due
	clearDead bool // the read deadline must be cleared (no idle_timeout)
	// due is when idle_timeout ends the current wait, Unix ns; 0: never.
	// The sweeper reads it for parked sessions.
	due atomic.Int64
	// idle is server.idle_timeout as it was when the client connected: a
	// reload applies to clients connected after it, resumed or not.
	idle time.Duration
}

// serverPark is the server's parker and its sweeper.
type serverPark struct {
	parker *idlepark.Parker // nil: parking unsupported
	once   sync.Once
	ended  sync.Once // stopParking ran (Shutdown may be called again)
	stop   chan struct{}
	done   chan struct{}
}

// startParking starts the parker and its sweeper, once, with the first
// listener. Where epoll is missing, clients keep their goroutines.
func (s *Server) startParking() {
	s.park.once.Do(func() {
		p, err := idlepark.New()
		if err != nil {
			if !errors.Is(err, idlepark.ErrUnsupported) {
				s.log.Warn("idle clients will not be parked", "err", err)
			}
			return
		}
		s.park.parker = p
		s.park.stop = make(chan struct{})
		s.park.done = make(chan struct{})
		s.metrics.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "redproxy_client_connections_parked",
			Help: "Idle client connections parked without a goroutine (server.idle_park_after).",
		}, func() float64 { return float64(p.Len()) }))
		go s.sweepParking()
	})
}

// stopParking stops the sweeper and the parker; every session has ended.
func (s *Server) stopParking() {
	s.park.once.Do(func() {}) // none may start after this
	if s.park.parker == nil {
		return
	}
	s.park.ended.Do(func() {
		close(s.park.stop)
		<-s.park.done
		s.park.parker.Close()
	})
}

// parkTick is how often the sweeper looks: often enough that a client
// parks within about 1.5 × idle_park_after and a parked one is closed
// within a second of its idle_timeout.
func parkTick(after time.Duration) time.Duration {
	return min(max(after/2, 10*time.Millisecond), time.Second)
}

// releaseAfterParks is how many parkings free enough goroutine stacks (4 KB
// each) to be worth a forced collection that returns them to the OS.
const releaseAfterParks = 1024

// sweepParking asks sessions waiting longer than idle_park_after to park,
// and wakes parked sessions whose idle_timeout is due, so that they close.
func (s *Server) sweepParking() {
	defer close(s.park.done)
	var ask, wake []*Session
	var asked int // parkings asked for since memory was last given back
	released := time.Now()
	tick := time.NewTimer(parkTick(s.Config().Server.IdleParkAfter.Duration))
	defer tick.Stop()
	for {
		select {
		case <-s.park.stop:
			return
		case <-tick.C:
		}
		after := s.Config().Server.IdleParkAfter.Duration
		now := time.Now()
		s.mu.Lock()
		for sess := range s.sessions {
			switch sess.park.state.Load() {
			case parkWaiting:
				since := sess.list.active.Load()
				if since == 0 {
					since = sess.createdAt.UnixNano()
				}
				if after > 0 && now.UnixNano()-since >= int64(after) {
					ask = append(ask, sess)
				}
			case parkParked:
				if due := sess.park.due.Load(); due != 0 && now.UnixNano() >= due {
					wake = append(wake, sess)
				}
			}
		}
		s.mu.Unlock()
		for _, sess := range ask {
			sess.askPark()
		}
		for _, sess := range wake {
			sess.wake()
		}
		asked += len(ask)
		if asked >= releaseAfterParks && (len(ask) == 0 || time.Since(released) >= time.Minute) {
			// The parked goroutines' stacks are free heap now, which the
			// runtime would return to the OS only slowly (and a client
			// burst that parks leaves garbage the next GC is far from):
			// give it back once the burst is over.
			debug.FreeOSMemory()
			asked, released = 0, time.Now()
		}
		clear(ask)
		clear(wake)
		ask, wake = ask[:0], wake[:0]
		if cap(ask) > 1024 {
			ask = nil // a burst of parking does not stay allocated
		}
		tick.Reset(parkTick(after))
	}
}

// askPark moves the read deadline of a session waiting in ReadBatch to
// now, so that it looks at parking.
func (sess *Session) askPark() {
	// sess.mu orders this deadline change before the session taking its
	// state back (answerPark), so that the session's restored deadline is
	// the last word.
	sess.mu.Lock()
	if sess.park.state.CompareAndSwap(parkWaiting, parkAsked) {
		sess.nc.SetReadDeadline(time.Now())
	}
	sess.mu.Unlock()
}

// wake resumes a parked session, for an interrupt, a kill or its idle
// timeout; a session that is not parked notices those by itself.
func (sess *Session) wake() {
	p := sess.srv.park.parker
	if p == nil || sess.park.state.Load() != parkParked {
		return
	}
	if p.Unpark(uint64(sess.id)) {
		go sess.resume()
	}
}

// resume serves a parked session again, on a new goroutine, with a Reader
// and Call of its own again.
func (sess *Session) resume() {
	sess.park.state.Store(parkBusy)
	sess.rd = sess.newReader()
	sess.sessionBatch = newSessionBatch()
	sess.serve()
}

// parkable reports whether the session may park if it stays idle: see the
// top of this file for why each condition.
func (sess *Session) parkable() bool {
	return sess.srv.park.parker != nil && sess.rd.Parkable() &&
		sess.pin.pipe == nil && sess.abort.reason == nil && !sess.cmulti.open &&
		!sess.quitting && !sess.outDead &&
		!sess.tierWrites.Pending() && !sess.flightWrites.Pending()
}

// readDeadline sets the deadline of the wait about to start: idle_timeout
// from its start, which a wait continued after a park keeps.
func (sess *Session) readDeadline(idle time.Duration) {
	switch {
	case idle > 0:
		due := sess.park.due.Load()
		if !sess.park.keepDue {
			due = time.Now().Add(idle).UnixNano()
			sess.park.due.Store(due)
		}
		sess.nc.SetReadDeadline(time.Unix(0, due))
	case sess.park.clearDead:
		sess.nc.SetReadDeadline(time.Time{})
	}
	sess.park.keepDue, sess.park.clearDead = false, false
}

// answerPark is called when the sweeper asked the session to park while it
// waited in ReadBatch, which returned got requests and err. It parks the
// session (parked) or undoes the request: the deadline it moved is put
// back, and when only that deadline ended the wait, the wait is retried
// (retry).
func (sess *Session) answerPark(got int, err error, idle time.Duration) (parked, retry bool) {
	sess.mu.Lock() // the sweeper's SetReadDeadline is done
	sess.park.state.Store(parkBusy)
	sess.mu.Unlock()
	timedOut := got == 0 && errors.Is(err, os.ErrDeadlineExceeded)
	if timedOut && sess.interrupted.Load() {
		return false, false // interrupt moved the deadline too: end
	}
	due := sess.park.due.Load()
	if timedOut && idle > 0 && time.Now().UnixNano() >= due {
		return false, false // idle_timeout is due: end
	}
	if timedOut && sess.rd.Parkable() && sess.parkNow() {
		return true, false
	}
	if idle > 0 {
		sess.nc.SetReadDeadline(time.Unix(0, due))
	} else {
		sess.nc.SetReadDeadline(time.Time{})
	}
	sess.park.keepDue = timedOut
	return false, timedOut
}

// parkNow gives back the session's buffers, its Reader and its Call, and
// puts its socket in the parker. On true the goroutine must return at
// once without touching the session: another one may already be serving
// it.
func (sess *Session) parkNow() bool {
	p := sess.srv.park.parker
	sc, ok := sess.nc.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	rd, b := sess.rd, sess.sessionBatch
	sess.releaseBuffers()
	sess.rd, sess.sessionBatch = nil, nil // resume makes new ones
	// For the goroutine that resumes it: the wait goes on, with its
	// idle_timeout (due, which the sweeper watches meanwhile), and without
	// the deadline the sweeper set.
	sess.park.keepDue, sess.park.clearDead = true, true
	sess.park.state.Store(parkParked)
	undo := func() {
		sess.park.state.Store(parkBusy)
		sess.park.keepDue, sess.park.clearDead = false, false
		sess.rd, sess.sessionBatch = rd, b
	}
	if err := p.Park(uint64(sess.id), rc, sess.resume); err != nil {
		undo()
		return false
	}
	// An interrupt that looked before the state said parked did not wake
	// the session: take it back and end it here. (If the Unpark fails,
	// someone else resumed it.)
	if sess.interrupted.Load() && p.Unpark(uint64(sess.id)) {
		undo()
		return false
	}
	return true
}

// releaseBuffers gives back everything a session keeps between batches for
// reuse, so that a parked client holds no buffer at all.
func (sess *Session) releaseBuffers() {
	sess.rd.Release()
	sess.call.Release()
	sess.out, sess.local, sess.slots, sess.batchReqs, sess.aclKeys = nil, nil, nil, nil, nil
	// The per-batch scratch of routes, the mirror and namespaces: empty
	// between batches, where a session parks.
	sess.route.keys = nil
	sess.mirrorS = nil
	if sess.ns.w != nil {
		*sess.ns.b = nsBatch{}
		sess.ns.w.Release()
	}
}

// ParkedClients is how many client connections are parked right now.
func (s *Server) ParkedClients() int {
	if s.park.parker == nil {
		return 0
	}
	return s.park.parker.Len()
}
