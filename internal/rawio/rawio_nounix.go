//go:build !unix

package rawio

import "syscall"

const enabled = false

// ReadFD is not used where sockets are not descriptors.
func ReadFD(uintptr, []byte) (int, error) { return 0, syscall.EINVAL }

// WriteFD is not used where sockets are not descriptors.
func WriteFD(uintptr, []byte) (int, error) { return 0, syscall.EINVAL }

type iovec struct{}

// writevFD is not used where sockets are not descriptors.
func writevFD(uintptr, [][]byte, *[]iovec) (int, error) { return 0, syscall.EINVAL }
