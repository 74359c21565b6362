package cluster

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"testing"
)

// scanModel is a cluster as SCAN sees it, for checking the walk's plan:
// slot owners that change between calls, and per node a hash table of
// scanPages buckets that a node's cursor walks one bucket per call. Each
// slot holds one key; a node puts it in a bucket of its own choosing, so
// a key that moves to another node lands at another place in its walk.
type scanModel struct {
	owner [Slots]int
	addrs []string
	m     *Map
}

const scanPages = 4

// scanKeys is one key per slot.
var scanKeys = func() (keys [Slots]string) {
	left := Slots
	for i := 0; left > 0; i++ {
		k := fmt.Sprintf("key:%d", i)
		if s := Slot([]byte(k)); keys[s] == "" {
			keys[s] = k
			left--
		}
	}
	return keys
}()

func newScanModel(nodes int) *scanModel {
	sm := &scanModel{}
	for i := range nodes {
		sm.addrs = append(sm.addrs, fmt.Sprintf("10.0.0.%d:6379", i+1))
	}
	for s := range sm.owner {
		sm.owner[s] = s * nodes / Slots
	}
	sm.build()
	return sm
}

func (sm *scanModel) build() {
	m := newMap()
	for s, i := range sm.owner {
		if err := m.assign(s, s, sm.addrs[i]); err != nil {
			panic(err)
		}
	}
	sm.m = m
}

// bucket is where node addr keeps key.
func scanBucket(addr, key string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(addr + "/" + key))
	return h.Sum64() % scanPages
}

// call runs one SCAN with cursor: the keys it returns and the next cursor.
// stale reports a cursor made with a map that differs from the current
// one where it matters, and collided one whose hash did not show it.
func (sm *scanModel) call(cursor uint64, made *Map) (keys []string, next uint64, collided bool) {
	w, addr, nodeCursor, _ := planScanWalk(sm.m, cursor)
	if addr == "" {
		panic("a served slot was planned as unserved")
	}
	if cursor != 0 && made != sm.m {
		// Stale: what the cursor relies on changed (scanHash's labels).
		base := int(cursor>>cursorBaseLow&cursorBaseMask) * scanBaseStep
		slot := int(cursor & cursorSlotMask)
		stale := fmt.Sprint(scanLabels(made, base, slot)) != fmt.Sprint(scanLabels(sm.m, base, slot))
		collided = stale && cursor>>cursorSlotBits&cursorHashMask == scanHash(sm.m, base, slot)
	}
	for s, i := range sm.owner {
		k := scanKeys[s]
		if sm.addrs[i] == addr && scanBucket(addr, k) == nodeCursor && w.keeps([]byte(k)) {
			keys = append(keys, k)
		}
	}
	if nodeCursor+1 < scanPages {
		return keys, w.cursor(nodeCursor + 1), collided
	}
	return keys, w.next(), collided
}

// scanLabels is what a cursor of base b at slot relies on, as scanHash
// hashes it: per slot from b on, its primary if that one's lowest slot
// from b on is at most slot, "+" if another serves it, "-" if none does.
func scanLabels(m *Map, b, slot int) []string {
	lowest := map[string]int{}
	for s := Slots - 1; s >= b; s-- {
		if addr := m.Owner(s); addr != "" {
			lowest[addr] = s
		}
	}
	var out []string
	for s := b; s < Slots; s++ {
		addr := m.Owner(s)
		switch {
		case addr == "":
			out = append(out, "-")
		case lowest[addr] <= slot:
			out = append(out, addr)
		default:
			out = append(out, "+")
		}
	}
	return out
}

// mutate moves a range of slots to another node, or fails a node over to
// a new address.
func (sm *scanModel) mutate(r *rand.Rand) {
	if r.IntN(4) == 0 {
		i := r.IntN(len(sm.addrs))
		sm.addrs[i] += "'"
	} else {
		from := r.IntN(Slots)
		to := min(Slots, from+1+r.IntN(2000))
		n := r.IntN(len(sm.addrs))
		for s := from; s < to; s++ {
			sm.owner[s] = n
		}
	}
	sm.build()
}

