package bufpool

import (
	"bytes"
	"runtime"
	"sync/atomic"
	"testing"
)

func TestGetSizes(t *testing.T) {
	for _, c := range []struct{ n, want int }{
		{0, MinSize}, {1, MinSize}, {MinSize, MinSize}, {MinSize + 1, 2 * MinSize},
		{100_000, 128 << 10}, {1 << 20, 1 << 20}, {1<<20 + 1, 2 << 20},
		{MaxSize, MaxSize}, {MaxSize + 1, MaxSize + 1}, {10 << 20, 10 << 20},
	} {
		b := Get(c.n)
		if len(b) != c.want || cap(b) != c.want {
			t.Errorf("Get(%d): len %d cap %d, want %d", c.n, len(b), cap(b), c.want)
		}
		Put(b)
	}
}

func TestPooled(t *testing.T) {
	for n, want := range map[int]bool{
		0: false, 16 << 10: false, MinSize: true, MinSize + 1: false, 48 << 10: false,
		64 << 10: true, MaxSize: true, 2 * MaxSize: false,
	} {
		if Pooled(n) != want {
			t.Errorf("Pooled(%d) = %v, want %v", n, !want, want)
		}
	}
}

// A buffer handed back is handed out again with its capacity, and a
// round trip allocates nothing (Put takes a pointer, not a slice header).
func TestPutGetReuses(t *testing.T) {
	allocs := testing.AllocsPerRun(100, func() {
		b := Get(100_000)
		b[0] = 1
		Put(b)
	})
	if allocs > 0.5 {
		t.Errorf("Get and Put of a pooled size: %.1f allocations per round trip, want none", allocs)
	}
	// A slice of a pooled buffer that starts inside it has a capacity
	// that is no class: it is not taken, so no Get can hand out memory
	// past its array's end.
	b := Get(MinSize * 2)
	Put(b[1:])
	Put(b[:0]) // the whole buffer, by its capacity
	if c := Get(MinSize * 2); cap(c) != MinSize*2 {
		t.Fatalf("Get after Put: cap %d", cap(c))
	}
}

func TestCopy(t *testing.T) {
	src := make([]byte, 3*copyPiece+17)
	for i := range src {
		src[i] = byte(i * 7)
	}
	for _, c := range []struct{ dst, src int }{
		{0, 10}, {10, 0}, {5, 10}, {copyPiece, copyPiece}, {len(src), len(src)},
		{len(src) + 5, len(src)}, {2*copyPiece + 1, len(src)}, {len(src), copyPiece + 3},
	} {
		dst := make([]byte, c.dst)
		n := Copy(dst, src[:c.src])
		want := min(c.dst, c.src)
		if n != want || !bytes.Equal(dst[:n], src[:want]) {
			t.Errorf("Copy(%d bytes, %d bytes) = %d, want %d and the same bytes", c.dst, c.src, n, want)
		}
	}
}

// Copy lets other goroutines run while it copies a large buffer: with one
// P, a goroutine started before the copy runs before it ends. A plain
// copy keeps the P for the whole copy (the runtime cannot stop a goroutine
// inside memmove), which stalled every client of the proxy while one
// 256 MB request was copied.
func TestCopyLetsOthersRun(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	src := make([]byte, 8*copyPiece)
	dst := make([]byte, len(src))
	var ran atomic.Bool
	done := make(chan struct{})
	go func() {
		ran.Store(true)
		close(done)
	}()
	Copy(dst, src)
	ranDuring := ran.Load()
	<-done
	if !ranDuring {
		t.Fatal("no other goroutine ran during a copy of 2 MB")
	}
}
