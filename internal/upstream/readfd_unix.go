//go:build unix

package upstream

import (
	"net"
	"syscall"

	"github.com/redproxy/redproxy/internal/rawio"
)

// rawReadable: a socket can be read with read(2) on its descriptor inside
// syscall.RawConn.Read (readRaw).
const rawReadable = true

func readFD(fd uintptr, b []byte) (int, error) { return rawio.ReadFD(fd, b) }

// peekEOF reports whether the peer's FIN waits unread on nc's bare
// socket: recv with MSG_PEEK returns 0 then, and leaves it for the
// reader. Always false for a socket readRaw does not read (TLS).
func peekEOF(nc net.Conn) bool {
	raw := rawSocket(nc)
	if raw == nil {
		return false
	}
	eof := false
	raw.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		eof = err == nil && n == 0
	})
	return eof
}

// peekGone reports whether nc's bare socket says the peer is gone: its FIN
// (EOF) or a reset waits unread. For a kept idle connection about to be
// lent: Redis may have closed it (CLIENT KILL, a restart) a moment before,
// and the pipe's reader not have seen it yet, or have seen it and closed
// the socket without having marked the pipe down yet. False for TLS.
func peekGone(nc net.Conn) bool {
	raw := rawSocket(nc)
	if raw == nil {
		return false
	}
	gone := false
	if err := raw.Control(func(fd uintptr) { gone = rawio.PeerGoneFD(fd) }); err != nil {
		return true // closed already
	}
	return gone
}
