package stampede

import (
	"bytes"
	"errors"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/resp"
)

// Fetcher sends cmd upstream, followed by then when it is not nil, on a
// shared connection of DB db speaking RESP3 when resp3, and appends their
// replies back to back to dst (which may be nil); a failed reply fails the
// fetch, and what it may have written past len(dst) is garbage.
// (Two fixed arguments rather than a variadic list: a list passed through
// a function value escapes, one allocation per read.) It must not depend on
// the caller's client connection (see Group.Do). The upstream is the one in
// force when the fetch is sent, which for a held read is after the hold:
// a reload may have switched it meanwhile.
type Fetcher func(db int, resp3 bool, cmd, then, dst []byte) ([]byte, error)

// Protection is stampede protection for one configuration, as the proxy
// uses it: the coalescing group (which local-tier fills share: one
// mechanism), the miss hold and early refresh rules, and the protocol that
// ties them to the reads and writes of clients. It is safe for concurrent
// use. A reload builds a new one; reads and holds in flight on the old one
// finish there, and the new one takes over the old holds (Succeed), so a
// read held on a miss is released by its filler's write after the reload.
type Protection struct {
	group    *Group
	metrics  *Metrics
	coalesce bool
	misses   *Misses // nil when no hold or early refresh rule is configured
	// eligible is coalescable for every top-level command of New's table
	// (subcommands never are: OBJECT ..., MEMORY USAGE).
	eligible map[*commands.Command]bool
	fetch    Fetcher

	// retired are the miss holds of earlier Protections whose rules a
	// reload changed (Succeed): reads held there wait for a filler whose
	// write now goes through p, so p forwards writes and closes to them
	// while retiredOn, for retiredFor after the last such reload.
	retired   []*Misses
	retiredOn *atomic.Bool
}

// retiredFor is how long writes and closes are forwarded to the holds of
// rules a reload replaced: a hold lasts at most MaxHoldTimeout, and a read
// that started on the old rules may create one up to a fetch later.
// After it, a hold of the old rules still waiting (none should be) ends at
// its timeout.
const retiredFor = 2 * MaxHoldTimeout

// New builds stampede protection for c over the commands of table,
// fetching through fetch. m may be shared with earlier Protections.
func New(c Config, table *commands.Table, m *Metrics, fetch Fetcher) *Protection {
	p := &Protection{
		group:    NewGroup(Options{MaxWaiters: c.MaxWaiters, Metrics: m}),
		metrics:  m,
		coalesce: c.Coalesce,
		misses:   NewMisses(c, m),
		eligible: map[*commands.Command]bool{},
		fetch:    fetch,
	}
	for _, cmd := range table.Commands() {
		p.eligible[cmd] = coalescable(cmd)
	}
	return p
}

// Metrics returns the counters p updates, for the next Protection.
func (p *Protection) Metrics() *Metrics { return p.metrics }

// KeepMisses makes p use old's miss holds and early refreshes, for a
// reload that changes the upstream but not the rules: holds are about
// keys, not the upstream, so a read held on a miss seen on the old
// upstream still waits for its filler, whose write now goes to the new one
// and must release it. Only the coalescing group is new.
func (p *Protection) KeepMisses(old *Protection) {
	p.misses = old.misses
	p.retired, p.retiredOn = old.retired, old.retiredOn
}

// SameMissRules reports whether a and b have the same hold and early
// refresh rules, all that Misses depends on: a reload between them may
// keep the miss holds (KeepMisses).
func SameMissRules(a, b Config) bool {
	return slices.Equal(a.Hold, b.Hold) && slices.Equal(a.EarlyRefresh, b.EarlyRefresh)
}

