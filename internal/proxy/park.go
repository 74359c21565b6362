package proxy

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
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
	// cameBack: the client was parked early (under pressure) and sent
	// again before idle_park_after had passed, so it is not as idle as it
	// looked; it parks only after idle_park_after from then on. Written
	// before the session publishes parkWaiting, which the sweeper loads
	// before reading it.
	cameBack bool
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
	// hangups watches clients blocked in a command for their leaving
	// (watchHangup); nil where parking is unsupported.
	hangups *idlepark.Parker
	// started is parker for readers that may run while startParking
	// does (ParkedClients): sessions read parker itself, safely, since
	// they start after it.
	started atomic.Pointer[idlepark.Parker]
	once    sync.Once
	ended   sync.Once // stopParking ran (Shutdown may be called again)
	stop    chan struct{}
	done    chan struct{}
	// kick asks the sweeper to look soon: many clients are connected and
	// unparked (kickParking). pressed: its last look found pressure.
	kick    chan struct{}
	pressed atomic.Bool
	// held is how many unparked sessions the last look found that do not
	// count towards pressure (busy, came back, never parkable), which
	// kickParking leaves out: a server with that many long-lived clients
	// does not look 20 times a second for every new connection.
	held atomic.Int64
	// pressure is parkPressure, or a test's own (SetParkPressure); tickCap
	// is the longest pause between looks, a second but in tests.
	pressure atomic.Int64
	tickCap  atomic.Int64
	sweeps   atomic.Int64       // looks so far, for tests
	armed    atomic.Int64       // the pause the sweeper armed last, for tests
	early    prometheus.Counter // parkings asked for early, under pressure
}

// Parking under pressure. Every client connected at once leaves something
// in Go's runtime for good: its goroutine's record (about 450 bytes, which
// the runtime keeps for reuse and never frees) and its poller descriptor
// (about 250 bytes, likewise). So the memory idle clients cost is set by
// how many were connected and not yet parked at the same moment: 10,000
// clients that connect within a second and then idle cost 1.96 KiB each
// when they park after idle_park_after (2 s), 1.30 after 100 ms, and 1.08
// with the pressure rule below (bench/README.md, "Idle connections"). Parking every client after 100
// ms would cost a park and a resume per request to a client whose requests
// come 100 ms to 2 s apart, so only when more than parkPressure clients
// wait unparked does the sweeper park the ones idle for pressureParkAfter,
// and for pressureLinger after the last look that found that many (so the
// end of a burst parks early too, but a trickle of new clients after it
// does not keep the pressure on); and a client that comes back before
// idle_park_after is not parked early again (cameBack), while one whose
// requests come further apart than that may be, once per idle spell.
const (
	parkPressure      = 1024
	pressureParkAfter = 100 * time.Millisecond
	pressureTick      = 50 * time.Millisecond
	pressureLinger    = time.Second
)

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
		if h, err := idlepark.NewHangups(); err == nil {
			s.park.hangups = h
		} else {
			s.log.Warn("clients blocked in a command will be checked for leaving every 50 ms", "err", err)
		}
		s.park.started.Store(p)
		s.park.stop = make(chan struct{})
		s.park.done = make(chan struct{})
		s.park.kick = make(chan struct{}, 1)
		s.park.pressure.CompareAndSwap(0, parkPressure)
		s.park.tickCap.CompareAndSwap(0, int64(time.Second))
		s.park.early = prometheus.NewCounter(prometheus.CounterOpts{
			Name: "redproxy_client_parks_early_total",
			Help: "Idle clients asked to park before server.idle_park_after, because more than 1024 clients waited unparked at once.",
		})
		s.metrics.Registry.MustRegister(s.park.early, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
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
		if s.park.hangups != nil {
			s.park.hangups.Close()
		}
	})
}

