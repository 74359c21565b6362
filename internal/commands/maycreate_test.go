package commands

import "testing"

// TestMayCreate: the key-spec flags the policy's fallback reads as "this
// command may create or overwrite the key", on Redis's own specs.
func TestMayCreate(t *testing.T) {
	cases := []struct {
		cmd  string
		spec int
		want bool
	}{
		{"hset", 0, true},   // RW|UPDATE
		{"lpush", 0, true},  // RW|INSERT
		{"set", 0, true},    // RW|ACCESS|UPDATE|VARIABLE_FLAGS
		{"copy", 1, true},   // destination OW|UPDATE
		{"copy", 0, false},  // source RO|ACCESS
		{"get", 0, false},   // RO|ACCESS
		{"del", 0, false},   // RM|DELETE
		{"lpop", 0, false},  // RW|ACCESS|DELETE
		{"bitop", 0, true},  // destination OW|UPDATE
		{"bitop", 1, false}, // sources RO
	}
	b := Builtin()
	for _, c := range cases {
		cmd := b.Get(c.cmd)
		if cmd == nil || c.spec >= len(cmd.KeySpecs) {
			t.Fatalf("%s: no spec %d", c.cmd, c.spec)
		}
		s := cmd.KeySpecs[c.spec]
		if got := s.Flags.MayCreate(); got != c.want {
			t.Errorf("%s spec %d (%v): MayCreate = %v, want %v", c.cmd, c.spec, s.Flags, got, c.want)
		}
		if !s.Complete() {
			t.Errorf("%s spec %d: not complete", c.cmd, c.spec)
		}
	}
	// SORT's STORE destination is found only by parsing: incomplete.
	if sort := b.Get("sort"); sort.KeySpecs[2].Complete() {
		t.Error("sort's STORE spec reported complete")
	}
	args := argv("BITOP AND dst a b")
	if got := b.Get("bitop").KeySpecs[1].AppendKeys(args, nil); !equalInts(got, []int{3, 4}) {
		t.Errorf("bitop sources = %v", got)
	}
}
