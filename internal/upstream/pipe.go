package upstream

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"hash/maphash"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redproxy/redproxy/internal/bufpool"
	"github.com/redproxy/redproxy/internal/rawio"
	"github.com/redproxy/redproxy/internal/resp"
)

// Options describe how to reach Redis and how patient to be with it.
type Options struct {
	Addr     string
	Username string
	Password string
	DB       int
	RESP3    bool // speak RESP3 (HELLO 3) on this connection
	// TLS, when not nil, wraps the connection in TLS (DialConn). It is
	// built once per configuration and shared by every dial.
	TLS *tls.Config

	DialTimeout time.Duration
	// ReplyTimeout: when the oldest pending reply is older than this, the
	// watchdog probes Redis on a fresh connection (health.go) instead of
	// trusting the silence.
	ReplyTimeout time.Duration
	// DeadTimeout: a connection whose oldest reply is overdue is closed
	// when that reply is this old, unless Redis says it is running a script
	// (health.go). Defaults to 30 s, and is never below ReplyTimeout.
	DeadTimeout  time.Duration
	ReconnectMin time.Duration
	ReconnectMax time.Duration

	// Name is set with CLIENT SETNAME so operators can tell the proxy's
	// connections apart in CLIENT LIST.
	Name string
	// Handshake holds extra commands sent after AUTH/HELLO/SELECT, each of
	// which must not answer with an error (e.g. CLIENT TRACKING ON OPTIN).
	Handshake [][]string
	// OnPush receives RESP3 push frames (invalidations). It runs on the
	// reader goroutine, in order with replies; the frame is only valid
	// during the call. Nil drops pushes. A push longer than ReplyLimit
	// closes the connection instead (see ReplyLimit).
	OnPush func(frame []byte)
	// ReplyLimit bounds what one connection's reader holds whole: it is
	// the reply limit (Call.SetReplyLimit) of every Call sent on the
	// connection that set none itself (a health check, a control command,
	// a fetch whose creator forgot), and the longest push frame it takes.
	// Replies past a Call's limit are read past, never held (call.go); a
	// push cannot be, since OnPush takes it whole, so a longer one closes
	// the connection with an error logged (a local tier's invalidation
	// push names one key; then everything it read is invalidated as for
	// any lost connection). 0: DefaultReplyLimit. The proxy sets
	// server.client_output_limit: no client could take a longer reply.
	ReplyLimit int
	// OnUp runs (on a pipe goroutine) each time a connection is established,
	// and OnDown each time one is lost, before its Calls are failed.
	OnUp   func()
	OnDown func(err error)
	// OnReadOnly runs (on the reader goroutine) for each -READONLY reply:
	// the server is a replica now, so a primary's address is stale. With
	// WantPrimary it also runs for a dial refused as a replica's.
	OnReadOnly func()
	// WantPrimary: the server must say it is a primary (HELLO's role) for
	// a dial to succeed; a replica's is refused with ErrNotPrimary. For
	// Sentinel mode, where the address in use may have been turned into a
	// replica: its connections closed, a redial reached it again and the
	// proxy served reads from it, older than what it had acknowledged
	// (found by review of an aborted failover).
	WantPrimary bool
	// OnOverdue runs (on the watchdog goroutine) each time a reply
	// ReplyTimeout overdue makes the pipe probe Redis: at ReplyTimeout,
	// then every ReplyTimeout while it stays overdue.
	OnOverdue func()
	// OnVersion runs (on the dialling goroutine) with the server's
	// version from HELLO's reply, on each dial whose handshake sends
	// HELLO (RESP3, or WantPrimary).
	OnVersion func(version string)

	Logger *slog.Logger

	// noReconnect is set for dedicated connections (DialPipe): a pinned
	// transaction must never silently continue on a fresh connection that
	// has no MULTI or WATCH state, so once lost, the pipe stays down.
	noReconnect bool
	// cancel, when set, is closed once the dial is no longer wanted (the
	// pipe it is for was closed): the dial and its handshake end then,
	// instead of at DialTimeout (dial).
	cancel <-chan struct{}
	// firstBackoff, when set, is the reconnect loop's first wait instead of
	// ReconnectMin (tests: a backoff far longer than the test runs).
	firstBackoff time.Duration
	// handshakeTimeout, when longer than DialTimeout, bounds the handshake
	// once connected: a command sent alone waits for Redis as long as its
	// reply may take (aloneOptions).
	handshakeTimeout time.Duration
	// shared is what a Pool's pipes share: the reply sizes they learn
	// and the signal that one of them is no longer backlogged. nil
	// outside a Pool.
	shared *poolShared
}

