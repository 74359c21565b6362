package stampede

import (
	"bytes"
	"errors"
	"hash/maphash"
	"sync"
	"sync/atomic"
)

var (
	// ErrTooManyWaiters: the fetch this read would join already has
	// Options.MaxWaiters waiters. The caller should send its read upstream
	// alone, which is always correct.
	ErrTooManyWaiters = errors.New("stampede: too many waiters for one fetch")
	// ErrFetchPanicked is handed to the waiters of a fetch whose function
	// panicked; the leader's goroutine goes on panicking.
	ErrFetchPanicked = errors.New("stampede: shared fetch failed")
)

// Options configure a Group.
type Options struct {
	// MaxWaiters caps the callers that may join one fetch (besides its
	// leader); 0 means no cap.
	MaxWaiters int
	// Metrics may be nil.
	Metrics *Metrics

	// unsafeJoinInFlight breaks the join rule on purpose: callers join a
	// fetch that is already in flight. Tests use it to show that the
	// linearizability checks can fail.
	unsafeJoinInFlight bool
}

// Group coalesces identical reads; see the package documentation for the
// join rule. It is safe for concurrent use. It keeps nothing once a key's
// fetches have returned but a few entries to reuse.
type Group struct {
	mu sync.Mutex
	// keys holds the entries of keys with fetches in flight or
	// collecting, by hash of the key; entries whose keys share a hash are
	// chained. Keyed by hash rather than by string so that a lone read,
	// what nearly every read is, needs no string of its own for the map.
	keys map[uint64]*entry
	seed maphash.Seed
	// free holds entries of lone reads, reused by later ones: every lone
	// GET with coalescing on passes through here.
	free    []*entry
	max     int
	metrics *Metrics
	unsafe  bool
}

// maxFreeEntries bounds Group.free: as many entries as reads that can be
// in flight at once without sharing would be reused, but a burst of them
// need not be kept. maxFreeKeyBytes keeps a read with a huge key (the key
// is the whole command) from leaving its buffer behind.
const (
	maxFreeEntries  = 256
	maxFreeKeyBytes = 4 << 10
)

// entry is one key's fetches: at most one in flight and one collecting.
type entry struct {
	key   []byte // a copy, in a buffer kept when the entry is reused
	hash  uint64
	chain *entry // the next entry with the same hash
	// inflight is the fetch sent upstream; next the one collecting
	// waiters until it returns.
	inflight *fetchCall
	next     *fetchCall
	// first is the fetch of the read that made the entry, allocated with
	// it: a lone read, the common case, needs no object of its own.
	first fetchCall
}

type fetchCall struct {
	// done is released when the fetch has returned (reply and err are
	// set); a WaitGroup rather than a channel so that the call needs no
	// allocation of its own.
	done sync.WaitGroup
	// reply is what the waiters get: a copy of the leader's reply, which
	// lies in a buffer of the leader's (Fetcher's dst) that it reuses.
	reply   []byte
	err     error
	waiters int // callers that joined, not counting the leader
}

// NewGroup returns an empty Group.
func NewGroup(o Options) *Group {
	unsafe := o.unsafeJoinInFlight
	if h := hooks.Load(); h != nil && h.unsafeJoinInFlight {
		unsafe = true
	}
	return &Group{keys: map[uint64]*entry{}, seed: maphash.MakeSeed(), max: o.MaxWaiters, metrics: o.Metrics, unsafe: unsafe}
}

// Do returns the reply of a fetch of key that was sent after Do was called.
// If such a fetch is collecting waiters, Do joins it; otherwise this caller
// becomes the leader of the next fetch and runs fetch() itself once the
// fetch in flight (if any) has returned. shared reports whether the reply
// came from another caller's fetch. The returned bytes are shared: callers
// must not modify them. It returns ErrTooManyWaiters when the cap is hit
// (the caller should go upstream alone), ErrFetchPanicked to the waiters of
// a fetch that panicked, and otherwise whatever fetch returned.
//
// fetch must not depend on the calling goroutine or its client connection:
// waiters rely on it running to the end even if the leader's client is gone.
// Its reply may lie in a buffer of the leader's: the waiters get a copy.
func (g *Group) Do(key string, fetch func() ([]byte, error)) (reply []byte, shared bool, err error) {
	return g.do([]byte(key), g.metrics, fetch)
}

