// Package rawio reads and writes non-blocking sockets with raw system
// calls, which skip the Go runtime's bookkeeping for calls that may block.
//
// syscall.Read and syscall.Write enter the runtime's syscall state: the
// goroutine's P may be handed to another thread if the call lasts, and the
// runtime's monitor thread (sysmon) is woken from its deep sleep by the
// first such call after the process went idle, then polls every 20 µs for
// a millisecond. A proxy whose goroutines go idle and enter a read or write
// thousands of times a second keeps sysmon polling all the time, and on a
// core shared with Redis each of those wake-ups is a context switch taken
// from Redis and the proxy. A read or write of a non-blocking socket never
// blocks, so entering the syscall state buys nothing for it; the netpoller
// (whose own epoll_wait is raw) does the waiting.
//
// Only for descriptors in non-blocking mode, which every net.Conn's is.
package rawio

import (
	"errors"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

// Writer writes a bare TCP or Unix socket with raw write(2) calls.
// Safe for concurrent use; writes are serialized, as net.Conn's are.
type Writer struct {
	mu   sync.Mutex
	conn net.Conn
	raw  syscall.RawConn
	// w.writeFD, w.tryFD and w.writeVecFD, bound once: a write
	// allocates nothing.
	fn    func(fd uintptr) bool
	tryFn func(fd uintptr)
	vecFn func(fd uintptr) bool

	// The write in progress, under mu.
	b     []byte
	vec   [][]byte // WriteVec's buffers, consumed as written
	iov   []iovec  // writev's array, kept between writes
	n     int
	errno error
	full  bool // tryFD found the socket full
}

// BareSocket returns c's socket when c is a bare TCP or Unix socket, and
// nil otherwise: a wrapper (TLS) changes the bytes, so its socket must not
// be read or written directly.
func BareSocket(c net.Conn) syscall.RawConn {
	var sc syscall.Conn
	switch c := c.(type) {
	case *net.TCPConn:
		sc = c
	case *net.UnixConn:
		sc = c
	default:
		return nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return raw
}

// NewWriter returns a Writer of c when c is a bare TCP or Unix socket, and
// nil otherwise (TLS and other wrappers keep their own Write).
func NewWriter(c net.Conn) *Writer {
	if !enabled {
		return nil
	}
	raw := BareSocket(c)
	if raw == nil {
		return nil
	}
	w := &Writer{conn: c, raw: raw}
	w.fn, w.tryFn, w.vecFn = w.writeFD, w.tryFD, w.writeVecFD
	return w
}

// Write writes all of b, waiting in the netpoller while the socket is
// full, as net.Conn.Write does, and honouring the connection's write
// deadline. Errors have the shape net.Conn.Write gives them (*net.OpError
// "write" wrapping a *os.SyscallError, os.ErrDeadlineExceeded or
// net.ErrClosed), so callers need not tell the two apart.
func (w *Writer) Write(b []byte) (int, error) {
	w.mu.Lock()
	w.b, w.n, w.errno = b, 0, nil
	err := w.raw.Write(w.fn)
	return w.done(err)
}

// WriteVec writes every buffer of bufs in order, as Write writes one,
// with writev(2): a large buffer goes to the socket from where it is
// rather than being copied beside the others first. bufs is consumed: its
// elements are resliced as they are written, so the caller must not rely
// on them afterwards. Where raw calls are off (race detector, other
// systems) the buffers are written one write(2) at a time.
func (w *Writer) WriteVec(bufs [][]byte) (int, error) {
	w.mu.Lock()
	w.vec, w.n, w.errno = bufs, 0, nil
	err := w.raw.Write(w.vecFn)
	w.vec = nil
	return w.done(err)
}

// WriteWithin is Write with a timeout: when timeout > 0, the connection's
// write deadline is set to timeout from when the socket is found full,
// before waiting for room. A write the socket takes at once needs no
// deadline, so it sets none (which saves a clock read and a timer update
// per write), and the deadline a former write left behind does not apply
// to it. Every write to the connection must then go through WriteWithin
// with the same timeout, since other writes would see that deadline.
func (w *Writer) WriteWithin(b []byte, timeout time.Duration) (int, error) {
	w.mu.Lock()
	w.b, w.n, w.errno, w.full = b, 0, nil, false
	err := w.raw.Control(w.tryFn)
	if err == nil && w.full {
		if timeout > 0 {
			w.conn.SetWriteDeadline(time.Now().Add(timeout))
		}
		err = w.raw.Write(w.fn)
	}
	return w.done(err)
}

// TryWrite writes what the socket takes of b at once and never waits:
// full reports that it took less than all of b because it is full.
func (w *Writer) TryWrite(b []byte) (n int, full bool, err error) {
	w.mu.Lock()
	w.b, w.n, w.errno, w.full = b, 0, nil, false
	err = w.raw.Control(w.tryFn)
	full = err == nil && w.errno == nil && w.full
	n, err = w.done(err)
	return n, full, err
}

// done ends the write in progress, which err (from RawConn) ended, and
// unlocks the Writer.
func (w *Writer) done(err error) (int, error) {
	n, errno := w.n, w.errno
	w.b, w.errno = nil, nil
	w.mu.Unlock()
	if errno != nil {
		err = os.NewSyscallError("write", errno)
	} else if err != nil {
		var oe *net.OpError
		if errors.As(err, &oe) {
			err = oe.Err
		}
	}
	if err != nil {
		c := w.conn
		return n, &net.OpError{Op: "write", Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
	}
	return n, nil
}

// tryFD writes what it can of w.b without waiting.
func (w *Writer) tryFD(fd uintptr) { w.full = !w.writeFD(fd) }

// writeFD writes what is left of w.b; false: the socket is full, wait.
func (w *Writer) writeFD(fd uintptr) bool {
	for w.n < len(w.b) {
		m, e := WriteFD(fd, w.b[w.n:])
		if e != nil {
			if e == syscall.EINTR {
				continue
			}
			return w.stopOn(e)
		}
		w.n += m
	}
	return true
}

// stopOn ends a raw write on errno e (not EINTR): false, wait for room,
// on EAGAIN; true, done, on any other, kept in w.errno.
func (w *Writer) stopOn(e error) bool {
	if e == syscall.EAGAIN {
		return false
	}
	w.errno = e
	return true
}

// writeVecFD writes what is left of w.vec; false: the socket is full.
func (w *Writer) writeVecFD(fd uintptr) bool {
	for {
		for len(w.vec) > 0 && len(w.vec[0]) == 0 {
			w.vec = w.vec[1:]
		}
		if len(w.vec) == 0 {
			return true
		}
		m, e := writevFD(fd, w.vec, &w.iov)
		if e != nil {
			if e == syscall.EINTR {
				continue
			}
			return w.stopOn(e)
		}
		w.n += m
		for m > 0 {
			if m < len(w.vec[0]) {
				w.vec[0] = w.vec[0][m:]
				break
			}
			m -= len(w.vec[0])
			w.vec = w.vec[1:]
		}
	}
}
