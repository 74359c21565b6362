package proxy

import (
	"syscall"
	"unsafe"
)

// Linux TCP states (include/net/tcp_states.h).
const (
	tcpClose     = 7
	tcpCloseWait = 8
)

// peerClosed reports whether the peer of the TCP socket fd has ended its
// side (FIN or reset), whatever data is still unread before the end. It
// is for TLS clients, whose last bytes before a close are a close_notify
// record that a peek would take for live data.
func peerClosed(fd uintptr) bool {
	var info syscall.TCPInfo
	size := uint32(unsafe.Sizeof(info))
	_, _, errno := syscall.Syscall6(syscall.SYS_GETSOCKOPT, fd, syscall.SOL_TCP, syscall.TCP_INFO,
		uintptr(unsafe.Pointer(&info)), uintptr(unsafe.Pointer(&size)), 0)
	if errno != 0 {
		return false
	}
	return info.State == tcpCloseWait || info.State == tcpClose
}
