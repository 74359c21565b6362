package proxy

import (
	"slices"
	"strings"
	"testing"

	"github.com/redproxy/redproxy/internal/commands"
)

// What a queued write keeps for EXEC (txWriteArgs) leaves out long values
// but must name the same keys: the write hooks find them again with
// cmd.Keys, through keywords (SORT ... STORE, XREAD STREAMS), counts
// (EVAL's numkeys) and positions.
func TestTxWriteArgsKeepTheKeys(t *testing.T) {
	table := commands.Builtin()
	big := strings.Repeat("x", 1000)
	bigKey := strings.Repeat("k", 1000)
	for _, args := range [][]string{
		{"SET", "k", big},
		{"SET", bigKey, big, "EX", "10"},
		{"MSET", "a", big, bigKey, big},
		{"EVAL", big, "2", "a", bigKey, big},
		{"FCALL", "f", "1", bigKey, big},
		{"SORT", "src", "BY", "w_*", "GET", big, "STORE", "dst"},
		{"XADD", "s", "*", "f", big},
		{"COPY", "a", bigKey, "DB", "1"},
		{"SWAPDB", "0", "1"},
		{"LMOVE", bigKey, "b", "LEFT", "RIGHT"},
	} {
		t.Run(args[0], func(t *testing.T) {
			raw := make([][]byte, len(args))
			for i, a := range args {
				raw[i] = []byte(a)
			}
			cmd := table.Lookup(raw)
			if cmd == nil {
				t.Fatalf("%s not in the table", args[0])
			}
			kept := txWriteArgs(cmd, raw)
			want, got := cmd.Keys(raw, nil), cmd.Keys(kept, nil)
			if !slices.Equal(want, got) {
				t.Fatalf("keys at %v in what is kept, %v in the command", got, want)
			}
			for _, i := range want {
				if string(kept[i]) != args[i] {
					t.Errorf("key %d kept as %.20q", i, kept[i])
				}
			}
			size := 0
			for i, a := range kept {
				if !slices.Contains(want, i) {
					size += len(a)
				}
			}
			if size > len(args)*maxKeptTxArg {
				t.Errorf("kept %d bytes of arguments that are not keys", size)
			}
			if cmd.Name == "swapdb" && (string(kept[1]) != "0" || string(kept[2]) != "1") {
				t.Errorf("SWAPDB's databases kept as %q %q", kept[1], kept[2])
			}
		})
	}
}
