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
	"syscall"
)

// ErrUnsupported is returned by New where there is no epoll.
var ErrUnsupported = errors.New("idlepark: parking is not supported on this platform")

// ErrClosed is returned by Park after Close.
var ErrClosed = errors.New("idlepark: parker closed")

// Ticket names one parking of one connection. Tickets are never reused, so
// a stale ticket (of a connection that was resumed since) matches nothing.
type Ticket uint64

// parked is one connection waiting in the set.
type parked struct {
	rc     syscall.RawConn
	resume func()
}

// Parker is one epoll set and the goroutine that waits on it.
type Parker struct {
	impl poller

	mu      sync.Mutex
	waiting map[Ticket]parked
	next    Ticket
	closed  bool
}

// New starts a Parker and its goroutine.
func New() (*Parker, error) {
	p := &Parker{waiting: make(map[Ticket]parked)}
	if err := p.impl.open(); err != nil {
		return nil, err
	}
	go p.impl.run(p.ready)
	return p, nil
}

// Reserve returns the ticket the next Park must use. It is separate from
// Park so that the caller can publish the ticket (for Unpark from other
// goroutines) before the connection can be resumed.
func (p *Parker) Reserve() Ticket {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.next++
	return p.next
}

// Park adds the connection behind rc to the set under ticket t. Once its
// socket is readable, its peer hangs up or Unpark takes it, resume runs
// once, on a new goroutine (only for readiness: Unpark's caller resumes it
// itself). On error nothing is parked and resume never runs.
func (p *Parker) Park(t Ticket, rc syscall.RawConn, resume func()) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return ErrClosed
	}
	p.waiting[t] = parked{rc: rc, resume: resume}
	p.mu.Unlock()
	// Registered after the entry exists: readiness may be reported before
	// add returns (bytes already queued), and must find it.
	var err error
	cerr := rc.Control(func(fd uintptr) { err = p.impl.add(fd, uint64(t)) })
	if err == nil {
		err = cerr
	}
	if err != nil {
		p.mu.Lock()
		_, mine := p.waiting[t]
		delete(p.waiting, t)
		p.mu.Unlock()
		if !mine {
			// Readiness took it already: it runs resume, so report
			// success rather than have the caller carry on too.
			return nil
		}
		return err
	}
	return nil
}

// Unpark takes the connection parked under t out of the set. It reports
// true if it did: the caller then owns the connection and must resume it
// itself. False means it is not parked under t (never was, or readiness or
// another Unpark took it first).
func (p *Parker) Unpark(t Ticket) bool {
	e, ok := p.take(t)
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

func (p *Parker) take(t Ticket) (parked, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.waiting[t]
	if ok {
		delete(p.waiting, t)
	}
	return e, ok
}

// forget removes the socket from the set. Done through Control, which
// holds the descriptor open meanwhile, so the number cannot have been
// reused by another connection; if the connection is closed already, the
// kernel removed it with the socket.
func (p *Parker) forget(e parked) {
	e.rc.Control(func(fd uintptr) { p.impl.remove(fd) })
}

// ready is called by the poller's goroutine for a ticket whose socket is
// readable or hung up.
func (p *Parker) ready(token uint64) {
	e, ok := p.take(Ticket(token))
	if !ok {
		return // unparked meanwhile
	}
	p.forget(e)
	go e.resume()
}
