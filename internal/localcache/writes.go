package localcache

import (
	"strconv"

	"github.com/redproxy/redproxy/internal/commands"
)

// Writes is one client's writes in flight through the proxy: the keys it
// marked, and whether a fence is due once the replies are in. The session
// owns it; the zero value is ready.
type Writes struct {
	marks []mark
	fence bool
	// swapped are the databases of SWAPDBs in flight (-1: every one, for
	// a script that may run SWAPDB), emptied again by WriteDone: Redis
	// (7.0) sends no invalidation for SWAPDB, so the fence alone would not
	// drop what a fill read between WriteStart's flush and the swap.
	swapped []int
}

type mark struct {
	h uint64
	// filtered: the key had no record, and the write is counted in its
	// shard's writing filter instead of in a record's inflight.
	filtered bool
}

// Fenced reports whether WriteDone will raise a fence.
func (w *Writes) Fenced() bool { return w.fence || len(w.swapped) > 0 }

// Swapped returns the databases of the SWAPDBs among w's writes (-1:
// every database), which WriteDone drops again; the caller must not keep
// or change the slice.
func (w *Writes) Swapped() []int { return w.swapped }

// FlushSwapped drops db (-1: every database) again, as WriteDone does for
// a SWAPDB, for a caller that cannot tell when a SWAPDB's reply arrives
// but can call this after the SWAPDB may have run and before its reply may
// reach the client (proxy/relayhooks.go: a relay whose replies it no
// longer counts). Fills in flight discard their replies; fills sent after
// it reach Redis after any swap that had run by then.
func (c *Cache) FlushSwapped(db int) { c.flush(db, FlushForwarded, nil) }

// Pending reports whether there is anything for WriteDone to do.
func (w *Writes) Pending() bool { return len(w.marks) > 0 || w.fence || len(w.swapped) > 0 }

// WriteStart is called for every write before it is sent to Redis (for a
// transaction, for each queued write before EXEC is sent). It drops the
// keys the write names, makes every fill of them in flight discard its
// reply, and marks them "write in flight": until WriteDone, they are
// neither served nor filled. A write whose keys cannot all be named (a
// script, MOVE, COPY ... DB, an incomplete key spec) also asks for a fence
// after its reply; FLUSHALL, FLUSHDB and SWAPDB flush what they empty and
// fence too, and so does a script that may run SWAPDB (scripts.go), for
// every database. inTx says a SELECT queued in the write's transaction may
// have moved it to another database than db, so it is fenced as well.
func (c *Cache) WriteStart(w *Writes, db int, cmd *commands.Command, args [][]byte, inTx bool) {
	if cmd == nil {
		return
	}
	switch flushKind(cmd, args) {
	case "flushall":
		c.flush(-1, FlushForwarded, nil)
		w.fence = true
		return
	case "flushdb":
		c.flush(db, FlushForwarded, nil)
		w.fence = true
		return
	case "swapdb":
		for _, a := range args[1:] {
			if n, err := strconv.Atoi(string(a)); err == nil {
				c.flush(n, FlushForwarded, nil)
				w.swapped = append(w.swapped, n)
			}
		}
		w.fence = true
		return
	}
	if cmd.Flags&commands.CatScripting != 0 && c.scriptSwaps(cmd, args) {
		// A script that may run SWAPDB, on databases it may compute:
		// handled as a SWAPDB of every database (scripts.go).
		c.flush(-1, FlushForwarded, nil)
		w.swapped = append(w.swapped, -1)
		w.fence = true
		return
	}
	if inTx || unknownKeys(cmd, args) {
		w.fence = true
	}
	var buf [8]int
	for _, i := range cmd.Keys(args, buf[:0]) {
		c.markWrite(w, db, args[i])
	}
	if mode := hooks.Load(); mode != nil && mode.FenceWrites {
		w.fence = true
	}
}

// markWrite drops db/key and counts a write in flight for it.
func (c *Cache) markWrite(w *Writes, db int, key []byte) {
	h := c.hash(db, key)
	s := c.shardOf(h)
	// Writes only weigh against reads (admit): a key not read since the
	// read sketch last aged cannot be admitted now, so its writes are not
	// counted. That keeps the write sketch's atomic updates, cache misses
	// in a table of up to 1MB, off the writes of keys nobody reads through
	// the proxy, most writes, for a read-only look at one word.
	if c.reads.seen(h) && c.writes.add(h, 1) {
		c.wantHalve()
	}
	fenceOnly := false
	if hk := hooks.Load(); hk != nil && hk.FenceWrites {
		fenceOnly = true
	}
	s.mu.Lock()
	rec := s.recs[h]
	if rec == nil {
		// Nothing to drop and no fill in flight (a fill has a record):
		// only keep fills from starting until the reply.
		if !fenceOnly {
			s.writing[writeSlot(h)].Add(1)
			w.marks = append(w.marks, mark{h: h, filtered: true})
		}
		s.mu.Unlock()
		return
	}
	if !rec.same(db, key) {
		// Another key holds this hash, so this one is not in the tier and
		// cannot be marked; a fence covers it instead.
		s.mu.Unlock()
		w.fence = true
		return
	}
	rec.gen++
	c.dropEntries(s, rec)
	c.dropAside(rec)
	if fenceOnly {
		c.maybeForget(s, rec)
		s.mu.Unlock()
		return
	}
	rec.inflight++
	s.mu.Unlock()
	w.marks = append(w.marks, mark{h: h})
}

// WriteDone is called once the replies of the writes started since the last
// WriteDone have arrived (or failed): the keys may be filled again, and a
// fence is raised if one is due. A fill sent from now on reaches Redis after
// the writes ran, so it reads their result.
func (c *Cache) WriteDone(w *Writes) {
	for _, m := range w.marks {
		s := c.shardOf(m.h)
		if m.filtered {
			s.writing[writeSlot(m.h)].Add(-1)
			continue
		}
		s.mu.Lock()
		if rec := s.recs[m.h]; rec != nil {
			rec.inflight--
			c.maybeForget(s, rec)
		}
		s.mu.Unlock()
	}
	clear(w.marks)
	w.marks = w.marks[:0]
	// A fill sent after the flush in WriteStart may have run before the
	// swap and kept the other database's old value: drop both again (and
	// make fills still in flight discard theirs). Fills sent from now on
	// run after the swap.
	for _, db := range w.swapped {
		c.flush(db, FlushForwarded, nil)
	}
	w.swapped = w.swapped[:0]
	if w.fence {
		w.fence = false
		c.Fence()
	}
}
