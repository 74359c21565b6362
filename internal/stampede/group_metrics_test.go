package stampede

import (
	"errors"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/redistest"
)

// TestOverflowedReadIsNotCountedAsCoalesced shows that a read past
// max_waiters, which its caller sends upstream alone (waiter_overflows_total),
// is not counted in coalesced_reads_total, documented as reads "as leader or
// joiner of a shared fetch". What went wrong (found by review): Group.do
// counted the read before checking the cap, so every overflowed read was
// also counted as coalesced, and coalesced - fetches_saved overstated the
// fetches the group sent, most of all when coalescing gave up.
func TestOverflowedReadIsNotCountedAsCoalesced(t *testing.T) {
	m := NewMetrics(nil)
	g := NewGroup(Options{MaxWaiters: 1, Metrics: m})
	gt := newGates()
	f := gt.fetch(numbered)
	a := doAsync(g, "k", f) // leads the fetch in flight
	gt.waitStarted(t, 1)
	b := doAsync(g, "k", f) // leads the next fetch, collecting
	redistest.Eventually(t, 5*time.Second, func() bool { _, next, _, _ := g.state("k"); return next }, "B never became the next leader")
	c := doAsync(g, "k", f) // joins the next fetch: the one waiter allowed
	redistest.Eventually(t, 5*time.Second, func() bool { _, _, _, w := g.state("k"); return w == 1 }, "C never joined")
	const overflowing = 5
	for range overflowing {
		if _, _, err := g.Do("k", f); !errors.Is(err, ErrTooManyWaiters) {
			t.Fatalf("err = %v, want ErrTooManyWaiters", err)
		}
	}
	gt.release(1)
	gt.waitStarted(t, 2)
	gt.release(2)
	for _, ch := range []chan result{a, b, c} {
		if r := <-ch; r.err != nil {
			t.Fatal(r.err)
		}
	}
	if got := counter(m.Overflows); got != overflowing {
		t.Fatalf("overflows = %v, want %d", got, overflowing)
	}
	// Three reads went through the group (two leaders, one joiner); the
	// five overflowed reads were sent alone by their callers.
	if got := counter(m.Coalesced); got != 3 {
		t.Fatalf("coalesced_reads_total = %v after 3 coalesced reads and %d overflowed ones, want 3", got, overflowing)
	}
}
