package proxy

import (
	"testing"
	"unsafe"
)

// A parked client costs its Session and little else (park.go), so the
// Session's size is most of the idle-memory figure of bench/README.md.
// 416 bytes is a Go allocation size class; one byte more and every client
// costs 448. State of the batch being answered goes in sessionBatch,
// which a parked session drops; state only some sessions need goes behind
// a pointer allocated on first use (ns.b, route.reads).
func TestSessionFitsItsSizeClass(t *testing.T) {
	if got := unsafe.Sizeof(Session{}); got > 416 {
		t.Fatalf("Session is %d bytes, over the 416-byte size class: put batch state in sessionBatch, or rarely used state behind a pointer", got)
	}
}