// Succeed makes p, built by a reload, take over from old, the Protection
// in force until now. With sameRules (SameMissRules of their configs) p
// keeps old's miss holds and early refreshes (KeepMisses): a reload of
// max_waiters or coalesce, or an upstream switch, leaves a held read
// waiting for its filler's write through p. Otherwise the rules changed
// and p has holds of its own, but for retiredFor p forwards writes of the
// keys old's hold rules match, and closed clients, to old's holds (and
// to those old was still forwarding to), so a read held there is
// released by its filler, not by its timeout.
func (p *Protection) Succeed(old *Protection, sameRules bool) {
	if old == nil {
		return
	}
	if sameRules {
		p.KeepMisses(old)
		return
	}
	if old.retiredOn != nil && old.retiredOn.Load() {
		p.retired = append(p.retired, old.retired...)
	}
	if old.misses != nil && len(old.misses.holdRules) > 0 {
		p.retired = append(p.retired, old.misses)
	}
	if len(p.retired) == 0 {
		return
	}
	on := new(atomic.Bool)
	on.Store(true)
	p.retiredOn = on
	time.AfterFunc(retiredFor, func() { on.Store(false) })
}

// forwarding returns the retired holds p still forwards to.
func (p *Protection) forwarding() []*Misses {
	if p.retiredOn == nil || !p.retiredOn.Load() {
		return nil
	}
	return p.retired
}

// TracksWrites reports whether writes matter to p (it has hold or early
// refresh rules, or forwards to holds of rules a reload replaced), so
// callers can skip WriteStart's key scan.
func (p *Protection) TracksWrites() bool { return p.misses != nil || len(p.forwarding()) > 0 }

// coalescable reports whether identical calls of cmd may share one reply:
// read-only, deterministic, never blocking, and with a reply that does not
// depend on when it is asked (TTLs count down). Subcommands (OBJECT ...,
// MEMORY USAGE) and scripts are left alone. The single-key condition is
// checked per call.
func coalescable(cmd *commands.Command) bool {
	if !cmd.Is(commands.ReadOnly) || cmd.Flags&(commands.Write|commands.Nondeterministic|commands.Blocking|commands.CatScripting) != 0 {
		return false
	}
	switch cmd.Name {
	case "ttl", "pttl", "expiretime", "pexpiretime", "randomkey", "srandmember", "hrandfield", "zrandmember",
		"scan", "sscan", "hscan", "zscan", "touch":
		return false
	}
	return true
}

// ErrClientGone is Read's answer to a read held by a miss hold whose
// client left meanwhile (gone reported it): nobody is left to answer, and
// the caller ends the client's session, as for a client that leaves while
// blocked in BLPOP.
var ErrClientGone = errors.New("stampede: the held read's client is gone")

// goneEvery is how often a held read asks whether its client is gone: as
// often as the proxy's blocking commands do.
const goneEvery = 50 * time.Millisecond

// Read answers a read through coalescing, miss holds and early refresh.
// The caller must send only a read that is alone in its client's batch,
// from a client outside MULTI, WATCH and relays (see the package
// documentation); owner is that client's id. handled is false when p has
// nothing to do with the read (not coalescable, or too many waiters for a
// read no rule applies to: one a rule applies to is fetched alone here,
// overflowRead): the caller sends it upstream itself, which is always
// correct. Otherwise err is the answer, or the reply is appended to dst
// and the result returned (a lone read's reply is fetched straight into
// it, a shared one copied). dst's bytes are never changed; on an error or
// !handled, out is nil. gone (nil: never) reports whether the client has
// left (hung up, or was killed or interrupted); a read held by a miss
// hold asks it every goneEvery, and when it is true stops waiting and
// returns ErrClientGone (handled): a hold lasts up to a minute, and a
// client that left must not keep its session (and a hold it fills) that
// long.
func (p *Protection) Read(cmd *commands.Command, args [][]byte, raw []byte, db int, resp3 bool, owner int64, gone func() bool, dst []byte) (out []byte, handled bool, err error) {
	key, match, ok := p.readKey(cmd, args)
	if !ok || !p.coalesce && !match.Any() {
		return nil, false, nil
	}
	out, err = p.read(raw, key, db, resp3, match, owner, gone, dst)
	if errors.Is(err, ErrTooManyWaiters) {
		return nil, false, nil
	}
	return out, true, err // read returns no bytes with an error
}

