//go:build !unix

package resp

import "syscall"

// rawReadable is false where a descriptor is not read with read(2): the
// Reader then reads through io.Reader and keeps its buffer while idle.
const rawReadable = false

func readFD(uintptr, []byte) (int, error) { return 0, syscall.EINVAL }
