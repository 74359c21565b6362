package stampede

import (
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Misses coordinates GET misses on the key patterns of Config.Hold (miss
// hold) and Config.EarlyRefresh (XFetch); see the package documentation.
// Keys are a DB number and the key's bytes; owners are client connection
// ids, so that a filler's own reads are never held and its disconnect ends
// its holds. It is safe for concurrent use.
type Misses struct {
	holdRules    []holdRule
	refreshRules []*refreshRule
	metrics      *Metrics
	now          func() time.Time
	rand         func() float64 // uniform in (0, 1]

	mu         sync.Mutex
	holds      map[string]*Hold
	refreshing map[string]refreshState
	missed     map[string]missMark // misses handed out, for measuring δ

	// written are the holds a write ended lately, by key, and seq numbers
	// those ends (incremented under mu, read without it by Seq): a read
	// takes Seq before its fetch is sent, and a nil it gets for a key whose
	// hold a write ended after that was read by Redis before the write, so
	// it must not make a new filler (MissedSince). Bounded as missed is.
	written map[string]writtenMark
	seq     atomic.Uint64

	// When each full map was last swept for stale entries (sweepDue), and
	// how many sweeps ran, for tests.
	sweptMissed, sweptWritten, sweptRefreshing time.Time
	sweeps                                     int
}

type writtenMark struct {
	h   *Hold
	seq uint64
	at  time.Time
}

type holdRule struct {
	pat     pattern
	timeout time.Duration
}

type refreshRule struct {
	pat   pattern
	beta  float64
	delta atomic.Int64 // EWMA of recompute times in nanoseconds; 0 until measured
}

type refreshState struct {
	owner int64
	until time.Time // after this the key has expired anyway; allow another filler
}

type missMark struct {
	at   time.Time
	rule int
}

// Bounds on the δ bookkeeping: a miss that is not followed by a write within
// missMaxAge was not a recompute, and a flood of misses on distinct keys must
// not grow memory without bound.
const (
	missMaxAge  = time.Minute
	missMaxKeys = 10000
	// sweepEvery spaces the sweeps of a full map (sweepDue).
	sweepEvery = time.Second
	// deltaWeight is the EWMA weight of a new δ sample.
	deltaWeight = 0.3
)

// maxHolds caps the miss holds open at once; a variable for tests. A hold
// lives until its key is written or its timeout (up to a minute), and
// costs a timer, a channel and a map entry (about 0.3 KB): a flood of
// misses on distinct keys under a hold rule held 1,000,000 of them, 300 to
// 370 MB of heap (found by a probe). Past the cap a miss starts no hold:
// its reader gets the nil, as every reader does without a rule.
var maxHolds = 100_000

// Match says which rules apply to a key. The zero value is "none".
type Match struct {
	hold, refresh int // index+1 of the first matching rule, 0 for none
}

// Any reports whether some rule applies.
func (r Match) Any() bool { return r.hold > 0 || r.refresh > 0 }

// Hold reports whether a miss hold applies.
func (r Match) Hold() bool { return r.hold > 0 }

// Refresh reports whether early refresh applies.
func (r Match) Refresh() bool { return r.refresh > 0 }

// NewMisses compiles the rules of c, or returns nil when c has none.
func NewMisses(c Config, m *Metrics) *Misses {
	if len(c.Hold) == 0 && len(c.EarlyRefresh) == 0 {
		return nil
	}
	ms := &Misses{
		metrics:    m,
		now:        time.Now,
		rand:       func() float64 { return 1 - rand.Float64() },
		holds:      map[string]*Hold{},
		refreshing: map[string]refreshState{},
		missed:     map[string]missMark{},
		written:    map[string]writtenMark{},
	}
	for _, r := range c.Hold {
		ms.holdRules = append(ms.holdRules, holdRule{pat: compilePattern(r.Pattern), timeout: r.Timeout.Duration})
	}
	for _, r := range c.EarlyRefresh {
		ms.refreshRules = append(ms.refreshRules, &refreshRule{pat: compilePattern(r.Pattern), beta: r.BetaInForce()})
	}
	return ms
}

// Match finds the first hold rule and the first early refresh rule whose
// pattern matches key.
func (m *Misses) Match(key []byte) Match {
	var r Match
	for i := range m.holdRules {
		if m.holdRules[i].pat.Match(key) {
			r.hold = i + 1
			break
		}
	}
	for i, rr := range m.refreshRules {
		if rr.pat.Match(key) {
			r.refresh = i + 1
			break
		}
	}
	return r
}

func missKey(db int, key []byte) string {
	return strconv.Itoa(db) + ":" + string(key)
}

// Hold is one key's miss hold. Held reads Wait for it and then read the
// key through the coalescing group (Protection.heldRead).
type Hold struct {
	filler   int64
	metrics  *Metrics // the counters of the key's upstream
	done     chan struct{}
	released bool // guarded by Misses.mu
	timer    *time.Timer
}

// Wait blocks until the hold ends: a write of the key came back, the
// filler's connection closed, or the timeout ran out.
func (h *Hold) Wait() { <-h.done }

// waitFor is Wait for a held read of a client that may leave: it asks
// gone every goneEvery (nothing wakes a waiter when a client leaves: the
// proxy notices it by asking, as for its blocking commands) and returns
// false as soon as gone is true, true when the hold ended. A nil gone
// waits as Wait.
func (h *Hold) waitFor(gone func() bool) bool {
	if gone == nil {
		h.Wait()
		return true
	}
	tick := time.NewTicker(goneEvery)
	defer tick.Stop()
	for {
		select {
		case <-h.done:
			return true
		case <-tick.C:
			if gone() {
				return false
			}
		}
	}
}

// Held returns the hold on key that the read of owner must wait for, or
// nil when there is none (or owner is its filler). A non-nil result counts
// as a held read.
func (m *Misses) Held(db int, key []byte, r Match, owner int64) *Hold {
	if !r.Hold() {
		return nil
	}
	k := missKey(db, key)
	m.mu.Lock()
	defer m.mu.Unlock()
	if h := m.holds[k]; h != nil && h.filler != owner {
		m.metrics.forKey(key).held()
		return h
	}
	return nil
}

// Seq is the token a read whose nil may reach MissedSince takes before its
// fetch is sent.
func (m *Misses) Seq() uint64 { return m.seq.Load() }

// Missed is MissedSince for a nil known to be read after every hold on key
// that has ended.
func (m *Misses) Missed(db int, key []byte, r Match, owner int64, mayHold bool) *Hold {
	return m.MissedSince(db, key, r, owner, mayHold, math.MaxUint64)
}

// MissedSince is told that owner's GET of key returned nil and is about to be
// answered; since is Seq as it was before that GET's fetch was sent. When a hold rule applies and another client already fills the
// key, it returns that hold (if mayHold) and owner must wait and fetch
// again; otherwise owner gets the nil and, if no hold is active, becomes the
// filler of a new one. mayHold is false for a read that has already been
// held once, so that no client waits longer than one hold timeout.
//
// A nil whose fetch was sent before a write ended key's last hold (since
// is older than that end) was read by Redis before the filler's write, and
// only handled after the hold ended: it is answered as the held reads
// were, with the ended hold (if mayHold), so the read fetches again and
// gets the filler's value, rather than making its client a second filler
// that recomputes what was just written. Found by review: without this a
// 100-client stampede made 2 or 3 fillers, groupcache-style re-checking
// inside the flight fixes it.
func (m *Misses) MissedSince(db int, key []byte, r Match, owner int64, mayHold bool, since uint64) *Hold {
	if !r.Any() {
		return nil
	}
	k := missKey(db, key)
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if r.Hold() {
		if h := m.holds[k]; h != nil {
			if h.filler != owner && mayHold {
				m.metrics.forKey(key).held()
				return h
			}
		} else if w, ok := m.written[k]; ok && mayHold && w.seq > since {
			m.metrics.forKey(key).held()
			return w.h // ended: the read fetches again at once
		} else if len(m.holds) < maxHolds {
			h := &Hold{filler: owner, metrics: m.metrics.forKey(key), done: make(chan struct{})}
			m.holds[k] = h
			h.timer = time.AfterFunc(m.holdRules[r.hold-1].timeout, func() { m.release(k, h, true) })
		} else {
			m.metrics.forKey(key).holdSkipped()
		}
	}
	if r.Refresh() {
		m.markMiss(k, r.refresh-1, now, false)
	}
	return nil
}

// markMiss remembers when a miss of k was handed out, to measure δ when k is
// written. The first miss counts unless overwrite (an early refresh, whose
// filler is the one recomputing).
func (m *Misses) markMiss(k string, rule int, now time.Time, overwrite bool) {
	if _, ok := m.missed[k]; ok {
		// Already counted: a full map takes an update of its own entry
		// (review: an early refresh of a key in a full map kept its older
		// mark, and δ was measured from it).
		if overwrite {
			m.missed[k] = missMark{at: now, rule: rule}
		}
		return
	}
	if len(m.missed) >= missMaxKeys {
		if !m.sweepDue(&m.sweptMissed, now) {
			return
		}
		for mk, v := range m.missed {
			if now.Sub(v.at) > missMaxAge {
				delete(m.missed, mk)
			}
		}
		if len(m.missed) >= missMaxKeys {
			return
		}
	}
	m.missed[k] = missMark{at: now, rule: rule}
}

// sweepDue reports whether a full map last swept at *last may be swept
// again now, and if so notes the sweep: at most once per sweepEvery. A
// sweep walks the whole map under m.mu, and inside missMaxAge a flood of
// misses on distinct keys finds nothing to drop: every miss walked 10,000
// entries again, and with an early refresh rule the proxy handled about
// 5,000 misses a second in all (found by a probe). Between sweeps a full
// map takes no new entry, as when a sweep finds nothing stale.
func (m *Misses) sweepDue(last *time.Time, now time.Time) bool {
	if !last.IsZero() && now.Sub(*last) < sweepEvery {
		return false
	}
	*last = now
	m.sweeps++
	return true
}

// noteWritten remembers that a write ended k's hold h (MissedSince);
// m.mu is held.
func (m *Misses) noteWritten(k string, h *Hold, now time.Time) {
	if _, ok := m.written[k]; !ok && len(m.written) >= missMaxKeys {
		if !m.sweepDue(&m.sweptWritten, now) {
			return // as when the sweep finds nothing stale
		}
		for wk, w := range m.written {
			if now.Sub(w.at) > missMaxAge {
				delete(m.written, wk)
			}
		}
		if len(m.written) >= missMaxKeys {
			return // a nil read before this write may make a second filler, as before
		}
	}
	m.written[k] = writtenMark{h: h, seq: m.seq.Add(1), at: now}
}

// release ends h if it is still k's hold; m.mu must not be held.
func (m *Misses) release(k string, h *Hold, timeout bool) {
	m.mu.Lock()
	m.releaseLocked(k, h, timeout)
	m.mu.Unlock()
}

func (m *Misses) releaseLocked(k string, h *Hold, timeout bool) {
	if m.holds[k] == h {
		delete(m.holds, k)
	}
	if h.released {
		return
	}
	h.released = true
	h.timer.Stop()
	if timeout {
		h.metrics.holdTimeout() // before waking the held reads, so they see it counted
	}
	close(h.done)
}

// Early decides whether owner's GET of key, which found a value with ttl to
// live, is answered with a miss so that owner refreshes it (XFetch). It is
// true for at most one reader per key until the key is written, the key's
// ttl has run out, or that reader's connection closes.
func (m *Misses) Early(db int, key []byte, r Match, owner int64, ttl time.Duration) bool {
	if !r.Refresh() || ttl <= 0 {
		return false
	}
	rule := m.refreshRules[r.refresh-1]
	delta := time.Duration(rule.delta.Load())
	if delta <= 0 || !xfetch(delta, rule.beta, ttl, m.rand()) {
		return false
	}
	k := missKey(db, key)
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if st, ok := m.refreshing[k]; ok && now.Before(st.until) {
		return false
	}
	if !m.roomToRefresh(k, now) {
		return false
	}
	m.refreshing[k] = refreshState{owner: owner, until: now.Add(ttl)}
	m.markMiss(k, r.refresh-1, now, true)
	m.metrics.forKey(key).earlyRefresh()
	return true
}

// roomToRefresh reports whether k may start an early refresh without the
// bookkeeping passing missMaxKeys. A reader that keeps its connection and
// never writes what it was asked to refresh leaves its entries here until
// their keys would have expired, so a full map first drops those; still
// full, the read is answered as usual (an early refresh is only an
// optimisation). m.mu is held.
func (m *Misses) roomToRefresh(k string, now time.Time) bool {
	if _, ok := m.refreshing[k]; ok || len(m.refreshing) < missMaxKeys {
		return true
	}
	if !m.sweepDue(&m.sweptRefreshing, now) {
		return false
	}
	for rk, st := range m.refreshing {
		if !now.Before(st.until) {
			delete(m.refreshing, rk)
		}
	}
	return len(m.refreshing) < missMaxKeys
}

// xfetch is the XFetch test: refresh when now − δ·β·ln(u) ≥ expiry, i.e.
// when −δ·β·ln(u) ≥ ttl, for u uniform in (0, 1]. It happens with
// probability exp(−ttl/(β·δ)).
func xfetch(delta time.Duration, beta float64, ttl time.Duration, u float64) bool {
	return -float64(delta)*beta*math.Log(u) >= float64(ttl)
}

// Written is told that a write of key passed through the proxy and its
// reply has come back: the key's hold ends, its early refresh is done, and
// the time since its miss is a δ sample.
func (m *Misses) Written(db int, key []byte, r Match) {
	if !r.Any() {
		return
	}
	k := missKey(db, key)
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if h := m.holds[k]; h != nil {
		m.releaseLocked(k, h, false)
		m.noteWritten(k, h, now)
	}
	delete(m.refreshing, k)
	if mk, ok := m.missed[k]; ok {
		delete(m.missed, k)
		if d := now.Sub(mk.at); d > 0 && d <= missMaxAge {
			m.refreshRules[mk.rule].sample(d)
		}
	}
}

// FillerRefused is told that owner's write of key was refused before it
// reached Redis: a hold or early refresh owner fills on key ends, as
// OwnerClosed ends all of them, with no δ sample (nothing was written).
func (m *Misses) FillerRefused(db int, key []byte, r Match, owner int64) {
	if !r.Any() {
		return
	}
	k := missKey(db, key)
	m.mu.Lock()
	defer m.mu.Unlock()
	if h := m.holds[k]; h != nil && h.filler == owner {
		m.releaseLocked(k, h, false)
	}
	if st, ok := m.refreshing[k]; ok && st.owner == owner {
		delete(m.refreshing, k)
	}
}

// sample folds one recompute time into δ. Only Written calls it, under
// Misses.mu, so the load and store do not race with each other.
func (r *refreshRule) sample(d time.Duration) {
	old := time.Duration(r.delta.Load())
	if old <= 0 {
		r.delta.Store(int64(d))
		return
	}
	r.delta.Store(int64(float64(old) + deltaWeight*float64(d-old)))
}

// Delta is the current recompute-time estimate of early refresh rule i (0
// until measured).
func (m *Misses) Delta(i int) time.Duration { return time.Duration(m.refreshRules[i].delta.Load()) }

// OwnerClosed ends the holds and early refreshes that owner was filling:
// its client is gone and will not write.
func (m *Misses) OwnerClosed(owner int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, h := range m.holds {
		if h.filler == owner {
			m.releaseLocked(k, h, false)
		}
	}
	for k, st := range m.refreshing {
		if st.owner == owner {
			delete(m.refreshing, k)
		}
	}
}
