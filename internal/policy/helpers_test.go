package policy

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pelletier/go-toml/v2"

	"github.com/redproxy/redproxy/internal/commands"
)

var table = commands.Builtin()

// testNow is the clock of every compiled test policy, so EXAT/PXAT cases
// are exact.
var testNow = time.Unix(1_700_000_000, 0)

// parseConfig decodes a TOML document holding a [policy] section the way
// the config package does: over the defaults, rejecting unknown keys.
func parseConfig(t testing.TB, doc string) Config {
	t.Helper()
	var file struct {
		Policy Config `toml:"policy"`
	}
	file.Policy = DefaultConfig()
	if err := toml.NewDecoder(strings.NewReader(doc)).DisallowUnknownFields().Decode(&file); err != nil {
		t.Fatalf("decode policy: %v\n%s", err, doc)
	}
	return file.Policy
}

func compileDoc(t testing.TB, doc string) *Policy {
	t.Helper()
	p, err := Compile(parseConfig(t, doc))
	if err != nil {
		t.Fatalf("compile: %v\n%s", err, doc)
	}
	p.now = func() time.Time { return testNow }
	return p
}

// cmd builds a request from words; "<N>" stands for an N-byte value.
func cmd(words ...string) Request {
	args := make([][]byte, len(words))
	for i, w := range words {
		var n int
		if _, err := fmt.Sscanf(w, "<%d>", &n); err == nil && strings.HasPrefix(w, "<") && strings.HasSuffix(w, ">") {
			args[i] = []byte(strings.Repeat("x", n))
			continue
		}
		args[i] = []byte(w)
	}
	return Request{Cmd: table.Lookup(args), Args: args}
}

// line splits a command line on spaces.
func line(s string) Request { return cmd(strings.Fields(s)...) }

func batch(lines ...string) []Request {
	reqs := make([]Request, len(lines))
	for i, l := range lines {
		reqs[i] = line(l)
	}
	return reqs
}

// summary renders a decision compactly: "" when clean, else the outcomes
// and rules of its violations, then any rewrite and fix-ups, e.g.
// "fixed:ttl expire=[s:k 86400]" or "refused:command".
func summary(d Decision) string {
	var parts []string
	for _, v := range d.Violations {
		parts = append(parts, v.Outcome.String()+":"+v.Rule)
	}
	if d.Args != nil {
		parts = append(parts, "args=["+joinArgs(d.Args)+"]")
	}
	for _, e := range d.Expires {
		lt := ""
		if e.LT {
			lt = " lt"
		}
		if e.DB != nil {
			parts = append(parts, fmt.Sprintf("expire=[%s %d%s db=%s]", e.Key, e.Seconds, lt, e.DB))
			continue
		}
		parts = append(parts, fmt.Sprintf("expire=[%s %d%s]", e.Key, e.Seconds, lt))
	}
	return strings.Join(parts, " ")
}

func joinArgs(args [][]byte) string {
	s := make([]string, len(args))
	for i, a := range args {
		s[i] = string(a)
	}
	return strings.Join(s, " ")
}

// checkBatch runs CheckBatch and checks invariants every decision must
// keep, whatever the rules.
func checkBatch(t testing.TB, p *Policy, reqs []Request) []Decision {
	t.Helper()
	out := p.CheckBatch(reqs, nil)
	if len(out) != len(reqs) {
		t.Fatalf("got %d decisions for %d requests", len(out), len(reqs))
	}
	for i, d := range out {
		isOpen := func(j int) bool { return slices.ContainsFunc(d.Open, func(o OpenTTL) bool { return o.V == j }) }
		for _, o := range d.Open {
			if v := d.Violations[o.V]; v.Rule != RuleTTL || (v.Outcome == Fixed) != (o.Fix != nil) {
				t.Errorf("request %d: open violation %d is %s:%s with fix %v", i, o.V, v.Outcome, v.Rule, o.Fix)
			}
			if o.Fix != nil && !d.AllOpen() {
				t.Errorf("request %d: a fixed requirement open beside others: %s", i, summary(d))
			}
		}
		if d.Refuse != nil && len(d.Open) > 0 {
			// Deferrable: every refusal is an open one.
			for j, v := range d.Violations {
				if v.Outcome == Refused && !isOpen(j) {
					t.Errorf("request %d: refused by %s yet open: %s", i, v.Rule, summary(d))
				}
			}
		}
		if d.Refuse != nil {
			// An open refusal keeps the other keys' fixes, for a
			// transaction that forwards the write (Decision.Open).
			if len(d.Open) == 0 && (d.Args != nil || len(d.Expires) > 0) {
				t.Errorf("request %d refused but has fixes: %s", i, summary(d))
			}
			if d.Refuse.Outcome != Refused || !strings.HasPrefix(d.Refuse.Message(), "ERR redproxy policy: ") {
				t.Errorf("request %d: bad refusal %+v", i, *d.Refuse)
			}
		}
		for _, v := range d.Violations {
			if !strings.HasPrefix(v.Message(), "ERR redproxy policy: ") {
				t.Errorf("request %d: message without prefix: %q", i, v.Message())
			}
		}
	}
	return out
}

// batchCase is one batch for the look-ahead tests: the requests as command
// lines and the summary expected for each request's decision.
type batchCase struct {
	name  string
	batch []string
	want  []string
}

// runBatchCases checks each case's batch with p, as a subtest.
func runBatchCases(t *testing.T, p *Policy, cases []batchCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out := checkBatch(t, p, batch(c.batch...))
			for i := range out {
				if got := summary(out[i]); got != c.want[i] {
					t.Errorf("request %d (%s): got %q, want %q", i, c.batch[i], got, c.want[i])
				}
			}
		})
	}
}