func (o *Options) defaults() {
	if o.DialTimeout <= 0 {
		o.DialTimeout = 2 * time.Second
	}
	if o.ReplyTimeout <= 0 {
		o.ReplyTimeout = 5 * time.Second
	}
	if o.DeadTimeout <= 0 {
		o.DeadTimeout = 30 * time.Second
	}
	if o.DeadTimeout < o.ReplyTimeout {
		o.DeadTimeout = o.ReplyTimeout
	}
	if o.ReconnectMin <= 0 {
		o.ReconnectMin = 50 * time.Millisecond
	}
	if o.ReconnectMax < o.ReconnectMin {
		o.ReconnectMax = 2 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.ReplyLimit <= 0 {
		o.ReplyLimit = DefaultReplyLimit
	}
}

// DefaultReplyLimit is Options.ReplyLimit when none is set: the default of
// server.client_output_limit.
const DefaultReplyLimit = 64 << 20

// PipeStats are counters for metrics; all are cumulative except Up and
// Pending.
type PipeStats struct {
	Up       bool
	Pending  int
	Dials    uint64
	Failures uint64
	Timeouts uint64 // connections closed because Redis stayed silent for DeadTimeout
	Overdue  uint64 // replies that took longer than ReplyTimeout (the connection was probed)
	Commands uint64
	Held     uint64 // a Pool's Sends that waited for a pipe to have room (Pool.sendRoom)
}

// Pipe is one shared pipelined connection to Redis that reconnects by
// itself. See the package documentation for its ordering guarantees.
type Pipe struct {
	opt Options

	mu      sync.Mutex
	live    *liveConn // nil while disconnected
	pending []*Call   // sent or queued, awaiting replies, oldest first
	head    int       // pending[head] is the oldest
	wq      []*Call   // queued, not yet written
	closed  bool
	// closeErr is what Calls pending at Close fail with: ErrClosed, or
	// ErrConnLost when the pipe was abandoned (Abandon).
	closeErr error
	// redialing is true while a reconnect loop runs, so only one does.
	redialing bool
	// wanted is signalled by a Send that found the connection down: the
	// reconnect loop then tries again without waiting out its backoff,
	// though not sooner than ReconnectMin after its last try. Without it,
	// clients were told "unavailable" for up to reconnect_max (2 s) after
	// Redis was back (found by a probe: 0.3-1.6 s after a restart).
	wanted chan struct{}
	// dialDue, while set, is closed when the pipe's dial under way, or the
	// one a client's Send was let through for (Send, dialGate.admit), has
	// ended: Pool.Send waits on it for the first command after an outage,
	// which Redis back and idle connections waiting out their backoff
	// answered "upstream unavailable" while the dial it asked for went
	// through (a client of Redis itself dials and is served).
	dialDue atomic.Pointer[dialWait]

	wake chan struct{}
	stop chan struct{}
	// dead is closed when a dedicated pipe's (DialPipe) one connection
	// ends: nothing is left for its watchdog to watch. A dead idle pipe
	// waits in its backend's idle list until taken; its watchdog woke
	// ten times a second all that while (found by a soak probe: 20 such
	// after a Redis restart, none reused). nil for pipes that redial.
	dead    chan struct{}
	workers sync.WaitGroup

	// lagging is set by the watchdog while the oldest pending reply has
	// waited more than a tenth of the reply timeout, so that a Pool sends
	// new Calls to a pipe that is not stuck behind a slow command.
	lagging atomic.Bool
	// queued: Calls wait in wq for the writer, which has not taken them
	// yet; writing: the writer is in a write, which may wait for a Redis
	// that reads nothing (a long script). A Pool sends more to a pipe that
	// is queued but not writing, to join the write about to be made
	// (Pool.Send).
	queued, writing atomic.Bool
	// writes counts the pending Calls with a command other than a read
	// (Call.OnlyReads): a Pool keeps Calls of reads off a pipe where one
	// waits, which Redis may be holding (CLIENT PAUSE WRITE), with the
	// whole connection behind it.
	writes atomic.Int32
	// heavy counts the pending Calls whose commands or replies are large
	// (heavyMin): a Pool sends others' Calls to a pipe without one while
	// there is such a pipe. Round robin put one command in four behind a
	// 512 MB SET or a 60 MB GET, and every client stalled on it (found
	// by a probe: 565-877 ms for others behind a 512 MB SET, where
	// Redis's own clients waited at most 5 ms).
	heavy atomic.Int32
	// expected is the pending Calls' Call.expect together (under mu):
	// the replies Redis may be holding for this connection in its output
	// buffer until the reader takes them. A Pool sends no Call expected
	// to be large that would take it past backlogMax (sendBounded).
	// backlogged is set while it is past half of that, so that a Pool
	// sends other Calls elsewhere; below, the pool's waiters are woken.
	expected   int64
	backlogged atomic.Bool
	// dialFailed: the last dial could not connect (refused, unreachable,
	// TLS) and the pipe is waiting to redial (Pool.WaitDialed stops
	// waiting for a pipe that cannot connect).
	dialFailed atomic.Bool
	// refused is the handshake error of the last dial when Redis refused
	// it (NOAUTH, WRONGPASS, maxclients), nil otherwise: a Pool with no
	// pipe up names it in the error its clients get (Pool.Send).
	refused atomic.Pointer[error]

	// seq numbers Calls in write order (under mu); written is the seq of
	// the last Call whose bytes the writer has handed to the socket, and
	// flushed is signalled after each write. Redis may answer before it
	// has read a whole request (a protocol error after a bulk header),
	// and a Call whose long parts are written in place must not complete
	// while the writer may still read them (replyReader.replied).
	seq     uint64
	written atomic.Uint64
	flushed chan struct{}

	dials, failures, timeouts, overdue, commands atomic.Uint64
}

// liveConn is one established socket and the goroutines serving it.
type liveConn struct {
	nc         net.Conn
	w          *rawio.Writer // nc's socket written with raw calls; nil: write nc
	done       chan struct{} // closed when the reader exits
	writerDone chan struct{}
	reason     atomic.Pointer[error] // why it was closed, if by us
}

// write writes b to the connection, with raw system calls on a bare
// socket (see rawio for why).
func (lc *liveConn) write(b []byte) (int, error) {
	if lc.w == nil {
		return lc.nc.Write(b)
	}
	return lc.w.Write(b)
}

func (lc *liveConn) closeWith(err error) {
	lc.reason.CompareAndSwap(nil, &err)
	if tc, ok := lc.nc.(*net.TCPConn); ok {
		// The FIN goes now: Close sends it only once the reader, which
		// holds the socket in its read, has let go. A client blocked in
		// BLPOP that left must have its block dropped by Redis before
		// the next push reaches it.
		tc.CloseWrite()
	}
	lc.nc.Close()
}

// closeFromReader is closeWith for the reader goroutine, which may be
// inside the RawConn.Read that holds the socket (readRaw): net.Conn.Close
// waits for every holder to let go, so closing there waited for itself
// forever, with the pipe's Calls stuck and Shutdown hung (seen after a
// SYNC turned a shared connection into a replication stream). The close
// finishes once the reader returns, which it does when it sees the reason.
func (lc *liveConn) closeFromReader(err error) {
	lc.reason.CompareAndSwap(nil, &err)
	go lc.nc.Close()
}

// NewPipe starts connecting in the background and returns at once. Calls
// sent before the first connection is up fail with ErrUnavailable.
func NewPipe(opt Options) *Pipe {
	opt.defaults()
	p := &Pipe{opt: opt, wake: make(chan struct{}, 1), stop: make(chan struct{}), flushed: make(chan struct{}, 1), wanted: make(chan struct{}, 1)}
	p.redialing = true
	p.workers.Add(2)
	go p.redial()
	go p.watchdog()
	return p
}

// Send queues c on the connection. It fails at once with ErrUnavailable if
// the connection is down, so clients get a prompt error instead of waiting
// for a reconnect.
func (p *Pipe) Send(c *Call) error { return p.send(c, false) }

// errBacklogged: sendBounded refused the Call; nothing was sent.
var errBacklogged = errors.New("redproxy: upstream connection backlogged")

// sendBounded is Send, but refuses (errBacklogged) a Call expected to be
// large (Call.expect) that would take the pipe's expected replies past
// backlogMax, unless they are at most half of it: a Call of any size
// goes once the pipe has drained that far, so Redis holds at most half
// of backlogMax and one Call for it.
func (p *Pipe) sendBounded(c *Call) error { return p.send(c, true) }

func (p *Pipe) send(c *Call, bounded bool) error {
	if len(c.parts) == 0 {
		c.complete(nil)
		return nil
	}
	now := nanotime()
	p.mu.Lock()
	if p.closed {
		err := p.closeErr
		p.mu.Unlock()
		if err == ErrConnLost && !p.opt.noReconnect {
			// An abandoned shared pipe: nothing was sent, and the
			// caller may try another.
			err = ErrUnavailable
		}
		return err
	}
	if p.live == nil {
		p.mu.Unlock()
		if p.opt.noReconnect {
			return ErrConnLost
		}
		p.askRedial()
		return ErrUnavailable
	}
	if bounded && c.expect > 0 && p.expected > backlogMax/2 && p.expected+c.expect > backlogMax {
		p.mu.Unlock()
		return errBacklogged
	}
	if c.limit == 0 {
		c.limit = p.opt.ReplyLimit
	}
	c.sent = now
	p.seq++
	c.seq = p.seq
	if !c.OnlyReads() {
		p.writes.Add(1)
	}
	if c.heavy = c.size >= heavyMin; c.heavy {
		p.heavy.Add(1)
	}
	if c.expect > 0 {
		p.expected += c.expect
		if p.expected > backlogMax/2 && !p.backlogged.Load() {
			p.backlogged.Store(true)
		}
	}
	p.pending = append(p.pending, c)
	p.wq = append(p.wq, c)
	p.queued.Store(true)
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
	return nil
}

// askRedial asks the reconnect loop of a pipe that is down to dial again
// without waiting out its backoff, when the address's dialGate lets a
// client-asked redial through. Admitted here rather than in the loop so
// that dialDue is set before Send returns, for Pool.Send to wait on.
func (p *Pipe) askRedial() {
	if p.dialDue.Load() != nil {
		return // a dial is under way or due already
	}
	gate := dialGateOf(p.opt.Addr)
	if !gate.admit(time.Now(), p.opt.ReconnectMin) {
		return
	}
	due := newDialWait(p.opt)
	if !p.dialDue.CompareAndSwap(nil, due) {
		return
	}
	gate.due.Store(due)
	select {
	case p.wanted <- struct{}{}:
	default:
	}
	if isClosed(p.stop) || p.Up() {
		// A close that came in between ended the loop that would have
		// dialled, or a dial that came in between succeeded.
		p.endDial(false)
	}
}

// beginDial marks a dial as under way for Pool.Send to wait on, unless one
// a client was let through for is marked already.
func (p *Pipe) beginDial() {
	if p.dialDue.Load() == nil {
		p.dialDue.CompareAndSwap(nil, newDialWait(p.opt))
	}
}

// endDial says the dial under way or due has ended (or will not happen),
// and whether it connected.
func (p *Pipe) endDial(ok bool) {
	if due := p.dialDue.Swap(nil); due != nil {
		dialGateOf(p.opt.Addr).due.CompareAndSwap(due, nil)
		due.ok.Store(ok)
		close(due.done)
	}
}

// dialWait is a dial that Sends may wait for (Pool.awaitDial): done is
// closed when it ends, and no Send waits for it past until. One deadline
// per dial, not per Send: a client's pipeline is sent in one Send per
// batch read, and coalesced reads one behind another, and with a wait
// per Send a pipeline of 1,000 waited 22 s for one dial (found by a probe).
type dialWait struct {
	done  chan struct{}
	until int64 // nanotime
	// ok: it connected (read once done is closed). A Send waits again
	// only after a dial that did, which lets its own pipes dial at once
	// (dialGate.admit); after one that failed it is answered (found by
	// review: three failed dials of 100 ms each waited for in a row).
	ok atomic.Bool
}

// newDialWait is a dial due now: waited for at most ReconnectMin (before
// it begins) and redialWaitMax (a Redis that is back answers a dial
// within milliseconds), or DialTimeout if shorter.
func newDialWait(opt Options) *dialWait {
	return &dialWait{done: make(chan struct{}), until: nanotime() + int64(opt.ReconnectMin+min(opt.DialTimeout, redialWaitMax))}
}

// Up reports whether the connection is established.
func (p *Pipe) Up() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.live != nil
}

