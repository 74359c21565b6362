package policy

import (
	"fmt"
	"slices"
	"strconv"
	"testing"

	"github.com/redproxy/redproxy/internal/commands"
)

// ttlDoc: s:* has a default (writes are fixed), l:* has none (writes are
// refused) and refuses long TTLs, r:* only reports, p:* matches no rule.
const ttlDoc = `
[policy]
[[policy.ttl]]
pattern = "s:*"
required = true
default = "24h"
max = "7d"

[[policy.ttl]]
pattern = "l:*"
required = true
max = "1m"
max_action = "refuse"

[[policy.ttl]]
pattern = "r:*"
required = true
default = "1h"
max = "1h"
action = "report"
`

var (
	nowS    = testNow.Unix()
	nowMs   = testNow.UnixMilli()
	in10dS  = strconv.FormatInt(nowS+10*86400, 10)
	in10dMs = strconv.FormatInt(nowMs+10*86400*1000, 10)
	in100S  = strconv.FormatInt(nowS+100, 10)
	in100Ms = strconv.FormatInt(nowMs+100_000, 10)
	max7dS  = strconv.FormatInt(nowS+7*86400, 10)
	max7dMs = strconv.FormatInt(nowMs+7*86400*1000, 10)
)

// TestTTLEveryKeyCreatingCommand runs each key-creating or TTL-changing
// command, one family at a time, against a key whose rule has a default.
func TestTTLEveryKeyCreatingCommand(t *testing.T) {
	p := compileDoc(t, ttlDoc)
	const fix = "fixed:ttl expire=[s:k 86400]"
	const fixD = "fixed:ttl expire=[s:d 86400]"
	cases := []struct{ cmd, want string }{
		// strings
		{"SET s:k v", "fixed:ttl args=[SET s:k v EX 86400]"},
		{"set s:k v nx get", "fixed:ttl args=[set s:k v nx get EX 86400]"},
		{"SET s:k v XX", "fixed:ttl args=[SET s:k v XX EX 86400]"},
		{"SET s:k v KEEPTTL", fix},
		{"SET s:k v EX 100", ""},
		{"SET s:k v NX PX 100000", ""},
		{"SET s:k v EXAT " + in100S, ""},
		{"SET s:k v PXAT " + in100Ms, ""},
		{"SET s:k v EX 9999999", "fixed:ttl_max args=[SET s:k v EX 604800]"},
		{"SET s:k v px 999999999999", "fixed:ttl_max args=[SET s:k v px 604800000]"},
		{"SET s:k v EXAT " + in10dS, "fixed:ttl_max args=[SET s:k v EXAT " + max7dS + "]"},
		{"SET s:k v PXAT " + in10dMs, "fixed:ttl_max args=[SET s:k v PXAT " + max7dMs + "]"},
		{"SET s:k v EX notanumber", ""}, // Redis refuses it
		{"SETEX s:k 100 v", ""},
		{"SETEX s:k 9999999 v", "fixed:ttl_max args=[SETEX s:k 604800 v]"},
		{"PSETEX s:k 100000 v", ""},
		{"PSETEX s:k 999999999999 v", "fixed:ttl_max args=[PSETEX s:k 604800000 v]"},
		{"SETNX s:k v", fix},
		{"GETSET s:k v", fix},
		{"GETEX s:k", ""},
		{"GETEX s:k EX 100", ""},
		{"GETEX s:k EX 9999999", "fixed:ttl_max args=[GETEX s:k EX 604800]"},
		{"GETEX s:k PERSIST", "refused:ttl"},
		{"MSET s:a 1 p:b 2 s:c 3", "fixed:ttl fixed:ttl expire=[s:a 86400] expire=[s:c 86400]"},
		{"MSETNX s:k 1", fix},
		{"INCR s:k", fix},
		{"INCRBY s:k 5", fix},
		{"INCRBYFLOAT s:k 0.5", fix},
		{"DECR s:k", fix},
		{"DECRBY s:k 5", fix},
		{"APPEND s:k v", fix},
		{"SETRANGE s:k 0 v", fix},
		{"SETBIT s:k 7 1", fix},
		{"BITFIELD s:k SET u8 0 1", fix},
		{"BITFIELD s:k OVERFLOW SAT INCRBY u8 0 1", fix},
		{"BITFIELD s:k GET u8 0", ""},
		{"BITOP AND s:d p:a p:b", fixD},
		// hashes
		{"HSET s:k f v", fix},
		{"HSETNX s:k f v", fix},
		{"HMSET s:k f v", fix},
		{"HINCRBY s:k f 1", fix},
		{"HINCRBYFLOAT s:k f 1.5", fix},
		{"HDEL s:k f", ""},
		// lists
		{"LPUSH s:k a", fix},
		{"RPUSH s:k a b", fix},
		{"LPUSHX s:k a", ""},
		{"RPUSHX s:k a", ""},
		{"LINSERT s:k BEFORE a b", ""},
		{"LSET s:k 0 a", ""},
		{"LMOVE p:src s:d LEFT RIGHT", fixD},
		{"BLMOVE p:src s:d LEFT RIGHT 0", fixD},
		{"RPOPLPUSH p:src s:d", fixD},
		{"BRPOPLPUSH p:src s:d 0", fixD},
		{"LMOVE s:k p:d LEFT RIGHT", ""}, // the source only loses elements
		// sets
		{"SADD s:k m", fix},
		{"SMOVE p:a s:d m", fixD},
		{"SUNIONSTORE s:d p:a p:b", fixD},
		{"SINTERSTORE s:d p:a", fixD},
		{"SDIFFSTORE s:d p:a", fixD},
		{"SREM s:k m", ""},
		// sorted sets
		{"ZADD s:k 1 m", fix},
		{"ZADD s:k NX CH 1 m", fix},
		{"ZADD s:k GT INCR 1 m", fix},
		{"ZADD s:k XX 1 m", ""},
		{"ZADD s:k CH xx 1 m", ""},
		{"ZINCRBY s:k 1 m", fix},
		{"ZUNIONSTORE s:d 1 p:a", fixD},
		{"ZINTERSTORE s:d 2 p:a p:b", fixD},
		{"ZDIFFSTORE s:d 1 p:a", fixD},
		{"ZRANGESTORE s:d p:a 0 -1", fixD},
		// geo
		{"GEOADD s:k 13.36 38.11 m", fix},
		{"GEOADD s:k XX 13.36 38.11 m", ""},
		{"GEORADIUS p:g 15 37 200 km STORE s:d", fixD},
		{"GEORADIUS p:g 15 37 200 km COUNT 5 STOREDIST s:d", fixD},
		{"GEORADIUS p:g 15 37 200 km WITHDIST", ""},
		{"GEORADIUSBYMEMBER p:g m 200 km STORE s:d", fixD},
		{"GEOSEARCHSTORE s:d p:g FROMMEMBER m BYRADIUS 10 km", fixD},
		// streams
		{"XADD s:k * f v", fix},
		{"XADD s:k MAXLEN ~ 1000 * f v", fix},
		{"XADD s:k MINID = 0 LIMIT 10 * f v", fix},
		{"XADD s:k NOMKSTREAM * f v", ""},
		{"XADD s:k MAXLEN 10 NOMKSTREAM * f v", ""},
		{"XGROUP CREATE s:k g $ MKSTREAM", fix},
		{"XGROUP CREATE s:k g $", ""},
		// hyperloglog
		{"PFADD s:k a", fix},
		{"PFMERGE s:d p:a", fixD},
		// keyspace
		// The TTL taken from p:a may be above max: lowered after (LT).
		{"COPY p:a s:d", fixD + " expire=[s:d 604800 lt]"},
		{"COPY p:a s:d DB 1 REPLACE", "fixed:ttl expire=[s:d 86400 db=1] expire=[s:d 604800 lt db=1]"},
		{"RENAME p:a s:d", fixD + " expire=[s:d 604800 lt]"},
		{"RENAMENX p:a s:d", fixD + " expire=[s:d 604800 lt]"},
		{"RESTORE s:k 0 payload", "fixed:ttl args=[RESTORE s:k 86400000 payload]"},
		{"RESTORE s:k 0 payload REPLACE ABSTTL", "fixed:ttl args=[RESTORE s:k " + strconv.FormatInt(nowMs+86400000, 10) + " payload REPLACE ABSTTL]"},
		{"RESTORE s:k 5000 payload", ""},
		{"RESTORE s:k 999999999999 payload", "fixed:ttl_max args=[RESTORE s:k 604800000 payload]"},
		{"RESTORE s:k " + in10dMs + " payload ABSTTL", "fixed:ttl_max args=[RESTORE s:k " + max7dMs + " payload ABSTTL]"},
		{"SORT p:l STORE s:d", fixD},
		{"SORT p:l BY nosort LIMIT 0 10 GET # ALPHA STORE s:d", fixD},
		{"SORT p:l BY store GET store", ""},
		{"SORT p:l", ""},
		{"PERSIST s:k", "refused:ttl"},
		{"EXPIRE s:k 100", ""},
		{"EXPIRE s:k 9999999", "fixed:ttl_max args=[EXPIRE s:k 604800]"},
		{"EXPIRE s:k 9999999 NX", "fixed:ttl_max args=[EXPIRE s:k 604800 NX]"},
		{"PEXPIRE s:k 999999999999", "fixed:ttl_max args=[PEXPIRE s:k 604800000]"},
		{"EXPIREAT s:k " + in10dS, "fixed:ttl_max args=[EXPIREAT s:k " + max7dS + "]"},
		{"PEXPIREAT s:k " + in10dMs, "fixed:ttl_max args=[PEXPIREAT s:k " + max7dMs + "]"},
		{"EXPIRE s:k 0", ""},
		{"EXPIRE s:k -5", ""},
		{"DEL s:k", ""},
		{"GET s:k", ""},
		{"EVAL return 1 1 s:k", ""}, // scripts: TTLs cannot be checked
		// keys no rule matches
		{"SET p:k v", ""},
		{"HSET p:k f v", ""},
		{"PERSIST p:k", ""},
		{"EXPIRE p:k 999999999", ""},
	}
	for _, c := range cases {
		t.Run(c.cmd, func(t *testing.T) {
			out := checkBatch(t, p, []Request{line(c.cmd)})
			if got := summary(out[0]); got != c.want {
				t.Errorf("%s\n got: %q\nwant: %q", c.cmd, got, c.want)
			}
		})
	}
}