// do is Do with the key as bytes (copied only when the key is not in the
// map yet), counting in m rather than the Group's Metrics: those of the
// read's upstream (Metrics.forKey).
func (g *Group) do(key []byte, m *Metrics, fetch func() ([]byte, error)) (reply []byte, shared bool, err error) {
	h := maphash.Bytes(g.seed, key)
	g.mu.Lock()
	e := g.lookup(h, key)
	fresh := e == nil
	if fresh {
		e = g.insert(h, key)
	}
	if g.unsafe && e.inflight != nil {
		return g.join(e.inflight, m)
	}
	if e.next != nil {
		if g.max > 0 && e.next.waiters >= g.max {
			g.mu.Unlock()
			m.overflow()
			return nil, false, ErrTooManyWaiters
		}
		return g.join(e.next, m)
	}
	// Counted only now, as a leader (join counts joiners): a read past
	// the cap above is sent alone by its caller and coalesces nothing.
	m.read()
	// A new entry has no fetch yet: this read leads its first one.
	c := &e.first
	if !fresh {
		c = new(fetchCall)
	}
	c.done.Add(1)
	if prev := e.inflight; prev != nil {
		// Collect until the fetch in flight returns, then send ours: every
		// caller that joins meanwhile arrived before our fetch is sent.
		e.next = c
		g.mu.Unlock()
		prev.done.Wait()
		g.mu.Lock()
		e.inflight, e.next = c, nil
		if err := prev.err; unanswered(err) {
			// The upstream did not answer the fetch in flight within
			// its time: ours would wait as long again behind it, and its
			// callers, who came while that one waited, fail with its
			// error (found by a probe: coalesced GETs of a frozen Redis
			// failed at twice dead_timeout). Ended under the same lock,
			// and not as a fetch that timed out itself: a read that
			// comes after this one is sent (found by review).
			g.endLocked(e, c, nil, err, true, false)
			return nil, false, err
		}
	} else {
		e.inflight = c
	}
	g.mu.Unlock()
	reply, err = g.run(key, e, c, fetch)
	return reply, false, err
}

// errNotSent is the error of a fetch ended unsent behind one that timed
// out: its callers get that timeout, and a fetch collecting behind it is
// sent (unanswered reports false for it).
type errNotSent struct{ err error }

func (e errNotSent) Error() string { return e.err.Error() }
func (e errNotSent) Unwrap() error { return e.err }
func (errNotSent) Timeout() bool   { return false }

// unanswered reports whether a fetch's error is a timeout (its Timeout
// method, as net's errors and the upstream's reply timeout have): the
// upstream gave no answer in its time.
func unanswered(err error) bool {
	var t interface{ Timeout() bool }
	return err != nil && errors.As(err, &t) && t.Timeout()
}

// lookup returns key's entry, or nil; g.mu is held.
func (g *Group) lookup(h uint64, key []byte) *entry {
	for e := g.keys[h]; e != nil; e = e.chain {
		if bytes.Equal(e.key, key) {
			return e
		}
	}
	return nil
}

// insert adds an entry for key, reusing a free one; g.mu is held.
func (g *Group) insert(h uint64, key []byte) *entry {
	var e *entry
	if n := len(g.free); n > 0 {
		e, g.free[n-1] = g.free[n-1], nil
		g.free = g.free[:n-1]
	} else {
		e = new(entry)
	}
	e.key = append(e.key[:0], key...)
	e.hash, e.chain = h, g.keys[h]
	g.keys[h] = e
	return e
}

// remove takes e out of the map; g.mu is held.
func (g *Group) remove(e *entry) {
	p := g.keys[e.hash]
	if p == e {
		if e.chain == nil {
			delete(g.keys, e.hash)
		} else {
			g.keys[e.hash] = e.chain
		}
		return
	}
	for ; p != nil; p = p.chain {
		if p.chain == e {
			p.chain = e.chain
			return
		}
	}
}

// join waits for c; g.mu is held on entry. A joiner is a coalesced read
// and a fetch saved.
func (g *Group) join(c *fetchCall, m *Metrics) ([]byte, bool, error) {
	c.waiters++
	g.mu.Unlock()
	m.read()
	m.saved()
	c.done.Wait()
	return c.reply, true, c.err
}

