//go:build unix

package rawio

import "syscall"

// PeerGoneFD reports, consuming nothing, whether the peer of the socket fd
// closed its side or reset the connection: a one-byte MSG_PEEK finds the
// end of the stream (0 bytes) or a hard error. Bytes waiting, or none yet
// (EAGAIN), say nothing of it.
func PeerGoneFD(fd uintptr) bool {
	var b [1]byte
	n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	return err == nil && n == 0 || err != nil && err != syscall.EAGAIN && err != syscall.EWOULDBLOCK && err != syscall.EINTR
}
