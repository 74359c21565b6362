package upstream

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redproxy/redproxy/internal/resp"
)

// BackendOptions configure the upstream side.
type BackendOptions struct {
	Addr, Username, Password string
	TLS                      *tls.Config // nil: plaintext
	Connections, Databases   int
	MaxPinned                int
	// Pins, when set, is the limit of dedicated connections shared with
	// other backends of the same server (every upstream credential's
	// pools; a cluster node's takes from a Child of it), so that
	// upstream.max_pinned bounds them together; nil gives the backend a
	// limit of its own. MaxPinned sets its size.
	Pins         *PinLimit
	DialTimeout  time.Duration
	ReplyTimeout time.Duration
	DeadTimeout  time.Duration
	ReconnectMin time.Duration
	ReconnectMax time.Duration
	Logger       *slog.Logger
	// OnReadOnly runs when Redis answers -READONLY on a connection of the
	// backend: the primary has become a replica (Sentinel mode watches
	// for it). Nil ignores it.
	OnReadOnly func()
	// OnVersion is every connection's Options.OnVersion: the server's
	// version, learned on each dial of a RESP3 connection (a Backend
	// always has one for DB 0).
	OnVersion func(version string)
	// WantPrimary is every connection's Options.WantPrimary.
	WantPrimary bool
	// OnConnLost runs (on a pipe goroutine) each time a connection of the
	// backend ends other than by the proxy closing it (Close, a drained
	// generation): the server closed it, it broke or timed out. Its
	// replacement may reach another process on the same address (a
	// restart), so what was learnt over the old one is stale: replica
	// reads stop trusting the last poll (proxy/replicas.go). Nil ignores
	// it.
	OnConnLost func()
	// OnOverdue is every connection's Options.OnOverdue: a reply of the
	// backend overdue by ReplyTimeout (again every ReplyTimeout while it
	// stays overdue). Nil ignores it.
	OnOverdue func()
	// OnDedicatedUnavailable runs when a dedicated connection (a
	// transaction's, a blocking command's, a relay's) cannot be dialled:
	// the server is unreachable or refused the handshake. Nil ignores it.
	OnDedicatedUnavailable func()
	// Handshake holds extra commands every connection sends after
	// AUTH/HELLO/SELECT (READONLY for a cluster replica's reads).
	Handshake [][]string
	// ReplyLimit is every connection's Options.ReplyLimit (0: the
	// default).
	ReplyLimit int
	// NoDialWait makes NewBackend return without waiting for DB 0's first
	// dials: Redis was just found not answering (refused, or accepted and
	// silent), so those dials would only fail or time out, each holding
	// the proxy's start back by up to DialTimeout.
	NoDialWait bool
}

// Backend owns the shared upstream pools: one per database and protocol,
// created on first use so that a proxy whose clients only use DB 0 keeps
// only DB 0's connections.
//
// The pools and the options they dial with form a generation. A reload
// that changes the upstream (Switch) starts a new generation: commands
// sent from then on use its pools, while the old generation's pools are
// closed only once what was sent on them has been answered (drain).
type Backend struct {
	gen atomic.Pointer[backendGen]
	// moves counts the switches to another server: every Failover, and
	// a Switch to another address (Moves).
	moves atomic.Uint32
	mu    sync.Mutex // creating pools, switching generations
	// pins is upstream.max_pinned and what is taken of it, possibly
	// shared with other backends (BackendOptions.Pins).
	pins *PinLimit

	// Dedicated connections: pinned to one client for a transaction or a
	// blocking command, or relayed raw for pub/sub and MONITOR. pinned
	// counts those in use; idle keeps clean ones for reuse per DB and
	// protocol, so a transaction does not pay a dial.
	pinned    atomic.Int64
	idleMu    sync.Mutex
	idle      map[int][]*Pipe
	closedDed bool

	// Redis's client ids of dedicated pipes, learnt on first need (CLIENT
	// UNBLOCK). A dedicated pipe never reconnects, so its id holds for its
	// life; the entry goes when the pipe is closed.
	idsMu sync.Mutex
	ids   map[*Pipe]int64

	// dialled records the generation each dedicated pipe in use was dialled
	// in, so one from before a switch is closed on release, never reused.
	dialled map[*Pipe]*backendGen
	// relays records each relayed connection in use: its generation, so a
	// failover can cut the ones to the old primary, and its Redis id.
	relays map[net.Conn]relayConn
	closed bool
	drains sync.WaitGroup
	stop   chan struct{} // closed by Close: drains end at once

	// statsMu guards retiring, the generations a switch left that still
	// drain, and retired, the counters of those closed, by pool index: a
	// scrape adds them to the current generation's, so the counters never
	// go back. They did at every reload that changed an [upstream]
	// setting, and the dials and commands of the switch itself were never
	// seen (found by review).
	statsMu  sync.Mutex
	retiring []*backendGen
	retired  []PipeStats
}

// backendGen is one generation of upstream options and the pools dialled
// with them.
type backendGen struct {
	opt   BackendOptions
	pools []atomic.Pointer[Pool] // index db*2 + resp3
	alone *aloneConns            // RoundTrip's
	// retired is closed once the generation is no longer the current
	// one (a switch, a failover, Close): a dedicated connection still
	// in its handshake stops waiting then (patientHandshake), and
	// dialCurrent dials the new one.
	retired    chan struct{}
	retireOnce sync.Once
}

func (g *backendGen) retire() { g.retireOnce.Do(func() { close(g.retired) }) }

// ErrTooManyPinned is returned when upstream.max_pinned dedicated
// connections are already in use.
var ErrTooManyPinned = errors.New("redproxy: too many dedicated upstream connections in use (upstream.max_pinned)")

const maxIdlePerKey = 16

// PinLimit bounds the dedicated connections of one or more backends
// together. Its zero value allows none until SetMax.
//
// A cluster's nodes each take from a Child of one limit: every node may
// hold max at once, so a node that hangs holds up its own transactions
// and blocking commands, not the other nodes' (one limit for all let a
// frozen node's waiting transactions take every one, and the other
// nodes' were refused: found by a fault probe). The parent counts what
// its children hold and refuse, for the metrics, and carries the max.
type PinLimit struct {
	max atomic.Int64
	// held is what was taken under this limit itself (what max bounds);
	// total is held plus what its children hold (Used).
	held, total atomic.Int64
	// refused counts the clients turned away at the limit (a parent's
	// counts its children's too); loggedAt (nanotime) keeps the warning
	// to one line per pinRefusalLogEvery.
	refused  atomic.Int64
	loggedAt atomic.Int64
	// parent, for a Child: the limit whose max applies and whose totals
	// count this one's.
	parent *PinLimit
}

