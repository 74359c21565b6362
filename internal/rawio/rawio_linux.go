//go:build linux

package rawio

import (
	"syscall"
	"unsafe"
)

const enabled = true

// ReadFD reads from a non-blocking descriptor with read(2), without
// entering the runtime's syscall state (see the package comment).
func ReadFD(fd uintptr, b []byte) (int, error) {
	if raceEnabled {
		return syscall.Read(int(fd), b)
	}
	var p unsafe.Pointer
	if len(b) > 0 {
		p = unsafe.Pointer(&b[0])
	}
	n, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(p), uintptr(len(b)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// WriteFD writes to a non-blocking descriptor with write(2), without
// entering the runtime's syscall state.
func WriteFD(fd uintptr, b []byte) (int, error) {
	if raceEnabled {
		return syscall.Write(int(fd), b)
	}
	var p unsafe.Pointer
	if len(b) > 0 {
		p = unsafe.Pointer(&b[0])
	}
	n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(p), uintptr(len(b)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

type iovec = syscall.Iovec

// maxIovecs is Linux's IOV_MAX: writev takes at most this many buffers.
const maxIovecs = 1024

// writevFD writes the first buffers of bufs (up to maxIovecs) with one
// writev(2), without entering the runtime's syscall state; iov is the
// caller's array, reused. Under the race detector it writes bufs[0] with
// a plain write instead, which the detector sees.
func writevFD(fd uintptr, bufs [][]byte, iov *[]iovec) (int, error) {
	if raceEnabled || len(bufs) == 1 {
		return WriteFD(fd, bufs[0])
	}
	v := (*iov)[:0]
	for _, b := range bufs[:min(len(bufs), maxIovecs)] {
		if len(b) == 0 {
			continue
		}
		v = append(v, syscall.Iovec{Base: &b[0]})
		v[len(v)-1].SetLen(len(b))
	}
	*iov = v
	n, _, e := syscall.RawSyscall(syscall.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&v[0])), uintptr(len(v)))
	clear(v) // the array outlives the write; it must not keep buffers alive
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}