// upNow is Up that also looks at the socket for a close Redis sent that
// the reader has not taken yet (peekGone): for a kept dedicated connection
// about to be lent. A WATCH or MULTI sent on one that Redis had just
// closed failed, where a fresh connection would have served it.
func (p *Pipe) upNow() bool {
	p.mu.Lock()
	lc := p.live
	p.mu.Unlock()
	return lc != nil && !peekGone(lc.nc)
}

// Stats returns a snapshot for metrics.
func (p *Pipe) Stats() PipeStats {
	p.mu.Lock()
	s := PipeStats{Up: p.live != nil, Pending: len(p.pending) - p.head}
	p.mu.Unlock()
	s.Dials = p.dials.Load()
	s.Failures = p.failures.Load()
	s.Timeouts = p.timeouts.Load()
	s.Overdue = p.overdue.Load()
	s.Commands = p.commands.Load()
	return s
}

// Close fails pending Calls with ErrClosed and waits for every goroutine of
// the pipe to exit.
func (p *Pipe) Close() { p.closeWith(ErrClosed) }

// CloseWrite ends the connection's stream towards Redis (a FIN) and keeps
// reading: Redis finishes what it had begun, its reply still reaches the
// pending Call, and then, having read the end, it closes the connection,
// which fails what is left pending. False (nothing done) when the pipe has
// no connection or it is not a bare TCP one (TLS): then only Close ends it.
// For a client blocked in a pop that left: what Redis popped for it in the
// meantime must be read, to be put back.
func (p *Pipe) CloseWrite() bool {
	p.mu.Lock()
	lc := p.live
	p.mu.Unlock()
	if lc == nil {
		return false
	}
	tc, ok := lc.nc.(*net.TCPConn)
	return ok && tc.CloseWrite() == nil
}

// Abandon closes the pipe for good as if its connection had been lost:
// pending Calls fail with ErrConnLost (their commands may or may not have
// run), and so does every later Send. Used when the server behind it is no
// longer the one to talk to (a failover).
func (p *Pipe) Abandon() { p.closeWith(ErrConnLost) }

// AbandonAsync is Abandon without waiting: the pipe is closed for good
// before it returns (every later Send fails with ErrConnLost and nothing
// still queued is written), and its connection is closed and its
// goroutines waited for in the background. For many pipes cut at once
// (Backend.Failover), which must not wait on each other's goroutines but
// must not carry one more command either.
func (p *Pipe) AbandonAsync() {
	if lc, ok := p.markClosed(ErrConnLost); ok {
		go p.finishClose(lc, ErrConnLost)
	}
}

func (p *Pipe) closeWith(err error) {
	if lc, ok := p.markClosed(err); ok {
		p.finishClose(lc, err)
	}
}

// markClosed closes the pipe for good with err, under p.mu: from then on
// Send fails and the writer takes nothing more from the queue. It reports
// false if the pipe was closed already.
func (p *Pipe) markClosed(err error) (*liveConn, bool) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, false
	}
	p.closed = true
	p.closeErr = err
	lc := p.live
	p.mu.Unlock()
	close(p.stop)
	return lc, true
}

// finishClose closes the connection of a pipe markClosed closed and waits
// for its goroutines; the reader fails what is still pending with err.
func (p *Pipe) finishClose(lc *liveConn, err error) {
	if lc != nil {
		lc.closeWith(err)
	}
	p.workers.Wait()
}

// DialPipe connects synchronously and returns a Pipe for one client's
// exclusive use (a transaction, a blocking command). Unlike NewPipe it
// never reconnects: once the connection is lost every Send fails with
// ErrConnLost, so no command meant for the old connection's state can run
// on a new one.
func DialPipe(opt Options) (*Pipe, error) {
	opt.defaults()
	opt.noReconnect = true
	nc, err := Dial(opt)
	if err != nil {
		return nil, err
	}
	p := &Pipe{opt: opt, wake: make(chan struct{}, 1), stop: make(chan struct{}), dead: make(chan struct{}), flushed: make(chan struct{}, 1), wanted: make(chan struct{}, 1)}
	lc := &liveConn{nc: nc, w: rawio.NewWriter(nc), done: make(chan struct{}), writerDone: make(chan struct{})}
	p.live = lc
	p.dials.Add(1)
	p.workers.Add(3)
	go p.watchdog()
	go p.writer(lc)
	go p.reader(lc)
	return p, nil
}