// pinRefusalLogEvery: a client refused at max_pinned is logged at most
// this often (a burst of MULTI or BLPOP clients would otherwise flood the
// log); the count is in redproxy_upstream_dedicated_refused_total.
const pinRefusalLogEvery = 10 * time.Second

// NewPinLimit returns a limit of n dedicated connections.
func NewPinLimit(n int) *PinLimit {
	l := &PinLimit{}
	l.max.Store(int64(n))
	return l
}

// Child returns a limit of l's size (as l's changes) for one server of
// several that share l's setting (a cluster's nodes), counted in l's
// Used and Refused.
func (l *PinLimit) Child() *PinLimit { return &PinLimit{parent: l} }

// take reserves one dedicated connection, or reports that all are in use.
func (l *PinLimit) take() bool {
	if l.held.Add(1) > l.Max() {
		l.held.Add(-1)
		for x := l; x != nil; x = x.parent {
			x.refused.Add(1)
		}
		return false
	}
	for x := l; x != nil; x = x.parent {
		x.total.Add(1)
	}
	return true
}

// Refused is how many requests for a dedicated connection the limit
// turned away (its children's included).
func (l *PinLimit) Refused() int64 { return l.refused.Load() }

// shouldLog reports whether a refusal now is due a log line: one per
// pinRefusalLogEvery for a limit and its children together.
func (l *PinLimit) shouldLog() bool {
	if l.parent != nil {
		return l.parent.shouldLog()
	}
	now, last := nanotime(), l.loggedAt.Load()
	return (last == 0 || now-last >= int64(pinRefusalLogEvery)) && l.loggedAt.CompareAndSwap(last, now)
}

func (l *PinLimit) give() {
	l.held.Add(-1)
	for x := l; x != nil; x = x.parent {
		x.total.Add(-1)
	}
}

// SetMax changes the limit, and its children's. Connections already in
// use beyond a lowered limit stay until released. On a Child it does
// nothing: the parent's max applies.
func (l *PinLimit) SetMax(n int) {
	if l.parent == nil {
		l.max.Store(int64(n))
	}
}

// Max is the limit in force.
func (l *PinLimit) Max() int64 {
	if l.parent != nil {
		return l.parent.Max()
	}
	return l.max.Load()
}

// root is the limit whose totals count l's: its parent's, or its own.
func (l *PinLimit) root() *PinLimit {
	for l.parent != nil {
		l = l.parent
	}
	return l
}

// Used is the number of dedicated connections taken under the limit and
// its children.
func (l *PinLimit) Used() int64 { return l.total.Load() }

// takePin reserves a dedicated connection under the (shared) limit.
func (b *Backend) takePin() bool {
	if !b.pins.take() {
		if log := b.gen.Load().opt.Logger; log != nil && b.pins.shouldLog() {
			log.Warn("dedicated upstream connections exhausted: refusing a transaction, blocking command or subscription (raise upstream.max_pinned?)",
				"upstream", b.Addr(), "max_pinned", b.pins.Max(), "refused_total", b.pins.root().Refused())
		}
		return false
	}
	b.pinned.Add(1)
	return true
}

func (b *Backend) givePin() {
	b.pinned.Add(-1)
	b.pins.give()
}

// PinnedName is the name an idle dedicated pipe carries on Redis; while a
// client uses it, it carries the client's name, if the client set one.
const PinnedName = "redproxy-pinned"

// AcquirePipe returns a dedicated pipelined connection for one client.
func (b *Backend) AcquirePipe(db int, resp3 bool) (*Pipe, error) {
	return b.AcquirePipeFor(db, resp3, nil)
}

// AcquirePipeFor is AcquirePipe for a client that may leave while its
// connection is dialled: left, asked every leftPoll while the handshake
// waits past the dial timeout, ends the dial (ErrClientLeft). The
// handshake may wait up to DeadTimeout on a paused Redis
// (patientHandshake); a client that hung up meanwhile held its max_pinned
// slot all that time, and the commands it had queued (MULTI ... EXEC) ran
// once Redis resumed, where Redis frees a departed client's transaction
// (found by a probe).
func (b *Backend) AcquirePipeFor(db int, resp3 bool, left func() bool) (*Pipe, error) {
	if !b.takePin() {
		return nil, ErrTooManyPinned
	}
	key := db*2 + btoi(resp3)
	b.idleMu.Lock()
	for n := len(b.idle[key]); n > 0; n = len(b.idle[key]) {
		p := b.idle[key][n-1]
		b.idle[key] = b.idle[key][:n-1]
		// A switch empties the idle list only after it swapped the
		// generation: one left in between talks to the old upstream.
		if b.dialled[p] == b.gen.Load() && p.upNow() {
			b.idleMu.Unlock()
			return p, nil
		}
		delete(b.dialled, p)
		b.closePipe(p)
	}
	b.idleMu.Unlock()
	p, err := dialCurrent(b, func(g *backendGen) (*Pipe, error) {
		o := patientHandshake(g.options(db, resp3))
		o.Name = PinnedName
		// A switch, a failover or Close ends the wait, and so does the
		// client leaving.
		cancel, stop := untilLeft(g.retired, left, o.DialTimeout)
		o.cancel = cancel
		p, err := DialPipe(o)
		if stop() && err != nil {
			return nil, ErrClientLeft
		}
		return p, err
	}, func(p *Pipe) { go p.Close() }, func(p *Pipe, g *backendGen) {
		if b.dialled == nil {
			b.dialled = make(map[*Pipe]*backendGen)
		}
		b.dialled[p] = g
	})
	if err != nil {
		b.givePin()
	}
	return p, err
}

// dialCurrent dials a dedicated connection to the current generation and
// records it (under idleMu) as that generation's. A connection whose dial
// spanned a switch is dropped and dialled again: a failover's cut, which
// takes idleMu after swapping the generation, could not have seen it, and
// a MULTI on it ran on the old primary (found by review).
func dialCurrent[C any](b *Backend, dial func(*backendGen) (C, error), drop func(C), record func(C, *backendGen)) (C, error) {
	var zero C
	for range maxDialsAcrossSwitches {
		g := b.gen.Load()
		c, err := dial(g)
		if err != nil && b.gen.Load() != g {
			continue // ended by the switch (retired): dial the new upstream
		}
		if errors.Is(err, ErrTimeout) || err == ErrClientLeft {
			return zero, err // connected, and Redis answered nothing in time; or no one waits
		}
		if err != nil {
			if f := g.opt.OnDedicatedUnavailable; f != nil {
				f()
			}
			return zero, fmt.Errorf("%w: %w", ErrUnavailable, err) // both: the proxy tells a refused handshake from an outage
		}
		b.idleMu.Lock()
		if b.gen.Load() != g {
			b.idleMu.Unlock()
			drop(c)
			continue
		}
		record(c, g)
		b.idleMu.Unlock()
		return c, nil
	}
	return zero, errSwitchedWhileDialling
}

