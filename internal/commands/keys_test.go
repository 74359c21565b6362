package commands

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// keyCase is one call and the key indices Keys must report. valid marks calls
// Redis accepts as written, which TestKeysMatchRedis cross-checks against
// COMMAND GETKEYS on a real server.
type keyCase struct {
	cmd   string
	want  []int
	valid bool
}

var keyCases = []keyCase{
	// Fixed positions.
	{"GET k", []int{1}, true},
	{"SET k v EX 10 NX", []int{1}, true},
	{"DEL a b c", []int{1, 2, 3}, true},
	{"MSET a 1 b 2 c 3", []int{1, 3, 5}, true},
	{"MSET a 1 b", []int{1, 3}, false},
	{"MGET a b", []int{1, 2}, true},
	{"RENAME a b", []int{1, 2}, true},
	{"LMOVE a b LEFT RIGHT", []int{1, 2}, true},
	{"COPY a b DB 1 REPLACE", []int{1, 2}, true},
	{"BITOP AND d a b", []int{2, 3, 4}, true},
	{"GEOSEARCHSTORE d src FROMMEMBER m BYRADIUS 1 km", []int{1, 2}, true},
	{"OBJECT ENCODING k", []int{2}, true},
	{"object freq k", []int{2}, true},
	{"OBJECT HELP", nil, false},
	{"MEMORY USAGE k SAMPLES 5", []int{2}, true},
	{"PING", nil, false},
	{"GET", nil, false},
	{"SUBSCRIBE ch", nil, false},
	// Shard channels are hashed like keys but are not keys.
	{"SSUBSCRIBE ch", nil, false},
	{"SPUBLISH ch m", nil, false},

	// Scripts and functions: numkeys.
	{"EVAL s 2 a b x y", []int{3, 4}, true},
	{"EVAL s 0", nil, false},
	{"EVAL s 0 x", nil, false},
	{"eval s 5 a", []int{3}, false},
	{"EVAL s -1 a", nil, false},
	{"EVAL s abc a", nil, false},
	{"EVAL s 99999999999999999999999 a", []int{3}, false},
	{"EVAL s", nil, false},
	{"EVALSHA sha 1 a x", []int{3}, true},
	{"EVAL_RO s 2 a b", []int{3, 4}, true},
	{"EVALSHA_RO sha 1 a", []int{3}, true},
	{"FCALL f 2 a b x", []int{3, 4}, true},
	{"FCALL_RO f 1 a", []int{3}, true},

	// Streams: keys after STREAMS, half of the rest.
	{"XREAD STREAMS a 0", []int{2}, true},
	{"XREAD COUNT 2 STREAMS a b 0 0", []int{4, 5}, true},
	{"xread block 0 streams a $", []int{4}, true},
	{"XREAD COUNT 2 STREAMS a b c 0 0 0", []int{4, 5, 6}, true},
	{"XREAD STREAMS a b 0", []int{2}, false},
	{"XREAD COUNT 2", nil, false},
	{"XREAD COUNT 2 STREAMS", nil, false},
	{"XREADGROUP GROUP g c STREAMS a >", []int{5}, true},
	{"XREADGROUP GROUP g c COUNT 1 BLOCK 5 NOACK STREAMS a b > >", []int{10, 11}, true},
	{"XREADGROUP GROUP streams c STREAMS a >", []int{5}, true}, // group named "streams"

	// Sorted-set and set algebra: numkeys, some with a destination.
	{"ZUNION 2 a b WEIGHTS 1 2", []int{2, 3}, true},
	{"ZUNIONSTORE d 2 a b", []int{1, 3, 4}, true},
	{"ZINTER 1 a", []int{2}, true},
	{"ZINTERSTORE d 2 a b AGGREGATE MAX", []int{1, 3, 4}, true},
	{"ZDIFF 2 a b WITHSCORES", []int{2, 3}, true},
	{"ZDIFFSTORE d 2 a b", []int{1, 3, 4}, true},
	{"ZDIFFSTORE d 3 a b", []int{1, 3, 4}, false},
	{"SINTERCARD 2 a b LIMIT 1", []int{2, 3}, true},
	{"ZINTERCARD 2 a b", []int{2, 3}, true},
	{"LMPOP 2 a b LEFT COUNT 3", []int{2, 3}, true},
	{"BLMPOP 0 2 a b LEFT", []int{3, 4}, true},
	{"ZMPOP 1 a MIN", []int{2}, true},
	{"BZMPOP 1.5 2 a b MAX COUNT 2", []int{3, 4}, true},
	{"LMPOP x a LEFT", nil, false},

	// SORT: the STORE destination is not described by Redis's key specs.
	{"SORT k", []int{1}, true},
	{"SORT k BY w GET # STORE d", []int{1, 7}, true},
	{"sort k limit 0 10 store d", []int{1, 6}, true},
	{"SORT k BY store", []int{1}, true},
	{"SORT k GET store DESC", []int{1}, true},
	{"SORT k STORE a STORE b", []int{1, 5}, true},
	{"SORT k STORE", []int{1}, false},
	{"SORT_RO k BY w GET #", []int{1}, true},

	// MIGRATE: single key, or the KEYS form with an empty key argument.
	{"MIGRATE h 1 k 0 5000", []int{3}, true},
	{"MIGRATE h 1 k 0 5000 COPY REPLACE", []int{3}, true},
	{"MIGRATE h 1 '' 0 5000 COPY REPLACE KEYS a b", []int{9, 10}, true},
	{"migrate h 1 '' 0 5000 keys a", []int{7}, true},
	{"MIGRATE h 1 '' 0 5000 AUTH keys KEYS a", []int{9}, true},
	{"MIGRATE h 1 '' 0 5000 AUTH2 u keys KEYS a b", []int{10, 11}, true},
	{"MIGRATE h 1 '' 0 5000", []int{3}, true},
	{"MIGRATE h 1", nil, false},

	// GEORADIUS STORE/STOREDIST destinations after the fixed arguments.
	{"GEORADIUS k 0 0 10 km", []int{1}, true},
	{"GEORADIUS k 0 0 10 km STORE d", []int{1, 7}, true},
	{"georadius k 0 0 10 km count 5 storedist d", []int{1, 9}, true},
	{"GEORADIUS k 0 0 10 km STORE", []int{1}, false},
	{"GEORADIUSBYMEMBER k m 10 km STORE d", []int{1, 6}, true},
	{"GEORADIUSBYMEMBER k m 10 km WITHDIST", []int{1}, true},
	{"GEORADIUS_RO k 0 0 10 km", []int{1}, true},
	// Repeated: Redis writes only the last (COMMAND GETKEYS names it
	// alone); every one is named, so none escapes a namespace or the ACL.
	{"GEORADIUS k 0 0 10 km STORE x STORE y", []int{1, 7, 9}, false},
	{"GEORADIUSBYMEMBER k m 10 km STORE x STOREDIST y STORE z", []int{1, 6, 8, 10}, false},
}

