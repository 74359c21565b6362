package policy

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// fuzzWords mixes command names, options and keys that hit every rule, so
// random batches reach the interesting paths.
var fuzzWords = []string{
	"SET", "SETEX", "PSETEX", "SETNX", "GETSET", "GETEX", "MSET", "MSETNX", "INCR", "APPEND",
	"BITFIELD", "BITOP", "HSET", "LPUSH", "LMOVE", "BLMOVE", "SADD", "SMOVE", "ZADD", "ZRANGESTORE",
	"GEOADD", "GEORADIUS", "GEORADIUSBYMEMBER", "GEOSEARCHSTORE", "XADD", "XGROUP", "CREATE",
	"PFADD", "PFMERGE", "COPY", "RENAME", "RESTORE", "SORT", "PERSIST", "EXPIRE", "PEXPIRE",
	"EXPIREAT", "PEXPIREAT", "EVAL", "FCALL", "KEYS", "FLUSHALL", "CONFIG", "MULTI", "EXEC", "GET",
	"EX", "PX", "EXAT", "PXAT", "KEEPTTL", "NX", "XX", "GT", "LT", "GET", "PERSIST", "STORE",
	"STOREDIST", "COUNT", "BY", "LIMIT", "NOMKSTREAM", "MAXLEN", "MINID", "~", "=", "MKSTREAM",
	"ABSTTL", "REPLACE", "*", "0", "1", "-1", "60", "99999999999", "9223372036854775807",
	"-9223372036854775808", "s:k", "l:k", "r:k", "p:k", "session:1", "cache:x", "cache:v1:x", "foo",
	"", "<204800>",
}

const fuzzDoc = ttlDoc + namesDoc + `
[policy.values]
max_value_bytes = "64KB"
[policy.commands]
deny = ["config|set"]
[[policy.scope]]
users = ["u"]
mode = "report"
`

func TestRandomBatches(t *testing.T) {
	p := compileDoc(t, fuzzDoc)
	rng := rand.New(rand.NewPCG(1, 2))
	var out []Decision
	for range 10000 {
		reqs := make([]Request, 1+rng.IntN(6))
		for i := range reqs {
			words := make([]string, 1+rng.IntN(8))
			for j := range words {
				words[j] = fuzzWords[rng.IntN(len(fuzzWords))]
			}
			reqs[i] = cmd(words...)
			if rng.IntN(4) == 0 {
				reqs[i].User = "u"
			}
		}
		out = p.CheckBatch(reqs, out)
		checkInvariants(t, reqs, out)
	}
}

func FuzzCheckBatch(f *testing.F) {
	p := compileDoc(f, fuzzDoc)
	f.Add([]byte("SET s:k v\nEXPIRE s:k 10"))
	f.Add([]byte("MULTI\nHSET l:k f v\nEXPIRE l:k 30 XX\nEXEC"))
	f.Add([]byte("RESTORE s:k 0 x ABSTTL\nGETEX s:k PERSIST\nSORT a STORE"))
	f.Add([]byte("GEORADIUS g 1 2 3 km STORE\nXADD s:k MAXLEN ~\nEVAL x 99 a"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var reqs []Request
		for _, l := range bytes.Split(data, []byte("\n")) {
			args := bytes.Split(l, []byte(" "))
			reqs = append(reqs, Request{Cmd: table.Lookup(args), Args: args})
		}
		out := p.CheckBatch(reqs, nil)
		checkInvariants(t, reqs, out)
	})
}

func checkInvariants(t *testing.T, reqs []Request, out []Decision) {
	t.Helper()
	if len(out) != len(reqs) {
		t.Fatalf("%d decisions for %d requests", len(out), len(reqs))
	}
	for i, d := range out {
		fixed := false
		for _, v := range d.Violations {
			if (v.Outcome == Reported) != (v.Action == Report) {
				t.Fatalf("request %d: outcome %v with action %v", i, v.Outcome, v.Action)
			}
			fixed = fixed || v.Outcome == Fixed
		}
		if d.Refuse != nil && (d.Args != nil || len(d.Expires) > 0) {
			t.Fatalf("request %d refused with fixes", i)
		}
		if (d.Args != nil || len(d.Expires) > 0) && !fixed {
			t.Fatalf("request %d has fixes without a fixed violation: %s", i, summary(d))
		}
		if d.Args != nil && len(d.Args) < len(reqs[i].Args) {
			t.Fatalf("request %d: rewrite dropped arguments", i)
		}
		for _, e := range d.Expires {
			if e.Seconds <= 0 {
				t.Fatalf("request %d: expire of %d seconds", i, e.Seconds)
			}
		}
	}
}