// A SCAN walk whose slot map changes between its calls (slot moves and
// failovers at random) returns every key, though a key may move: moves
// here happen between calls, all of a slot at once, so a walk that follows
// them loses none. Walking on in the old order (before) lost keys here on
// the first change; a cursor whose 10-bit hash happens to match the new
// map's is the one loss left, and is counted apart.
func TestScanWalkAcrossChangingMaps(t *testing.T) {
	collisions, restarts, trials := 0, 0, 100
	for trial := range trials {
		r := rand.New(rand.NewPCG(uint64(trial), 7))
		sm := newScanModel(2 + r.IntN(4))
		seen := map[string]bool{}
		changes, collided := 0, false
		var cursor uint64
		made := sm.m
		for calls := 0; ; calls++ {
			if calls > 10000 {
				t.Fatalf("trial %d: the walk never ended", trial)
			}
			if changes < 12 && r.IntN(3) == 0 {
				sm.mutate(r)
				changes++
			}
			if cursor != 0 {
				if _, _, _, again := planScanWalk(sm.m, cursor); again {
					restarts++
				}
			}
			keys, next, c := sm.call(cursor, made)
			collided = collided || c
			for _, k := range keys {
				seen[k] = true
			}
			if cursor, made = next, sm.m; cursor == 0 {
				break
			}
		}
		if collided {
			collisions++
			continue
		}
		for s, k := range scanKeys {
			if !seen[k] {
				t.Fatalf("trial %d: slot %d's key %s never returned (%d changes)", trial, s, k, changes)
			}
		}
	}
	t.Logf("%d trials, %d with a hash collision, %d node walks started again", trials, collisions, restarts)
	if collisions > trials/10 {
		t.Fatalf("%d of %d trials met a hash collision", collisions, trials)
	}
}