// untilLeft is a channel closed once retired is, or, from after the
// dial timeout, once left (nil: never) reports true, asked every
// leftPoll; stop ends the watch, once it has (no left call runs after
// it), and reports whether left ended it. Not before: within the dial
// timeout the dial goes on as it always did, so a client that
// half-closes right behind its MULTI ... EXEC has it run, as Redis runs
// what it read before the end of the stream; past it the dial waits only
// because Redis is paused, which on Redis would free the departed
// client's commands.
func untilLeft(retired chan struct{}, left func() bool, after time.Duration) (<-chan struct{}, func() bool) {
	if left == nil {
		return retired, func() bool { return false }
	}
	out, done, exited := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var sawLeft bool
	go func() {
		defer close(exited)
		wait := time.NewTimer(after)
		defer wait.Stop()
		select {
		case <-done:
			return
		case <-retired:
			close(out)
			return
		case <-wait.C:
		}
		t := time.NewTicker(leftPoll)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-retired:
			case <-t.C:
				if !left() {
					continue
				}
				sawLeft = true
			}
			close(out)
			return
		}
	}()
	return out, func() bool {
		close(done)
		<-exited
		return sawLeft
	}
}

// leftPoll is how often a dial asks whether its client has left: as the
// proxy's blocked clients are asked.
const leftPoll = 50 * time.Millisecond

// maxDialsAcrossSwitches bounds the dials of a dedicated connection when
// the upstream keeps switching while it dials.
const maxDialsAcrossSwitches = 3

var errSwitchedWhileDialling = fmt.Errorf("%w: the upstream changed while connecting", ErrUnavailable)

// ReleasePipe gives a dedicated connection back. Only a connection whose
// state the caller knows to be clean (no MULTI, no WATCH, the DB and
// protocol it was dialled with) may be reused; anything else is closed.
func (b *Backend) ReleasePipe(p *Pipe, db int, resp3, clean bool) {
	b.givePin()
	if clean && p.Up() {
		key := db*2 + btoi(resp3)
		b.idleMu.Lock()
		// A pipe dialled before a switch talks to the old upstream.
		if !b.closedDed && b.dialled[p] == b.gen.Load() && len(b.idle[key]) < maxIdlePerKey {
			if b.idle == nil {
				b.idle = make(map[int][]*Pipe)
			}
			b.idle[key] = append(b.idle[key], p)
			b.idleMu.Unlock()
			return
		}
		b.idleMu.Unlock()
	}
	b.idleMu.Lock()
	delete(b.dialled, p)
	b.idleMu.Unlock()
	b.closePipe(p)
}

// closePipe closes a dedicated pipe in the background and forgets its id.
func (b *Backend) closePipe(p *Pipe) {
	b.idsMu.Lock()
	delete(b.ids, p)
	b.idsMu.Unlock()
	go p.Close()
}

var cmdClientID = resp.AppendCommandStrings(nil, "CLIENT", "ID")

// PipeID returns Redis's client id for the dedicated pipe p, asking Redis
// (one round trip) the first time. Only p's user may call it, between its
// own Calls.
func (b *Backend) PipeID(p *Pipe) (int64, error) {
	b.idsMu.Lock()
	id, ok := b.ids[p]
	b.idsMu.Unlock()
	if ok {
		return id, nil
	}
	c := NewCall()
	c.Add(cmdClientID)
	if err := p.Send(c); err != nil {
		return 0, err
	}
	c.Wait()
	r, err := c.Reply(0)
	if err != nil {
		return 0, err
	}
	id, ok = resp.Integer(r)
	if !ok {
		return 0, fmt.Errorf("redproxy: unexpected reply to CLIENT ID: %q", r)
	}
	b.idsMu.Lock()
	if b.ids == nil {
		b.ids = make(map[*Pipe]int64)
	}
	b.ids[p] = id
	b.idsMu.Unlock()
	return id, nil
}

// UnblockBeside sends CLIENT UNBLOCK rid [mode] (mode "", "TIMEOUT" or
// "ERROR"), about the connection of the dedicated pipe p whose Redis id is
// rid, on a connection of its own to the server p is connected to: after
// a switch, a pipe dialled before it still talks to the old upstream, and
// the id names that server's connection. It authenticates as the
// connections of as do (nil: as b's): a command one client sends about
// another's connection runs with the sender's Redis rights, as on Redis,
// not with those of the connection it names. It returns Redis's reply to
// the UNBLOCK; bare says what to do where Redis refuses the gate (see
// gen.unblock).
func (b *Backend) UnblockBeside(p *Pipe, rid int64, mode string, as *Backend, bare bool) ([]byte, error) {
	b.idleMu.Lock()
	g := b.dialled[p]
	b.idleMu.Unlock()
	if g == nil {
		g = b.gen.Load()
	}
	return g.unblock(as, rid, mode, bare)
}

// ErrUnblockUngated is UnblockBeside's and UnblockRelay's answer, without
// bare, where Redis refused the transaction that gates the UNBLOCK (see
// gen.unblock): nothing was sent about the connection.
var ErrUnblockUngated = errors.New("redproxy: Redis refused the transaction around CLIENT UNBLOCK")

// unblockGate is a command Redis holds back while clients are paused for
// writes (CLIENT PAUSE WRITE or ALL, FAILOVER), as it holds the blocking
// commands that arrive meanwhile: EVAL is "may-replicate". It has no keys
// (no cluster redirection), writes nothing and publishes nothing.
var unblockGate = resp.AppendCommandStrings(nil, "EVAL", "return 0", "0")

