package bufpool

import "testing"

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
