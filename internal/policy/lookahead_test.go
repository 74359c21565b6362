package policy

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/redistest"
)

// TestLookaheadTrustsOnlyCertainTTLs: a later command of the batch stands
// in for the write's TTL only when it certainly gives the key one: same
// database, same stretch of the batch (no transaction, connection-state or
// blocking command between), a TTL Redis accepts and that does not delete
// the key, and no condition that can leave a key without TTL alone.
// Everything else gets the fix-up (or, without a default, the refusal).
func TestLookaheadTrustsOnlyCertainTTLs(t *testing.T) {
	p := compileDoc(t, ttlDoc)
	const fix = "fixed:ttl expire=[s:k 86400]"
	past := strconv.FormatInt(nowS-10, 10)
	pastMs := strconv.FormatInt(nowMs-10_000, 10)
	cases := []batchCase{
		// Trusted: nothing can stop the TTL.
		{"pipeline", []string{"HSET s:k f v", "GET x", "EXPIRE s:k 100"}, []string{"", "", ""}},
		{"same transaction", []string{"MULTI", "HSET s:k f v", "EXPIRE s:k 100", "EXEC"}, []string{"", "", "", ""}},
		{"nx sets a missing ttl", []string{"HSET s:k f v", "EXPIRE s:k 100 NX"}, []string{"", ""}},
		{"lt sets a missing ttl", []string{"HSET s:k f v", "EXPIRE s:k 100 LT"}, []string{"", ""}},
		{"set ex overwrites", []string{"HSET s:k f v", "SET s:k v EX 100"}, []string{"", ""}},
		{"set ex repeated", []string{"HSET s:k f v", "SET s:k v EX 100 EX 200"}, []string{"", ""}},
		{"setex", []string{"HSET s:k f v", "SETEX s:k 100 v"}, []string{"", ""}},
		{"psetex", []string{"HSET s:k f v", "PSETEX s:k 100000 v"}, []string{"", ""}},
		{"expireat future", []string{"HSET s:k f v", "EXPIREAT s:k " + in100S}, []string{"", ""}},
		{"refusal between outside multi", []string{"HSET s:k f v", "KEYS *", "EXPIRE s:k 100"}, []string{"", "refused:command", ""}},

		// Another database, or a boundary between write and TTL.
		{"select between", []string{"HSET s:k f v", "SELECT 1", "EXPIRE s:k 100"}, []string{fix, "", ""}},
		{"select same db between", []string{"HSET s:k f v", "SELECT 0", "EXPIRE s:k 100"}, []string{fix, "", ""}},
		{"set rewritten across select", []string{"SET s:k v", "SELECT 1", "EXPIRE s:k 100"}, []string{"fixed:ttl args=[SET s:k v EX 86400]", "", ""}},
		{"swapdb between", []string{"HSET s:k f v", "SWAPDB 0 1", "EXPIRE s:k 100"}, []string{fix, "", ""}},
		{"move between", []string{"HSET s:k f v", "MOVE s:k 1", "EXPIRE s:k 100"}, []string{fix, "", ""}},
		{"quit between", []string{"HSET s:k f v", "QUIT", "EXPIRE s:k 100"}, []string{fix, "", ""}},
		{"reset between", []string{"HSET s:k f v", "RESET", "EXPIRE s:k 100"}, []string{fix, "", ""}},
		{"blocking between", []string{"HSET s:k f v", "BLPOP q 0", "EXPIRE s:k 100"}, []string{fix, "", ""}},
		{"subscribe between", []string{"HSET s:k f v", "SUBSCRIBE c", "EXPIRE s:k 100"}, []string{fix, "", ""}},
		{"client tracking between", []string{"HSET s:k f v", "CLIENT TRACKING ON", "EXPIRE s:k 100"}, []string{fix, "", ""}},
		{"ttl inside a later transaction", []string{"HSET s:k f v", "MULTI", "EXPIRE s:k 100", "EXEC"}, []string{fix, "", "", ""}},
		{"ttl inside a discarded transaction", []string{"HSET s:k f v", "MULTI", "EXPIRE s:k 100", "DISCARD"}, []string{fix, "", "", ""}},
		{"write inside a discarded transaction", []string{"MULTI", "HSET s:k f v", "DISCARD", "EXPIRE s:k 100"}, []string{"", fix, "", ""}},
		{"ttl after exec", []string{"MULTI", "HSET s:k f v", "EXEC", "EXPIRE s:k 100"}, []string{"", fix, "", ""}},
		{"write in a transaction begun earlier", []string{"HSET s:k f v", "EXEC", "EXPIRE s:k 100"}, []string{fix, "", ""}},
		{"watch then multi", []string{"HSET s:k f v", "WATCH s:k", "MULTI", "EXPIRE s:k 100", "EXEC"}, []string{fix, "", "", "", ""}},

		// Arguments that give no TTL.
		{"expire not a number", []string{"HSET s:k f v", "EXPIRE s:k abc"}, []string{fix, ""}},
		{"expire zero", []string{"HSET s:k f v", "EXPIRE s:k 0"}, []string{fix, ""}},
		{"expire negative", []string{"HSET s:k f v", "EXPIRE s:k -5"}, []string{fix, ""}},
		// A TTL past Redis's range is Redis's error to answer: neither a
		// TTL the write can count on nor one to clamp or report as too
		// long (clamped, it became a valid TTL and the write Redis
		// refuses ran; found by a probe).
		{"expire overflows", []string{"HSET r:k f v", "EXPIRE r:k 9223372036854775807"}, []string{"reported:ttl", ""}},
		{"pexpire overflows", []string{"HSET r:k f v", "PEXPIRE r:k 9223372036854775807"}, []string{"reported:ttl", ""}},
		{"overflow not clamped", []string{"HSET s:k f v", "EXPIRE s:k 9223372036854775807"}, []string{fix, ""}},
		{"set ex overflow not clamped", []string{"SET s:k v EX 9223372036854775"}, []string{""}},
		{"psetex overflow not clamped", []string{"PSETEX s:k 9223372036854775807 v"}, []string{""}},
		{"getex overflow not clamped", []string{"GETEX s:k EX 9223372036854775"}, []string{""}},
		{"expireat overflow not clamped", []string{"HSET s:k f v", "EXPIREAT s:k 9223372036854775807"}, []string{fix, ""}},
		{"expireat past", []string{"HSET s:k f v", "EXPIREAT s:k " + past}, []string{fix, ""}},
		{"pexpireat past", []string{"HSET s:k f v", "PEXPIREAT s:k " + pastMs}, []string{fix, ""}},
		{"set ex zero", []string{"HSET s:k f v", "SET s:k v EX 0"}, []string{fix, ""}},
		{"set ex not a number", []string{"HSET s:k f v", "SET s:k v EX abc"}, []string{fix, ""}},
		{"setex zero", []string{"HSET s:k f v", "SETEX s:k 0 v"}, []string{fix, ""}},
		{"setex missing value", []string{"HSET s:k f v", "SETEX s:k 100"}, []string{fix, ""}},

		// Conditions and options Redis refuses.
		{"expire xx", []string{"HSET s:k f v", "EXPIRE s:k 100 XX"}, []string{fix, ""}},
		{"expire gt", []string{"HSET s:k f v", "EXPIRE s:k 100 GT"}, []string{fix, ""}},
		{"expire nx lt refused", []string{"HSET s:k f v", "EXPIRE s:k 100 NX LT"}, []string{fix, ""}},
		{"expire nx xx refused", []string{"HSET s:k f v", "EXPIRE s:k 100 NX XX"}, []string{fix, ""}},
		{"expire gt lt refused", []string{"HSET s:k f v", "EXPIRE s:k 100 GT LT"}, []string{fix, ""}},
		{"expire unknown option", []string{"HSET s:k f v", "EXPIRE s:k 100 SOON"}, []string{fix, ""}},
		{"set nx", []string{"HSET s:k f v", "SET s:k v2 NX EX 100"}, []string{fix, ""}},
		{"set xx", []string{"HSET s:k f v", "SET s:k v2 XX EX 100"}, []string{fix, ""}},
		{"set get wrongtype", []string{"HSET s:k f v", "SET s:k v2 GET EX 100"}, []string{fix, ""}},
		{"set keepttl and ex", []string{"HSET s:k f v", "SET s:k v2 KEEPTTL EX 100"}, []string{fix, ""}},
		{"set ex and px", []string{"HSET s:k f v", "SET s:k v2 EX 100 PX 100000"}, []string{fix, ""}},
		{"set unknown option", []string{"HSET s:k f v", "SET s:k v2 EX 100 SOON"}, []string{fix, ""}},
		{"getex wrongtype", []string{"HSET s:k f v", "GETEX s:k EX 100"}, []string{fix, ""}},
		{"restore busykey", []string{"HSET s:k f v", "RESTORE s:k 100000 payload"}, []string{fix, ""}},

		// Without a default, what cannot be fixed is refused.
		{"no default, select between", []string{"HSET l:k f v", "SELECT 0", "EXPIRE l:k 30"}, []string{"refused:ttl", "", ""}},
		{"no default, expire xx", []string{"SET l:k v NX", "EXPIRE l:k 30 XX"}, []string{"refused:ttl", ""}},
	}
	runBatchCases(t, p, cases)
}

