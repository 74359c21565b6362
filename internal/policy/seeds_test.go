package policy

import (
	"github.com/redproxy/redproxy/internal/seeds"
	"os"
	"strconv"
	"strings"
	"testing"
)

func examplePolicy(t *testing.T) *Policy {
	t.Helper()
	doc, err := os.ReadFile("testdata/policy.example.toml")
	if err != nil {
		t.Fatal(err)
	}
	return compileDoc(t, string(doc))
}

// seedPatterns are the seeds' recommended patterns, each as the batch a
// client library sends (a pipeline, or MULTI ... EXEC for transactions).
var seedPatterns = []struct {
	name  string
	batch [][]string
}{
	{"cache-aside", [][]string{
		{"GET", "product:123"},
		{"SETEX", "product:123", "3600", `{"id":123,"name":"widget"}`},
	}},
	{"write-through", [][]string{
		{"SETEX", "product:123", "3600", `{"id":123,"name":"gadget"}`},
	}},
	{"tag-based invalidation", [][]string{
		{"MULTI"},
		{"SETEX", "product:1", "3600", `{"id":1}`},
		{"SADD", "tag:category:7", "product:1"},
		{"EXPIRE", "tag:category:7", "3600"},
		{"EXEC"},
	}},
	{"invalidate category", [][]string{
		{"SMEMBERS", "tag:category:7"},
		{"DEL", "product:1", "product:2"},
		{"DEL", "tag:category:7"},
	}},
	{"session storage", [][]string{
		{"MULTI"},
		{"HSET", "session:4f9c2d1e-8a7b-4c3d-9e2f-1a2b3c4d5e6f", "user_id", "42", "created_at", "1700000000"},
		{"EXPIRE", "session:4f9c2d1e-8a7b-4c3d-9e2f-1a2b3c4d5e6f", "86400"},
		{"EXEC"},
		{"HGETALL", "session:4f9c2d1e-8a7b-4c3d-9e2f-1a2b3c4d5e6f"},
		{"DEL", "session:4f9c2d1e-8a7b-4c3d-9e2f-1a2b3c4d5e6f"},
	}},
	{"fixed window rate limit", [][]string{
		{"MULTI"},
		{"INCR", "ratelimit:123:28333333"},
		{"EXPIRE", "ratelimit:123:28333333", "60"},
		{"EXEC"},
	}},
	{"sliding window rate limit", [][]string{
		{"EVAL", seeds.SlidingWindowScript, "1", "ratelimit:sliding:123", "1700000000000", "60000", "100"},
		{"EVALSHA", "2b0b4bb0d5c2e1a8c7e3f0d9a6b5c4d3e2f1a0b9", "1", "ratelimit:sliding:123", "1700000000000", "60000", "100"},
	}},
	{"distributed lock", [][]string{
		{"SET", "lock:order:payment:123", "9b2c7e4a-1d3f-4e5a-8b6c-7d8e9f0a1b2c", "NX", "PX", "5000"},
		{"EVAL", seeds.ReleaseLockScript, "1", "lock:order:payment:123", "9b2c7e4a-1d3f-4e5a-8b6c-7d8e9f0a1b2c"},
	}},
	{"stampede-safe fill", [][]string{
		{"GET", "product:9"},
		{"SET", "lock:product:9", "token", "NX", "PX", "5000"},
		{"SETEX", "product:9", "300", `{"id":9}`},
	}},
	{"pub/sub", [][]string{
		{"PUBLISH", "invalidation", `{"reason":"content_publish"}`},
	}},
	{"streams", [][]string{
		{"XADD", "events:orders", "MAXLEN", "10000", "*", "order_id", "1", "status", "paid"},
		{"XGROUP", "CREATE", "events:orders", "processor", "0", "MKSTREAM"},
		{"XREADGROUP", "GROUP", "processor", "worker-1", "COUNT", "10", "BLOCK", "2000", "STREAMS", "events:orders", ">"},
		{"XACK", "events:orders", "processor", "1700000000000-0"},
	}},
	{"idempotency SET NX EX", [][]string{
		{"SET", "cooldown:sms:user:42", "1", "NX", "EX", "60"},
	}},
	{"versioned accelerator cache keys", [][]string{
		{"SET", "states:all:v14", `{"states":[]}`, "EX", "600"},
		{"SET", "voice:all:v2", `{}`, "EX", "600"},
		{"SETEX", "cache:product:v2:789", "600", `{}`},
	}},
	{"naming conventions with TTLs", [][]string{
		{"SET", "user:123:profile", "{}", "EX", "3600"},
		{"SET", "order:456:status", "paid", "EX", "3600"},
		{"SET", "stats:pageviews:2024-01-01", "0", "EX", "86400"},
		{"ZADD", "scores:weekly", "100", "alice"},
		{"EXPIRE", "scores:weekly", "3600"},
	}},
}

// seedAntiPatterns are the seeds' anti-patterns with the rule that catches
// each. convention marks a rule the example ships in report mode because it
// encodes one application's conventions: the example only reports it, and
// refuses it once its action is set to follow the mode.
var seedAntiPatterns = []struct {
	name       string
	args       []string
	rule       string
	convention bool
}{
	{"KEYS * in production", []string{"KEYS", "*"}, RuleCommand, false},
	{"FLUSHALL without thought", []string{"FLUSHALL"}, RuleCommand, false},
	{"key without TTL", []string{"SET", "lock:nightly-job", "worker-1", "NX"}, RuleTTL, false},
	{"large blob", []string{"SETEX", "product:1", "3600", "<204800>"}, RuleValueSize, false},
	{"unnamed key", []string{"SET", "foo", "bar", "EX", "60"}, RuleNamespaces, true},
}

