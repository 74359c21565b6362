package cluster

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// physModel is scanModel with holes and keys that live on a node
// (phys) apart from the map: a slot left unserved keeps its key where
// it was, and a node's SCAN returns every key it holds.
type physModel struct {
	owner [Slots]int // -1: unserved
	phys  [Slots]string
	addrs []string
	m     *Map
}

func newPhysModel(nodes int) *physModel {
	pm := &physModel{}
	for i := range nodes {
		pm.addrs = append(pm.addrs, fmt.Sprintf("10.0.1.%d:6379", i+1))
	}
	for s := range pm.owner {
		pm.owner[s] = s * nodes / Slots
		pm.phys[s] = pm.addrs[pm.owner[s]]
	}
	pm.build()
	return pm
}

func (pm *physModel) build() {
	m := newMap()
	for s, i := range pm.owner {
		if i >= 0 {
			if err := m.assign(s, s, pm.addrs[i]); err != nil {
				panic(err)
			}
		}
	}
	pm.m = m
}

func (pm *physModel) call(cursor uint64, made *Map) (keys []string, next uint64, collided bool) {
	w, addr, nodeCursor, _ := planScanWalk(pm.m, cursor)
	if addr == "" {
		return nil, cursor, false // unserved: the client retries
	}
	if cursor != 0 && made != pm.m {
		base := int(cursor>>cursorBaseLow&cursorBaseMask) * scanBaseStep
		slot := int(cursor & cursorSlotMask)
		stale := fmt.Sprint(scanLabels(made, base, slot)) != fmt.Sprint(scanLabels(pm.m, base, slot))
		collided = stale && cursor>>cursorSlotBits&cursorHashMask == scanHash(pm.m, base, slot)
	}
	for s := range pm.phys {
		k := scanKeys[s]
		if pm.phys[s] == addr && scanBucket(addr, k) == nodeCursor && w.keeps([]byte(k)) {
			keys = append(keys, k)
		}
	}
	if nodeCursor+1 < scanPages {
		return keys, w.cursor(nodeCursor + 1), collided
	}
	return keys, w.next(), collided
}

func (pm *physModel) mutate(r *rand.Rand) {
	from := r.IntN(Slots)
	to := min(Slots, from+1+r.IntN(2000))
	switch r.IntN(5) {
	case 0: // failover
		i := r.IntN(len(pm.addrs))
		old := pm.addrs[i]
		pm.addrs[i] += "'"
		for s := range pm.phys {
			if pm.phys[s] == old {
				pm.phys[s] = pm.addrs[i]
			}
		}
	case 1: // unassign: keys stay
		for s := from; s < to; s++ {
			pm.owner[s] = -1
		}
	case 2: // assign unserved slots back to the node holding their keys
		for s := from; s < to; s++ {
			if pm.owner[s] < 0 {
				for i, a := range pm.addrs {
					if a == pm.phys[s] {
						pm.owner[s] = i
					}
				}
			}
		}
	default: // move
		n := r.IntN(len(pm.addrs))
		for s := from; s < to; s++ {
			pm.owner[s] = n
			pm.phys[s] = pm.addrs[n]
		}
	}
	pm.build()
}

// Review: every key that stays on one node (same address, never moved,
// though its slot may be unserved for a while) is returned, with holes,
// failovers and moves at random between calls.
func TestReview2ScanWalkPhysicalKeys(t *testing.T) {
	collisions, trials, unended := 0, 60, 0
	for trial := range trials {
		r := rand.New(rand.NewPCG(uint64(trial), 11))
		pm := newPhysModel(2 + r.IntN(4))
		start := pm.phys
		seen := map[string]bool{}
		changes, collided := 0, false
		var cursor uint64
		made := pm.m
		ended := false
		for calls := 0; calls < 20000; calls++ {
			if changes < 12 && r.IntN(3) == 0 {
				pm.mutate(r)
				changes++
			}
			if changes >= 12 && r.IntN(2) == 0 {
				// at the end, serve every slot: the key's node if present
				for s := range pm.owner {
					if pm.owner[s] < 0 {
						pm.owner[s] = 0
						for i, a := range pm.addrs {
							if a == pm.phys[s] {
								pm.owner[s] = i
							}
						}
						if pm.addrs[pm.owner[s]] != pm.phys[s] {
							pm.phys[s] = pm.addrs[pm.owner[s]]
						}
					}
				}
				pm.build()
			}
			keys, next, c := pm.call(cursor, made)
			collided = collided || c
			for _, k := range keys {
				seen[k] = true
			}
			if cursor, made = next, pm.m; cursor == 0 {
				ended = true
				break
			}
		}
		if !ended {
			unended++
			continue
		}
		if collided {
			collisions++
			continue
		}
		for s, k := range scanKeys {
			if start[s] == pm.phys[s] && !seen[k] {
				t.Fatalf("trial %d: slot %d's key %s (on %s throughout) never returned (%d changes)", trial, s, k, pm.phys[s], changes)
			}
		}
	}
	t.Logf("%d trials, %d collisions, %d never ended", trials, collisions, unended)
}

// Review: cursors a client makes up fill the map's hash cache, and then
// genuine cursors are hashed on every call (16,384 slots walked twice per
// SCAN: 38ns cached, 72µs uncached on a map of 3 ranges, milliseconds on
// a fragmented one) for as long as the map lasts. Only a base and a slot
// that is a primary's lowest from that base can come from a walk; those
// are few (64 bases per primary), and only they need caching.
func TestReview2ScanHashCacheNotFilledByMadeUpCursors(t *testing.T) {
	sm := newScanModel(3)
	m := sm.m
	for s := 1; s <= 2*scanHashesCached; s++ {
		planScanWalk(m, uint64(s)|1<<cursorNodeLow) // slot s, base 0: not a lowest
	}
	second := m.lowestSlot(sm.addrs[1])
	c := scanWalk{m: m, base: 256, slot: second}.cursor(5)
	planScanWalk(m, c)
	if _, ok := m.scanHashes.Load(uint32(256)<<cursorSlotBits | uint32(second)); !ok {
		t.Fatalf("after %d made-up cursors a genuine cursor's hash is not cached", 2*scanHashesCached)
	}
}