// redial connects with exponential backoff until it succeeds or the pipe is
// closed.
func (p *Pipe) redial() {
	defer p.workers.Done()
	backoff := p.opt.ReconnectMin
	if p.opt.firstBackoff > 0 {
		backoff = p.opt.firstBackoff
	}
	// A close must not wait out a dial into a server that accepts and
	// never answers (frozen, or its host gone): a failover's switch
	// closes the old server's pipes, holding every client on the dead
	// server until they are closed (found by review: 9.7 s with a 5 s
	// dial_timeout and the local tier on).
	opt := p.opt
	opt.cancel = p.stop
	defer p.endDial(false)
	for {
		p.dials.Add(1)
		started := time.Now()
		p.beginDial()
		nc, err := Dial(opt)
		tried := time.Now() // a dial that timed out waits its backoff from its end
		gate := dialGateOf(p.opt.Addr)
		if err == nil {
			gate.succeeded(tried)
		}
		if err == nil {
			p.mu.Lock()
			if p.closed {
				p.mu.Unlock()
				nc.Close()
				return
			}
			lc := &liveConn{nc: nc, w: rawio.NewWriter(nc), done: make(chan struct{}), writerDone: make(chan struct{})}
			p.live = lc
			p.redialing = false
			p.dialFailed.Store(false)
			p.refused.Store(nil)
			p.workers.Add(2)
			p.mu.Unlock()
			go p.writer(lc)
			go p.reader(lc)
			// A client's ask that came while this dial was under way is
			// answered by it; left queued, it made the next outage's
			// first redial skip its backoff.
			select {
			case <-p.wanted:
			default:
			}
			p.endDial(true)
			dialLogs.restored(p.opt.Logger, p.opt.Addr, &lossLogs)
			if p.opt.OnUp != nil {
				p.opt.OnUp()
			}
			return
		}
		// Not logged: a dial the pipe's close cut short, no failure of
		// the server's; and one with no address (Sentinel mode while no
		// primary is known, said in the Sentinel log), whose "dial tcp:
		// missing address" said nothing more (found by review).
		//
		// Nor one that had begun before another dial to the address
		// succeeded (dialGate.failed): logged, it began another outage
		// whose end was logged again once its pipe reconnected, two
		// "reachable again" lines for one restart under eight pipes (found
		// by CI, under load).
		//
		// Nor one the pipe's close cut short, which says nothing of the
		// address either: it made the gate take a silent address for a
		// reachable one (found by review).
		if !isClosed(p.stop) && gate.failed(started, tried, isTimeout(err)) && p.opt.Addr != "" {
			dialLogs.failed(p.opt.Logger, p.opt.Addr, p.opt.DB, err, backoff)
		}
		// Only a connection that could not be made: a handshake Redis
		// refused (maxclients) may clear in a moment, and a pool's first
		// client is worth waiting for then (found by review); one refused
		// for Redis's state (-BUSY on SELECT, -LOADING) is answered with
		// that at once (Pool.allDialsFailed).
		p.dialFailed.Store(!errors.Is(err, ErrHandshake))
		if errors.Is(err, ErrHandshake) {
			p.refused.Store(&err)
		} else {
			p.refused.Store(nil)
		}
		p.endDial(false)
		if !p.waitRedial(tried, backoff) {
			p.mu.Lock()
			p.redialing = false
			p.mu.Unlock()
			return
		}
		backoff *= 2
		if backoff > p.opt.ReconnectMax {
			backoff = p.opt.ReconnectMax
		}
	}
}

// waitRedial waits until the reconnect loop should dial again: backoff
// after its last try (at tried), or ReconnectMin after it once a client
// wanted the connection (wanted, signalled only when the address's
// dialGate let the client's ask through: askRedial). False: the pipe was
// closed.
func (p *Pipe) waitRedial(tried time.Time, backoff time.Duration) bool {
	t := time.NewTimer(time.Until(tried.Add(backoff)))
	defer t.Stop()
	select {
	case <-p.stop:
		return false
	case <-t.C:
		return true
	case <-p.wanted:
	}
	if !t.Stop() {
		select {
		case <-t.C:
		default:
		}
	}
	t.Reset(time.Until(tried.Add(p.opt.ReconnectMin)))
	select {
	case <-p.stop:
		return false
	case <-t.C:
		return true
	}
}

// dialGate is what the connections to one address know of each other's
// dials, so that redials asked for by clients (Pipe.wanted) are about one
// per ReconnectMin for the address while it is down, not one per
// connection: a proxy's pools to one Redis (each database and protocol in
// use, Options.Connections each, the local tier's) dialled a dead Redis
// 700-1050 times a second under load, 15-26 times as often as on their
// backoff alone (found by a probe).
type dialGate struct {
	failedAt  atomic.Int64 // end of the last failed dial begun after okAt
	okAt      atomic.Int64 // end of the last dial that succeeded
	claimedAt atomic.Int64 // when a client-asked redial was last let through
	// due is the dialDue of the pipe whose client-asked redial was let
	// through last, until that dial ends: a Pool whose own pipes were
	// not let through waits on it (Pool.awaitDial).
	due atomic.Pointer[dialWait]
	// unreachable: the last failed dial timed out (a host that answers
	// nothing, a frozen Redis). Pool.Send does not wait for dials then:
	// each would wait out dial_timeout (found by review: 300 ms per
	// command).
	unreachable atomic.Bool
}

var dialGates sync.Map // address -> *dialGate

func dialGateOf(addr string) *dialGate {
	if g, ok := dialGates.Load(addr); ok {
		return g.(*dialGate)
	}
	g, _ := dialGates.LoadOrStore(addr, &dialGate{})
	return g.(*dialGate)
}

func (g *dialGate) succeeded(at time.Time) {
	g.okAt.Store(at.UnixNano())
	g.unreachable.Store(false)
}

// failed records a failed dial begun at started and ended at ended, and
// reports whether it says anything of now: one begun before another dial
// to the address succeeded is of an outage that has ended.
func (g *dialGate) failed(started, ended time.Time, timedOut bool) bool {
	if started.UnixNano() <= g.okAt.Load() {
		return false
	}
	g.failedAt.Store(ended.UnixNano())
	g.unreachable.Store(timedOut)
	return true
}

// isTimeout reports whether a dial's err says it ran out of time.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded)
}

// admit says whether a connection a client asked for may dial now: at
// once when the last dial to the address succeeded (Redis is back; the
// other connections follow), else if no client-asked redial was let
// through within min.
func (g *dialGate) admit(now time.Time, min time.Duration) bool {
	if g.okAt.Load() > g.failedAt.Load() {
		return true
	}
	last := g.claimedAt.Load()
	return now.UnixNano()-last >= int64(min) && g.claimedAt.CompareAndSwap(last, now.UnixNano())
}