// parkTick is how often the sweeper looks: often enough that a client
// parks within about 1.5 × idle_park_after and a parked one is closed
// within a second of its idle_timeout.
func (s *Server) parkTick(after time.Duration) time.Duration {
	return min(max(after/2, 10*time.Millisecond), time.Duration(s.park.tickCap.Load()))
}

// releaseAfterParks is how many parkings free enough goroutine stacks (4 KB
// each) to be worth a forced collection that returns them to the OS.
const releaseAfterParks = 1024

// sweepParking asks sessions waiting longer than idle_park_after to park
// (or, under pressure, pressureParkAfter), and wakes parked sessions whose
// idle_timeout is due, so that they close.
func (s *Server) sweepParking() {
	defer close(s.park.done)
	var ask, soon, wake []*Session
	var asked int // parkings asked for since memory was last given back
	released := time.Now()
	var pressedUntil int64 // Unix ns
	// The first look is at once (it finds few clients, if any): every
	// later pause is then set by a look, so a tick cap a test sets holds
	// from the first look that starts after it, whenever the sweeper
	// started. Arming the first pause before the first look raced with it.
	tick := time.NewTimer(0)
	due := time.Now()
	defer tick.Stop()
	for {
		select {
		case <-s.park.stop:
			return
		case <-s.park.kick:
			// Look within pressureTick, not at once: startSession kicks
			// on every connection while many are unparked, and one look
			// covers them all.
			if time.Until(due) > pressureTick {
				tick.Reset(pressureTick)
				due = time.Now().Add(pressureTick)
			}
			continue
		case <-tick.C:
		}
		after := s.Config().Server.IdleParkAfter.Duration
		early := min(after, pressureParkAfter)
		now := time.Now().UnixNano()
		var waiting int // waiting sessions that may park early
		s.mu.Lock()
		unparked := len(s.sessions)
		for sess := range s.sessions {
			switch sess.park.state.Load() {
			case parkWaiting:
				if after <= 0 {
					continue
				}
				switch idle := now - sess.lastActive(); {
				case idle >= int64(after):
					ask = append(ask, sess)
				case sess.park.cameBack:
				default:
					waiting++
					if idle >= int64(early) {
						soon = append(soon, sess)
					}
				}
			case parkParked:
				unparked--
				if due := sess.park.due.Load(); due != 0 && now >= due {
					wake = append(wake, sess)
				}
			}
		}
		s.mu.Unlock()
		s.park.sweeps.Add(1)
		s.park.held.Store(int64(unparked - waiting))
		// Pressure lasts pressureLinger after the last look that found it,
		// however few wait meanwhile, looking every pressureTick: so the
		// clients of a burst park once idle pressureParkAfter, though none
		// had when it was found, the end of the burst parks early too, and
		// the burst's parkings end in one release of memory below instead
		// of some waiting idle_park_after past it.
		if int64(waiting) >= s.park.pressure.Load() {
			pressedUntil = now + int64(pressureLinger)
		}
		pressed := now < pressedUntil
		s.park.pressed.Store(pressed)
		if pressed {
			s.park.early.Add(float64(len(soon)))
			ask = append(ask, soon...)
		}
		for _, sess := range ask {
			sess.askPark()
		}
		for _, sess := range wake {
			sess.wake()
		}
		asked += len(ask)
		if asked >= releaseAfterParks && (len(ask) == 0 && !pressed || time.Since(released) >= time.Minute) {
			// The parked goroutines' stacks are free heap now, which the
			// runtime would return to the OS only slowly (and a client
			// burst that parks leaves garbage the next GC is far from):
			// give it back once the burst is over (nothing to park, and
			// no pressure: under pressure a look that finds no one idle
			// long enough yet is the middle of a burst). Two collections: the
			// first only moves what sync.Pools hold (the burst's 16 KB
			// read buffers, the pipes' scratch) to their victim caches,
			// which the second frees.
			runtime.GC()
			debug.FreeOSMemory()
			asked, released = 0, time.Now()
		}
		clear(ask)
		clear(soon)
		clear(wake)
		ask, soon, wake = ask[:0], soon[:0], wake[:0]
		if cap(ask) > 1024 || cap(soon) > 1024 {
			ask, soon = nil, nil // a burst of parking does not stay allocated
		}
		next := s.parkTick(after)
		if pressed {
			next = pressureTick
		}
		tick.Reset(next)
		due = time.Now().Add(next)
		s.park.armed.Store(int64(next))
	}
}

