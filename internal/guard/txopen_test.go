package guard_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// step is one command sent on its own (its own batch) and the reply it
// must get; a reply ending in "..." is a prefix.
type step struct {
	cmd   []string
	reply string
}

func steps(t *testing.T, p *proxytest.Proxy, ss ...step) {
	t.Helper()
	nc := p.Dial(t)
	for i, s := range ss {
		got := roundTrip(t, nc, s.cmd)[0]
		if want, ok := strings.CutSuffix(s.reply, "..."); ok && strings.HasPrefix(got, want) || got == s.reply {
			continue
		}
		t.Fatalf("step %d %q: got %q, want %q", i, s.cmd, got, s.reply)
	}
}

// A MULTI typed command by command (redis-cli, a client that does not
// pipeline its transaction) under a TTL rule without a default: the write
// is queued, and a later command of the same transaction that sets its
// TTL settles it, as a pipeline sent in one write always did. Left
// unsettled at EXEC, the transaction is discarded on Redis and EXEC
// answers EXECABORT with the policy's message; nothing of it ran. Found
// by a user's trial, where the same transaction passed or was refused
// from run to run depending on how the client's writes were batched.
func TestTransactionByStepSettlesTTL(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Policy = holesPolicy() })
	db0 := dbClient(t, p.Redis, 0)
	const abort = `-EXECABORT Transaction discarded because of: redproxy policy: key "`

	t.Run("expire later settles", func(t *testing.T) {
		steps(t, p,
			step{[]string{"MULTI"}, "+OK"},
			step{[]string{"SET", "l:a", "v"}, "+QUEUED"},
			step{[]string{"GET", "l:a"}, "+QUEUED"},
			step{[]string{"EXPIRE", "l:a", "60"}, "+QUEUED"},
			step{[]string{"EXEC"}, "*[+OK $v :1]"})
		wantTTL(t, db0, "l:a", time.Minute)
	})
	t.Run("pexpire nx later settles", func(t *testing.T) {
		steps(t, p,
			step{[]string{"MULTI"}, "+OK"},
			step{[]string{"HSET", "l:b", "f", "v"}, "+QUEUED"},
			step{[]string{"PEXPIRE", "l:b", "60000", "NX"}, "+QUEUED"},
			step{[]string{"EXEC"}, "*[:1 :1]"})
		wantTTL(t, db0, "l:b", time.Minute)
	})
	t.Run("never settled", func(t *testing.T) {
		steps(t, p,
			step{[]string{"MULTI"}, "+OK"},
			step{[]string{"SET", "l:c", "v"}, "+QUEUED"},
			step{[]string{"INCR", "plain:c"}, "+QUEUED"},
			step{[]string{"EXEC"}, abort + `l:c" needs a TTL...`},
			// The connection is clean after it: no transaction left open
			// on Redis, nothing left over for the next one.
			step{[]string{"GET", "l:c"}, "$(nil)"},
			step{[]string{"MULTI"}, "+OK"},
			step{[]string{"INCR", "plain:c"}, "+QUEUED"},
			step{[]string{"EXEC"}, "*[:1]"})
		if n := db0.Exists(ctx, "l:c").Val(); n != 0 {
			t.Errorf("the discarded transaction wrote l:c")
		}
		if row := findRow(reportJSON(t, p.Guard()), policy.RuleTTL, "set"); row == nil || row.Refused != 1 || row.ExampleKey != "l:c" {
			t.Errorf("report row for the refused SET: %+v", row)
		}
	})
	t.Run("a select between", func(t *testing.T) {
		// The EXPIRE after SELECT runs in another database (here the same
		// number, which the policy does not try to tell apart).
		steps(t, p,
			step{[]string{"MULTI"}, "+OK"},
			step{[]string{"SET", "l:d", "v"}, "+QUEUED"},
			step{[]string{"SELECT", "0"}, "+QUEUED"},
			step{[]string{"EXPIRE", "l:d", "60"}, "+QUEUED"},
			step{[]string{"EXEC"}, abort + `l:d" needs a TTL...`})
		if n := db0.Exists(ctx, "l:d").Val(); n != 0 {
			t.Errorf("the discarded transaction wrote l:d")
		}
	})
	t.Run("discard forgets", func(t *testing.T) {
		steps(t, p,
			step{[]string{"MULTI"}, "+OK"},
			step{[]string{"SET", "l:e", "v"}, "+QUEUED"},
			step{[]string{"DISCARD"}, "+OK"},
			step{[]string{"MULTI"}, "+OK"},
			step{[]string{"INCR", "plain:e"}, "+QUEUED"},
			step{[]string{"EXEC"}, "*[:1]"})
	})
	t.Run("one of two keys settled", func(t *testing.T) {
		steps(t, p,
			step{[]string{"MULTI"}, "+OK"},
			step{[]string{"MSET", "l:f1", "1", "l:f2", "2"}, "+QUEUED"},
			step{[]string{"EXPIRE", "l:f1", "60"}, "+QUEUED"},
			step{[]string{"EXEC"}, abort + `l:f2" needs a TTL...`})
	})
	t.Run("a later write clears the ttl again", func(t *testing.T) {
		steps(t, p,
			step{[]string{"MULTI"}, "+OK"},
			step{[]string{"SET", "l:g", "v"}, "+QUEUED"},
			step{[]string{"EXPIRE", "l:g", "60"}, "+QUEUED"},
			step{[]string{"SET", "l:g", "w"}, "+QUEUED"},
			step{[]string{"EXEC"}, abort + `l:g" needs a TTL...`})
	})
	t.Run("under watch, split across writes", func(t *testing.T) {
		nc := p.Dial(t)
		equalReplies(t, roundTrip(t, nc, []string{"WATCH", "l:i"}, []string{"MULTI"}, []string{"SET", "l:i", "v"}), []string{"+OK", "+OK", "+QUEUED"})
		equalReplies(t, roundTrip(t, nc, []string{"EXPIRE", "l:i", "60"}, []string{"EXEC"}), []string{"+QUEUED", "*[+OK :1]"})
		wantTTL(t, db0, "l:i", time.Minute)
	})
	t.Run("outside a transaction still refused", func(t *testing.T) {
		steps(t, p,
			step{[]string{"SET", "l:j", "v"}, `-ERR redproxy policy: key "l:j" needs a TTL...`},
			step{[]string{"EXPIRE", "l:j", "60"}, ":0"})
	})
}

