package commands

import (
	"errors"
	"strings"
	"testing"
)

// argv turns "SET k v" into [][]byte. A lone "”" stands for an empty argument.
func argv(s string) [][]byte {
	var out [][]byte
	for _, f := range strings.Fields(s) {
		if f == "''" {
			f = ""
		}
		out = append(out, []byte(f))
	}
	return out
}

func TestBuiltinIsGenerated(t *testing.T) {
	b := Builtin()
	if b.Len() < 200 {
		t.Fatalf("builtin table has %d commands; generated data missing?", b.Len())
	}
	if b != Builtin() {
		t.Fatal("Builtin must return the same shared table")
	}
	if !strings.HasPrefix(BuiltinRedisVersion, "7.") {
		t.Fatalf("builtin generated from Redis %q, want 7.x", BuiltinRedisVersion)
	}
}

func TestLookupCaseInsensitive(t *testing.T) {
	tab := Builtin()
	for _, in := range []string{"get k", "GET k", "gEt k", "GeT"} {
		c := tab.Lookup(argv(in))
		if c == nil || c.Name != "get" {
			t.Errorf("Lookup(%q) = %v, want get", in, c)
		}
	}
	for _, in := range []string{"", "nosuchcommand", "ge", "gett", "get|x"} {
		if c := tab.Lookup(argv(in)); c != nil {
			t.Errorf("Lookup(%q) = %q, want nil", in, c.Name)
		}
	}
	if c := tab.Lookup([][]byte{[]byte("get\x00")}); c != nil {
		t.Errorf("NUL-suffixed name matched %q", c.Name)
	}
	var nilTable *Table
	if nilTable.Lookup(argv("get k")) != nil {
		t.Error("nil table must find nothing")
	}
}

func TestLookupSubcommands(t *testing.T) {
	tab := Builtin()
	cases := []struct{ in, want string }{
		{"CLIENT SETNAME foo", "client|setname"},
		{"client setname foo", "client|setname"},
		{"Client SetName foo", "client|setname"},
		{"CONFIG GET maxmemory", "config|get"},
		{"config set maxmemory 1", "config|set"},
		{"SCRIPT LOAD return", "script|load"},
		{"OBJECT ENCODING k", "object|encoding"},
		{"client kill id 1", "client|kill"},
		// Container alone or with an unknown subcommand: the container, so the
		// proxy can forward and let Redis answer with its own error.
		{"CLIENT", "client"},
		{"CLIENT NOSUCH", "client"},
		// Commands without subcommands ignore args[1].
		{"GET setname", "get"},
	}
	for _, tc := range cases {
		c := tab.Lookup(argv(tc.in))
		if c == nil || c.Name != tc.want {
			t.Errorf("Lookup(%q) = %v, want %s", tc.in, c, tc.want)
			continue
		}
		if strings.Contains(tc.want, "|") && c.Parent == nil {
			t.Errorf("%s has no Parent", c.Name)
		}
	}
	if c := tab.Lookup(argv("client")); c.Subcommands["setname"] == nil {
		t.Error("client container lacks Subcommands[setname]")
	}
}

func TestGet(t *testing.T) {
	tab := Builtin()
	for in, want := range map[string]string{
		"GET": "get", "client|setname": "client|setname", "CLIENT SETNAME": "client|setname",
	} {
		if c := tab.Get(in); c == nil || c.Name != want {
			t.Errorf("Get(%q) = %v, want %s", in, c, want)
		}
	}
	if tab.Get("client|nosuch") != nil || tab.Get("nosuch") != nil {
		t.Error("Get must return nil for unknown names")
	}
}

