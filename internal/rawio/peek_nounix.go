//go:build !unix

package rawio

// PeerGoneFD: no peek where sockets are not unix descriptors.
func PeerGoneFD(uintptr) bool { return false }
