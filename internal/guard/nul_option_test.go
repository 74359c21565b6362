package guard_test

import (
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
)

// TestNULSuffixedOptionBypassesTTLRules shows that an option word spelled
// with a NUL byte and a suffix ("STORE\x00", "DB\x00", "PERSIST\x00") is
// the option to the policy exactly as it is to Redis.
//
// What went wrong (found by review): Redis reads option words with
// strcasecmp, which stops at the first NUL, so to Redis "STORE\x00" is
// STORE. The policy compared whole arguments (eqFold checked lengths) and
// did not see the option: SORT ... STORE\x00 created a key its rule
// requires a TTL for, with none and no fix-up; COPY ... DB\x00 1 got its
// fix-up sent to an unrelated key of the client's own database while the
// copy in database 1 kept no TTL; GETEX ... PERSIST\x00 removed a TTL the
// policy promises always to refuse removing (doc.go).
func TestNULSuffixedOptionBypassesTTLRules(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Policy = holesPolicy() })
	db0 := dbClient(t, p.Redis, 0)
	nc := p.Dial(t)

	t.Run("SORT STORE", func(t *testing.T) {
		check(t, "seed", db0.RPush(ctx, "p:list", "3", "1", "2").Err())
		// Control: the plain spelling gets its fix-up.
		got := roundTrip(t, nc, []string{"SORT", "p:list", "STORE", "s:sorted1"})
		if got[0] != ":3" {
			t.Fatalf("control: %q", got)
		}
		wantTTL(t, db0, "s:sorted1", 24*time.Hour)

		got = roundTrip(t, nc, []string{"SORT", "p:list", "STORE\x00", "s:sorted2"})
		if got[0] != ":3" {
			t.Fatalf("SORT ... STORE\\x00: %q", got)
		}
		if d := pttl(t, db0, "s:sorted2"); d < 0 {
			t.Errorf("SORT p:list STORE\\x00 s:sorted2 created s:sorted2 with PTTL %v: rule s:* requires a TTL (default 24h)", d)
		}
	})

	t.Run("COPY DB", func(t *testing.T) {
		db1 := dbClient(t, p.Redis, 1)
		check(t, "seed src", db0.Set(ctx, "s:src", "v", 0).Err())
		// An unrelated key of database 0 that happens to share the name.
		check(t, "seed unrelated", db0.Set(ctx, "s:dst", "database 0's own", 0).Err())
		got := roundTrip(t, nc, []string{"COPY", "s:src", "s:dst", "DB\x00", "1"})
		if got[0] != ":1" {
			t.Fatalf("COPY ... DB\\x00 1: %q", got)
		}
		if d := pttl(t, db1, "s:dst"); d < 0 {
			t.Errorf("COPY s:src s:dst DB\\x00 1 created s:dst in database 1 with PTTL %v: rule s:* requires a TTL", d)
		}
		if d := pttl(t, db0, "s:dst"); d != -1 {
			t.Errorf("COPY s:src s:dst DB\\x00 1 (which wrote database 1) gave database 0's unrelated s:dst PTTL %v", d)
		}
	})

	t.Run("GETEX PERSIST", func(t *testing.T) {
		check(t, "seed", db0.Set(ctx, "s:kept", "v", time.Hour).Err())
		got := roundTrip(t, nc, []string{"GETEX", "s:kept", "PERSIST"})
		if !strings.HasPrefix(got[0], `-ERR redproxy policy: key "s:kept" must keep its TTL`) {
			t.Fatalf("control: GETEX PERSIST = %q", got)
		}
		got = roundTrip(t, nc, []string{"GETEX", "s:kept", "PERSIST\x00"})
		if d := pttl(t, db0, "s:kept"); d < 0 {
			t.Errorf("GETEX s:kept PERSIST\\x00 answered %q and removed the TTL (PTTL %v) of a key rule s:* requires one for", got, d)
		}
	})
}