func seedBatch(lines [][]string) []Request {
	reqs := make([]Request, len(lines))
	for i, l := range lines {
		reqs[i] = cmd(l...)
	}
	return reqs
}

// TestSeedPatternsPass: under the example policy every seed pattern passes
// with no violation, no rewrite and no fix-up.
func TestSeedPatternsPass(t *testing.T) {
	p := examplePolicy(t)
	for _, pat := range seedPatterns {
		t.Run(pat.name, func(t *testing.T) {
			out := checkBatch(t, p, seedBatch(pat.batch))
			for i, d := range out {
				if s := summary(d); s != "" {
					t.Errorf("%s: %s", strings.Join(pat.batch[i], " "), s)
					for _, v := range d.Violations {
						t.Logf("  %s", v.Message())
					}
				}
			}
		})
	}
}

// TestSeedAntiPatterns: each anti-pattern is refused with the right rule
// under enforce, and only reported (forwarded unchanged) in report mode,
// whether report comes from --policy-mode or from the file's mode.
func TestSeedAntiPatterns(t *testing.T) {
	p := examplePolicy(t)
	doc, _ := os.ReadFile("testdata/policy.example.toml")
	reportDoc := strings.Replace(string(doc), `mode = "enforce"`, `mode = "report"`, 1)
	if reportDoc == string(doc) {
		t.Fatal("example has no mode line to change")
	}
	fileReport := compileDoc(t, reportDoc)
	// The naming rules turned to enforce, as the example's comment tells an
	// operator to once /policy/report is clean.
	namesOn := "[policy.names]\n# Report only: the namespace list and the version rule are one\n# application's conventions (see config.example.toml).\naction = \"\"\n"
	strictDoc := strings.Replace(string(doc), strings.Replace(namesOn, `action = ""`, `action = "report"`, 1), namesOn, 1)
	if strictDoc == string(doc) {
		t.Fatal("example has no [policy.names] action line to change")
	}
	strict := compileDoc(t, strictDoc)
	for _, ap := range seedAntiPatterns {
		t.Run(ap.name, func(t *testing.T) {
			req := cmd(ap.args...)
			if ap.convention {
				d := checkBatch(t, p, []Request{req})[0]
				if d.Refuse != nil || d.Args != nil || len(d.Expires) > 0 || len(d.Violations) == 0 || d.Violations[0].Rule != ap.rule {
					t.Errorf("example: got %q, want only reported by %s", summary(d), ap.rule)
				}
			}
			d := checkBatch(t, strict, []Request{req})[0]
			if d.Refuse == nil || d.Refuse.Rule != ap.rule {
				t.Errorf("enforce: got %q, want refused by %s", summary(d), ap.rule)
			} else if strings.Contains(d.Refuse.Message(), "xxxxxxxx") {
				t.Errorf("message contains the value: %q", d.Refuse.Message())
			}
			for name, rp := range map[string]*Policy{"--policy-mode=report": p.ForcedMode(Report), "mode = report": fileReport} {
				d := checkBatch(t, rp, []Request{req})[0]
				if d.Refuse != nil || d.Args != nil || len(d.Expires) > 0 {
					t.Errorf("%s: not forwarded unchanged: %q", name, summary(d))
				}
				found := false
				for _, v := range d.Violations {
					found = found || (v.Rule == ap.rule && v.Outcome == Reported && v.Action == Report)
				}
				if !found {
					t.Errorf("%s: got %q, want reported %s", name, summary(d), ap.rule)
				}
			}
		})
	}
}

// TestSeedTTLTable checks the example's TTL rules against the seeds' TTL
// strategy table.
func TestSeedTTLTable(t *testing.T) {
	p := examplePolicy(t)
	cases := []struct {
		key           string
		pattern       string
		def, min, max int64 // seconds; def 0 = none
	}{
		{"session:abc", "session:*", 86400, 86400, 7 * 86400},
		{"cache:api:v1:x", "cache:*", 300, 300, 900},
		{"ratelimit:user:123", "ratelimit:*", 3600, 60, 86400},
		{"token:reset:1", "token:*", 300, 300, 600},
		{"leaderboard:daily", "leaderboard:*", 3600, 3600, 86400},
		{"product:1", "product:*", 3600, 3600, 7 * 86400},
		{"lock:job", "lock:*", 0, 1, 3600},
	}
	for _, c := range cases {
		r, ok := p.TTLRule([]byte(c.key))
		if !ok || r.Pattern != c.pattern || !r.Required || int64(r.Default.Seconds()) != c.def || int64(r.Max.Seconds()) != c.max {
			t.Errorf("%s: rule %+v, %v", c.key, r, ok)
			continue
		}
		// The table's shortest TTL passes untouched, one second over max does not.
		ok1 := checkBatch(t, p, []Request{cmd("SET", c.key, "v", "EX", strconv.FormatInt(c.min, 10))})[0]
		over := checkBatch(t, p, []Request{cmd("SET", c.key, "v", "EX", strconv.FormatInt(c.max+1, 10))})[0]
		if summary(ok1) != "" || len(over.Violations) == 0 || over.Violations[0].Rule != RuleTTLMax {
			t.Errorf("%s: min TTL %q, over max %q", c.key, summary(ok1), summary(over))
		}
	}
	// Keys no specific rule covers are reported, never refused.
	d := checkBatch(t, p, []Request{cmd("SADD", "visitors:2024-01-01", "u1")})[0]
	if summary(d) != "reported:ttl" || d.Violations[0].Pattern != "*" {
		t.Errorf("catch-all: %q", summary(d))
	}
	// Streams are exempt.
	if s := summary(checkBatch(t, p, []Request{cmd("XADD", "events:orders", "*", "a", "1")})[0]); s != "" {
		t.Errorf("stream: %q", s)
	}
}
