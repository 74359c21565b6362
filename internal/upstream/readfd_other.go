//go:build !unix

package upstream

import (
	"net"
	"syscall"
)

// rawReadable is false where a descriptor is not read with read(2): the
// pipe's reader then reads through net.Conn.Read.
const rawReadable = false

func readFD(uintptr, []byte) (int, error) { return 0, syscall.EINVAL }

// peekEOF: only readRaw can miss a FIN (see Pipe.watchdog).
func peekEOF(net.Conn) bool { return false }

func peekGone(net.Conn) bool { return false }
