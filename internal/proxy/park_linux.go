package proxy

import "syscall"

// dupSocket duplicates a socket's descriptor, close-on-exec, so that the
// socket outlives the net.Conn that owned it (detach, park.go).
func dupSocket(fd int) (int, error) {
	r, _, errno := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_DUPFD_CLOEXEC, 0)
	if errno != 0 {
		return -1, errno
	}
	return int(r), nil
}
