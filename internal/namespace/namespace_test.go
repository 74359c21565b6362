package namespace

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/redproxy/redproxy/internal/commands"
)

func words(s string) [][]byte {
	var out [][]byte
	for _, w := range strings.Fields(s) {
		if w == `""` {
			w = ""
		}
		out = append(out, []byte(w))
	}
	return out
}

func join(args [][]byte) string {
	var parts []string
	for _, a := range args {
		parts = append(parts, string(a))
	}
	return strings.Join(parts, " ")
}

func TestNewRefusesPrefixesThatCannotConfine(t *testing.T) {
	for _, p := range []string{"", "a*", "a?", "a[b]", `a\`, "{t}:", "a b", "a\n", strings.Repeat("x", 65)} {
		if _, err := New(p); !errors.Is(err, ErrBadPrefix) {
			t.Errorf("New(%q): %v, want ErrBadPrefix", p, err)
		}
	}
	if _, err := New("test-run-42:"); err != nil {
		t.Fatal(err)
	}
}

func TestRewrite(t *testing.T) {
	ns, _ := New("t:")
	w := NewRewriter(ns)
	table := commands.Builtin()
	for _, c := range []struct {
		in, out string
		strip   Strip
	}{
		{"GET k", "GET t:k", StripNone},
		{"MSET a 1 b 2", "MSET t:a 1 t:b 2", StripNone},
		{"EVAL s 2 k1 k2 arg", "EVAL s 2 t:k1 t:k2 arg", StripNone},
		{"FCALL f 1 k arg", "FCALL f 1 t:k arg", StripNone},
		{"SORT l BY w_* GET # GET n_* LIMIT 0 5 STORE dst", "SORT t:l BY t:w_* GET # GET t:n_* LIMIT 0 5 STORE t:dst", StripNone},
		{"SORT_RO l BY nosort", "SORT_RO t:l BY t:nosort", StripNone},
		{"MIGRATE h 1 \"\" 0 100 AUTH keys KEYS a b", "MIGRATE h 1  0 100 AUTH keys KEYS t:a t:b", StripNone},
		{"OBJECT ENCODING k", "OBJECT ENCODING t:k", StripNone},
		{"XREAD COUNT 2 STREAMS s1 s2 0 0", "XREAD COUNT 2 STREAMS t:s1 t:s2 0 0", StripStreams},
		{"XREADGROUP GROUP g c STREAMS s >", "XREADGROUP GROUP g c STREAMS t:s >", StripStreams},
		{"GEORADIUS g 1 2 3 km STORE d STOREDIST e", "GEORADIUS t:g 1 2 3 km STORE t:d STOREDIST t:e", StripNone},
		{"SCAN 0", "SCAN 0 MATCH t:*", StripScan},
		{"SCAN 0 MATCH u:* COUNT 10", "SCAN 0 MATCH t:u:* COUNT 10", StripScan},
		{"KEYS u*", "KEYS t:u*", StripKeys},
		{"BLPOP a b 0", "BLPOP t:a t:b 0", StripFirst},
		{"LMPOP 2 a b LEFT", "LMPOP 2 t:a t:b LEFT", StripFirst},
		{"PUBLISH ch m", "PUBLISH t:ch m", StripNone},
		{"PUBLISH __keyevent@0__:set k", "PUBLISH t:__keyevent@0__:set k", StripNone},
		{"SUBSCRIBE a __keyspace@0__:k __keyevent@0__:del", "SUBSCRIBE t:a __keyspace@0__:t:k __keyevent@0__:del", StripNone},
		{"PSUBSCRIBE n* __keyspace@0__:*", "PSUBSCRIBE t:n* __keyspace@0__:t:*", StripNone},
		{"PUNSUBSCRIBE __keyspace@*__:*", "PUNSUBSCRIBE t:__keyspace@*__:*", StripNone},
		{"PUBSUB CHANNELS", "PUBSUB CHANNELS t:*", StripChannels},
		{"PUBSUB NUMSUB a b", "PUBSUB NUMSUB t:a t:b", StripPairs},
		{"PING", "PING", StripNone},
		{"SELECT 1", "SELECT 1", StripNone},
		{"MOVE k 1", "MOVE t:k 1", StripNone},
		{"COPY a b DB 1", "COPY t:a t:b DB 1", StripNone},
	} {
		w.Reset()
		out, res := w.Rewrite(table.Lookup(words(c.in)), words(c.in))
		if res.Action != Forward || join(out) != c.out || res.Strip != c.strip {
			t.Errorf("%s: %q %+v, want %q strip %d", c.in, join(out), res, c.out, c.strip)
		}
	}
	// A keyspace pattern must name its database: "*" there also matches
	// "0__:b:x", and "[__:]" hides the first "__:" in a character class
	// (both heard other namespaces' keys, found by review). CONFIG GET
	// showed requirepass.
	for _, in := range []string{"PSUBSCRIBE __keyspace@*__:*", "PSUBSCRIBE a __keyspace@0[__:]*", "PUBSUB CHANNELS __keyspace@?__:*", "CONFIG GET requirepass",
		"FLUSHALL", "SWAPDB 0 1", "CONFIG SET x y", "CLUSTER INFO", "DEBUG SLEEP 0", "MONITOR", "DBSIZE", "FUNCTION LOAD x", "CLIENT TRACKING ON"} {
		_, res := w.Rewrite(table.Lookup(words(in)), words(in))
		if res.Action != Refuse || !strings.Contains(res.Err, "not allowed in a namespace") {
			t.Errorf("%s: %+v, want a refusal", in, res)
		}
	}
	// The reason says what the client would get: invalidations naming the
	// keys as Redis knows them, prefix and all (it said "unprefixed",
	// found by a probe).
	if _, res := w.Rewrite(table.Lookup(words("CLIENT TRACKING ON")), words("CLIENT TRACKING ON")); !strings.Contains(res.Err, "prefixed key names") || strings.Contains(res.Err, "unprefixed") {
		t.Errorf("CLIENT TRACKING ON refused with %q", res.Err)
	}
	if _, res := w.Rewrite(nil, words("JSON.SET k $ 1")); res.Action != Refuse || !strings.Contains(res.Err, "unknown command 'JSON.SET'") {
		t.Errorf("a command the table does not know: %+v, want a refusal", res)
	}
	for in, want := range map[string]Action{"FLUSHDB": FlushDB, "FLUSHDB ASYNC": FlushDB, "RANDOMKEY": RandomKey} {
		if _, res := w.Rewrite(table.Lookup(words(in)), words(in)); res.Action != want {
			t.Errorf("%s: %+v, want action %d", in, res, want)
		}
	}
}

// Rewritten arguments handed out earlier in a batch stay intact while the
// arena moves on to new chunks.
func TestRewriteArenaKeepsEarlierResults(t *testing.T) {
	ns, _ := New("t:")
	w := NewRewriter(ns)
	table := commands.Builtin()
	var outs [][][]byte
	big := strings.Repeat("v", chunkSize)
	for i := range 50 {
		in := words("SET k" + strings.Repeat("x", i) + " " + big)
		out, _ := w.Rewrite(table.Lookup(in), in)
		outs = append(outs, out)
		_ = w.Encode(out)
	}
	for i, out := range outs {
		if want := "t:k" + strings.Repeat("x", i); string(out[1]) != want || len(out[2]) != len(big) {
			t.Fatalf("result %d now %q, want key %q", i, out[1], want)
		}
	}
}

func TestStripReply(t *testing.T) {
	ns, _ := New("t:")
	for _, c := range []struct {
		kind    Strip
		in, out string
	}{
		{StripBulk, "$3\r\nt:k\r\n", "$1\r\nk\r\n"},
		{StripBulk, "$-1\r\n", "$-1\r\n"},
		{StripBulk, "_\r\n", "_\r\n"},
		{StripKeys, "*2\r\n$3\r\nt:a\r\n$4\r\nt:bc\r\n", "*2\r\n$1\r\na\r\n$2\r\nbc\r\n"},
		{StripScan, "*2\r\n$2\r\n17\r\n*1\r\n$3\r\nt:a\r\n", "*2\r\n$2\r\n17\r\n*1\r\n$1\r\na\r\n"},
		{StripFirst, "*2\r\n$3\r\nt:q\r\n$3\r\njob\r\n", "*2\r\n$1\r\nq\r\n$3\r\njob\r\n"},
		{StripFirst, "*-1\r\n", "*-1\r\n"},
		{StripFirst, "*2\r\n$3\r\nt:l\r\n*1\r\n$1\r\nx\r\n", "*2\r\n$1\r\nl\r\n*1\r\n$1\r\nx\r\n"},
		{StripStreams, "*1\r\n*2\r\n$3\r\nt:s\r\n*0\r\n", "*1\r\n*2\r\n$1\r\ns\r\n*0\r\n"},
		{StripStreams, "%1\r\n$3\r\nt:s\r\n*0\r\n", "%1\r\n$1\r\ns\r\n*0\r\n"},
		{StripPairs, "*4\r\n$3\r\nt:a\r\n:1\r\n$3\r\nt:b\r\n:0\r\n", "*4\r\n$1\r\na\r\n:1\r\n$1\r\nb\r\n:0\r\n"},
		{StripChannels, "*1\r\n$18\r\n__keyspace@0__:t:k\r\n", "*1\r\n$16\r\n__keyspace@0__:k\r\n"},
		{StripKeys, "-ERR x\r\n", "-ERR x\r\n"},
		{StripKeys, "*1\r\n$1\r\nz\r\n", "*1\r\n$1\r\nz\r\n"}, // not in the namespace: left as it is
	} {
		if got := string(ns.StripReply(nil, c.kind, []byte(c.in))); got != c.out {
			t.Errorf("strip %d of %q: %q, want %q", c.kind, c.in, got, c.out)
		}
	}
}

// Messages split across reads come out whole and stripped; keyevent
// messages about other namespaces' keys are dropped.
func TestPubSubFilter(t *testing.T) {
	ns, _ := New("t:")
	in := "*3\r\n$9\r\nsubscribe\r\n$4\r\nt:ch\r\n:1\r\n" +
		"*3\r\n$7\r\nmessage\r\n$4\r\nt:ch\r\n$2\r\nhi\r\n" +
		"*4\r\n$8\r\npmessage\r\n$4\r\nt:c*\r\n$4\r\nt:ch\r\n$2\r\nyo\r\n" +
		"*3\r\n$7\r\nmessage\r\n$18\r\n__keyevent@0__:set\r\n$3\r\nu:k\r\n" +
		"*3\r\n$7\r\nmessage\r\n$18\r\n__keyevent@0__:set\r\n$3\r\nt:k\r\n" +
		">3\r\n$7\r\nmessage\r\n$18\r\n__keyspace@0__:t:k\r\n$3\r\nset\r\n" +
		"+PONG\r\n"
	want := "*3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n" +
		"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$2\r\nhi\r\n" +
		"*4\r\n$8\r\npmessage\r\n$2\r\nc*\r\n$2\r\nch\r\n$2\r\nyo\r\n" +
		"*3\r\n$7\r\nmessage\r\n$18\r\n__keyevent@0__:set\r\n$1\r\nk\r\n" +
		">3\r\n$7\r\nmessage\r\n$16\r\n__keyspace@0__:k\r\n$3\r\nset\r\n" +
		"+PONG\r\n"
	for _, step := range []int{1, 3, 7, len(in)} {
		f := NewPubSubFilter(ns, 1<<20)
		var out []byte
		for i := 0; i < len(in); i += step {
			var err error
			if out, err = f.Filter(out, []byte(in[i:min(i+step, len(in))])); err != nil {
				t.Fatal(err)
			}
		}
		if string(out) != want {
			t.Fatalf("reads of %d bytes: %q\nwant %q", step, out, want)
		}
	}
	f := NewPubSubFilter(ns, 16)
	if _, err := f.Filter(nil, bytes.Repeat([]byte("*3\r\n$7\r\nmessage\r\n"), 2)); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("an incomplete frame beyond the limit: %v, want ErrFrameTooLarge", err)
	}
}
