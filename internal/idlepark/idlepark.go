// Package idlepark lets idle connections wait without a goroutine each.
//
// A server that serves every connection on its own goroutine pays, for a
// client that sends nothing for minutes, the goroutine's stack (4 KB once
// it has served a request) and whatever the goroutine keeps referenced. A
// Parker holds such connections instead: their sockets wait in one epoll
// set, served by one goroutine, and when one becomes readable (or its peer
// hangs up) the function given to Park runs on a fresh goroutine, which
// picks the connection up where it was left.
//
// The caller owns the protocol state: it must park only a connection that
// has nothing buffered in user space (a parked connection is woken by the
// kernel's readiness alone), and it must not touch the connection between
// a successful Park and its resume.
//
// Parking is available on Linux; elsewhere New returns ErrUnsupported and
// the caller keeps its goroutine per connection.
package idlepark

import (
	"errors"
	"sync"
)

// ErrUnsupported is returned by New where there is no epoll.
var ErrUnsupported = errors.New("idlepark: parking is not supported on this platform")

// ErrClosed is returned by Park after Close.
var ErrClosed = errors.New("idlepark: parker closed")

// wakeToken is the key of the poller's own wake-up pipe.
const wakeToken = 0

// ErrBadKey is returned by Park for the key 0, which the Parker uses itself.
var ErrBadKey = errors.New("idlepark: key 0 is reserved")

// Conn is a connection to park: its socket's descriptor, reached as
// syscall.RawConn reaches it, and what picks the connection up again.
// Park keeps the Conn itself (two words a parked connection), so an
// implementation that is part of the caller's own per-connection state
// keeps nothing allocated for the parker but its map entry.
type Conn interface {
	// Control calls f with the socket's descriptor, kept open meanwhile.
	Control(f func(fd uintptr)) error
	// Resume serves the connection again; Park runs it on a new goroutine.
	Resume()
}

// Parker is one epoll set and the goroutine that waits on it.
type Parker struct {
	impl poller

	mu      sync.Mutex
	waiting map[uint64]Conn
	closed  bool
}

// New starts a Parker and its goroutine.
func New() (*Parker, error) { return start(false) }

// NewHangups starts a Parker that resumes a connection only when its peer
// hangs up (its FIN, or a reset), not when it sends bytes: for a client
// waiting on something else (a blocking command) whose leaving must be
// seen at once, though it may have pipelined more behind what it waits
// for.
func NewHangups() (*Parker, error) { return start(true) }

func start(hangupsOnly bool) (*Parker, error) {
	p := &Parker{waiting: make(map[uint64]Conn)}
	p.impl.hangupsOnly = hangupsOnly
	if err := p.impl.open(); err != nil {
		return nil, err
	}
	go p.impl.run(p.ready)
	return p, nil
}

// Park adds c to the set under key, which names the connection: non-zero,
// and unique among the connections parked at once (a connection id). Once
// its socket is readable or its peer hangs up, c.Resume runs once, on a
// new goroutine; Unpark takes it out instead, and then its caller resumes
// it. On error nothing is parked and Resume never runs.
//
// A connection resumed for readiness that an Unpark of the same key
// already resumed and parked again is resumed once more: a spurious but
// harmless wake-up, which the caller handles as it handles readiness.
func (p *Parker) Park(key uint64, c Conn) error {
	if key == wakeToken {
		return ErrBadKey
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return ErrClosed
	}
	p.waiting[key] = c
	p.mu.Unlock()
	// Registered after the entry exists: readiness may be reported before
	// add returns (bytes already queued), and must find it.
	var err error
	cerr := c.Control(func(fd uintptr) { err = p.impl.add(fd, key) })
	if err == nil {
		err = cerr
	}
	if err != nil {
		p.mu.Lock()
		_, mine := p.waiting[key]
		delete(p.waiting, key)
		p.mu.Unlock()
		if !mine {
			// Readiness took it already: it runs Resume, so report
			// success rather than have the caller carry on too.
			return nil
		}
		return err
	}
	return nil
}

// Unpark takes the connection parked under key out of the set. It reports
// true if it did: the caller then owns the connection and must resume it
// itself. False means none is parked under key (never was, or readiness
// or another Unpark took it first).
func (p *Parker) Unpark(key uint64) bool {
	e, ok := p.take(key)
	if ok {
		p.forget(e)
	}
	return ok
}

// Len is how many connections are parked.
func (p *Parker) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.waiting)
}

// Close stops the goroutine. Connections still parked stay in the set,
// never resumed: the caller must Unpark (or close) them first.
func (p *Parker) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.mu.Unlock()
	p.impl.close()
}

func (p *Parker) take(key uint64) (Conn, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.waiting[key]
	if ok {
		delete(p.waiting, key)
	}
	return e, ok
}

// forget removes the socket from the set. Done through Control, which
// holds the descriptor open meanwhile, so the number cannot have been
// reused by another connection; if the connection is closed already, the
// kernel removed it with the socket.
func (p *Parker) forget(c Conn) {
	c.Control(func(fd uintptr) { p.impl.remove(fd) })
}

// ready is called by the poller's goroutine for a key whose socket is
// readable or hung up.
func (p *Parker) ready(key uint64) {
	e, ok := p.take(key)
	if !ok {
		return // unparked meanwhile
	}
	p.forget(e)
	go e.Resume()
}
