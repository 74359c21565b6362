package proxy

import (
	"testing"
	"unsafe"
)

// A parked client costs its Session and little else (park.go), so the
// Session's size is the idle-memory figure of bench/README.md. 896 bytes
// is a Go allocation size class; one byte more and every client costs
// 1024. State only some sessions need goes behind a pointer allocated on
// first use (mirrorS, ns.b).
func TestSessionFitsItsSizeClass(t *testing.T) {
	if got := unsafe.Sizeof(Session{}); got > 896 {
		t.Fatalf("Session is %d bytes, over the 896-byte size class: move rarely used state behind a pointer", got)
	}
}