// TestTTLWithoutDefault: a rule without default refuses what it cannot fix,
// and max_action = "refuse" refuses long TTLs instead of clamping.
func TestTTLWithoutDefault(t *testing.T) {
	p := compileDoc(t, ttlDoc)
	cases := []struct{ cmd, want string }{
		{"SET l:k v", "refused:ttl"},
		{"SET l:k v NX PX 5000", ""},
		{"SET l:k v EX 60", ""},
		{"SET l:k v EX 61", "refused:ttl_max"},
		{"SET l:k v PX 60001", "refused:ttl_max"},
		{"HSET l:k f v", "refused:ttl"},
		{"MSET p:a 1 l:k 2", "refused:ttl"},
		{"EXPIRE l:k 3600", "refused:ttl_max"},
		// report-only rule: nothing changes
		{"SET r:k v", "reported:ttl"},
		{"HSET r:k f v", "reported:ttl"},
		{"EXPIRE r:k 7200", "reported:ttl_max"},
		{"PERSIST r:k", "reported:ttl"},
	}
	for _, c := range cases {
		out := checkBatch(t, p, []Request{line(c.cmd)})
		if got := summary(out[0]); got != c.want {
			t.Errorf("%s\n got: %q\nwant: %q", c.cmd, got, c.want)
		}
	}
}

