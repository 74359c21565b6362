package mirror

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/resp"
	"github.com/redproxy/redproxy/internal/upstream"
)

// TestMirrorPopWaitsForOpenWrites: a pop queued while another batch's
// writes are in flight to the primary (their ticket taken, not back)
// reaches the mirror after them, even though it was queued first; with no
// write in flight it goes at once. A ticket that never comes back holds
// the pop for maxHold at most.
func TestMirrorPopWaitsForOpenWrites(t *testing.T) {
	rs := redistest.Start(t)
	m := New(Options{
		Config:    Config{Upstream: "new", Writes: true, Queue: 100, QueueBytes: 1 << 20},
		Databases: 16,
		Dial: func(<-chan struct{}) Target {
			return BackendTarget(upstream.NewBackend(upstream.BackendOptions{Addr: rs.Addr(), Connections: 1, Databases: 16,
				DialTimeout: time.Second, ReplyTimeout: time.Second, ReconnectMin: time.Millisecond, ReconnectMax: 10 * time.Millisecond}), nil)
		},
	})
	defer m.Close()
	rc := rs.Client(t)
	ctx := context.Background()
	drained := func() {
		t.Helper()
		redistest.Eventually(t, 5*time.Second, func() bool { n, _ := m.Queued(); return n == 0 }, "queue never drained")
	}

	var push, pop Batch
	push.Begin(m) // the push is on its way to the primary
	pop.Write("lpop", false, resp.AppendCommandStrings(nil, "LPOP", "q"))
	m.EnqueueAfterWrites(0, false, &pop) // its reply came first
	pop.Reset()
	push.Write("rpush", false, resp.AppendCommandStrings(nil, "RPUSH", "q", "job"))
	m.Enqueue(0, false, &push)
	push.Reset()
	drained()
	if n, err := rc.LLen(ctx, "q").Result(); err != nil || n != 0 {
		t.Fatalf("mirror LLEN q = %d, %v: the pop ran before the push", n, err)
	}

	// No write in flight: at once.
	if err := rc.RPush(ctx, "q2", "x").Err(); err != nil {
		t.Fatal(err)
	}
	pop.Write("lpop", false, resp.AppendCommandStrings(nil, "LPOP", "q2"))
	m.EnqueueAfterWrites(0, false, &pop)
	pop.Reset()
	drained()
	if n, _ := rc.LLen(ctx, "q2").Result(); n != 0 {
		t.Fatal("the pop of q2 was not mirrored")
	}

	// A ticket never given back: the pop goes after maxHold.
	var lost Batch
	lost.Begin(m)
	if err := rc.RPush(ctx, "q3", "x").Err(); err != nil {
		t.Fatal(err)
	}
	pop.Write("lpop", false, resp.AppendCommandStrings(nil, "LPOP", "q3"))
	m.EnqueueAfterWrites(0, false, &pop)
	pop.Reset()
	drained()
	if n, _ := rc.LLen(ctx, "q3").Result(); n != 0 {
		t.Fatal("a pop held by a lost ticket was never mirrored")
	}
}

// TestMirrorLostTicketExpires: a ticket not back after maxHold is no
// longer waited for, so one lost ticket does not delay every later pop.
func TestMirrorLostTicketExpires(t *testing.T) {
	m := &Mirror{}
	var lost Batch
	lost.Begin(m)
	m.mu.Lock()
	m.open[lost.ticket] = time.Now().Add(-2 * maxHold)
	m.releaseLocked(time.Now())
	n := len(m.open)
	m.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d tickets still open", n)
	}
}

// heldMirror is a Mirror without a sender, for the held list's
// bookkeeping: what reaches m.queue, in what order.
func heldMirror() *Mirror {
	return &Mirror{cfg: Config{Writes: true, Queue: 100, QueueBytes: 1 << 20}, opt: Options{Databases: 16},
		wake: make(chan struct{}, 1)}
}

