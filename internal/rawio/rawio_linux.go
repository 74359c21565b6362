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
