package cluster

import "testing"

// buildWithHoles is sm.build with owner -1 meaning a slot no primary
// serves (a map from CLUSTER SLOTS while slots are unassigned).
func (sm *scanModel) buildWithHoles() {
	m := newMap()
	for s, i := range sm.owner {
		if i < 0 {
			continue
		}
		if err := m.assign(s, s, sm.addrs[i]); err != nil {
			panic(err)
		}
	}
	sm.m = m
}

// callWithHoles is sm.call for a model whose slots may be unserved.
func (sm *scanModel) callWithHoles(cursor uint64) (keys []string, next uint64) {
	w, addr, nodeCursor, _ := planScanWalk(sm.m, cursor)
	if addr == "" {
		panic("a served slot was planned as unserved")
	}
	for s, i := range sm.owner {
		k := scanKeys[s]
		if i >= 0 && sm.addrs[i] == addr && scanBucket(addr, k) == nodeCursor && w.keeps([]byte(k)) {
			keys = append(keys, k)
		}
	}
	if nodeCursor+1 < scanPages {
		return keys, w.cursor(nodeCursor + 1)
	}
	return keys, w.next()
}

// Slots that were unserved for a moment while the walk went past them,
// and served again (by the same node, their keys never moved) before the
// scan ended, must still be walked. next() skips unserved slots, so the
// cursor that starts the second primary names its lowest served slot; the
// map change that brings the slots back then restarts the walk with its
// base at that slot, and the slots below it that were unserved are taken
// for walked. Before bases, that change started the whole walk again and
// returned them.
func TestReviewScanWalkSlotsUnservedForAMoment(t *testing.T) {
	sm := newScanModel(3) // 0-5460, 5461-10922, 10923-16383
	seen := map[string]bool{}
	var cursor uint64
	// Walk the first primary to its last page.
	for cursor>>cursorNodeLow != scanPages-1 {
		keys, next := sm.callWithHoles(cursor)
		for _, k := range keys {
			seen[k] = true
		}
		cursor = next
	}
	// The second primary's first slots are unassigned for a moment...
	for s := 5461; s <= 6500; s++ {
		sm.owner[s] = -1
	}
	sm.buildWithHoles()
	restarted := true
	for restarted || cursor&cursorSlotMask == 0 {
		_, _, _, restarted = planScanWalk(sm.m, cursor)
		keys, next := sm.callWithHoles(cursor)
		for _, k := range keys {
			seen[k] = true
		}
		cursor = next
	}
	// ... the first primary's walk ended past them: back with the same node.
	for s := 5461; s <= 6500; s++ {
		sm.owner[s] = 1
	}
	sm.buildWithHoles()
	for calls := 0; cursor != 0; calls++ {
		if calls > 1000 {
			t.Fatal("the walk never ended")
		}
		keys, next := sm.callWithHoles(cursor)
		for _, k := range keys {
			seen[k] = true
		}
		cursor = next
	}
	missed, first := 0, -1
	for s, k := range scanKeys {
		if !seen[k] {
			if first < 0 {
				first = s
			}
			missed++
		}
	}
	if missed > 0 {
		t.Fatalf("%d keys never returned, from slot %d (their slots were unserved for a moment, served again by the same node before the scan's end)", missed, first)
	}
}

// A resharding ahead of the walk, among primaries not yet walked, costs
// nothing: here slot 16383 moves between the fourth and fifth primaries
// after every page while the first three are walked. Found by review: the
// hash covered who serves every slot from the base on, so each such move
// started the node under way again and the scan did not end while the
// moves went on (200 restarts in 200 calls).
func TestReviewScanWalkReshardingAheadOfTheWalkEnds(t *testing.T) {
	sm := newScanModel(5)
	third := sm.m.lowestSlot(sm.addrs[2])
	var cursor uint64
	made := sm.m
	restarts, moves := 0, 0
	seen := map[string]bool{}
	for calls := 0; ; calls++ {
		if calls > 0 && int(cursor&cursorSlotMask) <= third {
			sm.owner[Slots-1] = 3 + calls%2
			sm.build()
			moves++
			if _, _, _, again := planScanWalk(sm.m, cursor); again {
				restarts++
			}
		}
		keys, next, collided := sm.call(cursor, made)
		if collided {
			t.Skip("a hash collision")
		}
		for _, k := range keys {
			seen[k] = true
		}
		if cursor, made = next, sm.m; cursor == 0 {
			break
		}
		if calls > 200 {
			t.Fatalf("no end after %d calls under a resharding ahead of the walk: %d node walks started again", calls, restarts)
		}
	}
	if restarts != 0 || len(seen) != Slots {
		t.Fatalf("%d moves ahead of the walk: %d node walks started again, %d of %d keys returned", moves, restarts, len(seen), Slots)
	}
}