// readKey returns the key of a read that Read and Begin may take (a
// coalescable command with one key) and the hold and early refresh rules
// it matches, which apply to GET alone; ok is false for any other read.
func (p *Protection) readKey(cmd *commands.Command, args [][]byte) (key []byte, match Match, ok bool) {
	eligible, known := p.eligible[cmd]
	if !known {
		// A command of another table than p's: the proxy's follows its
		// upstream, and a table read after p was built has commands of
		// its own.
		eligible = cmd.Parent == nil && coalescable(cmd)
	}
	if !eligible {
		return nil, Match{}, false
	}
	var kb [2]int
	keys := cmd.KeysAtMost(args, kb[:0], 2) // one, or more than one
	if len(keys) != 1 {
		return nil, Match{}, false
	}
	key = args[keys[0]]
	if p.misses != nil && cmd.Name == "get" && len(args) == 2 {
		match = p.misses.Match(key)
	}
	return key, match, true
}

// Begin makes a read the leader of a fetch that the caller sends itself,
// with the same contract as Read about which reads may come here; the
// caller must send the read after Begin returns and end the Lead when its
// reply is in (Lead.End). Reads of the same key that arrive meanwhile
// collect behind it, as behind any fetch. ok is false where Read must be
// used instead: the read is not coalescable or not coalesced, a hold or
// early refresh rule matches its key, test hooks hold fetches, or a fetch
// of the same read is in flight or collecting already.
func (p *Protection) Begin(cmd *commands.Command, args [][]byte, raw []byte, db int, resp3 bool) (l Lead, ok bool) {
	if !p.coalesce {
		return Lead{}, false
	}
	key, match, ok := p.readKey(cmd, args)
	if !ok || match.Any() {
		return Lead{}, false
	}
	if h := hooks.Load(); h != nil && h.afterFetch != nil {
		return Lead{}, false // the hook runs on the leader's goroutine: Read's path
	}
	var fk [flightKeyBuf]byte
	return p.group.begin(appendFlightKey(fk[:0], 'r', db, resp3, raw), p.metrics.forKey(key))
}

// flightKeyBuf is room on the stack for the flight key of a typical read.
const flightKeyBuf = 128

// read answers one read through the group, applying the miss hold and
// early refresh rules of match, and appends the reply to dst.
func (p *Protection) read(raw, key []byte, db int, resp3 bool, match Match, owner int64, gone func() bool, dst []byte) ([]byte, error) {
	var since uint64 // before the fetch is sent (Misses.MissedSince)
	if match.Hold() {
		since = p.misses.Seq()
		if h := p.misses.Held(db, key, match, owner); h != nil {
			return p.heldRead(h, raw, key, db, resp3, match, owner, gone, dst)
		}
	}
	if match.Refresh() {
		var kb [flightKeyBuf]byte
		// The PTTL travels in the same fetch, right behind the GET on the
		// same connection; the client never sees it.
		both, _, err := p.group.do(appendFlightKey(kb[:0], 't', db, resp3, raw), p.metrics.forKey(key), func() ([]byte, error) {
			return p.fetch(db, resp3, raw, pttlCommand(key), nil)
		})
		if errors.Is(err, ErrTooManyWaiters) {
			both, err = p.fetch(db, resp3, raw, pttlCommand(key), nil) // alone, and still under the rules (overflowRead)
		}
		if err != nil {
			return nil, err
		}
		reply, ttl := splitTTL(both)
		if isNilReply(reply) {
			if h := p.misses.MissedSince(db, key, match, owner, true, since); h != nil {
				return p.heldRead(h, raw, key, db, resp3, match, owner, gone, dst)
			}
		} else if isValueReply(reply) && p.misses.Early(db, key, match, owner, ttl) {
			// Only a value may expire "a little early": an error
			// (WRONGTYPE for a key of another type, which may well have
			// a TTL) or any other reply passes through as Redis gave it.
			return append(dst, nilReply(resp3)...), nil
		}
		return append(dst, reply...), nil
	}
	out, reply, err := p.fetchRead(raw, key, db, resp3, dst)
	if errors.Is(err, ErrTooManyWaiters) && match.Any() {
		out, reply, err = p.overflowRead(raw, db, resp3, dst)
	}
	if err != nil {
		return nil, err
	}
	if !match.Any() {
		return out, nil
	}
	// Hold rules only (early refresh took the branch above).
	if isNilReply(reply) {
		if h := p.misses.MissedSince(db, key, match, owner, true, since); h != nil {
			return p.heldRead(h, raw, key, db, resp3, match, owner, gone, dst)
		}
	}
	return out, nil
}

