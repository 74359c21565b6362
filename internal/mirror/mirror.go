// Package mirror sends a copy of the proxy's traffic to a second upstream,
// fire-and-forget, to warm and validate it before routes switch to it
// (a migration).
//
// The primary path never waits for the mirror. A session collects the
// commands of one batch that are to be mirrored (Batch) and, once the
// primary's replies are in, hands them to Enqueue, which copies them into
// a bounded queue or drops them, counted, when the queue is full. One
// sender goroutine takes everything queued, sends it on the mirror's own
// connections (in queue order within a database, see sender) and, for
// sampled reads, compares the mirror's reply with the primary's, byte for
// byte (a reply past maxKeptReply by its length and hash, never held whole).
//
// The queue's limits count what is queued and what is in flight to the
// mirror, so a mirror that stalls (CLIENT PAUSE, DEBUG SLEEP, a dead
// network) costs at most mirror.queue commands and mirror.queue_bytes bytes;
// everything past that is dropped and counted, and the sender's wait ends
// at the mirror's reply or dead timeout.
package mirror

import (
	"bytes"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redproxy/redproxy/internal/resp"
	"github.com/redproxy/redproxy/internal/slowlog"
	"github.com/redproxy/redproxy/internal/upstream"
)

// Reasons a mirrored command was dropped (redproxy_mirror_dropped_total).
const (
	DropQueueFull   = "queue_full"  // the queue held mirror.queue commands or mirror.queue_bytes bytes
	DropTooLarge    = "too_large"   // the batch alone is larger than mirror.queue_bytes
	DropUnavailable = "unavailable" // no connection to the mirror was up: nothing was sent
	DropDBRange     = "db_range"    // the client's database does not exist on the mirror
	DropShutdown    = "shutdown"    // queued when the proxy shut down
	// DropNoScript: an EVALSHA whose script the mirror lacks, and whose
	// body the proxy never saw (loaded before it started): the mirror
	// answered NOSCRIPT, so it did not run there.
	DropNoScript = "noscript"
	// DropCrossSlot: with a cluster mirror, a command or transaction whose
	// keys hash to different slots and that Redis Cluster cannot split
	// (MGET, MSET, DEL, UNLINK, EXISTS and TOUCH are split): not sent.
	DropCrossSlot = "cross_slot"
)

var dropReasons = []string{DropQueueFull, DropTooLarge, DropUnavailable, DropDBRange, DropShutdown, DropNoScript, DropCrossSlot}

// Reasons a write was not mirrored at all, or a sampled read not compared
// (redproxy_mirror_skipped_total).
const (
	// SkipTransaction: a transaction that did not run on the primary (EXEC
	// answered EXECABORT, an error, or a null for a failed WATCH): nothing
	// of it is mirrored. One per transaction. (Transactions that ran are
	// mirrored whole, MULTI to EXEC.)
	SkipTransaction = "transaction"
	// SkipBlocking: a blocking XREADGROUP that delivered entries; what it
	// changed (the group's pending entries) is not mirrored. Blocking pops
	// are mirrored as their non-blocking forms.
	SkipBlocking = "blocking"
	// SkipPrimaryError: the primary answered the write with an error (or
	// not at all), so it did not run there; it is not run on the mirror.
	SkipPrimaryError = "primary_error"
	// SkipNondeterministic: a write whose effect the server chose and that
	// its reply does not tell (XCLAIM, XAUTOCLAIM, XTRIM with ~, MIGRATE):
	// run as sent, the mirror would choose otherwise and drift. SPOP and
	// XADD are mirrored as their effect, rebuilt from the reply.
	SkipNondeterministic = "nondeterministic"
	// SkipRelayed: a write of a relayed client (CLIENT TRACKING on, a
	// RESP3 subscriber, MONITOR), whose connection is a raw byte relay
	// the mirror does not see into. Counted so that a mirror missing
	// those clients' writes says so (found by review: they were lost
	// without a trace).
	SkipRelayed = "relayed"
	// SkipReplicaRead: a sampled read to compare that a replica answered
	// (upstream.read_from): it is mirrored, but not compared, since the
	// replica may lag the primary (found by review: its stale reply was
	// counted as the mirror's mismatch). One per read.
	SkipReplicaRead = "replica_read"
)

var skipReasons = []string{SkipTransaction, SkipBlocking, SkipPrimaryError, SkipNondeterministic, SkipRelayed, SkipReplicaRead}