func TestTTLMessages(t *testing.T) {
	p := compileDoc(t, ttlDoc)
	cases := []struct{ cmd, msg string }{
		{"SET l:1 v", `ERR redproxy policy: key "l:1" needs a TTL (rule "l:*"); set EX on the write, or EXPIRE the key in the same MULTI, or in the same pipeline sent in one write`},
		// Only SET takes EX: an HSET or INCR is told to EXPIRE.
		{"HSET l:1 f v", `ERR redproxy policy: key "l:1" needs a TTL (rule "l:*"); EXPIRE the key in the same MULTI, or in the same pipeline sent in one write`},
		{"INCR l:1", `ERR redproxy policy: key "l:1" needs a TTL (rule "l:*"); EXPIRE the key in the same MULTI, or in the same pipeline sent in one write`},
		{"SET l:1 v KEEPTTL", `ERR redproxy policy: key "l:1" needs a TTL (rule "l:*"); EXPIRE the key in the same MULTI, or in the same pipeline sent in one write`},
		// Commands with a SET form that takes EX are pointed at it (a
		// user's trial: SETNX was told to EXPIRE).
		{"SETNX l:1 v", `ERR redproxy policy: key "l:1" needs a TTL (rule "l:*"); use SET key value NX EX <seconds> instead, or EXPIRE the key in the same MULTI, or in the same pipeline sent in one write`},
		{"GETSET l:1 v", `ERR redproxy policy: key "l:1" needs a TTL (rule "l:*"); use SET key value GET EX <seconds> instead, or EXPIRE the key in the same MULTI, or in the same pipeline sent in one write`},
		{"RESTORE l:1 0 payload", `ERR redproxy policy: key "l:1" needs a TTL (rule "l:*"); give RESTORE a ttl, or EXPIRE the key in the same MULTI, or in the same pipeline sent in one write`},
		{"SET l:1 v EX 120", `ERR redproxy policy: TTL of 120s for key "l:1" exceeds the maximum of 60s (rule "l:*")`},
		// In the command's unit where seconds would hide the excess.
		{"SET l:1 v PX 60001", `ERR redproxy policy: TTL of 60001ms for key "l:1" exceeds the maximum of 60s (rule "l:*")`},
		{"PEXPIRE l:1 120000", `ERR redproxy policy: TTL of 120s for key "l:1" exceeds the maximum of 60s (rule "l:*")`},
		{"PERSIST l:1", `ERR redproxy policy: key "l:1" must keep its TTL (rule "l:*"); PERSIST would remove it`},
	}
	for _, c := range cases {
		out := checkBatch(t, p, []Request{line(c.cmd)})
		if out[0].Refuse == nil || out[0].Refuse.Message() != c.msg {
			t.Errorf("%s: got %+v, want message %q", c.cmd, out[0].Refuse, c.msg)
			continue
		}
		v := out[0].Refuse
		if v.Pattern != "l:*" || string(v.Key) != "l:1" || v.Action != Enforce {
			t.Errorf("%s: violation %+v", c.cmd, *v)
		}
	}
}