// TestLookaheadLargeBatchBoundaries: the map used for batches with many
// TTL setters honours boundaries like the linear scan.
func TestLookaheadLargeBatchBoundaries(t *testing.T) {
	p := compileDoc(t, ttlDoc)
	const n = 50
	var b []string
	for i := range n {
		b = append(b, fmt.Sprintf("HSET l:%d f v", i))
	}
	b = append(b, "SELECT 1")
	for i := range n {
		b = append(b, fmt.Sprintf("EXPIRE l:%d 30", i))
	}
	// The same keys again after the boundary: these are covered.
	for i := range n {
		b = append(b, fmt.Sprintf("HSET l:%d f v", i), fmt.Sprintf("EXPIRE l:%d 30", i))
	}
	out := checkBatch(t, p, batch(b...))
	for i, d := range out {
		want := ""
		if i < n {
			want = "refused:ttl"
		}
		if got := summary(d); got != want {
			t.Fatalf("request %d (%s): got %q, want %q", i, b[i], got, want)
		}
	}
}

// TestLookaheadIgnoresDeniedSetters: a request the proxy refuses before it
// runs (Request.Denied: the user's ACL) gives no key a TTL, so a write
// before it keeps its fix-up, in a small batch and in one large enough for
// the setters' map.
func TestLookaheadIgnoresDeniedSetters(t *testing.T) {
	p := compileDoc(t, ttlDoc)
	const fix = "fixed:ttl expire=[s:k 86400]"
	for _, pad := range []int{0, 40} {
		b := []string{"HSET s:k f v"}
		for i := range pad {
			b = append(b, fmt.Sprintf("SET s:pad%d v EX 100", i))
		}
		b = append(b, "EXPIRE s:k 100")
		for _, denied := range []bool{false, true} {
			reqs := batch(b...)
			reqs[len(reqs)-1].Denied = denied
			want := ""
			if denied {
				want = fix
			}
			if got := summary(checkBatch(t, p, reqs)[0]); got != want {
				t.Errorf("%d setters, EXPIRE denied=%v: HSET got %q, want %q", pad+1, denied, got, want)
			}
		}
	}
}

