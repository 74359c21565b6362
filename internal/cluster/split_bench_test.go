package cluster

import (
	"bytes"
	"strconv"
	"testing"

	"github.com/redproxy/redproxy/internal/resp"
)

// BenchmarkSplitMGET: an MGET split by slot. Finding each key's group by
// a scan of the groups so far cost a million-key MGET up to 16,384
// comparisons a key (seconds of the proxy's one core, found by a probe).
func BenchmarkSplitMGET(b *testing.B) {
	for _, n := range []int{2, 16, 1000, 100000} {
		args := [][]byte{[]byte("MGET")}
		for i := range n {
			args = append(args, []byte("key:"+strconv.Itoa(i)))
		}
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				bt := &batch{args: args}
				var o op
				bt.split(&o, mergeMGET, 1)
			}
		})
	}
}

// TestSplitGroupsBySlot: every key lands in the sub-command of its slot,
// in order, and pos finds it there, for few keys (groups found by a scan)
// and many (by an index).
func TestSplitGroupsBySlot(t *testing.T) {
	for _, n := range []int{1, 3, 15, 16, 17, 5000} {
		args := [][]byte{[]byte("MGET")}
		for i := range n {
			args = append(args, []byte("k"+strconv.Itoa(i%(n/2+1))))
		}
		bt := &batch{args: args}
		var o op
		bt.split(&o, mergeMGET, 1)
		if len(o.pos) != n {
			t.Fatalf("%d keys: %d positions", n, len(o.pos))
		}
		for k, p := range o.pos {
			s := bt.subs[p[0]]
			if s.slot != Slot(args[k+1]) {
				t.Fatalf("%d keys: key %q (slot %d) in the group of slot %d", n, args[k+1], Slot(args[k+1]), s.slot)
			}
			sent, err := resp.SplitCommand(s.raw, nil)
			if err != nil || p[1]+1 >= len(sent) || !bytes.Equal(sent[p[1]+1], args[k+1]) {
				t.Fatalf("%d keys: key %q is not element %d of its sub-command %q (%v)", n, args[k+1], p[1], s.raw, err)
			}
		}
		for i, s := range bt.subs {
			for j := range i {
				if bt.subs[j].slot == s.slot {
					t.Fatalf("%d keys: slot %d has two sub-commands", n, s.slot)
				}
			}
		}
	}
}