// TestTTLLookahead: a write followed, later in the same batch, by a command
// that sets the key's TTL needs no fix.
func TestTTLLookahead(t *testing.T) {
	p := compileDoc(t, ttlDoc)
	cases := []batchCase{
		{"hset then expire", []string{"HSET s:k f v", "EXPIRE s:k 100"}, []string{"", ""}},
		{"multi incr expire", []string{"MULTI", "INCR l:k", "EXPIRE l:k 60", "EXEC"}, []string{"", "", "", ""}},
		{"expire nx counts", []string{"HSET l:k f v", "EXPIRE l:k 30 NX"}, []string{"", ""}},
		{"expire lt counts", []string{"HSET l:k f v", "EXPIRE l:k 30 LT"}, []string{"", ""}},
		{"pexpireat counts", []string{"HSET l:k f v", "PEXPIREAT l:k " + strconv.FormatInt(nowMs+30_000, 10)}, []string{"", ""}},
		{"set ex counts", []string{"HSET s:k f v", "SET s:k v EX 100"}, []string{"", ""}},
		// GETEX answers WRONGTYPE for a set, so it does not count.
		{"getex ex does not count", []string{"SADD s:k m", "GETEX s:k EX 100"}, []string{"fixed:ttl expire=[s:k 86400]", ""}},
		{"other key", []string{"HSET s:k f v", "EXPIRE s:other 100"}, []string{"fixed:ttl expire=[s:k 86400]", ""}},
		{"expire xx does not count", []string{"HSET l:k f v", "EXPIRE l:k 30 XX"}, []string{"refused:ttl", ""}},
		{"expire gt does not count", []string{"HSET l:k f v", "EXPIRE l:k 30 GT"}, []string{"refused:ttl", ""}},
		{"expire before write", []string{"EXPIRE l:k 30", "HSET l:k f v"}, []string{"", "refused:ttl"}},
		{"refused expire does not count", []string{"HSET l:k f v", "EXPIRE l:k 3600"}, []string{"refused:ttl", "refused:ttl_max"}},
		{"clamped expire counts", []string{"HSET s:k f v", "EXPIRE s:k 99999999"}, []string{"", "fixed:ttl_max args=[EXPIRE s:k 604800]"}},
		{"mset partly covered", []string{"MSET s:a 1 s:b 2", "EXPIRE s:a 10"}, []string{"fixed:ttl expire=[s:b 86400]", ""}},
		{"persist then expire", []string{"PERSIST l:k", "EXPIRE l:k 10"}, []string{"", ""}},
		// Redis refuses a number with a leading zero (string2ll): it gives
		// no TTL (found by review).
		{"leading zero does not count", []string{"HSET s:k f v", "EXPIRE s:k 0100"}, []string{"fixed:ttl expire=[s:k 86400]", ""}},
		{"leading zero lock refused", []string{"SET l:k me NX", "EXPIRE l:k 030"}, []string{"refused:ttl", ""}},
		{"plus sign does not count", []string{"HSET s:k f v", "EXPIRE s:k +100"}, []string{"fixed:ttl expire=[s:k 86400]", ""}},
		// A 19-digit number Redis takes is still checked against max.
		{"19 digits checked", []string{"PEXPIREAT s:k 1000000000000000000"}, []string{"fixed:ttl_max args=[PEXPIREAT s:k " + strconv.FormatInt(nowMs+7*24*3600*1000, 10) + "]"}},
		{"tag invalidation", []string{"MULTI", "SETEX s:p 3600 data", "SADD s:tag s:p", "EXPIRE s:tag 3600", "EXEC"}, []string{"", "", "", "", ""}},
	}
	runBatchCases(t, p, cases)
}