// With the map unchanged, the walk visits each primary once, whole, in
// the order of its lowest slot: one node cursor per page, no filtering.
func TestScanWalkStableMapWalksEachNodeOnce(t *testing.T) {
	sm := newScanModel(3)
	sm.owner[0] = 2 // the third node also serves slot 0: it comes first
	sm.build()
	var order []string
	seen := map[string]int{}
	var cursor uint64
	for {
		w, addr, _, again := planScanWalk(sm.m, cursor)
		if again || w.base != 0 {
			t.Fatalf("cursor %d: restart %v, base %d on a map that did not change", cursor, again, w.base)
		}
		if len(order) == 0 || order[len(order)-1] != addr {
			order = append(order, addr)
		}
		keys, next, _ := sm.call(cursor, sm.m)
		for _, k := range keys {
			seen[k]++
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	want := []string{sm.addrs[2], sm.addrs[0], sm.addrs[1]}
	if fmt.Sprint(order) != fmt.Sprint(want) {
		t.Fatalf("walked %v, want %v", order, want)
	}
	for s, k := range scanKeys {
		if seen[k] != 1 {
			t.Fatalf("slot %d's key returned %d times", s, seen[k])
		}
	}
}

// A map that keeps changing away from the part being walked costs one
// restart, at the first change, not one per change: before, every change
// started the whole walk again, so a scan under a long resharding did not
// end until the resharding did.
func TestScanWalkChangesElsewhereDoNotRestart(t *testing.T) {
	sm := newScanModel(3)
	second := sm.addrs[1]
	var cursor uint64
	made := sm.m
	// Walk into the second node.
	for {
		_, addr, nodeCursor, _ := planScanWalk(sm.m, cursor)
		if addr == second && nodeCursor != 0 {
			break
		}
		_, cursor, _ = sm.call(cursor, made)
	}
	restarts := 0
	for moves := 0; cursor != 0; moves++ {
		if moves > 1000 {
			t.Fatalf("the walk never ended: %d restarts in %d changes", restarts, moves)
		}
		// Slot 0, long walked, between the first node and the third.
		sm.owner[0] = 2 - 2*(moves%2)
		sm.build()
		if _, _, _, again := planScanWalk(sm.m, cursor); again {
			restarts++
		}
		var collided bool
		if _, cursor, collided = sm.call(cursor, made); collided {
			t.Skip("a hash collision; the walk's cursors depend on the addresses only")
		}
		made = sm.m
	}
	if restarts != 1 {
		t.Fatalf("%d restarts, want 1 (the first change)", restarts)
	}
}

// filter leaves out the keys of slots below the base, and hands a page it
// keeps whole back as it is.
func TestScanWalkFilter(t *testing.T) {
	in := scanKeys[5]
	out := scanKeys[9]
	page := []byte(fmt.Sprintf("*2\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n", len(in), in, len(out), out))
	w := scanWalk{m: newScanModel(1).m, base: 6, slot: 6}
	got, ok := w.filter(page)
	if want := fmt.Sprintf("*1\r\n$%d\r\n%s\r\n", len(out), out); !ok || string(got) != want {
		t.Fatalf("filter = %q, %v; want %q", got, ok, want)
	}
	w.base = 5
	if got, ok := w.filter(page); !ok || &got[0] != &page[0] {
		t.Fatalf("a page kept whole was copied: %q, %v", got, ok)
	}
	if _, ok := w.filter([]byte("*1\r\n:1\r\n")); ok {
		t.Fatal("an integer in a SCAN page was taken for a key")
	}
}

// A cursor the previous version made (slot, the fingerprint's hash, then
// the node's cursor from bit 24 on) handed to this version, as by a
// client mid-scan across a proxy upgrade with the map unchanged: the walk
// starts again at the slot's base, and never sends a node another cursor
// than the one it gave. Without a salt in the hash (found by review), the
// old hash matched and the node's cursor was read from bit 30 on: the
// node was sent a position elsewhere in its walk, and keys were missed.
func TestScanWalkPreviousVersionCursor(t *testing.T) {
	sm := newScanModel(3)
	slot := sm.m.lowestSlot(sm.m.Primaries()[1])
	h := fnv.New64a()
	h.Write([]byte(sm.m.Fingerprint()))
	oldHash := h.Sum64() & (1<<10 - 1)
	for c := uint64(1); c < 1<<12; c++ {
		old := c<<24 | oldHash<<14 | uint64(slot)
		w, _, nodeCursor, _ := planScanWalk(sm.m, old)
		if nodeCursor != 0 || w.base > slot {
			t.Fatalf("old cursor %d (node cursor %d): the node was sent cursor %d, base %d", old, c, nodeCursor, w.base)
		}
	}
}

// One slot move, behind the walk, while a map whose primaries serve many
// separate ranges of slots is walked, costs at most one more walk of each
// primary. Found by review of a version that went on range by range after
// a change: each primary was walked once per range left (257 node walks
// for slots dealt out 64 at a time to 3 primaries, 16,385 dealt one at a
// time).
func TestScanWalkOneMoveOnFragmentedMap(t *testing.T) {
	for _, chunk := range []int{1024, 64, 1} {
		sm := newScanModel(3)
		for s := range sm.owner {
			sm.owner[s] = s / chunk % 3
		}
		sm.build()
		var cursor uint64
		made, moved, walks := sm.m, false, 0
		seen := map[string]bool{}
		for {
			if !moved && cursor&cursorSlotMask != 0 && cursor>>cursorNodeLow != 0 {
				moved = true // into the second primary's walk
				sm.owner[0] = 2
				sm.build()
			}
			if _, _, nc, _ := planScanWalk(sm.m, cursor); nc == 0 {
				walks++
			}
			keys, next, _ := sm.call(cursor, made)
			for _, k := range keys {
				seen[k] = true
			}
			if cursor, made = next, sm.m; cursor == 0 {
				break
			}
		}
		if !moved {
			t.Fatalf("slots dealt %d at a time: the walk never reached the second primary", chunk)
		}
		if most := 2*len(sm.addrs) + 1; walks > most {
			t.Errorf("slots dealt %d at a time: one move cost %d node walks, want at most %d", chunk, walks, most)
		}
		if len(seen) != Slots {
			t.Errorf("slots dealt %d at a time: %d of %d keys returned", chunk, len(seen), Slots)
		}
	}
}