func TestFlags(t *testing.T) {
	tab := Builtin()
	cases := []struct {
		cmd       string
		has, lack Flags
	}{
		{"get k", ReadOnly | Fast | CatRead, Write | ConnState},
		{"set k v", Write | Denyoom | CatWrite, ReadOnly},
		{"del k", Write | CatKeyspace, ReadOnly},
		{"subscribe ch", PubSub | CatPubSub | ConnState, Write},
		{"publish ch m", PubSub | CatPubSub, ConnState},
		{"multi", CatTransaction | ConnState | NoScript, Write},
		{"exec", CatTransaction | ConnState, 0},
		{"watch k", CatTransaction | ConnState, 0},
		{"select 1", CatConnection | ConnState, Write},
		{"client setname x", CatConnection | ConnState, Admin},
		{"client tracking on", ConnState, 0},
		{"client list", Admin, ConnState},
		{"hello 3", NoAuth | ConnState, 0},
		{"auth p", NoAuth | ConnState, 0},
		{"flushall", Write | CatDangerous, 0},
		{"keys *", ReadOnly | CatDangerous | CatKeyspace, 0},
		{"eval s 0", NoScript | MovableKeys | CatScripting, 0},
		{"blpop k 0", Write | Blocking | CatBlocking, 0},
		{"randomkey", ReadOnly | Nondeterministic, 0},
		{"smembers k", ReadOnly | NondeterministicOrder, Nondeterministic},
		{"spop k", Write | Nondeterministic, 0},
		{"ping", Fast, Write | ReadOnly},
	}
	for _, tc := range cases {
		c := tab.Lookup(argv(tc.cmd))
		if c == nil {
			t.Errorf("%q: unknown", tc.cmd)
			continue
		}
		if !c.Is(tc.has) {
			t.Errorf("%q: flags %v, want all of %v", tc.cmd, c.Flags, tc.has)
		}
		if tc.lack != 0 && c.Flags&tc.lack != 0 {
			t.Errorf("%q: flags %v, must have none of %v", tc.cmd, c.Flags, tc.lack)
		}
	}
	var nilCmd *Command
	if nilCmd.Is(0) || nilCmd.Is(Write) {
		t.Error("nil command must have no flags")
	}
}

func TestFlagsString(t *testing.T) {
	if got := (Write | CatSlow).String(); got != "Write | CatSlow" {
		t.Errorf("String = %q", got)
	}
	if got := Flags(0).String(); got != "0" {
		t.Errorf("String(0) = %q", got)
	}
	if got := (Write | 1<<63).String(); got != "Write | Flags(0x8000000000000000)" {
		t.Errorf("String with unnamed bit = %q", got)
	}
}

func TestArityOK(t *testing.T) {
	tab := Builtin()
	cases := []struct {
		cmd  string
		n    int
		want bool
	}{
		{"get", 2, true}, {"get", 1, false}, {"get", 3, false},
		{"set", 3, true}, {"set", 2, false}, {"set", 7, true},
		{"client setname", 3, true}, {"client setname", 2, false}, {"client setname", 4, false},
		{"config get", 3, true}, {"config get", 5, true}, {"config get", 2, false},
	}
	for _, tc := range cases {
		c := tab.Get(tc.cmd)
		if got := c.ArityOK(tc.n); got != tc.want {
			t.Errorf("%s (arity %d).ArityOK(%d) = %v, want %v", tc.cmd, c.Arity, tc.n, got, tc.want)
		}
	}
	var nilCmd *Command
	if nilCmd.ArityOK(1) {
		t.Error("nil command must reject every arity")
	}
}