// Under a rule with a default the fix-up waits for the transaction's end
// too: a limiter typed as MULTI, INCR, EXPIRE ... NX, EXEC keeps its own
// window, as on Redis (a user's trial: the window became the default's
// hour). Left unset, the key gets the default from a fix-up queued before
// EXEC, or before the SELECT that ends its stretch of the transaction, so
// that it runs in the key's database.
func TestTransactionByStepDefaults(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Policy = holesPolicy() })
	db0, db1 := dbClient(t, p.Redis, 0), dbClient(t, p.Redis, 1)
	steps(t, p,
		step{[]string{"MULTI"}, "+OK"},
		step{[]string{"INCR", "s:limit"}, "+QUEUED"},
		step{[]string{"EXPIRE", "s:limit", "60", "NX"}, "+QUEUED"},
		step{[]string{"EXEC"}, "*[:1 :1]"})
	wantTTL(t, db0, "s:limit", time.Minute)
	if row := findRow(reportJSON(t, p.Guard()), policy.RuleTTL, "incr"); row != nil {
		t.Errorf("a transaction that set its TTL was recorded: %+v", row)
	}

	steps(t, p,
		step{[]string{"MULTI"}, "+OK"},
		step{[]string{"HSET", "s:d1", "f", "v"}, "+QUEUED"},
		step{[]string{"GET", "plain:x"}, "+QUEUED"},
		step{[]string{"EXEC"}, "*[:1 $(nil)]"})
	wantTTL(t, db0, "s:d1", 24*time.Hour)
	if row := findRow(reportJSON(t, p.Guard()), policy.RuleTTL, "hset"); row == nil || row.Fixed != 1 {
		t.Errorf("the fix at EXEC was not recorded once: %+v", row)
	}

	steps(t, p,
		step{[]string{"MULTI"}, "+OK"},
		step{[]string{"HSET", "s:d2", "f", "v"}, "+QUEUED"},
		step{[]string{"SELECT", "1"}, "+QUEUED"},
		step{[]string{"HSET", "s:d2", "f", "w"}, "+QUEUED"},
		step{[]string{"SELECT", "0"}, "+QUEUED"},
		step{[]string{"EXEC"}, "*[:1 +OK :1 +OK]"})
	wantTTL(t, db0, "s:d2", 24*time.Hour)
	wantTTL(t, db1, "s:d2", 24*time.Hour)

	// SET gains no EX in the transaction; its fix is the EXPIRE ... NX.
	steps(t, p,
		step{[]string{"MULTI"}, "+OK"},
		step{[]string{"SET", "s:d3", "v"}, "+QUEUED"},
		step{[]string{"PEXPIRE", "s:d3", "90000"}, "+QUEUED"},
		step{[]string{"EXEC"}, "*[+OK :1]"})
	wantTTL(t, db0, "s:d3", 90*time.Second)
}