// TestSetLastTTLOptionChecked: Redis applies the last of repeated TTL
// options, so that is the one max applies to.
func TestSetLastTTLOptionChecked(t *testing.T) {
	p := compileDoc(t, ttlDoc)
	out := checkBatch(t, p, batch("SET s:k v EX 10 EX 99999999"))
	if got, want := summary(out[0]), "fixed:ttl_max args=[SET s:k v EX 10 EX 604800]"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// TestCopyToAnotherDatabase: COPY ... DB n creates the destination in
// database n; its fix-up carries that database, and no TTL set in the
// current one counts for it.
func TestCopyToAnotherDatabase(t *testing.T) {
	p := compileDoc(t, ttlDoc)
	cases := []batchCase{
		{"same db", []string{"COPY s:a s:b"}, []string{"fixed:ttl expire=[s:b 86400] expire=[s:b 604800 lt]"}},
		{"replace", []string{"COPY s:a s:b REPLACE"}, []string{"fixed:ttl expire=[s:b 86400] expire=[s:b 604800 lt]"}},
		{"db", []string{"COPY s:a s:b DB 3"}, []string{"fixed:ttl expire=[s:b 86400 db=3] expire=[s:b 604800 lt db=3]"}},
		{"db lower case, replace", []string{"copy s:a s:b replace db 3"}, []string{"fixed:ttl expire=[s:b 86400 db=3] expire=[s:b 604800 lt db=3]"}},
		{"ttl in this db does not count", []string{"COPY s:a s:b DB 3", "EXPIRE s:b 100"}, []string{"fixed:ttl expire=[s:b 86400 db=3] expire=[s:b 604800 lt db=3]", ""}},
		{"no default", []string{"COPY s:a l:b DB 3"}, []string{"refused:ttl"}},
	}
	runBatchCases(t, p, cases)
}

// TestEffectsDBInRange: a classifier's DB index, like its key and TTL
// indices, is always inside the arguments.
func TestEffectsDBInRange(t *testing.T) {
	for name, f := range effectTable {
		args := [][]byte{[]byte(name)}
		for n := 1; n < 8; n++ {
			for _, e := range f(args, nil) {
				if e.db >= len(args) {
					t.Errorf("%s with %d args: effect %+v out of range", name, len(args), e)
				}
			}
			args = append(args, []byte("db"))
		}
	}
}

// unclassify removes names from the effect table for one test, as if the
// command table had write commands nobody classified.
func unclassify(t *testing.T, names ...string) {
	t.Helper()
	for _, name := range names {
		f := effectTable[name]
		if f == nil {
			t.Fatalf("%s is not classified", name)
		}
		delete(effectTable, name)
		t.Cleanup(func() { effectTable[name] = f })
	}
}

// TestUnclassifiedWriteFallsBackToKeySpecs loads the command table from a
// real Redis's COMMAND reply and drops some of its write commands from the
// classification: their keys are classified from the key specs Redis
// reports, so the TTL and naming rules still apply.
func TestUnclassifiedWriteFallsBackToKeySpecs(t *testing.T) {
	srv := redistest.Start(t)
	loaded, err := commands.Load(context.Background(), srv.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	unclassify(t, "hset", "lpush", "incr", "copy", "lmove", "bitop")
	p := compileDoc(t, ttlDoc+`
[policy.names]
namespaces = ["s", "l", "r", "p", "src"]
`)
	cases := []struct{ cmd, want string }{
		{"HSET s:k f v", "fixed:ttl expire=[s:k 86400]"},   // RW|UPDATE
		{"LPUSH s:k a b", "fixed:ttl expire=[s:k 86400]"},  // RW|INSERT
		{"INCR s:k", "fixed:ttl expire=[s:k 86400]"},       // RW|ACCESS|UPDATE
		{"COPY src:a s:k", "fixed:ttl expire=[s:k 86400]"}, // source RO, destination OW
		{"LMOVE src:a s:k LEFT RIGHT", "fixed:ttl expire=[s:k 86400]"},
		{"BITOP AND s:k src:a src:b", "fixed:ttl expire=[s:k 86400]"},
		{"HSET l:k f v", "refused:ttl"},
		{"HSET bad f v", "refused:namespaces"},
		{"HDEL s:k f", ""}, // classified: no TTL effect
	}
	for _, c := range cases {
		req := line(c.cmd)
		req.Cmd = loaded.Lookup(req.Args)
		out := checkBatch(t, p, []Request{req})
		if got := summary(out[0]); got != c.want {
			t.Errorf("%s: got %q, want %q", c.cmd, got, c.want)
		}
	}
	// The fallback does not let a later EXPIRE in the batch go unnoticed.
	reqs := batch("HSET s:k f v", "EXPIRE s:k 100")
	for i := range reqs {
		reqs[i].Cmd = loaded.Lookup(reqs[i].Args)
	}
	if got := summary(checkBatch(t, p, reqs)[0]); got != "" {
		t.Errorf("HSET then EXPIRE: got %q", got)
	}
}

// TestUnclassifiableCommandsReported: a module write command whose key
// specs cannot describe its keys, or that has only legacy key positions,
// and a command the table does not know, are reported as unclassified;
// keys found are still taken as created.
func TestUnclassifiableCommandsReported(t *testing.T) {
	p := compileDoc(t, ttlDoc)
	withSpecs := &commands.Command{Name: "json.set", Arity: -4, Flags: commands.Write | commands.Denyoom,
		KeySpecs: []commands.KeySpec{{Flags: commands.KeyRW | commands.KeyUpdate,
			Begin: commands.BeginSearch{Kind: commands.BeginIndex, Index: 1},
			Find:  commands.FindKeys{Kind: commands.FindRange, KeyStep: 1}}}}
	incomplete := &commands.Command{Name: "mod.store", Arity: -2, Flags: commands.Write | commands.MovableKeys,
		KeySpecs: []commands.KeySpec{{Flags: commands.KeyOW | commands.KeyUpdate | commands.KeyIncomplete,
			Begin: commands.BeginSearch{Kind: commands.BeginIndex, Index: 1},
			Find:  commands.FindKeys{Kind: commands.FindRange, KeyStep: 1}}}}
	legacy := &commands.Command{Name: "mod.legacy", Arity: -3, Flags: commands.Write, FirstKey: 1, LastKey: 1, KeyStep: 1}
	readOnly := &commands.Command{Name: "json.get", Arity: -2, Flags: commands.ReadOnly,
		KeySpecs: []commands.KeySpec{{Flags: commands.KeyRO | commands.KeyAccess,
			Begin: commands.BeginSearch{Kind: commands.BeginIndex, Index: 1},
			Find:  commands.FindKeys{Kind: commands.FindRange, KeyStep: 1}}}}
	cases := []struct {
		cmd  *commands.Command
		line string
		want string
	}{
		{withSpecs, "JSON.SET s:k $ 1", "fixed:ttl expire=[s:k 86400]"},
		{withSpecs, "JSON.SET p:k $ 1", ""},
		{incomplete, "MOD.STORE s:k", "reported:unclassified fixed:ttl expire=[s:k 86400]"},
		{legacy, "MOD.LEGACY s:k x", "reported:unclassified fixed:ttl expire=[s:k 86400]"},
		{readOnly, "JSON.GET s:k", ""},
		{nil, "JSON.SET s:k $ 1", "reported:unclassified"},
	}
	for _, c := range cases {
		req := line(c.line)
		req.Cmd = c.cmd
		out := checkBatch(t, p, []Request{req})
		if got := summary(out[0]); got != c.want {
			t.Errorf("%s: got %q, want %q", c.line, got, c.want)
		}
		for _, v := range out[0].Violations {
			if v.Rule == RuleUnclassified && (v.Outcome != Reported || v.Action != Report) {
				t.Errorf("%s: unclassified finding %+v", c.line, v)
			}
		}
	}
	// No key rules: nothing to classify for.
	none := compileDoc(t, "[policy]\n")
	req := line("JSON.SET s:k $ 1")
	if out := checkBatch(t, none, []Request{req}); summary(out[0]) != "" {
		t.Errorf("without key rules: %q", summary(out[0]))
	}
}

// TestGetexLastTTLOptionChecked: Redis's GETEX, like SET, applies the last
// of repeated TTL options, so that is the one max applies to (found by
// review: the first was checked). Mixed units and PERSIST with a TTL are
// syntax errors to Redis in every version: the client gets Redis's error,
// not a policy refusal (found by a probe). An option Redis does not know
// is classified by what the rest would do.
func TestGetexLastTTLOptionChecked(t *testing.T) {
	p := compileDoc(t, ttlDoc)
	runBatchCases(t, p, []batchCase{
		{"last ex clamped", []string{"GETEX s:k EX 10 EX 99999999"}, []string{"fixed:ttl_max args=[GETEX s:k EX 10 EX 604800]"}},
		{"last ex refused", []string{"GETEX l:k EX 30 EX 99999"}, []string{"refused:ttl_max"}},
		{"last px refused", []string{"GETEX l:k PX 30000 PX 99999999"}, []string{"refused:ttl_max"}},
		{"first over, last within", []string{"GETEX l:k EX 99999 EX 30"}, []string{""}},
		{"mixed units: Redis's syntax error", []string{"GETEX l:k EX 30 PX 99999999"}, []string{""}},
		{"persist after ttl: Redis's syntax error", []string{"GETEX s:k EX 100 PERSIST"}, []string{""}},
		{"persist before ttl: Redis's syntax error", []string{"GETEX s:k PERSIST EX 100"}, []string{""}},
		{"unknown option: what PERSIST would do", []string{"GETEX s:k PERSIST BOGUS"}, []string{"refused:ttl"}},
		{"persist twice", []string{"GETEX s:k PERSIST PERSIST"}, []string{"refused:ttl"}},
		{"trailing ex", []string{"GETEX l:k EX 30 EX"}, []string{""}},
	})
}

// A command Redis refuses in every version, for its argument count or for
// options that conflict, has no effect the policy acts on: the client
// gets Redis's error, and inside MULTI the transaction's other commands
// still run at EXEC, as on Redis. Refused by the policy ("needs a TTL",
// "exceeds the maximum"), a MULTI was discarded with EXECABORT (found by
// a probe). An option Redis does not know is still classified by what
// the rest of the command would do, as a later Redis may accept it.
func TestCommandsRedisRefusesAreLeftToRedis(t *testing.T) {
	p := compileDoc(t, ttlDoc)
	runBatchCases(t, p, []batchCase{
		{"set nx xx", []string{"SET l:k v NX XX"}, []string{""}},
		{"set two units", []string{"SET l:k v EX 99999 PX 5"}, []string{""}},
		{"set keepttl with ex", []string{"SET l:k v KEEPTTL EX 5"}, []string{""}},
		{"set ex then keepttl", []string{"SET l:k v EX 99999 KEEPTTL"}, []string{""}},
		{"set ex nx xx", []string{"SET l:k v EX 99999 NX XX"}, []string{""}},
		{"set unknown option", []string{"SET l:k v BOGUS"}, []string{"refused:ttl"}},
		// Redis 8.4's IFEQ takes KEEPTTL as its value, and sets EX's TTL.
		{"set conflict beside an unknown option", []string{"SET l:k v IFEQ KEEPTTL EX 99999"}, []string{"refused:ttl_max"}},
		{"set without a ttl still", []string{"SET l:k v NX"}, []string{"refused:ttl"}},
		{"expire nx xx", []string{"EXPIRE l:k 99999 NX XX"}, []string{""}},
		{"expire gt lt", []string{"EXPIRE l:k 99999 GT LT"}, []string{""}},
		{"expire nx gt", []string{"PEXPIRE l:k 99999999 NX GT"}, []string{""}},
		{"expire xx gt over max still", []string{"EXPIRE l:k 99999 XX GT"}, []string{"refused:ttl_max"}},
		{"setex without a value", []string{"SETEX l:k 99999"}, []string{""}},
		{"setex too many", []string{"SETEX l:k 99999 v w"}, []string{""}},
		{"persist with an extra", []string{"PERSIST s:k extra"}, []string{""}},
		{"persist", []string{"PERSIST s:k"}, []string{"refused:ttl"}},
		{"mset without a value", []string{"MSET l:a v l:b"}, []string{""}},
		{"msetnx without a value", []string{"MSETNX l:a v l:b"}, []string{""}},
		{"mset", []string{"MSET l:a v l:b w"}, []string{"refused:ttl refused:ttl"}},
		{"hset without a value", []string{"HSET l:h f v g"}, []string{""}},
		{"hmset without a value", []string{"HMSET l:h f v g"}, []string{""}},
		{"hset", []string{"HSET l:h f v g w"}, []string{"refused:ttl"}},
	})
}