// TestTTLLookaheadLargeBatch covers the map used once a batch has many TTL
// writes, with the same expectations as the linear scan.
func TestTTLLookaheadLargeBatch(t *testing.T) {
	p := compileDoc(t, ttlDoc)
	const n = 200
	var interleaved, writesFirst, uncovered []string
	for i := range n {
		interleaved = append(interleaved, fmt.Sprintf("HSET l:%d f v", i), fmt.Sprintf("EXPIRE l:%d 30", i))
		writesFirst = append(writesFirst, fmt.Sprintf("HSET l:%d f v", i))
		uncovered = append(uncovered, fmt.Sprintf("EXPIRE l:x%d 30", i), fmt.Sprintf("HSET l:x%d f v", i))
	}
	for i := range n {
		writesFirst = append(writesFirst, fmt.Sprintf("EXPIRE l:%d 30", i))
	}
	for name, b := range map[string][]string{"interleaved": interleaved, "writes first": writesFirst} {
		for i, d := range checkBatch(t, p, batch(b...)) {
			if s := summary(d); s != "" {
				t.Fatalf("%s: request %d (%s): %s", name, i, b[i], s)
			}
		}
	}
	for i, d := range checkBatch(t, p, batch(uncovered...)) {
		want := ""
		if i%2 == 1 {
			want = "refused:ttl"
		}
		if s := summary(d); s != want {
			t.Fatalf("uncovered: request %d (%s): got %q want %q", i, uncovered[i], s, want)
		}
	}
}

// TestEffectTableComplete keeps the TTL classification in step with the
// command table: every write command must be classified or listed as having
// no TTL effect, and every classified name must exist.
func TestEffectTableComplete(t *testing.T) {
	for _, c := range allCommands() {
		if !c.Is(commands.Write) {
			continue
		}
		_, classified := effectTable[c.Name]
		listed := slices.Contains(noTTLEffect, c.Name)
		if classified == listed {
			t.Errorf("write command %q: classified=%v, in noTTLEffect=%v; it must be exactly one", c.Name, classified, listed)
		}
	}
	for name := range effectTable {
		if table.Get(name) == nil {
			t.Errorf("effectTable names unknown command %q", name)
		}
	}
	for _, name := range noTTLEffect {
		if table.Get(name) == nil {
			t.Errorf("noTTLEffect names unknown command %q", name)
		}
	}
}

func allCommands() []*commands.Command {
	var all []*commands.Command
	for _, c := range table.Commands() {
		all = append(all, c)
		for _, s := range c.Subcommands {
			all = append(all, s)
		}
	}
	return all
}

// TestEffectsShortArgs: classifiers must not index past the arguments.
func TestEffectsShortArgs(t *testing.T) {
	for name, f := range effectTable {
		args := [][]byte{[]byte(name)}
		for n := 1; n < 8; n++ {
			for _, e := range f(args, nil) {
				if e.key >= len(args) || (e.kind == effSetTTL && e.ttl >= len(args)) {
					t.Errorf("%s with %d args: effect %+v out of range", name, len(args), e)
				}
			}
			args = append(args, []byte("x"))
		}
	}
}

func TestParseInt(t *testing.T) {
	// As Redis's string2ll (EXPIRE k <n> on redis-server 7.0.15 refuses
	// every rejected case).
	cases := map[string]int64{"0": 0, "42": 42, "-7": -7, "100": 100, "-100": -100, "10": 10,
		"9223372036854775807": 1<<63 - 1, "-9223372036854775808": -1 << 63, "1000000000000000000": 1e18}
	for s, want := range cases {
		if n, ok := parseInt([]byte(s)); !ok || n != want {
			t.Errorf("parseInt(%q) = %d, %v", s, n, ok)
		}
	}
	for _, s := range []string{"", "-", "+1", "1.5", " 1", "1 ", "9223372036854775808", "-9223372036854775809", "12345678901234567890",
		"1e3", "0100", "030", "00", "-0", "-01", "+0", "0x10", "100\x00", "18446744073709551616", "99999999999999999999999"} {
		if _, ok := parseInt([]byte(s)); ok {
			t.Errorf("parseInt(%q) accepted", s)
		}
	}
}