// Under report mode the same transaction is reported only if EXEC comes
// with the requirement still open, and then once; EXEC runs.
func TestTransactionByStepReportsAtExec(t *testing.T) {
	pol := holesPolicy()
	pol.Mode = "report"
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Policy = pol })
	steps(t, p,
		step{[]string{"MULTI"}, "+OK"},
		step{[]string{"SET", "l:r1", "v"}, "+QUEUED"},
		step{[]string{"EXPIRE", "l:r1", "60"}, "+QUEUED"},
		step{[]string{"EXEC"}, "*[+OK :1]"})
	if row := findRow(reportJSON(t, p.Guard()), policy.RuleTTL, "set"); row != nil {
		t.Fatalf("a settled write was reported: %+v", row)
	}
	steps(t, p,
		step{[]string{"MULTI"}, "+OK"},
		step{[]string{"SET", "l:r2", "v"}, "+QUEUED"},
		step{[]string{"EXEC"}, "*[+OK]"})
	row := findRow(reportJSON(t, p.Guard()), policy.RuleTTL, "set")
	if row == nil || row.Reported != 1 || row.Count != 1 || row.ExampleKey != "l:r2" {
		t.Fatalf("report row: %+v", row)
	}
}

// An upstream user whose ACL refuses MULTI: Redis answers -NOPERM and runs
// what the client sends next at once, so a write left open there would be
// written without its TTL. The write waits for EXEC only once Redis has
// opened the transaction; otherwise it is refused as outside one, also
// when MULTI and the write come in one write (found by review).
func TestTransactionByStepNeedsRedisToOpenIt(t *testing.T) {
	rs := redistest.Start(t)
	admin := rs.Client(t)
	check(t, "ACL SETUSER", admin.Do(ctx, "ACL", "SETUSER", "nomulti", "on", ">pw", "~*", "&*", "+@all", "-multi").Err())
	p := proxytest.Start(t, rs, func(c *config.Config) {
		c.Policy = holesPolicy()
		c.Upstream.Username, c.Upstream.Password = "nomulti", "pw"
	})
	refused := `-ERR redproxy policy: key "l:m" needs a TTL...`
	steps(t, p,
		step{[]string{"AUTH", "nomulti", "pw"}, "+OK"},
		step{[]string{"MULTI"}, "-NOPERM..."},
		step{[]string{"SET", "l:m", "v"}, refused},
		step{[]string{"EXEC"}, "-ERR EXEC without MULTI"})
	nc := p.Dial(t)
	equalReplies(t, roundTrip(t, nc, []string{"AUTH", "nomulti", "pw"}), []string{"+OK"})
	got := roundTrip(t, nc, []string{"MULTI"}, []string{"SET", "l:m", "v"})
	if !strings.HasPrefix(got[0], "-NOPERM") || !strings.HasPrefix(got[1], strings.TrimSuffix(refused, "...")) {
		t.Errorf("MULTI and SET in one write: %q", got)
	}
	if n := admin.Exists(ctx, "l:m").Val(); n != 0 {
		t.Errorf("l:m written with PTTL %v", pttl(t, admin, "l:m"))
	}

	// With MULTI allowed, MULTI and the write in one write, the TTL in
	// the next: the proxy learns Redis opened the transaction first.
	p2 := proxytest.Start(t, nil, func(c *config.Config) { c.Policy = holesPolicy() })
	nc = p2.Dial(t)
	equalReplies(t, roundTrip(t, nc, []string{"MULTI"}, []string{"SET", "l:m2", "v"}), []string{"+OK", "+QUEUED"})
	equalReplies(t, roundTrip(t, nc, []string{"EXPIRE", "l:m2", "60"}, []string{"EXEC"}), []string{"+QUEUED", "*[+OK :1]"})
	wantTTL(t, dbClient(t, p2.Redis, 0), "l:m2", time.Minute)
}

// A batch checked with the policy off settles nothing: what an earlier
// batch settled must not carry over to it (found by review: l:b was
// committed without a TTL after --policy-mode went off and on again
// within the transaction).
func TestTransactionByStepPolicyOffSettlesNothing(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Policy = holesPolicy() })
	db0 := dbClient(t, p.Redis, 0)
	nc := p.Dial(t)
	for _, s := range []step{
		{[]string{"MULTI"}, "+OK"},
		{[]string{"SET", "l:a", "v"}, "+QUEUED"},
		{[]string{"SET", "l:b", "v"}, "+QUEUED"},
		{[]string{"EXPIRE", "l:a", "60"}, "+QUEUED"},
	} {
		equalReplies(t, roundTrip(t, nc, s.cmd), []string{s.reply})
	}
	p.Guard().SetForcedMode(policy.Off)
	equalReplies(t, roundTrip(t, nc, []string{"PING"}), []string{"+QUEUED"})
	p.Guard().SetForcedMode(policy.Enforce)
	if got := roundTrip(t, nc, []string{"EXEC"})[0]; !strings.HasPrefix(got, `-EXECABORT Transaction discarded because of: redproxy policy: key "l:b" needs a TTL`) {
		t.Errorf("EXEC: %q", got)
	}
	if n := db0.Exists(ctx, "l:b").Val(); n != 0 {
		t.Errorf("l:b committed with PTTL %v", pttl(t, db0, "l:b"))
	}
}

