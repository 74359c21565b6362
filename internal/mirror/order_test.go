package mirror

import (
	"context"
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
		Dial: func() Target {
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
