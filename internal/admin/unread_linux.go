//go:build linux

package admin

import (
	"net"
	"syscall"
	"unsafe"
)

// unread is how many bytes wait unread in c's socket; ok is false when
// that cannot be told.
func unread(c net.Conn) (n int, ok bool) {
	sc, isSys := c.(syscall.Conn)
	if !isSys {
		return 0, false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return 0, false
	}
	var v int32
	var errno syscall.Errno
	if err := raw.Control(func(fd uintptr) {
		_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCINQ, uintptr(unsafe.Pointer(&v)))
	}); err != nil || errno != 0 {
		return 0, false
	}
	return int(v), true
}