// kickParking tells the sweeper that n clients are connected: when that
// many may be waiting unparked, it looks for pressure within pressureTick
// rather than at its next tick, which may be a second away while a burst
// connects.
func (s *Server) kickParking(n int) {
	p := s.park.parker
	if p == nil || int64(n) < s.park.pressure.Load() || s.park.pressed.Load() {
		return
	}
	if int64(n-p.Len())-s.park.held.Load() < s.park.pressure.Load() {
		return
	}
	select {
	case s.park.kick <- struct{}{}:
	default:
	}
}

// lastActive is when the client last sent a batch, or connected if it has
// sent none, Unix ns: where its idle time, for parking and CLIENT LIST,
// starts.
func (sess *Session) lastActive() int64 {
	if a := sess.list.active.Load(); a != 0 {
		return a
	}
	return sess.createdAt
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

// resume serves a parked session again, on a new goroutine, with its
// net.Conn, a Reader and batch state of its own again.
func (sess *Session) resume() {
	sess.park.state.Store(parkBusy)
	if !sess.park.cameBack {
		after := sess.srv.Config().Server.IdleParkAfter.Duration
		sess.park.cameBack = time.Now().UnixNano()-sess.lastActive() < int64(after)
	}
	sess.reattach()
	sess.rd = sess.newReader()
	sess.sessionBatch = newSessionBatch(sess.srv.cmdSet())
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

// parkNow gives back the session's buffers, its Reader, its batch state
// and (detach) its net.Conn, and puts its socket in the parker. On true
// the goroutine must return at once without touching the session: another
// one may already be serving it.
func (sess *Session) parkNow() bool {
	p := sess.srv.park.parker
	cc, ok := sess.nc.(*clientConn)
	if !ok {
		return false
	}
	// Not a plain TCP connection (a PROXY-protocol one keeps the address
	// from its header): parked with its net.Conn.
	detached := sess.detach()
	if !detached {
		if _, err := cc.SyscallConn(); err != nil {
			return false
		}
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
		sess.sessionBatch = b
		if detached {
			// The Reader read the closed net.Conn's socket.
			sess.reattach()
			rd = sess.newReader()
		}
		sess.rd = rd
	}
	if err := p.Park(uint64(sess.id), (*parkedClient)(cc)); err != nil {
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

// parkedClient is a client's connection as the parker holds it: the
// session's own clientConn, so that a parked client keeps no object of
// its own for the parker.
type parkedClient clientConn

// Control calls f with the socket's descriptor: the detached one, or that
// of the net.Conn the session parked with. Conn and the descriptor are
// read under sess.mu, which reattach holds to change them.
func (c *parkedClient) Control(f func(fd uintptr)) error {
	c.sess.mu.Lock()
	conn, fd := c.Conn, c.parked.fd
	c.sess.mu.Unlock()
	if conn == nil {
		f(uintptr(fd))
		return nil
	}
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return errors.ErrUnsupported
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	return rc.Control(f)
}

// Resume serves the session again (idlepark.Conn).
func (c *parkedClient) Resume() { c.sess.resume() }

// detachedSocket is a parked client's socket without the net.Conn that
// owned it: its descriptor, kept in the clientConn (which holds it while
// its Conn is nil), so that a parked client holds none of net's objects
// (its connection, descriptor and addresses: about 300 bytes on the heap,
// and a poller descriptor and finalizer outside it, which the runtime
// reuses for later connections) and keeps no object of its own for its
// socket. The two addresses CLIENT LIST shows are read from the socket
// when asked for (socketAddr).
type detachedSocket struct {
	fd     int32
	closed bool // closed while parked: the session closes it on resuming
}

// detach takes a plain TCP client's socket out of its net.Conn: it keeps
// a duplicate of the descriptor and closes the net.Conn, which leaves the
// socket open (no FIN: the duplicate still refers to it). False when the
// connection is not a plain TCP one, or the descriptor could not be
// duplicated: the session then parks with its net.Conn. Three system
// calls (fcntl, epoll_ctl, close), once per idle period.
func (sess *Session) detach() bool {
	cc, ok := sess.nc.(*clientConn)
	if !ok {
		return false
	}
	tc, ok := cc.Conn.(*net.TCPConn)
	if !ok {
		return false
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return false
	}
	fd, derr := -1, error(nil)
	if err := rc.Control(func(f uintptr) { fd, derr = dupSocket(int(f)) }); err != nil || derr != nil {
		return false
	}
	sess.mu.Lock()
	cc.Conn, cc.parked = nil, detachedSocket{fd: int32(fd)}
	sess.mu.Unlock()
	// The raw writer refers to the net.Conn closed here: dropped with it,
	// or every parked client would keep its closed net.Conn, descriptor
	// record and writer alive. The session's goroutine is the only writer
	// of the client (it is parking), so nothing writes through it now.
	cc.sock.Store(nil)
	tc.Close()
	return true
}

// reattach gives a resumed session whose socket was detached a net.Conn
// again (net.FileConn: the socket's options stay as they were), and closes
// it at once if the client was killed while parked. If the runtime cannot
// take the socket back (out of descriptors), the session sees its
// connection fail and ends.
func (sess *Session) reattach() {
	cc, ok := sess.nc.(*clientConn)
	if !ok || cc.Conn != nil {
		return
	}
	f := os.NewFile(uintptr(cc.parked.fd), "")
	nc, err := net.FileConn(f) // a duplicate of f's descriptor
	if err == nil && nc.RemoteAddr() == nil {
		// The client reset its connection while parked: the socket has no
		// peer, which net.FileConn does not treat as an error but leaves
		// RemoteAddr nil, and everything that names the client would fail.
		nc.Close()
		err = syscall.ENOTCONN
	}
	if errors.Is(err, syscall.ENOTCONN) {
		err = io.EOF // the client reset its connection while parked
	} else if err != nil {
		sess.logger().Warn("parked client's socket could not be resumed; connection closed", "err", err)
	}
	if err != nil {
		nc = &failedConn{err: err, local: cc.LocalAddr(), remote: cc.RemoteAddr()}
	}
	sess.mu.Lock()
	cc.Conn = nc
	closed := cc.parked.closed
	cc.parked = detachedSocket{fd: -1}
	sess.mu.Unlock()
	// Only now: until Conn is set, CLIENT LIST reads the addresses from
	// this descriptor, whose number must not go to another socket first.
	f.Close()
	if closed {
		nc.Close()
	}
}

// socketAddr is the address getName (syscall.Getsockname or Getpeername)
// gives for a parked client's socket, as net would give it; a socket that
// has lost its peer gives an empty address.
func socketAddr(fd int32, getName func(int) (syscall.Sockaddr, error)) net.Addr {
	sa, err := getName(int(fd))
	if err != nil {
		return &net.TCPAddr{}
	}
	switch sa := sa.(type) {
	case *syscall.SockaddrInet4:
		return net.TCPAddrFromAddrPort(netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port)))
	case *syscall.SockaddrInet6:
		ip := netip.AddrFrom16(sa.Addr)
		if sa.ZoneId != 0 {
			ip = ip.WithZone(strconv.Itoa(int(sa.ZoneId)))
		}
		return net.TCPAddrFromAddrPort(netip.AddrPortFrom(ip, uint16(sa.Port)))
	}
	return &net.TCPAddr{}
}

// closeConn closes the client's connection from another goroutine than
// the session's (CLIENT KILL, a shutdown past its deadline): a parked
// session's socket is closed when it resumes. It ends the connection at
// once: a TLS one without the close_notify alert (closeForced).
func (sess *Session) closeConn() {
	cc, ok := sess.nc.(*clientConn)
	if !ok {
		sess.nc.Close()
		return
	}
	sess.mu.Lock()
	conn := cc.Conn
	if conn == nil {
		cc.parked.closed = true
	}
	sess.mu.Unlock()
	if conn != nil {
		// Outside the lock: closing a TLS connection may write. A session
		// detaching meanwhile has seen interrupted and does not stay
		// parked (parkNow).
		cc.closeForced(conn)
	}
}

// addrs are the client's address and the proxy's end of its connection,
// as CLIENT LIST shows them, read from another goroutine.
func (sess *Session) addrs() (remote, local string) {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	return sess.nc.RemoteAddr().String(), sess.nc.LocalAddr().String()
}

// failedConn stands for a detached socket that could not be resumed: every
// read and write fails, so the session ends as for a broken connection.
type failedConn struct {
	err           error
	local, remote net.Addr
}

func (c *failedConn) Read([]byte) (int, error)         { return 0, c.err }
func (c *failedConn) Write([]byte) (int, error)        { return 0, c.err }
func (c *failedConn) Close() error                     { return nil }
func (c *failedConn) LocalAddr() net.Addr              { return c.local }
func (c *failedConn) RemoteAddr() net.Addr             { return c.remote }
func (c *failedConn) SetDeadline(time.Time) error      { return nil }
func (c *failedConn) SetReadDeadline(time.Time) error  { return nil }
func (c *failedConn) SetWriteDeadline(time.Time) error { return nil }

// releaseBuffers gives back everything a session keeps between batches for
// reuse, so that a parked client holds no buffer at all.
func (sess *Session) releaseBuffers() {
	sess.rd.Release()
	sess.call.Release()
	sess.out, sess.local, sess.slots, sess.batchReqs, sess.aclKeys = nil, nil, nil, nil, nil
	// The per-batch scratch of routes, the mirror and namespaces: empty
	// between batches, where a session parks.
	sess.routeKeyPos = nil
	sess.mirrorS = nil
	if sess.ns.w != nil {
		*sess.ns.b = nsBatch{}
		sess.ns.w.Release()
	}
}

// ParkedClients is how many client connections are parked right now.
func (s *Server) ParkedClients() int {
	if p := s.park.started.Load(); p != nil {
		return p.Len()
	}
	return 0
}

// hangupWatch is a blocked client's socket in the server's hang-ups
// parker: Resume (the parker's, on the client's FIN or a reset) closes
// gone.
type hangupWatch struct {
	syscall.RawConn
	gone chan struct{}
}

func (w *hangupWatch) Resume() { close(w.gone) }

// watchHangup puts the client's socket in the server's hang-ups parker
// while it waits on a blocking command, and returns a channel closed when
// the client leaves (nil where that cannot be watched: the 50 ms check
// alone then sees it) and what takes the socket out again. Redis sees a
// blocked client leave at once and drops its block; checked every 50 ms
// only, the proxy's connection stayed blocked meanwhile and popped the
// next element pushed for a client that was gone (found by review: 8
// pushes in 10 lost when sent right after the worker closed).
func (sess *Session) watchHangup() (gone <-chan struct{}, stop func()) {
	h := sess.srv.park.hangups
	if h == nil {
		return nil, func() {}
	}
	sc, ok := socketOf(sess.nc).(syscall.Conn)
	if !ok {
		return nil, func() {}
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil, func() {}
	}
	w := &hangupWatch{RawConn: rc, gone: make(chan struct{})}
	key := uint64(sess.id)
	if err := h.Park(key, w); err != nil {
		return nil, func() {}
	}
	return w.gone, func() { h.Unpark(key) }
}