// unblock sends CLIENT UNBLOCK rid [mode] to g's server (see roundTripAs
// for as) inside MULTI, behind unblockGate. Redis 7.0 crashes when CLIENT
// UNBLOCK names a client whose blocking command a pause holds back
// ("Unknown btype in replyToBlockedClientTimedOut"; fixed in later
// releases), and a client that leaves while its BLPOP is held so is
// ordinary during a failover's pause (found by review: Redis died). Such
// an EXEC is held back too, behind the held command, which Redis runs
// first when the pause ends: the UNBLOCK then finds it blocked on its keys,
// or answered. The price: during a pause, the UNBLOCK of a client that was
// blocked before it waits for the pause to end, where Redis would answer
// at once, since the proxy cannot tell the two apart.
//
// Where Redis refuses the transaction (EXECABORT: an upstream user
// without EVAL, or without CLIENT UNBLOCK; -BUSY), the UNBLOCK is then
// sent on its own if bare is set, as Redis would run a client's own, and
// otherwise not at all (ErrUnblockUngated). Where it refuses MULTI alone (an upstream user
// without it), the gate and the UNBLOCK have run outside it, and the
// UNBLOCK's reply is returned.
func (g *backendGen) unblock(as *Backend, rid int64, mode string, bare bool) ([]byte, error) {
	un := resp.AppendCommandStrings(nil, "CLIENT", "UNBLOCK", strconv.FormatInt(rid, 10))
	if mode != "" {
		un = resp.AppendCommandStrings(nil, "CLIENT", "UNBLOCK", strconv.FormatInt(rid, 10), mode)
	}
	tx := resp.AppendCommandStrings(nil, "MULTI")
	tx = append(tx, unblockGate...)
	tx = append(tx, un...)
	tx = resp.AppendCommandStrings(tx, "EXEC")
	replies, err := g.roundTripAs(as, tx)
	if err != nil {
		return nil, err
	}
	if len(replies) != 4 {
		return nil, errMismatch
	}
	if resp.IsError(replies[0]) {
		return replies[2], nil // MULTI refused: the UNBLOCK ran on its own
	}
	if el, ok := resp.ArrayElements(replies[3]); ok && len(el) == 2 {
		return el[1], nil
	}
	if !bare {
		return nil, ErrUnblockUngated
	}
	replies, err = g.roundTripAs(as, un)
	return lastReply(replies), err
}

// roundTripAs is roundTripAll (on a kept connection) with g's own
// credential, or on a connection of its own to g's server, closed after,
// with the credential as's connections use.
func (g *backendGen) roundTripAs(as *Backend, raw []byte) ([][]byte, error) {
	if as == nil {
		return g.roundTripAll(false, true, raw)
	}
	o := g.options(0, false)
	theirs := as.gen.Load().opt
	if o.Username == theirs.Username && o.Password == theirs.Password {
		return g.roundTripAll(false, true, raw)
	}
	o.Username, o.Password = theirs.Username, theirs.Password
	o.Name = "redproxy-alone"
	return roundTripAll(aloneOptions(o, g.alone.stop), raw)
}

// relayConn is a relayed connection in use.
type relayConn struct {
	gen *backendGen
	id  int64 // Redis's CLIENT ID of it; 0: not known; idAfterBusy: ask CLIENT LIST
}

// AcquireConn dials a raw dedicated connection for relaying (pub/sub,
// MONITOR, client-side tracking). It is never reused, so it carries the
// client's name, if it has one, for Redis's CLIENT LIST and SLOWLOG. Its
// handshake learns its Redis id (UnblockRelay), in the same round
// trip.
func (b *Backend) AcquireConn(db int, resp3 bool, name string) (net.Conn, error) {
	return b.AcquireConnFor(db, resp3, name, nil)
}

// AcquireConnFor is AcquireConn for a client that may leave while its
// connection is dialled (AcquirePipeFor).
func (b *Backend) AcquireConnFor(db int, resp3 bool, name string, left func() bool) (net.Conn, error) {
	if !b.takePin() {
		return nil, ErrTooManyPinned
	}
	type dialled struct {
		nc net.Conn
		id int64
	}
	d, err := dialCurrent(b, func(g *backendGen) (dialled, error) {
		o := patientHandshake(g.options(db, resp3))
		cancel, stop := untilLeft(g.retired, left, o.DialTimeout)
		o.cancel = cancel
		o.Name = "redproxy-relay"
		if name != "" {
			o.Name = name
		}
		nc, id, err := dial(o, true)
		if stop() && err != nil {
			return dialled{}, ErrClientLeft
		}
		return dialled{nc, id}, err
	}, func(d dialled) { d.nc.Close() }, func(d dialled, g *backendGen) {
		if b.relays == nil {
			b.relays = make(map[net.Conn]relayConn)
		}
		b.relays[d.nc] = relayConn{gen: g, id: d.id}
	})
	if err != nil {
		b.givePin()
	}
	return d.nc, err
}

// ErrRelayGone is UnblockRelay's answer for a connection that is no
// longer relayed (released, or never learnt its id).
var ErrRelayGone = errors.New("redproxy: relayed connection gone")

// UnblockRelay sends CLIENT UNBLOCK [mode] about the relayed connection
// nc (see UnblockBeside), to the server nc is on, never another: after a
// switch the id would name some other connection.
func (b *Backend) UnblockRelay(nc net.Conn, mode string, as *Backend, bare bool) ([]byte, error) {
	b.idleMu.Lock()
	r, ok := b.relays[nc]
	b.idleMu.Unlock()
	if !ok || r.id == 0 {
		return nil, ErrRelayGone
	}
	if r.id == idAfterBusy {
		id, busy, asked := relayIDFromList(r.gen, nc)
		if busy != nil {
			return busy, nil // Redis's own answer to an UNBLOCK now
		}
		if !asked {
			return nil, ErrRelayGone // unknown this time; asked again next time
		}
		b.idleMu.Lock()
		if cur, ok := b.relays[nc]; ok && cur.gen == r.gen {
			cur.id = id
			b.relays[nc] = cur
		}
		b.idleMu.Unlock()
		if id == 0 {
			return nil, ErrRelayGone
		}
		r.id = id
	}
	return r.gen.unblock(as, r.id, mode, bare)
}

var cmdClientList = resp.AppendCommandStrings(nil, "CLIENT", "LIST")

// relayIDFromList finds the Redis id of the relayed connection nc, whose
// handshake's CLIENT ID met a script (-BUSY), in CLIENT LIST: the line
// whose addr is nc's local address (unique while nc is open). 0 when
// Redis refuses CLIENT LIST or lists no such address (a NAT between the
// proxy and Redis): the relay keeps 0. Not asked (asked false) when Redis
// cannot be reached or its reply is too long to read; the -BUSY reply
// itself while the script still runs.
func relayIDFromList(g *backendGen, nc net.Conn) (id int64, busy []byte, asked bool) {
	reply, err := g.roundTrip(false, true, cmdClientList)
	if err != nil {
		return 0, nil, false
	}
	if bytes.HasPrefix(reply, busyPrefix) {
		return 0, reply, false
	}
	size, header, ok := resp.BulkHeader(reply)
	if !ok || int64(len(reply)) < int64(header)+size {
		return 0, nil, true
	}
	addr := []byte(" addr=" + nc.LocalAddr().String() + " ")
	for line := range bytes.SplitSeq(reply[header:int64(header)+size], []byte("\n")) {
		rest, ok := bytes.CutPrefix(line, []byte("id="))
		if !ok || !bytes.Contains(line, addr) {
			continue
		}
		digits, _, _ := bytes.Cut(rest, []byte(" "))
		id, err := strconv.ParseInt(string(digits), 10, 64)
		if err != nil || id <= 0 {
			return 0, nil, true
		}
		return id, nil, true
	}
	return 0, nil, true
}

