package upstream

import "testing"

// TestPinLimitChildren: each Child may hold its parent's max at once (a
// cluster node that hangs holds its own share only); the parent counts
// what they hold and refuse, its max applies to them as it changes, and
// what is taken under the parent itself has a share of its own.
func TestPinLimitChildren(t *testing.T) {
	root := NewPinLimit(2)
	a, b := root.Child(), root.Child()
	takeN := func(l *PinLimit, n int, name string) {
		t.Helper()
		for i := range n {
			if !l.take() {
				t.Fatalf("%s: take %d of %d refused (max %d)", name, i+1, n, l.Max())
			}
		}
	}
	takeN(a, 2, "a")
	if a.take() {
		t.Fatal("a: a third take under max 2 succeeded")
	}
	takeN(b, 2, "b") // refused with one limit for both
	takeN(root, 2, "root")
	if got := root.Used(); got != 6 {
		t.Errorf("root.Used() = %d, want 6 (a 2, b 2, its own 2)", got)
	}
	if a.Used() != 2 || b.Used() != 2 {
		t.Errorf("a.Used(), b.Used() = %d, %d, want 2, 2", a.Used(), b.Used())
	}
	if root.Refused() != 1 || a.Refused() != 1 || b.Refused() != 0 {
		t.Errorf("refused: root %d, a %d, b %d, want 1, 1, 0", root.Refused(), a.Refused(), b.Refused())
	}

	a.SetMax(10) // a child's max is its parent's
	if a.Max() != 2 || a.take() {
		t.Fatalf("a child's SetMax changed its limit: max %d", a.Max())
	}
	root.SetMax(3)
	if a.Max() != 3 {
		t.Fatalf("a.Max() after root.SetMax(3) = %d", a.Max())
	}
	takeN(a, 1, "a after root.SetMax(3)")
	if a.take() {
		t.Fatal("a: a fourth take under max 3 succeeded")
	}

	for range 3 {
		a.give()
	}
	for range 2 {
		b.give()
		root.give()
	}
	if root.Used() != 0 || a.Used() != 0 || b.Used() != 0 {
		t.Errorf("after every give: root %d, a %d, b %d in use", root.Used(), a.Used(), b.Used())
	}
}
