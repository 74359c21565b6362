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
	"syscall"
)

// Socket returns c's descriptor access when c is a bare TCP or Unix socket,
// and nil otherwise (TLS and other wrappers keep their own Read and Write).
func Socket(c net.Conn) syscall.RawConn {
	if !enabled {
		return nil
	}
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

// Write writes all of b to the socket behind raw, waiting in the netpoller
// while it is full, as net.Conn.Write does, and honouring the connection's
// write deadline. Errors have the shape net.Conn.Write gives them
// (*net.OpError "write" wrapping a *os.SyscallError or
// os.ErrDeadlineExceeded), so callers need not tell the two apart; c is
// the connection raw came from, for the error's addresses.
func Write(c net.Conn, raw syscall.RawConn, b []byte) (int, error) {
	var n int
	var errno error
	err := raw.Write(func(fd uintptr) bool {
		for n < len(b) {
			m, e := WriteFD(fd, b[n:])
			switch {
			case e == syscall.EINTR:
				continue
			case e == syscall.EAGAIN:
				return false
			case e != nil:
				errno = e
				return true
			}
			n += m
		}
		return true
	})
	if errno != nil {
		err = os.NewSyscallError("write", errno)
	} else if err != nil {
		var oe *net.OpError
		if errors.As(err, &oe) {
			err = oe.Err
		}
	}
	if err != nil {
		return n, &net.OpError{Op: "write", Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
	}
	return n, nil
}