// ReleaseConn closes a relayed connection.
func (b *Backend) ReleaseConn(nc net.Conn) {
	b.idleMu.Lock()
	delete(b.relays, nc)
	b.idleMu.Unlock()
	nc.Close()
	b.givePin()
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// NewBackend creates the pools for DB 0 eagerly (RESP2 and RESP3), so
// readiness reflects whether Redis is reachable.
func NewBackend(opt BackendOptions) *Backend {
	b := &Backend{stop: make(chan struct{}), pins: opt.Pins}
	if b.pins == nil {
		b.pins = NewPinLimit(opt.MaxPinned)
	} else {
		b.pins.SetMax(opt.MaxPinned)
	}
	b.gen.Store(newGen(opt))
	// Both dialled at once: waiting for each in turn made a start with
	// Redis unreachable take twice the dial timeout.
	resp2, resp3 := b.pool(0, false, false), b.pool(0, true, false)
	if opt.NoDialWait {
		return b
	}
	resp2.settle()
	resp3.settle()
	return b
}

func newGen(opt BackendOptions) *backendGen {
	if opt.Databases < 1 {
		opt.Databases = 1
	}
	return &backendGen{opt: opt, pools: make([]atomic.Pointer[Pool], 2*opt.Databases), alone: newAloneConns(), retired: make(chan struct{})}
}

// Options returns the upstream options for a connection to db.
func (b *Backend) Options(db int, resp3 bool) Options {
	return b.gen.Load().options(db, resp3)
}

func (g *backendGen) options(db int, resp3 bool) Options { return g.opt.ConnOptions(db, resp3) }

// ConnOptions are the options of one connection of a Backend made with o,
// to database db: for connections made outside any Backend (the local
// tier's to the nodes of a cluster) with the same settings.
func (o BackendOptions) ConnOptions(db int, resp3 bool) Options {
	var onDown func(error)
	if lost := o.OnConnLost; lost != nil {
		onDown = func(err error) {
			if err != ErrClosed {
				lost()
			}
		}
	}
	return Options{
		Addr: o.Addr, Username: o.Username, Password: o.Password,
		TLS: o.TLS, DB: db, RESP3: resp3,
		DialTimeout: o.DialTimeout, ReplyTimeout: o.ReplyTimeout, DeadTimeout: o.DeadTimeout,
		ReconnectMin: o.ReconnectMin, ReconnectMax: o.ReconnectMax,
		Name:        "redproxy",
		Logger:      o.Logger,
		OnReadOnly:  o.OnReadOnly,
		OnOverdue:   o.OnOverdue,
		OnVersion:   o.OnVersion,
		WantPrimary: o.WantPrimary,
		OnDown:      onDown,
		Handshake:   o.Handshake,
		ReplyLimit:  o.ReplyLimit,
	}
}

// Pool returns the shared pool for db and protocol, creating it if needed.
func (b *Backend) Pool(db int, resp3 bool) *Pool { return b.pool(db, resp3, true) }

// pool is Pool; wait: wait while the pool's first dials are under way.
func (b *Backend) pool(db int, resp3, wait bool) *Pool {
	i := db * 2
	if resp3 {
		i++
	}
	g := b.gen.Load()
	p := g.pools[i].Load()
	if p == nil {
		b.mu.Lock()
		// A switch may have happened meanwhile: never add a pool to a
		// generation that is draining.
		g = b.gen.Load()
		if p = g.pools[i].Load(); p == nil {
			p = NewPool(g.opt.Connections, g.options(db, resp3))
			p.retired, p.successor = g.retired, func() *Pool { return b.Pool(db, resp3) }
			p.startSettling(g.opt.DialTimeout)
			g.pools[i].Store(p)
		}
		// Not held while the dials go on: an upstream that does not
		// answer held every other database's first client, and a
		// reload's switch, behind this one for a whole dial timeout.
		b.mu.Unlock()
	}
	// The first clients of a database or protocol should not fail just
	// because its connections are still being dialled; later outages fail
	// fast instead, since the pipes reconnect in the background. Nor
	// should they wait for a Redis that refused every dial.
	if wait {
		p.settle()
	}
	return p
}

// RoundTrip runs one command on a connection of its own (see busy.go).
func (b *Backend) RoundTrip(resp3, keep bool, raw []byte) ([]byte, error) {
	return b.gen.Load().roundTrip(resp3, keep, raw)
}

// DrainingRoundTrips are, for each upstream a switch left for another
// address that is still draining (commands in flight there, a client's
// long script among them), a RoundTrip on a connection of its own to it:
// SCRIPT KILL and FUNCTION KILL must reach the script wherever it runs,
// and after a reload moved the address they answered NOTBUSY from the new
// server while the old one stayed busy (found by a probe).
func (b *Backend) DrainingRoundTrips() []func(resp3 bool, raw []byte) ([]byte, error) {
	cur := b.gen.Load()
	b.statsMu.Lock()
	defer b.statsMu.Unlock()
	var out []func(bool, []byte) ([]byte, error)
	addrs := []string{cur.opt.Addr}
	for _, g := range b.retiring {
		if slices.Contains(addrs, g.opt.Addr) {
			continue
		}
		addrs = append(addrs, g.opt.Addr)
		out = append(out, func(resp3 bool, raw []byte) ([]byte, error) { return g.roundTrip(resp3, false, raw) })
	}
	return out
}

// roundTrip runs one command on a connection of its own to g's upstream,
// one kept from the last such command unless keep is false (aloneConns).
func (g *backendGen) roundTrip(resp3, keep bool, raw []byte) ([]byte, error) {
	replies, err := g.roundTripAll(resp3, keep, raw)
	return lastReply(replies), err
}

// roundTripAll is roundTrip for raw holding one or more commands: it
// returns every reply, in order.
func (g *backendGen) roundTripAll(resp3, keep bool, raw []byte) ([][]byte, error) {
	o := g.options(0, resp3)
	o.Name = "redproxy-alone"
	return g.alone.roundTrip(o, resp3, keep, raw)
}

// Ready reports whether Redis answers a PING with PONG on a shared
// connection of DB 0, promptly: a Redis that is unreachable, busy running a
// script (-BUSY), loading its dataset (-LOADING) or not answering is not
// ready to serve clients, whatever the state of the proxy's connections.
func (b *Backend) Ready() bool {
	p := b.Pool(0, false)
	if !p.Up() {
		return false
	}
	c := NewCall()
	c.Add(resp.Ping)
	if err := p.Send(c); err != nil {
		return false
	}
	t := time.NewTimer(min(b.gen.Load().opt.ReplyTimeout, time.Second))
	defer t.Stop()
	select {
	case <-c.Done():
	case <-t.C:
		return false // the Call is dropped; the pipe completes it unseen
	}
	r, err := c.Reply(0)
	return err == nil && string(r) == "+PONG\r\n"
}

// SetMaxPinned changes upstream.max_pinned. Dedicated connections already
// in use over a lowered limit stay until their clients release them.
func (b *Backend) SetMaxPinned(n int) { b.pins.SetMax(n) }

// drainGrace is the least time an old generation is kept after a switch:
// a session that took a pool just before the switch sends on it a moment
// later, and must find it open.
const drainGrace = time.Second

// Switch starts a new generation with opt (a new address, pool size or
// timeouts). Commands sent after it returns use connections dialled with
// opt; the old generation's pools are closed in the background once every
// request sent on them has been answered (or failed by upstream.dead_timeout),
// and no sooner than drainGrace. Dedicated pipes in use (MULTI, WATCH,
// blocking commands) keep their old upstream until their clients release
// them; released ones are closed, not reused. Relays
// (subscribers, CLIENT TRACKING clients, MONITOR) are closed when the
// address changes, as by Failover: left on the old server, a subscriber
// hears nothing published on the new one and a tracking client reads the
// old server's values, with no sign of either; a closed connection is one
// every client library reconnects from (and resubscribes). The pools of
// the new generation are dialled before Switch returns for DB 0, as at
// start, so readiness reflects the new upstream.
func (b *Backend) Switch(opt BackendOptions) { b.switchGen(opt, false)() }

// Failover starts a new generation with opt, the new primary, like Switch,
// except that nothing more is read from the old server: its shared pools
// are closed at once, failing the requests still waiting there with
// ErrConnLost (a write among them may or may not have run: it is reported,
// never resent), and the dedicated connections dialled to it (MULTI,
// blocking commands, pub/sub, MONITOR and tracking relays) are cut, so
// their clients see the loss instead of talking on to a demoted or dead
// server.
func (b *Backend) Failover(opt BackendOptions) { b.switchGen(opt, true)() }

// FailoverUnsettled is Failover up to the wait for the new generation's
// first dials, which it returns for the caller to run: a caller failing
// several backends over to the same primary (one per upstream credential)
// cuts every one from the old primary first. Failed over and settled one
// after the other, the k-th credential's clients wrote on to the demoted
// primary for k dial times, and those acknowledged writes were lost (found
// by a probe: 70-225 ms, 75 writes where the proxy's own credential lost 6).
func (b *Backend) FailoverUnsettled(opt BackendOptions) (settle func()) {
	return b.switchGen(opt, true)
}

// SwitchUnsettled is Switch up to the wait for the new generation's first
// dials, which it returns, for the same reason as FailoverUnsettled.
func (b *Backend) SwitchUnsettled(opt BackendOptions) (settle func()) {
	return b.switchGen(opt, false)
}

// switchGen swaps in a generation with opt and returns the wait for its
// first dials.
func (b *Backend) switchGen(opt BackendOptions, failover bool) (settle func()) {
	next := newGen(opt)
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return func() {}
	}
	// Swapped and listed at once, under statsMu: a scrape in between
	// would count the old generation twice or not at all, and a counter
	// read higher once must never read lower after.
	b.statsMu.Lock()
	old := b.gen.Swap(next)
	b.retiring = append(b.retiring, old)
	b.statsMu.Unlock()
	old.retire()
	if failover || old.opt.Addr != opt.Addr {
		// After the swap: whoever reads the new count sends on the new
		// generation (Moves).
		b.moves.Add(1)
	}
	b.drains.Add(1)
	b.mu.Unlock()
	b.SetMaxPinned(opt.MaxPinned)

	b.idleMu.Lock()
	stale := b.idle
	b.idle = nil
	for _, ps := range stale {
		for _, p := range ps {
			delete(b.dialled, p)
		}
	}
	b.idleMu.Unlock()
	for _, ps := range stale {
		for _, p := range ps {
			b.closePipe(p)
		}
	}
	if failover {
		b.cutDedicated(next)
		old.abandon()
		b.fold(old)
		b.drains.Done()
	} else {
		if old.opt.Addr != opt.Addr {
			b.cutRelays(next)
		}
		go b.drain(old)
	}
	// Both dialled at once, as at start: one after the other held the
	// reload for twice the dial timeout when the new upstream did not
	// answer.
	resp2, resp3 := b.pool(0, false, false), b.pool(0, true, false)
	return func() {
		resp2.settle()
		resp3.settle()
	}
}