// isClosed reports whether ch is closed.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// writer writes queued Calls, as many as are queued per write, and goes back
// to sleep when the queue is empty.
func (p *Pipe) writer(lc *liveConn) {
	defer p.workers.Done()
	defer close(lc.writerDone)
	var spare []*Call
	out := writeBatch{vectored: lc.w != nil}
	for {
		select {
		case <-p.wake:
		case <-lc.done:
			return
		}
		// Let the other clients the poller just woke queue their commands
		// before writing, so that one write carries many clients' batches
		// instead of one each: with 50 clients at -P 1 this is what keeps
		// the proxy from spending a write syscall per request.
		runtime.Gosched()
		for {
			p.mu.Lock()
			if p.closed {
				// Closed for good (Close, Abandon): nothing queued is
				// written now, not even what came before, which the
				// reader fails with the close's error when the
				// connection ends. After a failover no command goes to
				// the old server once the cut returned.
				p.mu.Unlock()
				break
			}
			batch := p.wq
			p.wq = spare
			p.queued.Store(false)
			p.mu.Unlock()
			if len(batch) == 0 {
				spare = batch
				break
			}
			cmds := 0
			p.writing.Store(true)
			// Read before any write: once written, a Call may complete
			// and be reused (its seq rewritten by the next Send).
			last := batch[len(batch)-1].seq
			for _, c := range batch {
				for _, part := range c.parts {
					out.add(part)
				}
				cmds += len(c.parts)
				if out.size >= 1<<20 {
					seq := c.seq
					if err := out.flush(lc); err != nil {
						lc.closeWith(ErrConnLost)
						return
					}
					p.wrote(seq)
				}
			}
			if err := out.flush(lc); err != nil {
				lc.closeWith(ErrConnLost)
				return
			}
			p.wrote(last)
			p.writing.Store(false)
			p.commands.Add(uint64(cmds))
			clear(batch)
			spare = batch[:0]
		}
	}
}

// wrote records that the Calls up to seq are written.
func (p *Pipe) wrote(seq uint64) {
	p.written.Store(seq)
	select {
	case p.flushed <- struct{}{}:
	default:
	}
}

// vecPart: a request part at least this long is written from where it is
// (writev) rather than copied into the writer's buffer. A 100 KB SET
// copied cost 7.5 % of the proxy's CPU for it; below this a copy is
// cheaper than another iovec.
const vecPart = 16 << 10

// writeBatch gathers the bytes of one upstream write: short parts copied
// together, long ones (vecPart) by reference. A part's bytes are the
// client's and stay put until its Call completes, which the reader lets
// happen only once the writer has published it as written (Pipe.written,
// replyReader.replied), so a reference is as good as a copy.
type writeBatch struct {
	vectored bool     // the connection takes WriteVec (a bare socket)
	buf      []byte   // short parts, copied
	copied   int      // buf[:copied] is already in vecs
	vecs     [][]byte // what to write, in order, when a part went by reference
	size     int      // bytes gathered
}

func (b *writeBatch) add(part []byte) {
	b.size += len(part)
	if !b.vectored || len(part) < vecPart {
		b.buf = append(b.buf, part...)
		return
	}
	if len(b.buf) > b.copied {
		// A later append may move buf; this slice keeps the old array,
		// which holds the same bytes.
		b.vecs = append(b.vecs, b.buf[b.copied:])
		b.copied = len(b.buf)
	}
	b.vecs = append(b.vecs, part)
}

// flush writes what is gathered and empties the batch.
func (b *writeBatch) flush(lc *liveConn) error {
	var err error
	switch {
	case len(b.vecs) > 0:
		if len(b.buf) > b.copied {
			b.vecs = append(b.vecs, b.buf[b.copied:])
		}
		_, err = lc.w.WriteVec(b.vecs)
		clear(b.vecs[:cap(b.vecs)]) // no client's bytes kept past the write
		b.vecs = b.vecs[:0]
	case len(b.buf) > 0:
		_, err = lc.write(b.buf)
	}
	b.buf, b.copied, b.size = b.buf[:0], 0, 0
	if cap(b.buf) > 4<<20 {
		b.buf = nil
	}
	return err
}

// reader frames replies and completes Calls in FIFO order. When the
// connection ends it fails whatever is still pending and starts redialing.
func (p *Pipe) reader(lc *liveConn) {
	defer p.workers.Done()
	err := p.readLoop(lc)
	if r := lc.reason.Load(); r != nil {
		err = *r
	} else {
		err = ErrConnLost
	}
	close(lc.done)
	lc.nc.Close()
	<-lc.writerDone

	p.mu.Lock()
	p.live = nil
	failed := p.pending[p.head:]
	p.pending, p.head = nil, 0
	p.writes.Store(0)
	p.heavy.Store(0)
	p.expected = 0
	p.backlogged.Store(false)
	// Redis dropped what it held for the connection; a Send waiting for
	// room finds the pipe down and goes on (Pool.sendRoom).
	p.opt.shared.signal()
	p.wq = nil
	p.queued.Store(false)
	p.writing.Store(false)
	closed, closeErr := p.closed, p.closeErr
	redial := !closed && !p.opt.noReconnect
	p.redialing = redial
	p.mu.Unlock()

	if err == ErrTimeout {
		p.timeouts.Add(1)
	}
	if !closed {
		// A pipe closed on purpose (a reload's drain, a failover's cut,
		// shutdown) lost nothing: counted, every routine reload showed
		// on the dashboards as an upstream incident (found by review).
		p.failures.Add(1)
		lossLogs.lost(p.opt.Logger, p.opt.Addr, p.opt.DB, p.opt.RESP3, err, len(failed))
	}
	if p.opt.OnDown != nil {
		p.opt.OnDown(err)
	}
	if closed {
		err = closeErr
	}
	for _, c := range failed {
		c.complete(err)
	}
	if redial {
		p.workers.Add(1)
		go p.redial()
	}
	if p.dead != nil {
		close(p.dead) // a dedicated pipe's only connection
	}
}

func (p *Pipe) readLoop(lc *liveConn) error {
	rr := replyReader{p: p, lc: lc, buf: make([]byte, 32<<10)}
	if raw := rawSocket(lc.nc); raw != nil {
		return rr.readRaw(raw)
	}
	for {
		if err := rr.dispatch(); err != nil {
			return err
		}
		if rr.fill > 0 {
			n, err := lc.nc.Read(rr.fillSpace())
			if n > 0 {
				if err := rr.filled(n); err != nil {
					return err
				}
				continue
			}
			if err == io.EOF {
				return ErrConnLost
			}
			return err
		}
		rr.makeRoom()
		n, err := lc.nc.Read(rr.buf[rr.w:])
		rr.w += n
		if err != nil && n == 0 {
			if err == io.EOF {
				return ErrConnLost
			}
			return err
		}
	}
}

// replyReader is the reader goroutine's state: the replies read and not
// yet framed, and the Call they belong to.
type replyReader struct {
	p    *Pipe
	lc   *liveConn
	buf  []byte
	r, w int // unread bytes are buf[r:w]
	scan resp.ReplyScanner
	cur  *Call
	err  error // why readRaw's callback stopped

	// A reply the Call will not keep is streamed: framed by
	// scan.Consume and dropped from buf as it is, never held whole.
	// Digested (Call.SetMaxReply), its bytes are hashed on the way;
	// past the Call's reply limit, they are only counted out.
	stream bool
	digest bool
	hash   maphash.Hash
	length int64
	head   [DigestHead]byte

	// fill is how many bytes of a large bulk reply are still to be read
	// straight into its Call's reply buffer (startFill).
	fill int
}