func TestKeys(t *testing.T) {
	tab := Builtin()
	for _, tc := range keyCases {
		args := argv(tc.cmd)
		c := tab.Lookup(args)
		if c == nil {
			t.Errorf("%q: unknown command", tc.cmd)
			continue
		}
		got := c.Keys(args, nil)
		if !equalInts(got, tc.want) {
			t.Errorf("Keys(%q) = %v, want %v", tc.cmd, got, tc.want)
		}
	}
}

func TestKeysAppends(t *testing.T) {
	c := Builtin().Get("mget")
	dst := make([]int, 1, 8)
	dst[0] = 42
	got := c.Keys(argv("MGET a b"), dst)
	if !equalInts(got, []int{42, 1, 2}) {
		t.Fatalf("Keys must append to dst, got %v", got)
	}
	var nilCmd *Command
	if got := nilCmd.Keys(argv("GET a"), dst[:1]); !equalInts(got, []int{42}) {
		t.Fatalf("nil command must return dst unchanged, got %v", got)
	}
}

// TestKeySpecInterpreter exercises spec shapes no Redis 7.0 command uses, so
// that commands described by newer servers or modules work too.
func TestKeySpecInterpreter(t *testing.T) {
	cases := []struct {
		spec KeySpec
		cmd  string
		want []int
	}{
		// Keynum with a key step (key/value pairs counted as keys).
		{KeySpec{Begin: BeginSearch{Kind: BeginIndex, Index: 1}, Find: FindKeys{Kind: FindKeynum, KeyNumIdx: 0, FirstKey: 1, KeyStep: 2}},
			"X 2 k1 v1 k2 v2", []int{2, 4}},
		// Keyword searched backwards from the end.
		{KeySpec{Begin: BeginSearch{Kind: BeginKeyword, Keyword: "KEYS", StartFrom: -2}, Find: FindKeys{Kind: FindRange, LastKey: -1, KeyStep: 1}},
			"X keys a KEYS b c", []int{4, 5}},
		// Keyword at the very end cannot introduce a key.
		{KeySpec{Begin: BeginSearch{Kind: BeginKeyword, Keyword: "TO", StartFrom: 1}, Find: FindKeys{Kind: FindRange, LastKey: 0, KeyStep: 1}},
			"X a TO", nil},
		// Range with a positive last key beyond the arguments is clipped.
		{KeySpec{Begin: BeginSearch{Kind: BeginIndex, Index: 1}, Find: FindKeys{Kind: FindRange, LastKey: 5, KeyStep: 1}},
			"X a b", []int{1, 2}},
		// A zero key step from a broken reply must not loop forever.
		{KeySpec{Begin: BeginSearch{Kind: BeginIndex, Index: 1}, Find: FindKeys{Kind: FindRange, LastKey: -1, KeyStep: 0}},
			"X a b", []int{1, 2}},
		// Index 0 is the command name, never a key.
		{KeySpec{Begin: BeginSearch{Kind: BeginIndex, Index: 0}, Find: FindKeys{Kind: FindRange, LastKey: 0, KeyStep: 1}},
			"X a", nil},
		// Unknown parts contribute nothing.
		{KeySpec{Begin: BeginSearch{Kind: BeginIndex, Index: 1}}, "X a", nil},
		{KeySpec{Find: FindKeys{Kind: FindRange, KeyStep: 1}}, "X a", nil},
	}
	for i, tc := range cases {
		c := &Command{Name: "x", Arity: -1, KeySpecs: []KeySpec{tc.spec}}
		if got := c.Keys(argv(tc.cmd), nil); !equalInts(got, tc.want) {
			t.Errorf("case %d Keys(%q) = %v, want %v", i, tc.cmd, got, tc.want)
		}
	}
}