// CutDedicated severs every dedicated pipe and relay in use, as Failover
// does: for a server that is gone for good (a node that left its cluster),
// whose clients must see the loss rather than talk on to it.
func (b *Backend) CutDedicated() { b.cutDedicated(nil) }

// cutDedicated severs the dedicated pipes and relays in use that were
// dialled before the generation cur. Their users see ErrConnLost (pipes) or
// a closed connection (relays) and release them as usual. The pipes are
// dead when it returns (a Send fails); only their closing is left to
// goroutines.
func (b *Backend) cutDedicated(cur *backendGen) {
	var pipes []*Pipe
	b.idleMu.Lock()
	for p, g := range b.dialled {
		if g != cur {
			pipes = append(pipes, p)
		}
	}
	b.idleMu.Unlock()
	for _, p := range pipes {
		// Dead before this returns, so no command of their clients
		// (an EXEC, a write under WATCH) goes to the old server after
		// the failover was adopted; closed in the background, as a
		// frozen server's connection may take a while.
		p.AbandonAsync()
	}
	b.cutRelays(cur)
}

// cutRelays closes the relays in use that were dialled before the
// generation cur; their clients see the connection closed.
func (b *Backend) cutRelays(cur *backendGen) {
	var conns []net.Conn
	b.idleMu.Lock()
	for nc, r := range b.relays {
		if r.gen != cur {
			conns = append(conns, nc)
		}
	}
	b.idleMu.Unlock()
	for _, nc := range conns {
		nc.Close()
	}
}

