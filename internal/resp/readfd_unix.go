//go:build unix

package resp

import "github.com/redproxy/redproxy/internal/rawio"

// rawReadable: a socket can be read directly, with read(2) on its
// descriptor, inside syscall.RawConn.Read.
const rawReadable = true

func readFD(fd uintptr, b []byte) (int, error) { return rawio.ReadFD(fd, b) }