func (m *Mirror) queuedNames() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, e := range m.queue {
		for _, c := range e.cmds {
			out = append(out, c.name)
		}
	}
	return out
}

func write(b *Batch, name string) {
	b.Write(name, false, resp.AppendCommandStrings(nil, name, "q"))
}

// TestMirrorHeldPopKeepsItsClientOrder: a review found a client's next
// write queued at once while its own pop was still held, so it reached the
// mirror first. A session's entries after its held one are held behind
// it and released with it, in order; once it is released, they go at
// once again.
func TestMirrorHeldPopKeepsItsClientOrder(t *testing.T) {
	m := heldMirror()
	var other, a Batch
	other.Begin(m) // another client's write in flight
	write(&a, "lpop")
	m.EnqueueAfterWrites(0, false, &a)
	a.Reset()
	write(&a, "lpush") // the same client's next batch, without writes in flight of its own
	m.Enqueue(0, false, &a)
	a.Reset()
	if got := m.queuedNames(); len(got) != 0 {
		t.Fatalf("queued %v while the client's pop is held", got)
	}
	write(&other, "rpush")
	m.Enqueue(0, false, &other)
	if got := m.queuedNames(); !slices.Equal(got, []string{"rpush", "lpop", "lpush"}) {
		t.Fatalf("queued %v, want rpush, lpop, lpush", got)
	}
	write(&a, "incr") // nothing held now: at once
	m.Enqueue(0, false, &a)
	if got := m.queuedNames(); len(got) != 4 || got[3] != "incr" {
		t.Fatalf("queued %v, want incr last", got)
	}
}

// TestMirrorHeldWriteKeepsItsTicket: a client's write held behind its own
// pop keeps its ticket until it is released, and goes ahead of another
// client's pop that waits for it (the pop its push may have woken), though
// that pop was queued first; with the ticket given back at once, the pop
// went first.
func TestMirrorHeldWriteKeepsItsTicket(t *testing.T) {
	m := heldMirror()
	var other, a, b Batch
	other.Begin(m)
	write(&a, "lpop")
	m.EnqueueAfterWrites(0, false, &a) // a's pop, held behind other
	a.Reset()
	a.Begin(m) // a's push, sent to the primary
	write(&b, "blpop->lpop")
	m.EnqueueAfterWrites(0, false, &b) // b's pop, woken by a's push, answered first
	write(&a, "lpush")
	m.Enqueue(0, false, &a)
	m.mu.Lock()
	open := len(m.open)
	m.mu.Unlock()
	if open != 2 {
		t.Fatalf("%d tickets open, want 2 (other's, and a's held push)", open)
	}
	write(&other, "rpush")
	m.Enqueue(0, false, &other)
	if got := m.queuedNames(); !slices.Equal(got, []string{"rpush", "lpop", "lpush", "blpop->lpop"}) {
		t.Fatalf("queued %v, want rpush, lpop, lpush, blpop->lpop", got)
	}
	m.mu.Lock()
	open, held := len(m.open), len(m.held)
	m.mu.Unlock()
	if open != 0 || held != 0 {
		t.Fatalf("%d tickets open, %d entries held after all were released", open, held)
	}
}

// TestMirrorHeldBehindExpiresWithIt: entries held behind a client's pop
// share its maxHold: a lost ticket delays them no longer than the pop.
func TestMirrorHeldBehindExpiresWithIt(t *testing.T) {
	m := heldMirror()
	var lost, a Batch
	lost.Begin(m)
	write(&a, "lpop")
	m.EnqueueAfterWrites(0, false, &a)
	a.Reset()
	a.Begin(m)
	write(&a, "lpush")
	m.Enqueue(0, false, &a)
	m.mu.Lock()
	m.releaseLocked(time.Now().Add(maxHold))
	held := len(m.held)
	m.mu.Unlock()
	if got := m.queuedNames(); held != 0 || !slices.Equal(got, []string{"lpop", "lpush"}) {
		t.Fatalf("queued %v, %d still held", got, held)
	}
}