// drain closes a replaced generation's pools once nothing is pending on
// them, bounded by the dead timeout, after which the pipes would have
// failed a request that Redis does not answer anyway. (A request only
// overdue, past upstream.reply_timeout, is still waited for: Redis may be slow,
// paused or running a script, and would answer it.)
func (b *Backend) drain(g *backendGen) {
	defer b.drains.Done()
	defer b.fold(g)
	defer g.close()
	wait := func(d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return true
		case <-b.stop:
			return false
		}
	}
	dead := g.opt.DeadTimeout
	if dead <= 0 {
		dead = 30 * time.Second // Options' default
	}
	deadline := time.Now().Add(drainGrace + g.opt.ReplyTimeout + 2*dead)
	if !wait(drainGrace) {
		return
	}
	for time.Now().Before(deadline) && g.pending() > 0 {
		if !wait(10 * time.Millisecond) {
			return
		}
	}
}

// fold adds the counters of g, a generation a switch left that is done,
// to the backend's retired ones.
func (b *Backend) fold(g *backendGen) {
	b.statsMu.Lock()
	defer b.statsMu.Unlock()
	if len(b.retired) < len(g.pools) {
		b.retired = append(b.retired, make([]PipeStats, len(g.pools)-len(b.retired))...)
	}
	for i := range g.pools {
		if p := g.pools[i].Load(); p != nil {
			s, _ := p.Stats()
			addCounters(&b.retired[i], s)
		}
	}
	b.retiring = slices.DeleteFunc(b.retiring, func(r *backendGen) bool { return r == g })
}

func addCounters(to *PipeStats, s PipeStats) {
	to.Dials += s.Dials
	to.Failures += s.Failures
	to.Timeouts += s.Timeouts
	to.Overdue += s.Overdue
	to.Commands += s.Commands
	to.Held += s.Held
}

// PoolStats is the shared pool of database db and protocol's state now
// (Up, Pending, up: connections up) and its counters since the backend
// was made, over every generation: those a switch left count on. ok is
// false when no generation has made that pool.
func (b *Backend) PoolStats(db int, resp3 bool) (s PipeStats, up int, ok bool) {
	i := db * 2
	if resp3 {
		i++
	}
	return b.poolStats(i)
}

// AllPoolStats adds up PoolStats over every database and protocol with a
// pool: what INFO shows for the upstream. db 0's RESP2 pool alone said 4
// connections up where Redis had 8 (RESP3 clients too; found by a probe).
func (b *Backend) AllPoolStats() (s PipeStats, up int) {
	for i := range len(b.gen.Load().pools) {
		ps, u, ok := b.poolStats(i)
		if ok {
			s.Dials += ps.Dials
			s.Failures += ps.Failures
			up += u
		}
	}
	return s, up
}

func (b *Backend) poolStats(i int) (s PipeStats, up int, ok bool) {
	b.statsMu.Lock()
	defer b.statsMu.Unlock()
	if g := b.gen.Load(); i < len(g.pools) {
		if p := g.pools[i].Load(); p != nil {
			s, up = p.Stats()
			ok = true
		}
	}
	for _, old := range b.retiring {
		if i < len(old.pools) {
			if p := old.pools[i].Load(); p != nil {
				os, _ := p.Stats()
				addCounters(&s, os)
				ok = true
			}
		}
	}
	if i < len(b.retired) && b.retired[i] != (PipeStats{}) {
		addCounters(&s, b.retired[i])
		ok = true
	}
	return s, up, ok
}

func (g *backendGen) pending() int64 {
	var n int64
	for i := range g.pools {
		if p := g.pools[i].Load(); p != nil {
			s, _ := p.Stats()
			n += int64(s.Pending)
		}
	}
	return n
}

func (g *backendGen) abandon() {
	for i := range g.pools {
		if p := g.pools[i].Load(); p != nil {
			p.Abandon()
		}
	}
}

func (g *backendGen) close() {
	g.retire()
	g.alone.close()
	for i := range g.pools {
		if p := g.pools[i].Load(); p != nil {
			p.Close()
		}
	}
}

// Close closes every pool and waits for their goroutines.
func (b *Backend) Close() {
	b.idleMu.Lock()
	b.closedDed = true
	for _, ps := range b.idle {
		for _, p := range ps {
			p.Close()
		}
	}
	b.idle = nil
	b.idleMu.Unlock()
	b.mu.Lock()
	if !b.closed {
		b.closed = true
		close(b.stop)
	}
	g := b.gen.Load()
	b.mu.Unlock()
	g.close()
	b.drains.Wait()
}

// RegisterMetrics exposes upstream state, read when Prometheus scrapes.
func (b *Backend) RegisterMetrics(reg prometheus.Registerer) {
	reg.MustRegister(&backendCollector{b: b})
}

// RegisterMetricsWithNode is RegisterMetrics with an empty node label on
// the series a cluster node's have it on (DescribeNodeMetrics): for a
// registry that also holds a cluster's nodes' series under the same
// names, which must carry the same labels (with routes, beside a named
// cluster upstream). Prometheus reads an empty label as no label, so
// queries that name none see the same series.
func (b *Backend) RegisterMetricsWithNode(reg prometheus.Registerer) {
	reg.MustRegister(&backendCollector{b: b, node: true})
}

// backendCollector is one backend's collector; node: with an empty node
// label (RegisterMetricsWithNode).
type backendCollector struct {
	b    *Backend
	node bool
}

// backendDescs are the upstream metrics of one backend; labelled with the
// node as well in cluster mode (NodeMetrics), where a backend is a node.
type backendDescs struct {
	up, pending, failures, timeouts, overdue, dials, pinned, commands, held *prometheus.Desc
	refused                                                                 *prometheus.Desc // the shared limit's, so not per node: nil there
}

func newBackendDescs(node bool) *backendDescs {
	var first []string
	if node {
		first = []string{"node"}
	}
	labels := append(first, "db", "protocol")
	var refused *prometheus.Desc
	if !node {
		refused = prometheus.NewDesc("redproxy_upstream_dedicated_refused_total", "Clients refused a dedicated upstream connection (a transaction, blocking command, pub/sub, MONITOR) because upstream.max_pinned were in use.", nil, nil)
	}
	return &backendDescs{
		refused:  refused,
		up:       prometheus.NewDesc("redproxy_upstream_connections_up", "Shared upstream connections currently established.", labels, nil),
		pending:  prometheus.NewDesc("redproxy_upstream_queue_depth", "Client batches sent or queued on shared upstream connections and not yet answered.", labels, nil),
		failures: prometheus.NewDesc("redproxy_upstream_connection_failures_total", "Shared upstream connections lost (errors, timeouts, Redis going away).", labels, nil),
		timeouts: prometheus.NewDesc("redproxy_upstream_timeouts_total", "Shared upstream connections closed because Redis answered nothing, not even a PING on a fresh connection, for upstream.dead_timeout.", labels, nil),
		overdue:  prometheus.NewDesc("redproxy_upstream_overdue_replies_total", "Times a shared upstream connection's oldest reply took longer than upstream.reply_timeout and Redis was probed (slow command, busy script, CLIENT PAUSE, or a dead server).", labels, nil),
		dials:    prometheus.NewDesc("redproxy_upstream_dials_total", "Connection attempts to Redis.", labels, nil),
		pinned:   prometheus.NewDesc("redproxy_upstream_dedicated_connections", pinnedHelp, first, nil),
		commands: prometheus.NewDesc("redproxy_upstream_commands_total", "Commands written to Redis on shared connections.", labels, nil),
		held:     prometheus.NewDesc("redproxy_upstream_backlog_waits_total", "Client batches held back because every shared upstream connection had about 64 MB of replies in Redis's hands, until one had room (at most upstream.dead_timeout).", labels, nil),
	}
}

