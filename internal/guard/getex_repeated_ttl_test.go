package guard_test

import (
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
)

// TestGetexRepeatedTTLOption shows that GETEX's TTL is checked against a
// rule's max as Redis applies it: the last of repeated EX/PX/EXAT/PXAT
// options.
//
// What went wrong (found by review): Redis's GETEX takes a repeated TTL
// option and applies the last one, as SET does, but classifyGetex returned
// at the first. GETEX k EX 100 EX 99999999 was checked as EX 100 and set
// the second: a clamped rule was not clamped, and max_action = "refuse"
// did not refuse.
func TestGetexRepeatedTTLOption(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Policy = maxTTLPolicy() })
	db0 := dbClient(t, p.Redis, 0)
	nc := p.Dial(t)
	const week = 7 * 24 * time.Hour

	// Control: a single EX over the max is clamped.
	check(t, "seed", db0.Set(ctx, "s:g", "v", time.Hour).Err())
	roundTrip(t, nc, []string{"GETEX", "s:g", "EX", "99999999"})
	wantTTL(t, db0, "s:g", week)

	got := roundTrip(t, nc, []string{"GETEX", "s:g", "EX", "100", "EX", "99999999"})
	if got[0] != "$v" {
		t.Fatalf("GETEX: %q", got)
	}
	if d := pttl(t, db0, "s:g"); d > week {
		t.Errorf("GETEX s:g EX 100 EX 99999999: PTTL %v, over the max of 7d (rule s:*, clamp)", d)
	}

	check(t, "seed", db0.Set(ctx, "l:g", "v", 30*time.Second).Err())
	got = roundTrip(t, nc, []string{"GETEX", "l:g", "EX", "30", "EX", "99999"})
	if !strings.HasPrefix(got[0], "-ERR redproxy policy: TTL of") {
		t.Errorf("GETEX l:g EX 30 EX 99999 = %q, PTTL now %v: rule l:* refuses TTLs over 1m", got[0], pttl(t, db0, "l:g"))
	}
}