// fetchRead reads raw through the group, under the flight key of a plain
// read, and returns dst with the reply appended and the reply alone. The
// leader's fetch appends its reply to dst itself; a waiter gets a copy of
// it from the group and appends that. ErrTooManyWaiters: the caller sends
// the read alone.
func (p *Protection) fetchRead(raw, key []byte, db int, resp3 bool, dst []byte) (out, reply []byte, err error) {
	start := len(dst)
	var kb [flightKeyBuf]byte
	var fetched []byte
	reply, shared, err := p.group.do(appendFlightKey(kb[:0], 'r', db, resp3, raw), p.metrics.forKey(key), func() ([]byte, error) {
		var err error
		if fetched, err = p.fetch(db, resp3, raw, nil, dst); err != nil {
			return nil, err
		}
		return fetched[start:], nil
	})
	if err != nil {
		return nil, nil, err
	}
	if shared {
		return append(dst, reply...), reply, nil
	}
	return fetched, reply, nil
}

// overflowRead reads raw alone, outside the group, for a read past
// max_waiters whose key a hold or early refresh rule matches: its nil must
// still meet the rules (Misses.MissedSince). Handed back to the caller to
// send alone, as a read no rule matches is, every read past the cap in a
// stampede got the nil and recomputed (found by a probe: 86 of 100
// cache-aside clients with max_waiters 5, 893 of 2000 at the default
// 1000, where the hold lets one).
func (p *Protection) overflowRead(raw []byte, db int, resp3 bool, dst []byte) (out, reply []byte, err error) {
	start := len(dst)
	out, err = p.fetch(db, resp3, raw, nil, dst)
	if err != nil {
		return nil, nil, err
	}
	return out, out[start:], nil
}

// heldRead waits for a miss hold to end and then reads the key through the
// group, as any read: the reads the hold released share fetches that are
// all sent after the release, which keeps each reply inside its reader's
// window, and the group applies max_waiters to them (the excess are sent
// alone, like any read past the cap, overflowRead) and
// counts them as coalesced reads and fetches saved. A read that is held
// once is never held again: if the key is still missing it gets the nil
// (and may become the next filler). ErrClientGone: gone said the client
// left while the read was held (see Read).
func (p *Protection) heldRead(h *Hold, raw, key []byte, db int, resp3 bool, match Match, owner int64, gone func() bool, dst []byte) ([]byte, error) {
	if !h.waitFor(gone) {
		return nil, ErrClientGone
	}
	out, reply, err := p.fetchRead(raw, key, db, resp3, dst)
	if errors.Is(err, ErrTooManyWaiters) {
		out, reply, err = p.overflowRead(raw, db, resp3, dst)
	}
	if err != nil {
		return nil, err
	}
	if isNilReply(reply) {
		p.misses.Missed(db, key, match, owner, false)
	}
	return out, nil
}

// Fill shares a fill of the local tier with every concurrent read of the
// same command (coalesced reads and other fills), under the key coalesced
// reads use, so concurrent misses of a hot key make one request. Whoever
// leads the fetch, its reply is a read Redis ran after every waiter asked.
// When fill fails (the tier cannot fill: a write in flight, no fill
// connection, a reply with no RESP2 form), the leader reads raw through
// the Fetcher instead, so waiters always get an answer. ErrTooManyWaiters:
// the caller should send its read upstream alone.
func (p *Protection) Fill(db int, resp3 bool, raw []byte, fill func() ([]byte, error)) ([]byte, error) {
	var kb [flightKeyBuf]byte
	reply, _, err := p.group.do(appendFlightKey(kb[:0], 'r', db, resp3, raw), p.metrics, func() ([]byte, error) {
		if reply, err := fill(); err == nil {
			return reply, nil
		}
		return p.fetch(db, resp3, raw, nil, nil)
	})
	return reply, err
}