// run executes the leader's fetch and returns its result to the leader.
// The deferred part also runs when fetch panics, so waiters are never
// stranded and the key never stays blocked.
func (g *Group) run(key []byte, e *entry, c *fetchCall, fetch func() ([]byte, error)) (reply []byte, err error) {
	finished := false
	defer func() {
		if !finished {
			reply, err = nil, ErrFetchPanicked
		}
		g.end(e, c, reply, err, finished)
	}()
	reply, err = fetch()
	if h := hooks.Load(); h != nil && h.afterFetch != nil {
		h.afterFetch(string(key))
	}
	finished = true
	return reply, err
}

// end records the result of fetch c of entry e, wakes its waiters and the
// fetch collecting behind it, and frees e when nothing else uses it.
func (g *Group) end(e *entry, c *fetchCall, reply []byte, err error, finished bool) {
	g.mu.Lock()
	g.endLocked(e, c, reply, err, finished, true)
}

// endLocked is end with g.mu held, which it releases. sent is false for a
// fetch ended without being sent (do, behind one that timed out): its
// error is its waiters' only, not passed to a fetch collecting behind it.
func (g *Group) endLocked(e *entry, c *fetchCall, reply []byte, err error, finished, sent bool) {
	// Joins happen under g.mu (and, but for the unsafe test mode, only to
	// a fetch not yet sent), so c.waiters is final here.
	if c.waiters > 0 {
		c.reply, c.err = bytes.Clone(reply), err
	}
	if !sent && c.waiters > 0 {
		c.err = errNotSent{err}
	} else if c.waiters == 0 && sent && unanswered(err) {
		c.err = err // for the fetch collecting behind it (do)
	}
	if e.inflight == c {
		e.inflight = nil
	}
	if e.inflight != nil || e.next != nil {
		g.mu.Unlock()
		c.done.Done()
		return
	}
	g.remove(e)
	if c != &e.first || c.waiters > 0 || !finished || len(g.free) >= maxFreeEntries || cap(e.key) > maxFreeKeyBytes {
		g.mu.Unlock()
		c.done.Done()
		return
	}
	// A lone read's entry: out of the map and waited on by no one, so no
	// other goroutine can reach it; the leader's result is already with
	// the leader. Done before it is free, so that the next reader's Add
	// cannot meet this Done.
	c.done.Done()
	e.inflight, e.chain, c.reply, c.err = nil, nil, nil, nil
	g.free = append(g.free, e)
	g.mu.Unlock()
}

// Lead is a fetch that its leader sends itself rather than through a
// function Do runs: a lone read whose reply is written to its client by
// whoever completes the request (the proxy's direct replies), so that the
// leader's goroutine need not wait for it. The zero Lead leads nothing.
// Every Lead that Begin returns must be ended with End exactly once, after
// the request's reply is in (or it failed): until then reads of the key
// collect behind it.
type Lead struct {
	g *Group
	e *entry
	c *fetchCall
}

// Active reports whether l is a fetch yet to be ended.
func (l Lead) Active() bool { return l.g != nil }

// End ends l with the request's reply or error (reply is copied only if a
// caller joined it), and leaves l the zero Lead, no longer Active. A fetch
// collecting behind l is sent after this.
func (l *Lead) End(reply []byte, err error) {
	l.g.end(l.e, l.c, reply, err, true)
	*l = Lead{}
}

// begin makes the caller the leader of a fetch of key that it sends
// itself, when key has no fetch in flight or collecting (a read that would
// have to wait first cannot be sent now); otherwise ok is false and the
// caller uses do. As with do, the fetch must be sent after begin returns.
func (g *Group) begin(key []byte, m *Metrics) (l Lead, ok bool) {
	if g.unsafe {
		return Lead{}, false // the unsafe test mode joins fetches in flight: do's path
	}
	h := maphash.Bytes(g.seed, key)
	g.mu.Lock()
	if g.lookup(h, key) != nil {
		g.mu.Unlock()
		return Lead{}, false
	}
	e := g.insert(h, key)
	c := &e.first
	c.done.Add(1)
	e.inflight = c
	g.mu.Unlock()
	m.read()
	return Lead{g: g, e: e, c: c}, true
}

// testHooks let tests in this and other packages (through export_test.go)
// break the join rule or hold a fetch's reply, in a proxy they start.
type testHooks struct {
	unsafeJoinInFlight bool
	// afterFetch runs on the leader's goroutine after fetch returned and
	// before the waiters are woken: a reply "still on its way".
	afterFetch func(key string)
}

var hooks atomic.Pointer[testHooks]