func TestLegacyKeys(t *testing.T) {
	cases := []struct {
		first, last, step int
		cmd               string
		want              []int
	}{
		{1, 1, 1, "X a b", []int{1}},
		{1, -1, 1, "X a b c", []int{1, 2, 3}},
		{1, -2, 1, "X a b c", []int{1, 2}},
		{1, -1, 2, "X a 1 b 2", []int{1, 3}},
		{2, 5, 1, "X a b", []int{2}},
		{0, 0, 0, "X a b", nil},
		{1, -1, 0, "X a b", []int{1, 2}},
	}
	for _, tc := range cases {
		c := &Command{Name: "x", Arity: -1, FirstKey: tc.first, LastKey: tc.last, KeyStep: tc.step}
		if got := c.Keys(argv(tc.cmd), nil); !equalInts(got, tc.want) {
			t.Errorf("legacy (%d,%d,%d) Keys(%q) = %v, want %v", tc.first, tc.last, tc.step, tc.cmd, got, tc.want)
		}
	}
}

// allCommands lists every command and subcommand of a table.
func allCommands(t *Table) []*Command {
	var out []*Command
	for _, c := range t.cmds {
		out = append(out, c)
		for _, s := range c.Subcommands {
			out = append(out, s)
		}
	}
	return out
}

