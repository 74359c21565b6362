package cluster

import (
	"testing"
	"time"
)

// TestMigratingHold: a slot whose owner answered ASK is migrating from it
// until the map names another owner (the migration ended) or askHold has
// passed since the last ASK; not after a few seconds, while reads on the
// primary meet no ASK for keys not moved yet (found by review: the first
// hold, 10 s, lapsed with the slot still MIGRATING).
func TestMigratingHold(t *testing.T) {
	var r Router
	const slot = 42
	if r.migrating(slot, "a:1") {
		t.Fatal("a slot no node answered ASK for is migrating")
	}
	r.noteAsk(slot, "a:1")
	if !r.migrating(slot, "a:1") {
		t.Fatal("a slot its owner just answered ASK for is not migrating")
	}
	if r.migrating(slot, "b:2") {
		t.Fatal("the ASK of the slot's old owner holds the reads of its new owner")
	}
	if r.migrating(slot+1, "a:1") {
		t.Fatal("another slot of the same node is migrating")
	}
	r.asks[slot].Load().at -= int64(time.Minute) // a minute without an ASK
	if !r.migrating(slot, "a:1") {
		t.Fatal("the hold lapsed a minute after the last ASK")
	}
	r.asks[slot].Load().at -= int64(askHold)
	if r.migrating(slot, "a:1") {
		t.Fatal("the hold outlasted askHold without an ASK")
	}
}