// FillRead is Fill for a read that may be held: a lone read (the same
// contract as Read about which reads may come here) by client owner,
// which gone reports gone as for Read. When a miss hold rule matches its
// key, the hold protocol applies as it does to Read: a read of a key
// another client is filling waits for that client's write (or the hold's
// timeout) and then reads Redis through the group; a fill that returns nil
// makes owner the filler (it gets the nil) or, when someone else already
// fills the key, holds owner like any read. Found by review: the local
// tier's fills went through Fill, which never looked at the hold rules,
// and the tier keeps no nil reply, so once a key was admitted every read
// of it while missing was a fill and the hold never applied; in a
// cache-aside stampede the stampede's own reads admitted the key midway
// and most clients got the nil and recomputed. A read held here is not
// filled after its release: it reads Redis through the group (heldRead),
// as any held read, and the tier fills the key on a later read.
//
// Early refresh is not applied here: a value the tier fills is answered
// as Redis gave it, and hits are answered without Redis at all (see the
// README, "Early refresh"). A nil still counts as the miss that starts the
// δ measurement, so δ is measured the same with the tier on.
func (p *Protection) FillRead(cmd *commands.Command, args [][]byte, raw []byte, db int, resp3 bool, owner int64, gone func() bool, fill func() ([]byte, error)) ([]byte, error) {
	key, match, ok := p.readKey(cmd, args)
	if !ok || !match.Any() {
		return p.Fill(db, resp3, raw, fill)
	}
	var since uint64 // before the fill is sent (Misses.MissedSince)
	if match.Hold() {
		since = p.misses.Seq()
		if h := p.misses.Held(db, key, match, owner); h != nil {
			return p.heldRead(h, raw, key, db, resp3, match, owner, gone, nil)
		}
	}
	reply, err := p.Fill(db, resp3, raw, fill)
	if errors.Is(err, ErrTooManyWaiters) {
		// Past max_waiters: filled alone, and still under the rules
		// (overflowRead).
		if reply, err = fill(); err != nil {
			reply, _, err = p.overflowRead(raw, db, resp3, nil)
		}
	}
	if err != nil {
		return nil, err
	}
	if isNilReply(reply) {
		if h := p.misses.MissedSince(db, key, match, owner, true, since); h != nil {
			return p.heldRead(h, raw, key, db, resp3, match, owner, gone, nil)
		}
	}
	return reply, nil
}

// HoldsOrRefreshes reports whether a hold or early refresh rule applies
// to the read cmd args (a GET of a matching key): the reads FillRead must
// be used for.
func (p *Protection) HoldsOrRefreshes(cmd *commands.Command, args [][]byte) bool {
	if p.misses == nil {
		return false
	}
	_, match, ok := p.readKey(cmd, args)
	return ok && match.Any()
}

// Writes are one client's writes of keys under a hold or early refresh
// rule, from WriteStart until their replies are in (Done): only then
// may held reads fetch again and see them. The zero value is empty. A
// client's Writes belong to the goroutine serving it.
type Writes struct {
	marks []writeMark
}

type writeMark struct {
	misses *Misses // the rules the key matched: a reload may replace them meanwhile
	db     int
	key    []byte
	match  Match
	// refusedBy is the client whose write of key the proxy refused
	// (WriteRefused), 0 for a write sent to Redis.
	refusedBy int64
}

// Pending reports whether w holds writes whose replies are not yet in.
func (w *Writes) Pending() bool { return len(w.marks) > 0 }

// WriteStart is told of a write of cmd with args in DB db before it is
// sent upstream; it remembers in w the keys under a rule.
func (p *Protection) WriteStart(w *Writes, db int, cmd *commands.Command, args [][]byte) {
	p.mark(w, db, cmd, args, 0)
}

// WriteRefused is told of a write of cmd with args in DB db that the
// proxy refused (the policy, the user's ACL): it never reaches Redis, so
// its client, if it fills a hold or an early refresh of one of its keys,
// will not fill it. Once the batch's replies are in (Done) those end, as
// when the client closes, and the held reads fetch again at once rather
// than wait out the hold's timeout (found by a probe: a filler whose SET
// the policy refused for its size kept 100 readers waiting 2 s). Another
// client's refused write ends nothing: Redis's value did not change.
func (p *Protection) WriteRefused(w *Writes, db int, cmd *commands.Command, args [][]byte, owner int64) {
	p.mark(w, db, cmd, args, owner)
}

