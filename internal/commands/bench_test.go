package commands

import "testing"

// hotCalls is a mix of what a proxy sees: plain reads and writes, mixed-case
// names, subcommands and movable-key commands.
var hotCalls = [][][]byte{
	argv("GET user:1"),
	argv("set user:1 v EX 10"),
	argv("MGET a b c d"),
	argv("MSET a 1 b 2"),
	argv("client SETNAME app"),
	argv("EVALSHA abc 2 a b x"),
	argv("XREADGROUP GROUP g c COUNT 1 BLOCK 5 STREAMS a b > >"),
	argv("ZUNIONSTORE d 2 a b"),
	argv("SORT k BY w STORE d"),
	argv("MIGRATE h 1 '' 0 5000 KEYS a b"),
	argv("georadius k 0 0 10 km STORE d"),
	argv("nosuchcommand x"),
}

// TestHotPathDoesNotAllocate is the hard guarantee behind the benchmark.
func TestHotPathDoesNotAllocate(t *testing.T) {
	tab := Builtin()
	dst := make([]int, 0, 16)
	n := 0
	allocs := testing.AllocsPerRun(100, func() {
		for _, args := range hotCalls {
			c := tab.Lookup(args)
			n += len(c.Keys(args, dst[:0]))
			if c.IsBlocking(args) && c.Is(Write) && c.ArityOK(len(args)) {
				n++
			}
		}
	})
	if allocs != 0 {
		t.Fatalf("Lookup+Keys+IsBlocking allocated %.1f times per run, want 0", allocs)
	}
	if n == 0 {
		t.Fatal("found no keys at all; the loop did not exercise anything")
	}
}

func BenchmarkLookupKeys(b *testing.B) {
	tab := Builtin()
	dst := make([]int, 0, 16)
	b.ReportAllocs()
	b.ResetTimer()
	n := 0
	for i := 0; b.Loop(); i++ {
		args := hotCalls[i%len(hotCalls)]
		c := tab.Lookup(args)
		n += len(c.Keys(args, dst[:0]))
	}
	if n < 0 {
		b.Fatal("unreachable; keeps the result alive")
	}
}

func BenchmarkLookupGet(b *testing.B) {
	tab := Builtin()
	args := argv("GET user:1")
	dst := make([]int, 0, 4)
	b.ReportAllocs()
	for b.Loop() {
		dst = tab.Lookup(args).Keys(args, dst[:0])
	}
}
