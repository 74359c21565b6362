package stampede

import (
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/commands"
)

// A reload that changes the hold rules builds a Protection with holds of
// its own (Succeed with sameRules false). A read held by the old rules
// must still be released by its filler's write through the new one, or by
// its filler's close, not only by its timeout (found by review: a held
// read stalled for the whole hold timeout after a [stampede] reload).
func TestSucceedForwardsToRetiredHolds(t *testing.T) {
	table := commands.Builtin()
	set := table.Get("set")
	oldCfg := Config{Coalesce: true, MaxWaiters: 10, Hold: []HoldRule{{Pattern: "h:*", Timeout: dur(time.Minute)}}}
	newCfg := Config{Coalesce: true, MaxWaiters: 10, Hold: []HoldRule{{Pattern: "x:*", Timeout: dur(time.Second)}}}
	if SameMissRules(oldCfg, newCfg) {
		t.Fatal("SameMissRules: different hold rules compare equal")
	}
	if !SameMissRules(oldCfg, Config{MaxWaiters: 99, Hold: []HoldRule{{Pattern: "h:*", Timeout: dur(time.Minute)}}, EarlyRefresh: []RefreshRule{}}) {
		t.Fatal("SameMissRules: same rules (nil and empty refresh lists) compare different")
	}
	m := NewMetrics(nil)
	for _, how := range []string{"write", "close"} {
		old := New(oldCfg, table, m, nil)
		k := []byte("h:" + how)
		match := old.misses.Match(k)
		if old.misses.Missed(0, k, match, 1, true) != nil {
			t.Fatal("the first miss was held")
		}
		h := old.misses.Missed(0, k, match, 2, true)
		if h == nil {
			t.Fatal("the second miss was not held")
		}
		p := New(newCfg, table, m, nil)
		p.Succeed(old, false)
		if !p.TracksWrites() {
			t.Fatal("the new Protection does not track writes for the old holds")
		}
		var w Writes
		switch how {
		case "write":
			p.WriteStart(&w, 0, set, [][]byte{[]byte("set"), k, []byte("v")})
			w.Done()
		case "close":
			p.ClientClosed(&w, 1)
		}
		select {
		case <-h.done:
		default:
			t.Errorf("after a %s through the Protection that replaced the rules, the old hold still waits", how)
		}
	}
}