// pinnedHelp: a backend's gauge shows the total upstream.max_pinned bounds
// (shared by every credential's backends); a cluster node's series show
// that node's, which it bounds per node. One text for both: series of one
// name in one registry must share it (RegisterMetricsWithNode).
const pinnedHelp = "Dedicated upstream connections in use (transactions, blocking commands, pub/sub, MONITOR): what upstream.max_pinned bounds, all upstream credentials together, or per node of a cluster (node label)."

var (
	plainDescs = newBackendDescs(false)
	nodeDescs  = newBackendDescs(true)
)

func (d *backendDescs) describe(ch chan<- *prometheus.Desc) {
	for _, desc := range []*prometheus.Desc{d.pinned, d.up, d.pending, d.failures, d.timeouts, d.overdue, d.dials, d.commands, d.held, d.refused} {
		if desc != nil {
			ch <- desc
		}
	}
}

func (c *backendCollector) Describe(ch chan<- *prometheus.Desc) {
	if c.node {
		nodeDescs.describe(ch)
		DescribeRefused(ch)
		return
	}
	plainDescs.describe(ch)
}

func (c *backendCollector) Collect(ch chan<- prometheus.Metric) {
	if c.node {
		c.b.collect(ch, nodeDescs, true, "")
		c.b.pins.CollectRefused(ch)
		return
	}
	c.b.collect(ch, plainDescs, true)
}

// DescribeNodeMetrics and CollectNodeMetrics are, for a collector over
// the backends of a cluster's nodes, the metrics of RegisterMetrics with
// the node's address as the first label.
func DescribeNodeMetrics(ch chan<- *prometheus.Desc) { nodeDescs.describe(ch) }

// DescribeRefused and CollectRefused are, for a collector over a
// cluster's nodes, redproxy_upstream_dedicated_refused_total of the limit
// the nodes' limits are Children of: every node's refusals.
func DescribeRefused(ch chan<- *prometheus.Desc) { ch <- plainDescs.refused }

// CollectRefused: see DescribeRefused.
func (l *PinLimit) CollectRefused(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(plainDescs.refused, prometheus.CounterValue, float64(l.Refused()))
}

// CollectNodeMetrics: see DescribeNodeMetrics.
func (b *Backend) CollectNodeMetrics(ch chan<- prometheus.Metric, node string) {
	b.collect(ch, nodeDescs, false, node)
}

// collect sends b's series of d, labelled with node if given; shared: the
// pinned gauge is the whole limit's (every credential's backends), not
// b's own (a cluster node's).
func (b *Backend) collect(ch chan<- prometheus.Metric, d *backendDescs, shared bool, node ...string) {
	pinned := b.pinned.Load()
	if shared {
		pinned = b.pins.Used()
	}
	ch <- prometheus.MustNewConstMetric(d.pinned, prometheus.GaugeValue, float64(pinned), node...)
	if d.refused != nil {
		ch <- prometheus.MustNewConstMetric(d.refused, prometheus.CounterValue, float64(b.pins.Refused()))
	}
	g := b.gen.Load()
	for i := range g.pools {
		s, up, ok := b.poolStats(i)
		if !ok {
			continue
		}
		proto := "resp2"
		if i%2 == 1 {
			proto = "resp3"
		}
		labels := append(node[:len(node):len(node)], strconv.Itoa(i/2), proto)
		ch <- prometheus.MustNewConstMetric(d.up, prometheus.GaugeValue, float64(up), labels...)
		ch <- prometheus.MustNewConstMetric(d.pending, prometheus.GaugeValue, float64(s.Pending), labels...)
		ch <- prometheus.MustNewConstMetric(d.failures, prometheus.CounterValue, float64(s.Failures), labels...)
		ch <- prometheus.MustNewConstMetric(d.timeouts, prometheus.CounterValue, float64(s.Timeouts), labels...)
		ch <- prometheus.MustNewConstMetric(d.overdue, prometheus.CounterValue, float64(s.Overdue), labels...)
		ch <- prometheus.MustNewConstMetric(d.dials, prometheus.CounterValue, float64(s.Dials), labels...)
		ch <- prometheus.MustNewConstMetric(d.commands, prometheus.CounterValue, float64(s.Commands), labels...)
		ch <- prometheus.MustNewConstMetric(d.held, prometheus.CounterValue, float64(s.Held), labels...)
	}
}

// Moves is how many times the backend has moved to another server (a
// Failover, or a Switch to another address). A write forwarded when it
// was n went to a server the backend has left if it is more than n now:
// what WAIT asks of the server now says nothing about that write (the
// proxy answers WAIT itself then). It is counted after the new
// generation is in place, so a sender that read n sends to the server
// of the n-th move or a later one, never to one left before.
func (b *Backend) Moves() uint32 { return b.moves.Load() }

// DialledBefore reports whether the dedicated pipe p, in use, was dialled
// before the current generation: to the server before a switch or a
// failover.
func (b *Backend) DialledBefore(p *Pipe) bool {
	b.idleMu.Lock()
	g, ok := b.dialled[p]
	b.idleMu.Unlock()
	return ok && g != b.gen.Load()
}

// Addr is the address the current generation dials.
func (b *Backend) Addr() string { return b.gen.Load().opt.Addr }

// Connections is the number of shared connections per pool.
func (b *Backend) Connections() int { return b.gen.Load().opt.Connections }

// Pinned is the number of dedicated connections in use.
func (b *Backend) Pinned() int64 { return b.pinned.Load() }

// PinnedTotal is the number of dedicated connections in use under this
// backend's limit, its own and those of the backends sharing the limit.
func (b *Backend) PinnedTotal() int64 { return b.pins.Used() }

// MaxPinned is upstream.max_pinned as in force now.
func (b *Backend) MaxPinned() int64 { return b.pins.Max() }