func TestIsBlocking(t *testing.T) {
	tab := Builtin()
	cases := []struct {
		cmd  string
		want bool
	}{
		{"BLPOP a b 0", true},
		{"brpop a 1.5", true},
		{"BLMOVE a b LEFT RIGHT 0", true},
		{"BRPOPLPUSH a b 0", true},
		{"BLMPOP 0 2 a b LEFT", true},
		{"BZPOPMIN a 0", true},
		{"BZPOPMAX a 0", true},
		{"BZMPOP 0 1 a MIN", true},
		{"WAIT 1 0", true},
		{"XREAD STREAMS a 0", false},
		{"XREAD COUNT 10 STREAMS a 0", false},
		{"XREAD BLOCK 0 STREAMS a $", true},
		{"xread count 1 block 100 streams a $", true},
		{"XREAD COUNT 1 bLoCk 5 STREAMS a $", true},
		{"XREAD STREAMS block 0", false},         // a stream key named "block"
		{"XREAD COUNT block STREAMS a 0", false}, // malformed count value named "block"
		{"XREADGROUP GROUP g c STREAMS a >", false},
		{"XREADGROUP GROUP g c BLOCK 10 STREAMS a >", true},
		{"XREADGROUP GROUP block c STREAMS a >", false}, // group named "block"
		{"XREADGROUP GROUP g block NOACK STREAMS a >", false},
		{"XREADGROUP GROUP g c NOACK BLOCK 0 STREAMS a >", true},
		{"GET k", false},
		{"LPOP k", false},
		{"LMPOP 1 a LEFT", false},
		{"SUBSCRIBE ch", false},
	}
	for _, tc := range cases {
		args := argv(tc.cmd)
		c := tab.Lookup(args)
		if c == nil {
			t.Errorf("%q: unknown", tc.cmd)
			continue
		}
		if got := c.IsBlocking(args); got != tc.want {
			t.Errorf("IsBlocking(%q) = %v, want %v", tc.cmd, got, tc.want)
		}
	}
	var nilCmd *Command
	if nilCmd.IsBlocking(argv("BLPOP a 0")) {
		t.Error("nil command must not block")
	}
}

func TestParseRejectsMalformed(t *testing.T) {
	bad := []any{
		"COMMAND",
		[]any{"not an entry"},
		[]any{[]any{"get", int64(2)}}, // too short
		[]any{[]any{int64(1), int64(2), []any{}, int64(1), int64(1), int64(1)}}, // name not a string
		[]any{[]any{"get", "x", []any{}, int64(1), int64(1), int64(1)}},         // arity not a number
		[]any{[]any{"get", int64(2), []any{}, int64(1), int64(1), int64(1), []any{}, []any{},
			[]any{[]any{"flags", []any{}, "begin_search"}}}}, // odd pair array
		[]any{[]any{"get", int64(2), []any{}, int64(1), int64(1), int64(1), []any{}, []any{},
			[]any{map[any]any{"flags": []any{}, "begin_search": map[any]any{"type": "index", "spec": map[any]any{}},
				"find_keys": map[any]any{"type": "range", "spec": map[any]any{}}}}}}, // index missing
	}
	for i, r := range bad {
		if _, err := Parse(r); !errors.Is(err, ErrBadReply) {
			t.Errorf("case %d: err = %v, want ErrBadReply", i, err)
		}
	}
}

// TestParseLegacyReply feeds the entry shape of Redis 6 (no key specs) and
// checks that legacy positions work and that Load-style merging gives
// movable-key commands their specs back.
func TestParseLegacyReply(t *testing.T) {
	reply := []any{
		[]any{"mset", int64(-3), []any{"write", "denyoom"}, int64(1), int64(-1), int64(2), []any{"@write", "@string", "@slow"}},
		[]any{"eval", int64(-3), []any{"noscript", "movablekeys"}, int64(0), int64(0), int64(0), []any{"@slow", "@scripting"}},
		nil, // COMMAND INFO of an unknown name
	}
	cmds, err := Parse(reply)
	if err != nil {
		t.Fatal(err)
	}
	tab := newTable(cmds)
	if got := tab.Get("mset").Keys(argv("MSET a 1 b 2 c 3"), nil); !equalInts(got, []int{1, 3, 5}) {
		t.Errorf("legacy MSET keys = %v", got)
	}
	if got := tab.Get("eval").Keys(argv("EVAL s 1 k"), nil); len(got) != 0 {
		t.Errorf("legacy EVAL without specs must not guess keys, got %v", got)
	}
	if !tab.Get("mset").Is(Write | Denyoom | CatWrite | CatSlow) {
		t.Errorf("mset flags = %v", tab.Get("mset").Flags)
	}

	cmds, _ = Parse(reply)
	fillMissingSpecs(cmds, Builtin())
	tab = newTable(cmds)
	if got := tab.Get("eval").Keys(argv("EVAL s 2 k1 k2 a"), nil); !equalInts(got, []int{3, 4}) {
		t.Errorf("merged EVAL keys = %v, want [3 4]", got)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
