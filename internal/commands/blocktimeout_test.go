package commands

import (
	"testing"
	"time"
)

func TestBlockTimeout(t *testing.T) {
	tab := Builtin()
	for _, tc := range []struct {
		cmd  string
		want time.Duration
		ok   bool
	}{
		{"BLPOP a b 1.5", 1500 * time.Millisecond, true},
		{"BRPOP a 0", 0, true},
		{"BZPOPMIN z 2", 2 * time.Second, true},
		{"BLMOVE a b LEFT RIGHT 0.25", 250 * time.Millisecond, true},
		{"BRPOPLPUSH a b 3", 3 * time.Second, true},
		{"BLMPOP 4 2 a b LEFT", 4 * time.Second, true},
		{"BZMPOP 0.5 1 z MIN COUNT 2", 500 * time.Millisecond, true},
		{"WAIT 1 250", 250 * time.Millisecond, true},
		{"XREAD COUNT 2 BLOCK 700 STREAMS s $", 700 * time.Millisecond, true},
		{"XREADGROUP GROUP block c BLOCK 0 STREAMS s >", 0, true},
		{"XREAD STREAMS block 0", 0, false},
		{"BLPOP a -1", 0, false},
		{"BLPOP a inf", 0, false},
		{"BLPOP a x", 0, false},
		{"WAIT 1", 0, false},
		{"GET a", 0, false},
	} {
		args := argv(tc.cmd)
		c := tab.Lookup(args)
		if c == nil {
			t.Fatalf("%s: not in the table", tc.cmd)
		}
		if got, ok := c.BlockTimeout(args); got != tc.want || ok != tc.ok {
			t.Errorf("%s: BlockTimeout = %v, %v; want %v, %v", tc.cmd, got, ok, tc.want, tc.ok)
		}
	}
	// WAITAOF is Redis 7.2's, not in the built-in 7.0 table.
	waitaof := &Command{Name: "waitaof"}
	if got, ok := waitaof.BlockTimeout(argv("WAITAOF 1 0 100")); got != 100*time.Millisecond || !ok {
		t.Errorf("WAITAOF 1 0 100: BlockTimeout = %v, %v", got, ok)
	}
}
