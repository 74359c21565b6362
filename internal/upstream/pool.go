package upstream

import (
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// Pool is a fixed set of Pipes to one Redis database with one protocol.
// Sends go to the pipes in turn so that many clients' batches are spread
// out, except that a Send joins the write a pipe's writer is about to make,
// so each write still merges what queues up meanwhile.
type Pool struct {
	pipes []*Pipe
	next  atomic.Uint32
	// settling is set while the pool's first dials are under way, until
	// settleBy at the latest (see settle).
	settling atomic.Bool
	settleBy time.Time

	// spare takes Calls of reads only (Call.AddRead) while every pipe has
	// a write pending or lags (Send); dialled the first time that
	// happens. Under CLIENT PAUSE WRITE Redis holds each connection at its
	// first write and still answers reads on the others, but with writers
	// on every pipe a read had nowhere to go but behind a paused write
	// (found by a probe: a client that only read waited out a 3 s pause,
	// and a 34 s one failed its GET at dead_timeout, where Redis answered
	// it in 8 ms). A write never goes there, so the spare lags only when
	// Redis answers nobody.
	opt     Options
	spareMu sync.Mutex
	spare   atomic.Pointer[Pipe]
	spareBy atomic.Int64 // nanotime by which the spare's first dial is done
	closed  bool         // guarded by spareMu: no spare is dialled after Close

	dialWaits atomic.Uint64 // Sends that waited for a dial (awaitDial)

	// shared is what the pipes share (Options.shared); held counts the
	// Sends that waited for room (sendRoom).
	shared poolShared
	held   atomic.Uint64
	// retired, closed when the Backend's generation the pool belongs to
	// is replaced (a reload's Switch, a Sentinel failover), and
	// successor, the pool that replaces it: a Call waiting for room
	// (sendRoom) has not been sent, and goes where a Send would go now.
	// Set by Backend.pool before the pool is used; nil otherwise.
	retired   <-chan struct{}
	successor func() *Pool
}

// poolShared is what a Pool's pipes share: the reply sizes they learn,
// and the signal that one has room again.
type poolShared struct {
	room  roomSignal
	sizes replySizes
}

// learn records the sizes of c's replies, each for its command, when
// large or expected to be (so that a value that shrank is forgotten).
func (s *poolShared) learn(c *Call) {
	if s == nil {
		return
	}
	start := 0
	for i, end := range c.ends {
		if i < len(c.parts) {
			s.sizes.learn(c.parts[i], end-start)
		}
		start = end
	}
}

// signal wakes the Sends waiting for room (a nil poolShared, a pipe
// outside a Pool, has none).
func (s *poolShared) signal() {
	if s != nil {
		s.room.signal()
	}
}

// learnReply records that cmd's reply is size bytes (a header read).
func (s *poolShared) learnReply(cmd []byte, size int) {
	if s != nil {
		s.sizes.learn(cmd, size)
	}
}

// replySizes remembers, for commands whose last reply was large
// (bigReplyMin), how large: the proxy cannot know a reply's size before
// Redis sends it, but the clients that make Redis hold large replies
// mostly ask the same commands again (a hot large value, a page of a
// list). A Call's expected size is what it adds to its pipe's backlog
// (backlogMax). While no command had a large reply, a Send pays an atomic
// load for it; after, a hash and a map lookup per command.
type replySizes struct {
	n    atomic.Int32 // entries; read without the lock
	mu   sync.RWMutex
	seed maphash.Seed
	m    map[uint64]int64
}

// bigReplyMin is the reply size from which replySizes remembers a
// command: smaller replies never add up to backlogMax in any pipeline a
// client can make (max_request_bytes bounds its commands).
const bigReplyMin = 64 << 10

// replySizesMax bounds the commands remembered; past it an arbitrary one
// is forgotten for each new one.
const replySizesMax = 4096

// expect returns the bytes c's replies are expected to take.
func (r *replySizes) expect(c *Call) int64 {
	if r.n.Load() == 0 {
		return 0
	}
	var sum int64
	r.mu.RLock()
	for _, part := range c.parts {
		sum += r.m[maphash.Bytes(r.seed, part)]
	}
	r.mu.RUnlock()
	return sum
}

// learn records that cmd's reply took size bytes.
func (r *replySizes) learn(cmd []byte, size int) {
	if size < bigReplyMin && r.n.Load() == 0 {
		return
	}
	if r.n.Load() > 0 {
		// The same value read again, as a hot one is: no write, which
		// would make every Send's lookup (expect) wait.
		r.mu.RLock()
		known, ok := r.m[maphash.Bytes(r.seed, cmd)]
		r.mu.RUnlock()
		if ok == (size >= bigReplyMin) && (!ok || abs(known-int64(size)) <= known/8) {
			// Within an eighth: an estimate need be no closer, and a
			// list or hash that grows by a little each time does not
			// take the write lock on every read of it.
			return
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.seed, r.m = maphash.MakeSeed(), make(map[uint64]int64)
	}
	h := maphash.Bytes(r.seed, cmd)
	if size < bigReplyMin {
		delete(r.m, h)
	} else {
		if _, ok := r.m[h]; !ok && len(r.m) >= replySizesMax {
			for k := range r.m {
				delete(r.m, k)
				break
			}
		}
		r.m[h] = int64(size)
	}
	r.n.Store(int32(len(r.m)))
}

// roomSignal wakes every Send waiting for a pool's pipes to have room
// (Pool.sendRoom): the channel a waiter took is closed when a pipe has
// room. Without waiters a signal costs an atomic load.
type roomSignal struct {
	waiting atomic.Int32
	mu      sync.Mutex
	ch      chan struct{}
}

// wait returns the channel closed by the next signal; the caller counts
// itself in waiting meanwhile.
func (r *roomSignal) wait() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ch == nil {
		r.ch = make(chan struct{})
	}
	return r.ch
}

// signal wakes the waiters, if any.
func (r *roomSignal) signal() {
	if r.waiting.Load() == 0 {
		return
	}
	r.mu.Lock()
	if r.ch != nil {
		close(r.ch)
		r.ch = nil
	}
	r.mu.Unlock()
}

// NewPool starts n pipes with the same options.
func NewPool(n int, opt Options) *Pool {
	if n < 1 {
		n = 1
	}
	p := &Pool{pipes: make([]*Pipe, n), opt: opt}
	p.opt.shared = &p.shared
	for i := range p.pipes {
		p.pipes[i] = NewPipe(p.opt)
	}
	return p
}

// Send hands c to the next pipe that is up, passing over pipes stuck
// behind a slow reply (a long script, CLIENT PAUSE) while another pipe is
// not: Redis answers other connections meanwhile (with -BUSY during a
// script), and so should the proxy. A Call of reads (Call.OnlyReads) also
// passes over pipes with a write pending, and goes to the spare when every
// pipe up has one or lags: under CLIENT PAUSE WRITE Redis holds a
// connection at its first write, and everything sent behind it waits for
// the pause, while reads on another connection are answered. A Call
// expected to have large replies (replySizes) goes only where it keeps
// the replies Redis holds for the connection within backlogMax, and waits
// for room, up to the dead timeout, while no pipe has it: Redis would
// otherwise hold whatever the proxy's clients ask, at any rate, in its
// output buffers. It returns ErrUnavailable only when no pipe is up.
func (p *Pool) Send(c *Call) error {
	c.expect = p.shared.sizes.expect(c)
	reads := c.OnlyReads()
	sent, busy, err := p.sendFree(c, reads)
	if sent {
		return err
	}
	if c.expect > 0 {
		if sent, err := p.sendRoom(c); sent {
			return err
		}
		// No room in time, or no pipe up: as any Call from here on,
		// and counted nowhere (sendBounded refuses nothing else).
		c.expect = 0
	}
	if reads && busy {
		if sp := p.sparePipe(); sp != nil && !sp.lagging.Load() && !sp.backlogged.Load() && p.spareUp(sp) {
			if err := sp.Send(c); err != ErrUnavailable {
				return err
			}
		}
		// The spare is not up: a pipe with a write pending takes it as
		// any Call.
		if sent, _, err := p.sendFree(c, false); sent {
			return err
		}
	}
	n := uint32(len(p.pipes))
	start := p.next.Load()
	for i := uint32(0); i < n; i++ {
		pp := p.pipes[(start+i)%n]
		if !pp.lagging.Load() && pp.heavy.Load() == 0 && !pp.backlogged.Load() {
			continue
		}
		if err := pp.Send(c); err != ErrUnavailable {
			return err
		}
	}
	// No pipe up. A dial under way, or one the Sends above asked for, may
	// bring one up in a moment: Redis back while the connections wait out
	// their backoff (an idle proxy's are up to reconnect_max apart).
	//
	// Sent again after each dial ends: a Send to pipes Redis is back for
	// asks them to dial (Pipe.askRedial), at once once another dial to
	// the address succeeded, and then waits for their dial, a moment.
	for range 3 {
		if !p.awaitDial() {
			break
		}
		if sent, _, err := p.sendFree(c, false); sent {
			return err
		}
	}
	// When Redis refused their handshake (a password missing
	// or wrong, maxclients), say why: a bare "upstream unavailable" left
	// the cause in the proxy's log only, while a MULTI or BLPOP, which
	// dial their own connection, named it (found by review).
	for _, pp := range p.pipes {
		if refused := pp.refused.Load(); refused != nil {
			return fmt.Errorf("%w: %w", ErrUnavailable, *refused)
		}
	}
	return ErrUnavailable
}

// redialWaitMax bounds how long Sends wait for a dial beyond the
// connection's ReconnectMin (dialWait): a Redis that is back answers a
// dial within milliseconds. (While its address is unreachable, each dial
// waiting out dial_timeout, no Send waits: dialGate.unreachable.)
const redialWaitMax = 250 * time.Millisecond

// awaitDial waits, while no pipe is up, for a dial under way or due to
// end: one of the pool's pipes' (Pipe.dialDue), or the one another pool's
// pipe to the address was let through for (dialGate.due); each until its
// own deadline (dialWait.until), shared by every Send that waits for it.
// Not while the address is unreachable (dialGate.unreachable): a dial
// then lasts dial_timeout. It reports whether a dial connected in time.
func (p *Pool) awaitDial() bool {
	gate := dialGateOf(p.pipes[0].opt.Addr)
	var due *dialWait
	for _, pp := range p.pipes {
		if pp.Up() {
			return true
		}
		if d := pp.dialDue.Load(); d != nil && (due == nil || d.until > due.until) {
			due = d
		}
	}
	if gate.unreachable.Load() {
		return false
	}
	if due == nil {
		due = gate.due.Load()
	}
	if due == nil {
		return false
	}
	left := due.until - nanotime()
	if left <= 0 {
		return false
	}
	p.dialWaits.Add(1)
	t := time.NewTimer(time.Duration(left))
	defer t.Stop()
	select {
	case <-due.done:
		return due.ok.Load()
	case <-t.C:
		return false
	}
}

// sendFree hands c to a pipe up that does not lag and, when reads, has no
// write pending: the next in turn, unless it can join the write a pipe's
// writer is about to make. sent is false when no pipe took it; busy, when
// a pipe was passed over for lagging or a pending write (both are only
// ever set on a pipe up).
func (p *Pool) sendFree(c *Call, reads bool) (sent, busy bool, err error) {
	n := uint32(len(p.pipes))
	free := func(pp *Pipe) bool {
		return !pp.lagging.Load() && pp.heavy.Load() == 0 && !pp.backlogged.Load() && (!reads || pp.writes.Load() == 0)
	}
	if n > 1 {
		// Join the write the last pipe's writer is about to make rather
		// than start another: Redis reads and answers one write's
		// commands together, so fewer, fuller writes cost it (and the
		// proxy) less per command (GET -P 1, 50 clients: 15 commands per
		// upstream write instead of 5). Sends spread out again once the
		// writer takes them, and never pile up behind a write in
		// progress, which may be waiting for a Redis that reads nothing.
		if pp := p.pipes[p.next.Load()%n]; pp.queued.Load() && !pp.writing.Load() && free(pp) {
			if err := pp.sendBounded(c); err != ErrUnavailable && err != errBacklogged {
				return true, false, err
			}
		}
	}
	start := p.next.Add(1)
	for i := uint32(0); i < n; i++ {
		pp := p.pipes[(start+i)%n]
		if !free(pp) {
			busy = true
			continue
		}
		if err := pp.sendBounded(c); err != ErrUnavailable && err != errBacklogged {
			return true, busy, err
		}
	}
	return false, busy, nil
}

// sendRoom sends c, a Call expected to have large replies, to a pipe it
// keeps within backlogMax (Pipe.sendBounded), in turn among those up:
// lagging and heavy ones too (sendFree passed them over), as Send would
// next. While none has room it waits for one to (the pool's room signal),
// up to the dead timeout, after which, or when no pipe is up, it reports
// false and Send goes on as for any Call: a Redis that stopped answering
// is the watchdog's to judge. Waiters race for the room a signal makes;
// a pipe refuses under its lock what would take it past backlogMax, so
// the race lets no more through than that.
func (p *Pool) sendRoom(c *Call) (bool, error) {
	var t *time.Timer
	room := &p.shared.room
	retired := p.retired
	for {
		select {
		case <-retired:
			// A Send made now goes to the new generation: held on,
			// a Call was sent to the old server after a switch
			// (found by review), and failed with the old primary's
			// abandoned pipes after a failover.
			retired = nil
			if np := p.successor(); np != p {
				return true, np.Send(c)
			}
		default:
		}
		// Taken before the pipes are tried: a pipe that makes room
		// after they were closes this channel.
		ch := room.wait()
		n := uint32(len(p.pipes))
		start := p.next.Add(1)
		up := false
		for i := uint32(0); i < n; i++ {
			switch err := p.pipes[(start+i)%n].sendBounded(c); err {
			case ErrUnavailable:
			case errBacklogged:
				up = true
			default:
				return true, err
			}
		}
		if !up {
			return false, nil
		}
		if t == nil {
			p.held.Add(1)
			room.waiting.Add(1)
			defer room.waiting.Add(-1)
			t = time.NewTimer(p.pipes[0].opt.DeadTimeout)
			defer t.Stop()
			continue // counted in waiting: a signal is no longer skipped
		}
		select {
		case <-ch:
		case <-retired:
		case <-t.C:
			return false, nil
		}
	}
}

// sparePipe returns the spare pipe, started on first use (see spareUp).
// After Close it returns nil.
func (p *Pool) sparePipe() *Pipe {
	if sp := p.spare.Load(); sp != nil {
		return sp
	}
	p.spareMu.Lock()
	defer p.spareMu.Unlock()
	if sp := p.spare.Load(); sp != nil || p.closed {
		return sp
	}
	sp := NewPipe(p.opt)
	p.spareBy.Store(nanotime() + int64(sp.opt.DialTimeout))
	p.spare.Store(sp)
	return sp
}

// spareUp reports whether sp, the spare, is up, waiting for it while its
// first dial may still be under way: a spare dialled on need is up a
// moment later unless Redis answers no one, and reads that came meanwhile
// would otherwise go behind the held writes. Later, while it redials, it
// is passed over.
func (p *Pool) spareUp(sp *Pipe) bool {
	for !sp.Up() {
		if nanotime() > p.spareBy.Load() || sp.dialFailed.Load() || sp.refused.Load() != nil {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return true
}

// Do sends c and waits for it. A Send that fails completes nothing, so the
// error is recorded on the Call for the caller to read as usual.
func (p *Pool) Do(c *Call) {
	if err := p.Send(c); err != nil {
		c.Fail(err)
		return
	}
	c.Wait()
}

// WaitUp waits until at least one pipe is up or the timeout passes.
func (p *Pool) WaitUp(timeout time.Duration) bool { return p.waitUp(timeout, false) }

// WaitDialed is WaitUp that also stops once every pipe's dial has failed
// (they go on redialing in the background): for a pool's first use, which
// should not fail while its connections are being dialled, but need not
// wait out the timeout for a Redis that refused them. Backend.Pool's
// WaitUp held the proxy's start back by twice the dial timeout when Redis
// was not up yet (a container started before Redis's).
func (p *Pool) WaitDialed(timeout time.Duration) bool { return p.waitUp(timeout, true) }

func (p *Pool) waitUp(timeout time.Duration, untilFailed bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if p.Up() {
			return true
		}
		if untilFailed && p.allDialsFailed() || time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// startSettling marks a pool not yet published as having its first dials
// under way for at most timeout.
func (p *Pool) startSettling(timeout time.Duration) {
	p.settleBy = time.Now().Add(timeout)
	p.settling.Store(true)
}

// settle waits, while the pool's first dials are under way, until a pipe
// is up, every dial has failed or the dial timeout has passed: every
// caller meanwhile, not only the one that made the pool, since a command
// sent before the first dial ends would fail with ErrUnavailable.
func (p *Pool) settle() {
	if !p.settling.Load() {
		return
	}
	p.WaitDialed(time.Until(p.settleBy))
	p.settling.Store(false)
}

// allDialsFailed reports whether every pipe's last dial failed, or was
// refused for a state of Redis's (-BUSY, -LOADING: HandshakeRefusal's
// StateReply), which the first client is answered with at once, as by
// Redis directly; other refusals (maxclients) may clear in a moment and
// are waited for (found by a probe: a GET in a new database during a
// script past busy-reply-threshold waited the dial timeout, 2 s).
func (p *Pool) allDialsFailed() bool {
	for _, pp := range p.pipes {
		if pp.dialFailed.Load() {
			continue
		}
		var refusal *HandshakeRefusal
		if r := pp.refused.Load(); r != nil && errors.As(*r, &refusal) && refusal.StateReply() != nil {
			continue
		}
		return false
	}
	return true
}

// Up reports whether any pipe is connected.
func (p *Pool) Up() bool {
	for _, pp := range p.pipes {
		if pp.Up() {
			return true
		}
	}
	return false
}

// Stats sums the pipes' counters, the spare's included; up counts the
// pipes up, not the spare.
func (p *Pool) Stats() (s PipeStats, up int) {
	for i, pp := range p.all() {
		ps := pp.Stats()
		if ps.Up && i < len(p.pipes) {
			up++
		}
		s.Pending += ps.Pending
		s.Dials += ps.Dials
		s.Failures += ps.Failures
		s.Timeouts += ps.Timeouts
		s.Overdue += ps.Overdue
		s.Commands += ps.Commands
	}
	s.Held = p.held.Load()
	s.Up = up > 0
	return s, up
}

// all is the pipes and, if dialled, the spare (last).
func (p *Pool) all() []*Pipe {
	if sp := p.spare.Load(); sp != nil {
		return append(p.pipes[:len(p.pipes):len(p.pipes)], sp)
	}
	return p.pipes
}

// markClosed stops sparePipe dialling and returns every pipe to close.
func (p *Pool) markClosed() []*Pipe {
	p.spareMu.Lock()
	p.closed = true
	p.spareMu.Unlock()
	return p.all()
}

// Close closes every pipe and waits for their goroutines.
func (p *Pool) Close() {
	for _, pp := range p.markClosed() {
		pp.Close()
	}
}

// Abandon closes every pipe as lost (Pipe.Abandon).
func (p *Pool) Abandon() {
	for _, pp := range p.markClosed() {
		pp.Abandon()
	}
}

func abs(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}