// Kinds of mirror errors (redproxy_mirror_errors_total).
const (
	ErrReply      = "reply"      // the mirror answered an error where the primary did not
	ErrConnection = "connection" // no reply: connection lost, reply timeout, reply too large
)

var errorKinds = []string{ErrReply, ErrConnection}

// Options are what a Mirror needs beyond its configuration.
type Options struct {
	Config Config
	// Dial builds the connections to the mirror's upstream. The sender
	// calls it once, on its own goroutine, so a mirror that is down (or a
	// Sentinel or cluster slow to answer) delays neither the proxy's start
	// nor its clients. stop is closed when the mirror closes: a Dial
	// still looking for its upstream (a Sentinel that does not answer)
	// returns nil then, so Close does not wait for it.
	Dial func(stop <-chan struct{}) Target
	// Address is the mirror's address, for /debug/mirror.
	Address string
	// Databases is how many databases the mirror has; commands of a higher
	// database are dropped (DropDBRange).
	Databases int
	Logger    *slog.Logger
}

// Mirror is the running mirror: its queue, its sender and its counters.
type Mirror struct {
	cfg  Config
	opt  Options
	log  *slog.Logger
	stop chan struct{}
	done chan struct{}
	wake chan struct{}

	mu      sync.Mutex
	queue   []*entry
	cmds    int   // queued or in flight
	bytes   int64 // queued or in flight
	closed  bool
	target  Target
	issued  uint64               // the last ticket taken (order.go)
	open    map[uint64]time.Time // tickets taken and not back, with when
	held    []held               // entries waiting for open tickets, oldest first
	heldSeq uint64               // the last held entry's id
	closeMu sync.Mutex           // one Close at a time

	stats    stats
	patterns patterns
	lastLog  atomic.Int64 // unix nanoseconds of the last mismatch logged
	unlogged atomic.Int64 // mismatches not logged since
}

type stats struct {
	sent, sampled, compared, mismatches atomic.Int64
	dropped                             [7]atomic.Int64 // by dropReasons
	skipped                             [6]atomic.Int64 // by skipReasons
	errors                              [2]atomic.Int64 // by errorKinds
}

func indexOf(list []string, s string) int {
	for i, v := range list {
		if v == s {
			return i
		}
	}
	panic("mirror: unknown reason " + s)
}

// New starts a mirror's sender. Close stops it.
func New(o Options) *Mirror {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	m := &Mirror{
		cfg:  o.Config,
		opt:  o,
		log:  o.Logger.With("component", "mirror", "mirror_upstream", o.Config.Upstream),
		stop: make(chan struct{}),
		done: make(chan struct{}),
		wake: make(chan struct{}, 1),
	}
	m.patterns.m = make(map[string]*patternStat)
	go m.run()
	return m
}

// Writes reports whether writes are mirrored.
func (m *Mirror) Writes() bool { return m.cfg.Writes }

// Compare reports whether sampled reads are compared.
func (m *Mirror) Compare() bool { return m.cfg.Compare }

// SampleRead decides whether one read is mirrored (mirror.reads_sample),
// and counts it if so.
func (m *Mirror) SampleRead() bool {
	p := m.cfg.ReadsSample
	if p <= 0 || p < 1 && rand.Float64() >= p {
		return false
	}
	m.stats.sampled.Add(1)
	return true
}

// Skipped counts a write that is not mirrored, or a sampled read not
// compared, for reason (a Skip* value).
func (m *Mirror) Skipped(reason string) { m.stats.skipped[indexOf(skipReasons, reason)].Add(1) }

// Dropped counts n commands the session could not hand to the queue, for
// reason (a Drop* value): a transaction larger than mirror.queue_bytes.
func (m *Mirror) Dropped(reason string, n int) { m.drop(reason, n) }

// MaxBytes is mirror.queue_bytes: no one entry may be larger.
func (m *Mirror) MaxBytes() int { return int(m.cfg.QueueBytes) }

func (m *Mirror) drop(reason string, n int) {
	m.stats.dropped[indexOf(dropReasons, reason)].Add(int64(n))
}

// entry is one client batch's mirrored commands, copied: buf holds every
// part back to back, then the primary's replies and keys kept for
// comparison.
type entry struct {
	db    int
	resp3 bool
	// crossDB: the entry may change another database, so it is ordered
	// against every database's runs, not only its own (sender.send).
	crossDB bool
	buf     []byte
	ends    []int // ends[i] is where part i ends in buf
	cmds    []command
	size    int64
}

