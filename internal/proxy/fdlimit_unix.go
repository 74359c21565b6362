//go:build unix

package proxy

import "syscall"

// fileLimit is the process's limit on open file descriptors (its soft
// RLIMIT_NOFILE, which Go raises to the hard one at start), 0 if unknown.
func fileLimit() int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur > 1<<30 {
		return 0
	}
	return int(lim.Cur)
}
