package guard_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
)

// Where a fix-up inside MULTI runs matters: a COPY ... DB n queued in
// MULTI, then a SELECT queued after it. The copy in database n gets the
// default TTL, and an unrelated key of the same name in the COPY's own
// database gets none. (These placement tests come from the review of an
// attempt to move the fix-ups of a transaction to just before its EXEC,
// which broke each of them; see docs/COMPATIBILITY.md, "Policy TTL
// fix-ups".)
func TestTxFixupCopyDBThenSelect(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Policy = holesPolicy() })
	db := func(n int) *redis.Client { return dbClient(t, p.Redis, n) }
	check(t, "seed", db(0).Set(ctx, "plain:src", "v", 0).Err())
	// An unrelated key named like the copy, in the COPY's own database,
	// seeded straight on Redis without a TTL.
	check(t, "seed", db(0).Set(ctx, "s:cdst", "other", 0).Err())
	for _, byStep := range []bool{false, true} {
		name := map[bool]string{false: "pipelined", true: "by step"}[byStep]
		t.Run(name, func(t *testing.T) {
			check(t, "clean", db(1).Del(ctx, "s:cdst").Err())
			check(t, "clean", db(0).Persist(ctx, "s:cdst").Err())
			nc := p.Dial(t)
			cmds := [][]string{{"MULTI"}, {"COPY", "plain:src", "s:cdst", "DB", "1"}, {"SELECT", "2"}, {"EXEC"}, {"SELECT", "0"}}
			want := []string{"+OK", "+QUEUED", "+QUEUED", "*[:1 +OK]", "+OK"}
			if byStep {
				for i, c := range cmds {
					equalReplies(t, roundTrip(t, nc, c), want[i:i+1])
				}
			} else {
				equalReplies(t, roundTrip(t, nc, cmds...), want)
			}
			wantTTL(t, db(1), "s:cdst", 24*time.Hour)
			if d := pttl(t, db(0), "s:cdst"); d != -1 {
				t.Errorf("database 0's unrelated s:cdst got PTTL %v from the copy's fix-up", d)
			}
		})
	}
}

// MOVE keeps the key's TTL in the other database (policy/effects.go lists
// it as having no TTL effect), which holds because the write's fix-up runs
// right behind the write: inside MULTI too, the moved key has the default.
func TestTxFixupWriteThenMove(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Policy = holesPolicy() })
	db1 := dbClient(t, p.Redis, 1)
	nc := p.Dial(t)
	got := roundTrip(t, nc, []string{"MULTI"}, []string{"HSET", "s:txmove", "f", "v"}, []string{"MOVE", "s:txmove", "1"}, []string{"EXEC"})
	equalReplies(t, got, []string{"+OK", "+QUEUED", "+QUEUED", "*[:1 :1]"})
	wantTTL(t, db1, "s:txmove", 24*time.Hour)
}

// Fix-ups of 100 KB keys (long parts are written by reference) in two
// transactions pipelined in one write both land.
func TestTxFixupLargeKeysPipelined(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Policy = holesPolicy() })
	db0 := dbClient(t, p.Redis, 0)
	big := func(c byte) string {
		b := make([]byte, 100<<10)
		for i := range b {
			b[i] = c
		}
		return "s:" + string(b)
	}
	k1, k2 := big('a'), big('b')
	nc := p.Dial(t)
	got := roundTrip(t, nc, []string{"MULTI"}, []string{"HSET", k1, "f", "v"}, []string{"EXEC"},
		[]string{"MULTI"}, []string{"HSET", k2, "f", "v"}, []string{"SELECT", "1"}, []string{"EXEC"}, []string{"SELECT", "0"})
	equalReplies(t, got, []string{"+OK", "+QUEUED", "*[:1]", "+OK", "+QUEUED", "+QUEUED", "*[:1 +OK]", "+OK"})
	wantTTL(t, db0, k1, 24*time.Hour)
	wantTTL(t, db0, k2, 24*time.Hour)
}

// With upstream.databases above Redis's, a SELECT Redis refuses when EXEC
// runs it leaves the transaction in its database: each write's fix-up,
// right behind it, still runs in the write's database.
func TestTxFixupAfterAFailedSelect(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Policy = holesPolicy(); c.Upstream.Databases = 32 })
	db0, db1 := dbClient(t, p.Redis, 0), dbClient(t, p.Redis, 1)
	nc := p.Dial(t)
	got := roundTrip(t, nc, []string{"MULTI"}, []string{"SELECT", "20"}, []string{"HSET", "s:fb", "f", "v"},
		[]string{"SELECT", "1"}, []string{"HSET", "s:fa", "f", "v"}, []string{"SELECT", "20"}, []string{"EXEC"})
	if len(got) != 7 {
		t.Fatalf("replies %q", got)
	}
	t.Logf("EXEC: %s", got[6])
	wantTTL(t, db0, "s:fb", 24*time.Hour)
	wantTTL(t, db1, "s:fa", 24*time.Hour)
}