type command struct {
	parts      int // how many parts (RESP commands) it takes, from the previous command's end
	name       string
	read       bool
	compare    bool
	primaryErr bool
	dropped    bool   // not sent (DropCrossSlot): no replies
	reply, key [2]int // in buf
}

func (e *entry) part(i int) []byte {
	start := 0
	if i > 0 {
		start = e.ends[i-1]
	}
	return e.buf[start:e.ends[i]]
}

// Enqueue copies b's commands, run on the primary in database db with
// the protocol resp3, into the queue, or drops them (all of them: a
// batch is mirrored whole or not at all) when the queue is full. It never
// blocks on the mirror. b may be reused once it returns.
func (m *Mirror) Enqueue(db int, resp3 bool, b *Batch) { m.enqueue(db, resp3, b, false) }

func (m *Mirror) enqueue(db int, resp3 bool, b *Batch, after bool) {
	ticket := b.ticket
	b.ticket = 0
	defer func() {
		if ticket != 0 {
			m.end(ticket) // once b's entry is queued (or dropped), unless held
		}
	}()
	n := len(b.cmds)
	if n == 0 {
		return
	}
	if db >= m.opt.Databases {
		m.drop(DropDBRange, n)
		return
	}
	size := b.size()
	if size > int64(m.cfg.QueueBytes) {
		m.drop(DropTooLarge, n)
		return
	}
	m.mu.Lock()
	switch {
	case m.closed:
		m.mu.Unlock()
		m.drop(DropShutdown, n)
		return
	case m.cmds+n > m.cfg.Queue || m.bytes+size > int64(m.cfg.QueueBytes):
		m.mu.Unlock()
		m.drop(DropQueueFull, n)
		return
	}
	// Reserved before the copy, so that a full queue costs the client no
	// copy at all.
	m.cmds += n
	m.bytes += size
	m.mu.Unlock()

	e := b.copyOut(db, resp3, size)
	m.mu.Lock()
	if m.closed {
		m.cmds -= n
		m.bytes -= size
		m.mu.Unlock()
		m.drop(DropShutdown, n)
		return
	}
	own := m.heldIndex(b.held)
	switch {
	case after && (len(m.open) > 0 || own >= 0):
		// Behind the writes in flight now (order.go), and behind the
		// session's own held entry.
		m.heldSeq++
		m.held = append(m.held, held{after: m.issued, e: e, since: time.Now(), id: m.heldSeq})
		b.held = m.heldSeq
	case own >= 0:
		// Behind the session's own held entry (order.go).
		m.holdBehind(own, e, ticket)
		ticket = 0 // given back when e is released
		b.held = m.heldSeq
	default:
		b.held = 0
		m.queue = append(m.queue, e)
	}
	m.mu.Unlock()
	m.signal() // the entry queued, or the sender's wait now has a deadline (maxHold)
}

// Queued returns the commands and bytes queued or in flight.
func (m *Mirror) Queued() (cmds int, bytes int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cmds, m.bytes
}

// Close stops the sender: what is still queued is dropped (DropShutdown),
// and what is in flight fails at once, as the mirror's connections close.
func (m *Mirror) Close() {
	m.closeMu.Lock()
	defer m.closeMu.Unlock()
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	m.closed = true
	t := m.target
	m.mu.Unlock()
	close(m.stop)
	if t != nil {
		t.Close() // ends a wait on a stalled mirror
	}
	<-m.done
	m.mu.Lock()
	t = m.target
	m.mu.Unlock()
	if t != nil {
		t.Close() // the pools the last round created after the first Close
	}
}

// maxLogEvery spaces the mismatch log lines: one a second at most, each
// saying how many were not logged since.
const maxLogEvery = time.Second

func (m *Mirror) run() {
	defer close(m.done)
	t := m.opt.Dial(m.stop) // nil only once closed
	m.mu.Lock()
	m.target = t
	closed := m.closed
	m.mu.Unlock()
	if closed {
		m.take(nil) // counts what was queued as dropped
		return
	}
	s := sender{m: m, t: t}
	var round []*entry
	for {
		round = m.take(round[:0])
		if round == nil {
			return
		}
		s.send(round)
		var n int
		var size int64
		for _, e := range round {
			n += len(e.cmds)
			size += e.size
		}
		clear(round)
		m.mu.Lock()
		m.cmds -= n
		m.bytes -= size
		m.mu.Unlock()
	}
}