// streamMin is the shortest partial reply that is streamed rather than
// held until it is whole: a reply shorter than it costs no more than the
// read buffer it fits in.
const streamMin = 16 << 10

// dispatch frames every complete reply in the buffer and hands it to its
// Call, completing the Calls whose replies are all in.
func (rr *replyReader) dispatch() error {
	p, lc := rr.p, rr.lc
	for rr.r < rr.w {
		if rr.stream {
			n, done, err := rr.scan.Consume(rr.buf[rr.r:rr.w])
			if err != nil {
				lc.closeFromReader(err)
				return err
			}
			if rr.digest {
				rr.hash.Write(rr.buf[rr.r : rr.r+n])
				rr.length += int64(n)
			}
			rr.r += n
			if !done {
				return nil
			}
			rr.stream = false
			rr.streamed()
			continue
		}
		// A push is no Call's; any other reply with no Call waiting is a
		// mismatch, known from its first byte: waiting for its end would
		// hold it, however long it claims to be.
		push := p.opt.RESP3 && rr.buf[rr.r] == '>'
		if !push && rr.call() == nil {
			return rr.unexpected()
		}
		n, err := rr.scan.Scan(rr.buf[rr.r:rr.w])
		if err != nil {
			lc.closeFromReader(err)
			return err
		}
		if n == 0 {
			if push {
				if rr.w-rr.r > p.opt.ReplyLimit {
					return rr.pushTooLong()
				}
				return nil
			}
			if rr.startStream() {
				continue
			}
			rr.startFill()
			return nil
		}
		if push && n > p.opt.ReplyLimit {
			return rr.pushTooLong()
		}
		frame := rr.buf[rr.r : rr.r+n]
		rr.r += n
		if frame[0] == '-' && p.opt.OnReadOnly != nil && bytes.HasPrefix(frame, readOnlyPrefix) {
			p.opt.OnReadOnly()
		}
		if push {
			if p.opt.OnPush != nil {
				p.opt.OnPush(frame)
			}
			continue
		}
		rr.cur.addReply(frame)
		rr.replied()
	}
	return nil
}

// unexpected closes the connection for a reply that began with no Call
// waiting for it: Redis answers each command once, in order, so a reply
// nobody asked for means the order can no longer be trusted.
func (rr *replyReader) unexpected() error {
	p := rr.p
	p.opt.Logger.Error("BUG: upstream reply with no request waiting; closing the connection", "addr", p.opt.Addr, "db", p.opt.DB, "reply_prefix", string(rr.buf[rr.r:min(rr.w, rr.r+64)]))
	rr.lc.closeFromReader(errMismatch)
	return errMismatch
}

// pushTooLong closes the connection for a push frame longer than
// ReplyLimit: OnPush takes a push whole, so holding it would let a broken
// Redis grow the read buffer without bound.
func (rr *replyReader) pushTooLong() error {
	p := rr.p
	p.opt.Logger.Error("upstream sent a push frame longer than the connection's reply limit; closing the connection",
		"addr", p.opt.Addr, "db", p.opt.DB, "limit_bytes", p.opt.ReplyLimit, "push_prefix", string(rr.buf[rr.r:min(rr.w, rr.r+64)]))
	rr.lc.closeFromReader(errPushTooLong)
	return errPushTooLong
}

// call is the Call the next reply belongs to (the oldest pending), or nil.
func (rr *replyReader) call() *Call {
	if rr.cur == nil {
		p := rr.p
		p.mu.Lock()
		if p.head < len(p.pending) {
			rr.cur = p.pending[p.head]
		}
		p.mu.Unlock()
	}
	return rr.cur
}

// replied completes the current Call if that was its last reply.
func (rr *replyReader) replied() {
	p := rr.p
	if len(rr.cur.ends) != len(rr.cur.parts) {
		return
	}
	// Its bytes may still be in the writer's hands (an answer that came
	// before Redis read the whole request, or before the writer's write
	// returned): its owner may reuse them once it completes. Found by
	// review: a 64 MB SET over proto-max-bulk-len, answered after its
	// header, went on being written from a buffer its client had reused.
	if c := rr.cur; (c.expect > 0 || len(c.out) >= bigReplyMin) && !c.overflow && len(c.digests) == 0 {
		p.opt.shared.learn(c)
	}
wait:
	for rr.cur.seq > p.written.Load() {
		select {
		case <-p.flushed:
		case <-rr.lc.writerDone: // nothing more is written on this connection
			break wait
		}
	}
	p.mu.Lock()
	p.pending[p.head] = nil
	p.head++
	if p.head == len(p.pending) {
		p.pending, p.head = p.pending[:0], 0
	}
	if p.lagging.Load() && (p.head == len(p.pending) || p.pending[p.head].NoTimeout || nanotime()-p.pending[p.head].sent <= int64(p.opt.ReplyTimeout)/10) {
		// No longer lagging once its late replies are in, not at the
		// watchdog's next tick: until then every pipe of a pool that
		// Redis had kept waiting looked lagging, and Sends went round
		// robin, some onto the pipe behind a running script (found by a
		// probe: with busy-reply-threshold 1000, the commands sent in
		// the 100 ms after Redis began answering -BUSY waited for the
		// script's end, 5 s, where directly they got -BUSY at once).
		p.lagging.Store(false)
	}
	if c := rr.cur; c.expect > 0 {
		p.expected -= c.expect
		if p.expected <= backlogMax/2 {
			// Room for any Call now (sendBounded); waiters are woken
			// while it lasts, not only as it begins: one refused for
			// its size, or beaten to the room by another, tries again
			// at the next reply.
			if p.backlogged.Load() {
				p.backlogged.Store(false)
			}
			p.opt.shared.signal()
		}
	}
	if !rr.cur.OnlyReads() { // (its commands are as they were at Send)
		p.writes.Add(-1)
	}
	if rr.cur.heavy {
		p.heavy.Add(-1)
	}
	p.mu.Unlock()
	rr.cur.complete(nil)
	rr.cur = nil
}

// startStream decides, for the incomplete reply at buf[r:w], whether it
// is to be streamed rather than held until whole: when its Call (rr.cur,
// found by dispatch) will not keep it, because it is longer than the
// Call's SetMaxReply (digested) or does not fit the Call's reply limit
// (dropped, as addReply would once it is whole). A push frame is never
// streamed (OnPush takes it whole): dispatch bounds it by ReplyLimit.
func (rr *replyReader) startStream() bool {
	partial := rr.w - rr.r
	if partial <= streamMin {
		return false
	}
	c := rr.cur
	switch {
	case c.overflow:
		rr.digest = false
	case c.maxReply > 0 && partial > c.maxReply:
		rr.digest = true
		rr.hash.SetSeed(digestSeed)
		rr.length = 0
	case c.limit > 0 && len(c.out)+partial > c.limit:
		c.overflow, c.dropped = true, len(c.ends)
		rr.digest = false
	default:
		return false
	}
	rr.stream = true
	copy(rr.head[:], rr.buf[rr.r:rr.w])
	if partial >= heavyMin {
		rr.markHeavy() // a reply too large to keep is large to wait behind
	}
	return true
}

