//go:build unix && !linux

package rawio

import "syscall"

// Elsewhere the plain system calls: raw ones go through libc on some
// systems, and Go supports that only for its own calls.
const enabled = false

// ReadFD reads from a non-blocking descriptor.
func ReadFD(fd uintptr, b []byte) (int, error) { return syscall.Read(int(fd), b) }

// WriteFD writes to a non-blocking descriptor.
func WriteFD(fd uintptr, b []byte) (int, error) { return syscall.Write(int(fd), b) }

type iovec struct{}

// writevFD writes bufs[0]: raw calls, and so WriteVec, are not used here.
func writevFD(fd uintptr, bufs [][]byte, _ *[]iovec) (int, error) { return WriteFD(fd, bufs[0]) }