// At most maxOpenTTL (128) requirements wait in one transaction: each
// later batch checks them all. Past that a write is refused at queue time
// and EXEC fails as for any queue-time error.
func TestTransactionByStepOpenCap(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Policy = holesPolicy() })
	nc := p.Dial(t)
	equalReplies(t, roundTrip(t, nc, []string{"MULTI"}), []string{"+OK"})
	for i := range 128 {
		equalReplies(t, roundTrip(t, nc, []string{"SET", fmt.Sprintf("l:cap%d", i), "v"}), []string{"+QUEUED"})
	}
	if got := roundTrip(t, nc, []string{"SET", "l:cap128", "v"})[0]; !strings.HasPrefix(got, `-ERR redproxy policy: key "l:cap128" needs a TTL`) {
		t.Fatalf("129th open write: %q", got)
	}
	if got := roundTrip(t, nc, []string{"EXEC"})[0]; !strings.HasPrefix(got, "-EXECABORT Transaction discarded because of") {
		t.Errorf("EXEC: %q", got)
	}
}

// Every requirement of a typed transaction is recorded once, whatever
// ends the transaction, as the same transaction sent in one write is
// recorded at queue time: under enforce and under report mode alike
// (found by review: a DISCARD left it out under report mode while
// enforce counted the fix it had queued).
func TestTransactionByStepRecordedOnceHoweverItEnds(t *testing.T) {
	for _, mode := range []string{"enforce", "report"} {
		t.Run(mode, func(t *testing.T) {
			pol := holesPolicy()
			pol.Mode = mode
			p := proxytest.Start(t, nil, func(c *config.Config) { c.Policy = pol })
			for _, end := range [][]string{{"DISCARD"}, {"RESET"}, {"EXEC"}} {
				want := map[string]string{"DISCARD": "+OK", "RESET": "+RESET", "EXEC": "*[:1 +OK :1]"}[end[0]]
				steps(t, p,
					step{[]string{"MULTI"}, "+OK"},
					step{[]string{"HSET", "s:e1", "f", "v"}, "+QUEUED"},
					step{[]string{"SET", "l:end", "v"}, "+QUEUED"},
					step{[]string{"HSET", "s:e2", "f", "v"}, "+QUEUED"},
					step{end, map[bool]string{true: want, false: `-EXECABORT Transaction discarded because of: redproxy policy: key "l:end" needs a TTL...`}[end[0] != "EXEC" || mode == "report"]})
			}
			// Three transactions, each with two HSETs and a SET.
			rep := reportJSON(t, p.Guard())
			hset, set := findRow(rep, policy.RuleTTL, "hset"), findRow(rep, policy.RuleTTL, "set")
			if hset == nil || set == nil || hset.Count != 6 || set.Count != 3 {
				t.Fatalf("rows hset %+v set %+v, want 6 and 3", hset, set)
			}
			if mode == "report" && (hset.Reported != 6 || set.Reported != 3) ||
				mode == "enforce" && (hset.Fixed != 6 || set.Refused != 3) {
				t.Errorf("outcomes: hset %+v set %+v", hset, set)
			}
		})
	}
}

// Requirements closed by a boundary are recorded then and not kept (only
// EXEC's answer to the first refused one is): a client typing write and
// SELECT in turn holds no more than one batch's worth, however long its
// transaction, and EXEC still names the first write.
func TestTransactionByStepClosedAreNotKept(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Policy = holesPolicy() })
	nc := p.Dial(t)
	equalReplies(t, roundTrip(t, nc, []string{"MULTI"}), []string{"+OK"})
	const n = 300 // more than the 128 that may be open at once
	for i := range n {
		equalReplies(t, roundTrip(t, nc, []string{"SET", fmt.Sprintf("l:closed%d", i), "v"}), []string{"+QUEUED"})
		equalReplies(t, roundTrip(t, nc, []string{"SELECT", "0"}), []string{"+QUEUED"})
	}
	if got := roundTrip(t, nc, []string{"EXEC"})[0]; !strings.HasPrefix(got, `-EXECABORT Transaction discarded because of: redproxy policy: key "l:closed0" needs a TTL`) {
		t.Fatalf("EXEC: %q", got)
	}
	rep := reportJSON(t, p.Guard())
	if row := findRow(rep, policy.RuleTTL, "set"); row == nil || row.Refused != n {
		t.Fatalf("set row %+v, want %d refused", row, n)
	}
}
