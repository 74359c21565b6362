//go:build unix

package upstream

import "github.com/redproxy/redproxy/internal/rawio"

// rawReadable: a socket can be read with read(2) on its descriptor inside
// syscall.RawConn.Read (readRaw).
const rawReadable = true

func readFD(fd uintptr, b []byte) (int, error) { return rawio.ReadFD(fd, b) }
