package stampede

import (
	"errors"
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
// fetches have returned.
type Group struct {
	mu      sync.Mutex
	keys    map[string]*entry
	max     int
	metrics *Metrics
	unsafe  bool
}

// entry is one key's fetches: at most one in flight and one collecting.
type entry struct {
	inflight *fetchCall
	next     *fetchCall
	// first is the fetch of the read that made the entry, allocated with
	// it: a lone read, the common case, allocates one object, not two.
	first fetchCall
}

type fetchCall struct {
	// done is released when the fetch has returned (reply and err are
	// set); a WaitGroup rather than a channel so that the call needs no
	// allocation of its own.
	done    sync.WaitGroup
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
	return &Group{keys: map[string]*entry{}, max: o.MaxWaiters, metrics: o.Metrics, unsafe: unsafe}
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
func (g *Group) Do(key string, fetch func() ([]byte, error)) (reply []byte, shared bool, err error) {
	return g.do(key, g.metrics, fetch)
}

// do is Do counting in m rather than the Group's Metrics: those of the
// read's upstream (Metrics.forKey).
func (g *Group) do(key string, m *Metrics, fetch func() ([]byte, error)) (reply []byte, shared bool, err error) {
	m.read()
	g.mu.Lock()
	e := g.keys[key]
	fresh := e == nil
	if fresh {
		e = &entry{}
		g.keys[key] = e
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
	} else {
		e.inflight = c
	}
	g.mu.Unlock()
	g.run(key, e, c, fetch)
	return c.reply, false, c.err
}

// join waits for c; g.mu is held on entry.
func (g *Group) join(c *fetchCall, m *Metrics) ([]byte, bool, error) {
	c.waiters++
	g.mu.Unlock()
	m.saved()
	c.done.Wait()
	return c.reply, true, c.err
}

// run executes the leader's fetch. The deferred part also runs when fetch
// panics, so waiters are never stranded and the key never stays blocked.
func (g *Group) run(key string, e *entry, c *fetchCall, fetch func() ([]byte, error)) {
	finished := false
	defer func() {
		if !finished {
			c.reply, c.err = nil, ErrFetchPanicked
		}
		g.mu.Lock()
		if e.inflight == c {
			e.inflight = nil
		}
		if e.inflight == nil && e.next == nil && g.keys[key] == e {
			delete(g.keys, key)
		}
		g.mu.Unlock()
		c.done.Done()
	}()
	c.reply, c.err = fetch()
	if h := hooks.Load(); h != nil && h.afterFetch != nil {
		h.afterFetch(key)
	}
	finished = true
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