// streamed hands the Call a reply streamed past, once it has ended.
func (rr *replyReader) streamed() {
	p := rr.p
	if rr.head[0] == '-' && p.opt.OnReadOnly != nil && bytes.HasPrefix(rr.head[:], readOnlyPrefix) {
		p.opt.OnReadOnly()
	}
	if rr.digest {
		rr.cur.addDigest(rr.length, rr.hash.Sum64(), rr.head[:])
	} else {
		rr.cur.addDropped()
	}
	rr.replied()
}

// makeRoom makes room to read: it moves a partial reply to the front, or
// grows the buffer for a big one.
func (rr *replyReader) makeRoom() {
	if rr.stream && rr.r > 0 && rr.r < rr.w {
		// What a streamed reply left unreleased is a few bytes at most:
		// moved to the front, the next read gets the whole buffer.
		rr.w = copy(rr.buf, rr.buf[rr.r:rr.w])
		rr.r = 0
		return
	}
	if rr.r == rr.w {
		rr.shrink()
	} else if rr.w == len(rr.buf) {
		if rr.r > 0 {
			rr.w = bufpool.Copy(rr.buf, rr.buf[rr.r:rr.w])
			rr.r = 0
		} else {
			nb := make([]byte, 2*len(rr.buf))
			bufpool.Copy(nb, rr.buf[:rr.w])
			rr.buf = nb
			if rr.w >= heavyMin {
				rr.markHeavy() // a large aggregate (HGETALL, LRANGE)
			}
		}
	}
}

// backlogMax bounds the replies a pipe lets Redis hold for it, as
// expected from the sizes the pool has seen for the same commands
// (replySizes). Redis builds a connection's replies as fast as it reads the
// commands and keeps what the proxy has not read yet in that connection's
// output buffer, with no limit for a normal client; the proxy's shared
// connections carry every client's commands, and a client that leaves
// does not take its replies out of them as it does on its own connection.
// Clients that pipelined GETs of a 1 MB value and closed, 480 a second,
// took Redis to 7 GB of output buffers and stalled it for every client
// for tens of seconds (directly: 405 MB, no stall). Past it, Pools hold
// new Calls until the pipe's replies come in (Pool.Send). 64 MB is
// 50-100 ms of a loopback connection's replies: enough queued that
// Redis never waits for the proxy.
const backlogMax = 64 << 20

// heavyMin is the size from which a Call's commands or a reply of it make
// its pipe one that others' Calls avoid (Pipe.heavy): on loopback about a
// millisecond of the connection's time.
const heavyMin = 1 << 20

// markHeavy counts the Call whose reply is being read as heavy, once.
func (rr *replyReader) markHeavy() {
	p := rr.p
	p.mu.Lock()
	if c := rr.cur; c != nil && !c.heavy && p.live == rr.lc {
		c.heavy = true
		p.heavy.Add(1)
	}
	p.mu.Unlock()
}

// shrink empties the buffer, which holds nothing unread, and gives back
// one a large reply grew. Done before each read and before waiting for
// Redis: a pipe that went quiet after a 256 MB reply it streamed past the
// client's output limit kept a 128 MB buffer (heap profile).
func (rr *replyReader) shrink() {
	rr.r, rr.w = 0, 0
	if len(rr.buf) > 1<<20 {
		rr.buf = make([]byte, 32<<10)
	}
}

// fillMin is the shortest bulk reply read straight into its Call's reply
// buffer (startFill).
const fillMin = 32 << 10

// startFill begins reading the incomplete bulk string reply at buf[r:w]
// straight into its Call's reply buffer, when it is long enough (fillMin)
// and the Call will keep it whole: the reply is then copied once, by the
// kernel, instead of into buf and again into the Call (for a 100 KB GET
// that second copy was a fifth of the proxy's CPU). What buf holds of it
// goes to the Call now and the rest is read by readRaw or readLoop
// (fillSpace, filled). Replies the Call will not keep are streamed
// (startStream) and aggregates framed as before; a Call sharing a reply
// budget is left to addReply, which charges the budget.
func (rr *replyReader) startFill() {
	c, b := rr.cur, rr.buf[rr.r:rr.w]
	// Without a limit (a Call not sent by a Pipe) nothing is filled: the
	// limit bounds the sizes read below. A shared budget is charged by
	// addReply; here over charges nothing, so the check is made once.
	if c == nil || c.overflow || c.budget != nil || c.limit <= 0 {
		return
	}
	size, hdr, ok := resp.BulkHeader(b)
	if !ok || size > int64(c.limit) {
		return // not kept if over the limit: startStream drops it once enough has come
	}
	total := hdr + int(size) + 2
	rr.learnSize(total)
	if total < fillMin || len(b) >= total || (c.maxReply > 0 && total > c.maxReply) || c.over(total) {
		return
	}
	if total >= heavyMin {
		rr.markHeavy()
	}
	c.out = c.reserve(min(total, max(fillMin*2, fillFactor*len(b))))
	c.out = append(c.out, b...)
	rr.r = rr.w
	rr.fill = total - len(b)
}

// learnSize tells the pool's replySizes, as soon as a reply's header is
// read, how large the current Call's next reply is: the first reply of a
// hot large value to come back is when more clients' commands for it
// start to be held (Pool.Send), not when its last byte is read. Redis
// builds every reply of the commands it has read before it sends much of
// any (64 KB per connection per event loop round), and waiting for the
// whole first reply let 6 GB of them pile up (the flood of
// TestPoolHoldsCallsWhileRedisHoldsTheirReplies, 480 clients a second).
func (rr *replyReader) learnSize(total int) {
	if c := rr.cur; total >= bigReplyMin && len(c.ends) < len(c.parts) {
		rr.p.opt.shared.learnReply(c.parts[len(c.ends)], total)
	}
}

// fillFactor bounds the room the reply buffer gets ahead of a filling
// reply's bytes: at most this many times what has come (64 KB at least),
// so a reply that claims a large size and never sends it (a broken
// upstream) holds little (found by review: sized to the declaration up to
// 4 MB, 16 pipes each sent 64 KB of a declared 4 MB reply held 65 MB).
const fillFactor = 4

// fillSpace is where the next read of a filling reply goes: the rest of
// the reply, and nothing after it, so the next reply is read into buf.
func (rr *replyReader) fillSpace() []byte {
	c := rr.cur
	if len(c.out) == cap(c.out) {
		c.out = c.reserve(min(rr.fill, (fillFactor-1)*len(c.out)))
	}
	return c.out[len(c.out):min(len(c.out)+rr.fill, cap(c.out))]
}

// filled takes n bytes read into fillSpace; when the reply is whole it
// checks its CRLF and completes it as dispatch would.
func (rr *replyReader) filled(n int) error {
	c := rr.cur
	c.out = c.out[:len(c.out)+n]
	rr.fill -= n
	if rr.fill > 0 {
		return nil
	}
	rr.scan.Reset() // it had framed the reply's start (Scan): the rest never passed it
	if !bytes.HasSuffix(c.out, crlf) {
		rr.lc.closeFromReader(errBulkEnd)
		return errBulkEnd
	}
	c.ends = append(c.ends, len(c.out))
	rr.replied()
	return nil
}

var (
	crlf = []byte("\r\n")
	// errBulkEnd: a bulk string reply did not end with CRLF where its
	// length said.
	errBulkEnd = errors.New("redproxy: upstream bulk reply without CRLF at its declared end")
)