// FuzzKeys throws arbitrary arguments at every command: Keys, IsBlocking,
// ArityOK and Lookup must never panic and every key index must be in range.
func FuzzKeys(f *testing.F) {
	for _, tc := range keyCases {
		f.Add(uint16(0), tc.cmd)
	}
	f.Add(uint16(7), "1 2 3")
	f.Add(uint16(100), "STREAMS STREAMS STREAMS")
	f.Add(uint16(200), "-5 a b")
	f.Add(uint16(42), "99999999999999999999 KEYS STORE")

	tab := Builtin()
	all := allCommands(tab)
	dst := make([]int, 0, 64)
	f.Fuzz(func(t *testing.T, pick uint16, rest string) {
		split := argv(rest)
		check := func(c *Command, args [][]byte) {
			keys := c.Keys(args, dst[:0])
			for _, k := range keys {
				if k < 1 || k >= len(args) {
					t.Fatalf("%s: key index %d out of range for %d args %q", c.Name, k, len(args), args)
				}
			}
			_ = c.IsBlocking(args)
			_ = c.ArityOK(len(args))
		}
		// The fuzzed text as a whole call, resolved like client traffic.
		if c := tab.Lookup(split); c != nil {
			check(c, split)
		}
		// The fuzzed text as the arguments of one chosen command.
		c := all[int(pick)%len(all)]
		var args [][]byte
		if c.Parent != nil {
			args = append(args, []byte(c.Parent.Name), []byte(c.Name[len(c.Parent.Name)+1:]))
		} else {
			args = append(args, []byte(c.Name))
		}
		args = append(args, split...)
		if got := tab.Lookup(args); got == nil {
			t.Fatalf("Lookup(%q) = nil", args)
		}
		check(c, args)
	})
}

func ExampleCommand_Keys() {
	args := [][]byte{[]byte("EVAL"), []byte("return 1"), []byte("2"), []byte("a"), []byte("b"), []byte("x")}
	c := Builtin().Lookup(args)
	var buf [8]int
	for _, i := range c.Keys(args, buf[:0]) {
		fmt.Printf("%s ", args[i])
	}
	fmt.Println(c.Is(MovableKeys), c.IsBlocking(args))
	// Output: a b true false
}

func TestSortOptions(t *testing.T) {
	type opt struct {
		o SortOption
		v string
	}
	for _, c := range []struct {
		args string
		want []opt
	}{
		{"SORT k", nil},
		{"SORT k BY store STORE by", []opt{{SortBy, "store"}, {SortStore, "by"}}},
		{"SORT k LIMIT 0 10 GET # get o:* store d1 STORE d2", []opt{{SortGet, "#"}, {SortGet, "o:*"}, {SortStore, "d1"}, {SortStore, "d2"}}},
		{"SORT k LIMIT by get STORE d", []opt{{SortStore, "d"}}}, // LIMIT's values are never options
		{"SORT k ASC ALPHA BY", nil}, // an option with no value names nothing
	} {
		var args [][]byte
		for _, f := range strings.Fields(c.args) {
			args = append(args, []byte(f))
		}
		var got []opt
		for o, i := range SortOptions(args) {
			got = append(got, opt{o, string(args[i])})
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.args, got, c.want)
		}
	}
}

// KeysAtMost finds what Keys finds, cut at n, for every command of the
// table; and on a million-key MGET it stops at n without allocating.
func TestKeysAtMost(t *testing.T) {
	argSets := [][]string{
		{"k1", "k2", "k3", "k4"},
		{"2", "k1", "k2", "STREAMS", "s1", "s2", "0", "0"},
		{"k1", "v", "k2", "v", "STORE", "dst"},
	}
	for _, c := range Builtin().Commands() {
		for _, set := range argSets {
			args := [][]byte{[]byte(c.Name)}
			for _, a := range set {
				args = append(args, []byte(a))
			}
			all := c.Keys(args, nil)
			for n := range 3 {
				got := c.KeysAtMost(args, nil, n)
				want := all[:min(n, len(all))]
				if len(got) < len(want) || !slices.Equal(got[:len(want)], want) || len(got) > n && c.keysProc == procSpecs {
					t.Fatalf("%s %v: KeysAtMost %d = %v, Keys = %v", c.Name, set, n, got, all)
				}
			}
		}
	}
	mget := [][]byte{[]byte("mget")}
	for range 1_000_000 {
		mget = append(mget, []byte("k"))
	}
	cmd := Builtin().Get("mget")
	var buf [2]int
	if allocs := testing.AllocsPerRun(10, func() {
		if keys := cmd.KeysAtMost(mget, buf[:0], 2); len(keys) != 2 {
			t.Fatalf("KeysAtMost 2 of a million-key MGET: %d keys", len(keys))
		}
	}); allocs != 0 {
		t.Fatalf("KeysAtMost allocated %v times", allocs)
	}
}
