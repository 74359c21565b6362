package mirror

import (
	"slices"
	"time"
)

// The mirror's order across clients is the order their batches reach the
// queue, which is the order their replies reached the proxy, not the order
// the primary ran them in. For most writes that is the same; for a
// blocking pop woken by another client's push it is not: the two replies
// arrive together, and the pop's mirrored LPOP could reach the mirror
// before the RPUSH that fed it, find the list empty, and leave the element
// there for good.
//
// So every batch with writes takes a ticket (Begin) before it is sent to
// the primary, given back when the batch reaches the queue (Enqueue). A
// pop's mirrored command (EnqueueAfterWrites) waits, held, until every
// ticket taken before its reply arrived is back: the push that woke it
// was sent, so its ticket taken, before the pop could return. A held entry
// waits at most maxHold, and a ticket not back after maxHold is no longer
// waited for (a batch stuck on a slow primary, or a bug): the pop is then
// mirrored anyway.
//
// A held pop must not be overtaken by its own client's later commands:
// a review found a client's LPUSH, queued at once, reach the mirror ahead
// of its own held LPOP, and the mirror's list diverge. So a Batch knows
// its session's last held entry (Batch.held), and while that entry is
// still held, the session's later entries are held behind it, with its
// after and since, so they are released with it, in order. Such an entry
// keeps its ticket until it is released, and goes ahead of the held
// entries that wait for that ticket (other clients' pops its writes may
// have fed), so those still follow it.

const maxHold = time.Second

type held struct {
	after  uint64 // every ticket up to this one must be back
	e      *entry
	since  time.Time
	id     uint64 // Batch.held
	ticket uint64 // the entry's own, given back when it is released; 0: none
}

// heldIndex is the index in m.held of the entry id; -1 once it is
// released, or for id 0.
func (m *Mirror) heldIndex(id uint64) int {
	if id == 0 {
		return -1
	}
	for i := range m.held {
		if m.held[i].id == id {
			return i
		}
	}
	return -1
}

// holdBehind holds e behind m.held[i], its session's last held entry,
// keeping ticket (e's batch's, or 0) open until e is released: e goes
// ahead of the held entries that wait for ticket, and after the rest.
func (m *Mirror) holdBehind(i int, e *entry, ticket uint64) {
	m.heldSeq++
	h := held{after: m.held[i].after, e: e, since: m.held[i].since, id: m.heldSeq, ticket: ticket}
	j := i + 1
	for j < len(m.held) && (ticket == 0 || m.held[j].after < ticket) {
		j++
	}
	m.held = slices.Insert(m.held, j, h)
}

// Begin takes a ticket for a batch with writes that is about to be sent
// to the primary; Enqueue gives it back.
func (b *Batch) Begin(m *Mirror) {
	if b.ticket != 0 {
		return
	}
	m.mu.Lock()
	m.issued++
	b.ticket = m.issued
	if m.open == nil {
		m.open = map[uint64]time.Time{}
	}
	m.open[b.ticket] = time.Now()
	m.mu.Unlock()
}

// end gives ticket t back and queues the held entries it was the last
// to wait for.
func (m *Mirror) end(t uint64) {
	m.mu.Lock()
	delete(m.open, t)
	released := m.releaseLocked(time.Time{})
	m.mu.Unlock()
	if released {
		m.signal()
	}
}

// releaseLocked moves to the queue the held entries no open ticket is
// older than, in order, and, with a non-zero now, those held since
// maxHold before it.
func (m *Mirror) releaseLocked(now time.Time) bool {
	if len(m.held) == 0 && now.IsZero() {
		return false
	}
	released := false
	for {
		low := m.issued + 1 // the oldest open ticket
		for t, since := range m.open {
			if !now.IsZero() && now.Sub(since) >= maxHold {
				// Not back after maxHold: a batch stuck on a slow primary,
				// or a ticket lost. Later pops stop waiting for it.
				delete(m.open, t)
				continue
			}
			low = min(low, t)
		}
		if len(m.held) == 0 {
			return released
		}
		n, ended := 0, false
		for _, h := range m.held {
			if h.after >= low && (now.IsZero() || now.Sub(h.since) < maxHold) {
				break // the rest wait too, in order
			}
			m.queue = append(m.queue, h.e)
			if h.ticket != 0 {
				delete(m.open, h.ticket) // queued: the entries waiting for it may go
				ended = true
			}
			n++
		}
		clear(m.held[:n])
		m.held = append(m.held[:0], m.held[n:]...)
		released = released || n > 0
		if !ended {
			return released
		}
	}
}

func (m *Mirror) signal() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// EnqueueAfterWrites is Enqueue for a command whose effect depends on
// writes other clients sent before its reply arrived (a blocking pop's):
// it reaches the mirror after them.
func (m *Mirror) EnqueueAfterWrites(db int, resp3 bool, b *Batch) {
	m.enqueue(db, resp3, b, true)
}
