package proxy

import (
	"testing"
	"unsafe"
)

// A parked client costs its Session and little else (park.go), so the
// Session's size is most of the idle-memory figure of bench/README.md.
// 448 bytes is a Go allocation size class, and the Session holds the
// client's connection (clientConn) in it; one byte more and every client
// costs 480. State of the batch being answered goes in sessionBatch,
// which a parked session drops; state only some sessions need goes behind
// a pointer allocated on first use (ns.b, route.reads).
func TestSessionFitsItsSizeClass(t *testing.T) {
	if got := unsafe.Sizeof(Session{}); got > 448 {
		t.Fatalf("Session is %d bytes, over the 448-byte size class: put batch state in sessionBatch, or rarely used state behind a pointer", got)
	}
}

// A parked session drops its sessionBatch, which must then not share the
// size class of the runtime's goroutine records (480 bytes on 64-bit Go),
// which are never freed: the spans holding both could not be given back
// while the client idles.
func TestSessionBatchOutsideGoroutineSizeClass(t *testing.T) {
	if got := unsafe.Sizeof(sessionBatch{}); got > 448 && got <= 480 {
		t.Fatalf("sessionBatch is %d bytes, in the 480-byte size class of goroutine records", got)
	}
}
