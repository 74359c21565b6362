// Package bufpool recycles the large byte buffers that big requests and
// replies need for a moment: a client's read buffer grown for a 100 KB SET,
// a Call's reply buffer for a 100 KB GET.
//
// Without it each such buffer was made (and zeroed) for one request and
// left to the collector when the client went idle, which at -P 1 is after
// every request: a 100 KB SET through the proxy cost three allocations
// (32, 64 and 128 KB) and the collections they caused, about a third of
// the proxy's CPU (bench/README.md, "Large values"). Idle clients must
// still hold nothing, so the buffers go back here rather than staying with
// their client.
//
// Buffers come in power-of-two classes from MinSize to MaxSize. A pool
// holds its buffers only until the collector runs twice (sync.Pool), so a
// burst of large requests does not keep its memory for ever.
package bufpool

import (
	"math/bits"
	"runtime"
	"sync"
	"unsafe"
)

const (
	// MinSize is the smallest pooled buffer: below it a buffer costs
	// less than the pool's bookkeeping saves.
	MinSize = 32 << 10
	// MaxSize is the largest: larger buffers are rare, and made and
	// collected as before.
	MaxSize = 4 << 20

	minShift = 15 // log2(MinSize)
	classes  = 8  // MinSize << (classes-1) == MaxSize
)

// pools[i] holds buffers of MinSize<<i bytes, each as a pointer to its
// first byte: a pointer goes into a sync.Pool without an allocation, where
// a slice header would need one.
var pools [classes]sync.Pool

// class returns the class of a buffer of capacity n, or -1 when n is not
// exactly a class size.
func class(n int) int {
	if n < MinSize || n > MaxSize || n&(n-1) != 0 {
		return -1
	}
	return bits.TrailingZeros(uint(n)) - minShift
}

// classFor returns the smallest class holding n bytes, or -1 above MaxSize.
func classFor(n int) int {
	if n <= MinSize {
		return 0
	}
	if n > MaxSize {
		return -1
	}
	return bits.Len(uint(n-1)) - minShift
}

// Get returns a buffer of at least n bytes, its length its capacity: a
// class size when n ≤ MaxSize. Its contents are whatever its last user
// left.
func Get(n int) []byte {
	c := classFor(n)
	if c < 0 {
		return make([]byte, n)
	}
	size := MinSize << c
	if p, ok := pools[c].Get().(*byte); ok {
		return unsafe.Slice(p, size)
	}
	return make([]byte, size)
}

// Put gives b's memory back for reuse. The caller must hold the only
// reference to it: whatever still points into b would see another
// client's bytes. A buffer whose capacity is not a class size is left to
// the collector.
func Put(b []byte) {
	b = b[:cap(b)]
	c := class(len(b))
	if c < 0 {
		return
	}
	pools[c].Put(&b[0])
}

// Pooled reports whether a buffer of capacity n would be taken by Put.
func Pooled(n int) bool { return class(n) >= 0 }

// copyPiece is how much Copy moves between yields: a quarter of a
// millisecond of copying into memory the kernel has yet to fault in.
const copyPiece = 256 << 10

// Copy is copy for buffers that may be hundreds of megabytes. The
// runtime's memmove cannot be preempted, so one copy of 256 MB into a
// fresh buffer ran 206 ms without a preemption point (runtime trace, a
// 256 MB SET through the proxy). With GOMAXPROCS 2 the collector's
// dedicated mark worker held the other P all that time waiting to stop
// this goroutine, and every other client of the proxy stalled for it.
// Pieces alone do not help: the runtime asks a goroutine to stop with a
// signal that is ignored while it is inside memmove, and a loop of
// memmoves is inside memmove nearly all the time (47 ms unpreempted with
// 256 KB pieces). So Copy yields between pieces, where the scheduler runs
// what the collector asked of this P, and lets other clients run.
func Copy(dst, src []byte) int {
	n := 0
	for len(src) > copyPiece && len(dst) > copyPiece {
		k := copy(dst, src[:copyPiece])
		n += k
		dst, src = dst[k:], src[k:]
		runtime.Gosched()
	}
	return n + copy(dst, src)
}