// readRaw is the read loop on a plain socket, run inside one
// syscall.RawConn.Read call for the life of the connection so that a short
// read is followed by a wait for readability, not by a read that finds the
// socket empty (EAGAIN): one read(2) per batch of replies instead of two.
//
// Why no reply can be missed. RawConn.Read (internal/poll.FD.RawRead)
// clears the descriptor's read readiness once, when it starts (prepareRead),
// then calls the callback, and each time the callback returns false waits
// (waitRead) until the runtime's edge-triggered epoll has reported the
// socket readable since that clearing or since the last wait returned, and
// calls it again. A read that returns fewer bytes than asked for has
// emptied the socket at that moment; bytes Redis sends after it raise a new
// edge, which the poller records (or delivers to the waiting reader), and
// nothing clears it before the wait: the readiness is cleared only by
// prepareRead, before the first read, and by the wait that consumes it. So
// waiting after a short read misses no bytes. It can miss a FIN that came
// with the last bytes (Redis closing right behind a reply): the short read
// takes the bytes, and the FIN raises no new edge; the watchdog finds it
// with a peek once a reply is late (peekEOF). The opposite case, a read that
// fills the space, may leave bytes behind with no new edge, so it is
// followed by another read at once. The wait may also return for bytes a
// read already took (their edge came after it); the read then finds the
// socket empty and the callback waits again. Only a fresh RawConn.Read
// would clear readiness the wait has not consumed, which is why the whole
// loop stays inside one call and a new call always starts with a read.
func (rr *replyReader) readRaw(raw syscall.RawConn) error {
	waitFirst := false // the last read was short: wait before reading again
	err := raw.Read(func(fd uintptr) bool {
		for {
			if waitFirst {
				waitFirst = false
				if rr.r == rr.w && rr.fill == 0 {
					rr.shrink()
				}
				return false
			}
			if rr.lc.reason.Load() != nil {
				// Closed by the pipe (closeWith): the descriptor stays
				// open until this call returns, so stop reading it here
				// as nc.Read would.
				rr.err = ErrConnLost
				return true
			}
			var into []byte
			if rr.fill > 0 {
				into = rr.fillSpace()
			} else {
				rr.makeRoom()
				into = rr.buf[rr.w:]
			}
			n, err := readFD(fd, into)
			switch {
			case err == syscall.EINTR:
				continue
			case err == syscall.EAGAIN:
				return false
			case err != nil:
				rr.err = &os.SyscallError{Syscall: "read", Err: err}
				return true
			case n == 0:
				rr.err = ErrConnLost
				return true
			}
			if rr.fill > 0 {
				if rr.err = rr.filled(n); rr.err != nil {
					return true
				}
			} else {
				rr.w += n
				if rr.err = rr.dispatch(); rr.err != nil {
					return true
				}
			}
			waitFirst = n < len(into)
		}
	})
	if err != nil {
		return err // closed (closeWith), or the socket failed
	}
	return rr.err
}

// rawSocket returns nc's socket for reading it directly, or nil when nc is
// not a bare socket (TLS keeps reading through nc.Read).
func rawSocket(nc net.Conn) syscall.RawConn {
	if !rawReadable {
		return nil
	}
	return rawio.BareSocket(nc)
}

// watchdog watches the age of the oldest pending reply. Past ReplyTimeout
// it probes Redis on a fresh connection and keeps waiting while Redis runs
// a script; it closes the connection (failing its Calls, so no late reply
// can reach a later Call) when Redis cannot be reached, or when the reply
// is DeadTimeout overdue with no script running. See health.go.
func (p *Pipe) watchdog() {
	defer p.workers.Done()
	tick := p.opt.ReplyTimeout / 8
	if tick < time.Millisecond {
		tick = time.Millisecond
	}
	if tick > 100*time.Millisecond {
		tick = 100 * time.Millisecond
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	replyLimit := int64(p.opt.ReplyTimeout)
	deadLimit := int64(p.opt.DeadTimeout)
	var (
		verdicts   = make(chan probeVerdict, 1)
		probing    bool
		probeStart int64
		// The stall being watched: its connection, and when Redis last
		// said it was running a script.
		stallLC    *liveConn
		lastAlive  int64
		stallProbe *liveConn // connection the running probe is about
	)
	for {
		select {
		case <-p.stop:
			return
		case <-p.dead:
			return
		case v := <-verdicts:
			probing = false
			switch v {
			case probeBusy:
				if stallProbe == stallLC {
					lastAlive = nanotime()
				}
			case probeDead:
				p.mu.Lock()
				if p.live == stallProbe && stallProbe == stallLC {
					p.opt.Logger.Warn("upstream unreachable while a reply was overdue; closing the connection", "addr", p.opt.Addr, "db", p.opt.DB)
					p.live.closeWith(ErrConnLost)
				}
				p.mu.Unlock()
			}
			continue
		case <-t.C:
		}
		now := nanotime()
		p.mu.Lock()
		lc := p.live
		sent := int64(-1)
		if lc != nil && p.head < len(p.pending) && !p.pending[p.head].NoTimeout {
			sent = p.pending[p.head].sent
		}
		p.mu.Unlock()
		p.lagging.Store(sent >= 0 && now-sent > replyLimit/10)
		if sent >= 0 && now-sent > 2*int64(tick) && peekEOF(lc.nc) {
			// Redis closed the connection right behind the last bytes it
			// sent: readRaw's short read took the bytes, and the FIN,
			// which came with them, raises no new readiness to wake it
			// (found by review: such Calls waited for the dead timeout).
			// A peek costs one system call a tick, and only while a reply
			// is late.
			p.opt.Logger.Info("upstream closed the connection with replies pending", "addr", p.opt.Addr, "db", p.opt.DB)
			lc.closeWith(ErrConnLost)
			stallLC = nil
			continue
		}
		if sent < 0 || now-sent <= replyLimit {
			stallLC = nil
			continue
		}
		if stallLC != lc {
			stallLC, lastAlive = lc, 0
			p.overdue.Add(1)
			p.opt.Logger.Info("upstream reply overdue; asking Redis on a fresh connection why", "addr", p.opt.Addr, "db", p.opt.DB, "waited", time.Duration(now-sent))
		}
		if now-max(sent, lastAlive) > deadLimit {
			p.opt.Logger.Warn("upstream reply overdue for the dead timeout; closing the connection", "addr", p.opt.Addr, "db", p.opt.DB, "dead_timeout", p.opt.DeadTimeout)
			lc.closeWith(ErrTimeout)
			stallLC = nil
			continue
		}
		if !probing && now-probeStart >= replyLimit {
			probing, probeStart, stallProbe = true, now, lc
			if p.opt.OnOverdue != nil {
				p.opt.OnOverdue()
			}
			deadline := time.Now().Add(p.opt.ReplyTimeout)
			p.workers.Add(1)
			go func() {
				defer p.workers.Done()
				verdicts <- probe(p.opt, deadline, p.stop)
			}()
		}
	}
}

var readOnlyPrefix = []byte("-READONLY ")

var clockBase = time.Now()

// nanotime is a monotonic clock reading.
func nanotime() int64 { return int64(time.Since(clockBase)) }