// take waits for queued entries and takes them all; nil once closed.
func (m *Mirror) take(into []*entry) []*entry {
	m.mu.Lock()
	for len(m.queue) == 0 && !m.closed {
		var timeout <-chan time.Time
		if len(m.held) > 0 {
			timeout = time.After(max(time.Millisecond, maxHold-time.Since(m.held[0].since)))
		}
		m.mu.Unlock()
		select {
		case <-m.wake:
		case <-m.stop:
		case <-timeout:
		}
		m.mu.Lock()
		m.releaseLocked(time.Now())
	}
	if m.closed {
		for _, h := range m.held {
			m.queue = append(m.queue, h.e)
		}
		clear(m.held)
		m.held = nil
		for _, e := range m.queue {
			m.drop(DropShutdown, len(e.cmds))
			m.cmds -= len(e.cmds)
			m.bytes -= e.size
		}
		m.queue = nil
		m.mu.Unlock()
		return nil
	}
	if len(m.held) > 0 {
		m.releaseLocked(time.Now()) // those held past maxHold go too
	}
	into, m.queue = m.queue, into
	m.mu.Unlock()
	return into
}

// sender sends rounds of entries to the mirror's Target.
//
// A round is cut into runs, each one Call on one connection: commands
// reach the mirror in the round's order within a database, and databases
// are independent of each other (their runs go at the same time). A
// write's effect does not depend on the protocol, so a write joins the
// run in progress whatever its client's protocol; a sampled read, whose
// reply is compared byte for byte, needs its client's protocol, and a
// read of the other protocol starts a new run, sent after the previous
// one has been answered.
type sender struct {
	m       *Mirror
	t       Target
	runs    []run
	nruns   int
	last    map[int]int // database -> its last run this round
	scripts scripts
	args    [][]byte // scratch
}

type run struct {
	db    int
	resp3 bool
	call  *upstream.Call
	cmds  []cmdRef
	sent  bool
}

// cmdRef is one command of a run: command i of entry e.
type cmdRef struct {
	e *entry
	i int
}

func (s *sender) runFor(db int, resp3, read bool) *run {
	if j, ok := s.last[db]; ok {
		if r := &s.runs[j]; !read || r.resp3 == resp3 {
			return r
		}
	}
	if s.nruns == len(s.runs) {
		s.runs = append(s.runs, run{call: upstream.NewCall()})
	}
	r := &s.runs[s.nruns]
	r.db, r.resp3 = db, resp3
	s.last[db] = s.nruns
	s.nruns++
	return r
}

func (s *sender) send(round []*entry) {
	m := s.m
	if s.last == nil {
		s.last = map[int]int{}
	}
	rt, _ := s.t.(*routerTarget)
	for _, e := range round {
		if e.crossDB {
			// Databases' runs go at the same time: an entry that reaches
			// another database runs alone, after what came before it in
			// every database and before what comes after (a review found
			// SET k; MOVE k 1 then SELECT 1; INCR k reordered).
			s.flush()
		}
		p := 0
		for i := range e.cmds {
			c := &e.cmds[i]
			if c.parts > 1 && rt != nil && rt.crossSlot(e, p, c.parts) {
				c.dropped = true
				m.drop(DropCrossSlot, 1)
				p += c.parts
				continue
			}
			r := s.runFor(e.db, e.resp3, c.read)
			for k := p; k < p+c.parts; k++ {
				r.call.Add(s.prepare(e.part(k)))
			}
			r.cmds = append(r.cmds, cmdRef{e: e, i: i})
			p += c.parts
		}
		if e.crossDB {
			s.flush()
		}
	}
	s.flush()
}

// flush sends the runs gathered so far and checks their replies.
func (s *sender) flush() {
	if s.nruns == 0 {
		return
	}
	s.do()
	for i := range s.runs[:s.nruns] {
		r := &s.runs[i]
		if r.sent {
			s.check(r)
		}
		r.call.Reset()
		clear(r.cmds)
		r.cmds, r.sent = r.cmds[:0], false
	}
	s.nruns = 0
	clear(s.last)
}

// do sends the round's runs: each database's in order, one after the
// other's replies, and the databases at the same time.
func (s *sender) do() {
	runs := s.runs[:s.nruns]
	sendDB := func(db int) {
		for i := range runs {
			r := &runs[i]
			if r.db != db {
				continue
			}
			// The replies are held until the round is checked: cap them
			// like the requests, and each one (maxKeptReply).
			r.call.SetReplyLimit(int(s.m.cfg.QueueBytes))
			r.call.SetMaxReply(maxKeptReply)
			if err := s.t.Do(r.db, r.resp3, r.call); err != nil {
				s.m.drop(DropUnavailable, len(r.cmds))
				continue
			}
			r.sent = true
			s.m.stats.sent.Add(int64(len(r.cmds)))
		}
	}
	if len(s.last) == 1 {
		sendDB(runs[0].db)
		return
	}
	var wg sync.WaitGroup
	for db := range s.last {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sendDB(db)
		}()
	}
	wg.Wait()
}