// mark remembers in w the keys of cmd with args under a rule, as written
// (refusedBy 0) or as refused to client refusedBy.
func (p *Protection) mark(w *Writes, db int, cmd *commands.Command, args [][]byte, refusedBy int64) {
	retired := p.forwarding()
	if p.misses == nil && len(retired) == 0 {
		return
	}
	var kb [8]int
	for _, i := range cmd.Keys(args, kb[:0]) {
		if p.misses != nil {
			if match := p.misses.Match(args[i]); match.Any() {
				w.marks = append(w.marks, writeMark{misses: p.misses, db: db, key: bytes.Clone(args[i]), match: match, refusedBy: refusedBy})
			}
		}
		for _, m := range retired {
			// Only the hold: the retired early refresh rules sample
			// nothing any more.
			if match := m.Match(args[i]); match.Hold() {
				w.marks = append(w.marks, writeMark{misses: m, db: db, key: bytes.Clone(args[i]), match: Match{hold: match.hold}, refusedBy: refusedBy})
			}
		}
	}
}

// Done is told that the replies of every write in w are in: holds on
// their keys end and early refresh samples δ. w is empty afterwards.
func (w *Writes) Done() {
	for _, m := range w.marks {
		if m.refusedBy != 0 {
			m.misses.FillerRefused(m.db, m.key, m.match, m.refusedBy)
			continue
		}
		m.misses.Written(m.db, m.key, m.match)
	}
	clear(w.marks)
	w.marks = w.marks[:0]
}

// ClientClosed ends the holds and early refreshes owner was filling: its
// client will not write them now, and its waiters must not wait for the
// timeout. Its writes still in w, whose replies it never saw, release
// nothing.
func (p *Protection) ClientClosed(w *Writes, owner int64) {
	clear(w.marks)
	w.marks = w.marks[:0]
	if p.misses != nil {
		p.misses.OwnerClosed(owner)
	}
	for _, m := range p.forwarding() {
		m.OwnerClosed(owner)
	}
}

// appendFlightKey appends what identifies identical reads: DB, protocol and
// the exact command bytes, plus the kind of fetch ('r' plain, 't' with PTTL).
func appendFlightKey(b []byte, kind byte, db int, resp3 bool, raw []byte) []byte {
	b = append(b, kind)
	if resp3 {
		b = append(b, '3')
	} else {
		b = append(b, '2')
	}
	b = strconv.AppendInt(b, int64(db), 10)
	b = append(b, ':')
	return append(b, raw...)
}

func pttlCommand(key []byte) []byte { return resp.AppendCommandNamed(nil, "PTTL", key) }

// splitTTL separates a GET reply from the PTTL reply behind it. ttl is 0
// when the key has no expiry (or the PTTL reply is not a number).
func splitTTL(both []byte) (reply []byte, ttl time.Duration) {
	n, err := resp.ScanReply(both)
	if err != nil || n == 0 {
		return both, 0
	}
	rest := both[n:]
	if len(rest) < 4 || rest[0] != ':' {
		return both[:n], 0
	}
	ms, err := strconv.ParseInt(string(bytes.TrimSuffix(rest[1:], []byte("\r\n"))), 10, 64)
	if err != nil || ms <= 0 {
		return both[:n], 0
	}
	return both[:n], time.Duration(ms) * time.Millisecond
}

var (
	nilRESP2 = []byte("$-1\r\n")
	nilRESP3 = []byte("_\r\n")
)

func isNilReply(r []byte) bool { return bytes.Equal(r, nilRESP2) || bytes.Equal(r, nilRESP3) }

// isValueReply reports whether r is a GET's value: a bulk string that is
// not nil (RESP2's $-1; RESP3's nil is _, not a bulk string).
func isValueReply(r []byte) bool { return len(r) > 0 && r[0] == '$' && !isNilReply(r) }

func nilReply(resp3 bool) []byte {
	if resp3 {
		return nilRESP3
	}
	return nilRESP2
}