// maxKeptReply is the longest reply of the mirror's that the sender keeps
// whole. The mirror's replies are only classified and compared, never sent
// to a client, so a longer one is read past as it arrives
// (upstream.Call.SetMaxReply): the sender keeps its length, a 64-bit hash
// (maphash) of all its bytes and its first 64 bytes, and one reply costs
// the mirror a bounded amount of memory whatever its size. (A review
// measured ~255 MB allocated for a 64 MB value read back from the mirror:
// the reply was buffered whole before the run's reply cap dropped it, and
// every reply after it in the run went uncompared.)
//
// The compare stays byte for byte in effect: a reply up to this size is
// compared with the primary's bytes as before; a longer one matches when
// the primary's reply has the same length and the same hash, so a reply
// that differs in length or in any byte is a mismatch, but for a 2^-64
// chance of a hash collision. Errors are told by the first bytes
// (NOSCRIPT, an error reply), which are kept.
const maxKeptReply = 64 << 10

// check goes through a run's replies: errors counted, sampled reads
// compared with the primary's replies.
func (s *sender) check(r *run) {
	m := s.m
	rt, _ := s.t.(*routerTarget)
	reply := 0
	for _, ref := range r.cmds {
		e, c := ref.e, &ref.e.cmds[ref.i]
		var own []byte
		var ownDigest upstream.Digest // own was too long to keep (maxKeptReply): its digest
		ownDigested := false
		failed, errReply, noScript, crossSlot, unkept := false, false, false, false, false
		for p := 0; p < c.parts; p++ {
			rep, err := r.call.Reply(reply)
			var d upstream.Digest
			digested := errors.Is(err, upstream.ErrDigested)
			if digested {
				d, _ = r.call.Digest(reply)
				rep, err = d.Head, nil
			}
			reply++
			switch {
			case errors.Is(err, upstream.ErrOutputLimit):
				// Answered, past the run's reply cap: it ran, but its
				// reply (and every later one of the run) was not kept.
				unkept = true
			case err != nil:
				failed = true
			case bytes.HasPrefix(rep, noScriptReply):
				noScript = true
			case !digested && rt != nil && rt.refused(rep):
				crossSlot = true
			case resp.IsError(rep):
				errReply = true
			}
			if p == 0 {
				own, ownDigest, ownDigested = rep, d, digested
			}
		}
		switch {
		case failed:
			m.stats.errors[indexOf(errorKinds, ErrConnection)].Add(1)
			continue
		case noScript:
			// The proxy never saw the script's body (prepare): it did not
			// run on the mirror.
			m.drop(DropNoScript, 1)
			continue
		case crossSlot:
			m.drop(DropCrossSlot, 1)
			continue
		case errReply && !c.primaryErr:
			m.stats.errors[indexOf(errorKinds, ErrReply)].Add(1)
		}
		if !c.compare || unkept {
			continue
		}
		m.stats.compared.Add(1)
		primary := e.buf[c.reply[0]:c.reply[1]]
		var same bool
		if ownDigested {
			same = int64(len(primary)) == ownDigest.Len && upstream.DigestOf(primary).Sum == ownDigest.Sum
		} else {
			same = bytes.Equal(own, primary)
		}
		if !same {
			m.mismatch(c.name, e.buf[c.key[0]:c.key[1]], e.db)
		}
	}
}

// mismatch counts a sampled read whose replies differ, under its key's
// pattern (slowlog.KeyPattern: the key without its identifying parts, so
// neither the log nor /debug/mirror shows data), and logs it, at most once
// a second.
func (m *Mirror) mismatch(name string, key []byte, db int) {
	m.stats.mismatches.Add(1)
	pattern := slowlog.KeyPattern(key)
	m.patterns.add(pattern, name)
	now := time.Now().UnixNano()
	last := m.lastLog.Load()
	if now-last < int64(maxLogEvery) || !m.lastLog.CompareAndSwap(last, now) {
		m.unlogged.Add(1)
		return
	}
	m.log.Warn("mirror: a sampled read's reply from the mirror differs from the primary's",
		"command", name, "key_pattern", pattern, "db", db, "mismatches_not_logged", m.unlogged.Swap(0))
}
