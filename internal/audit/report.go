package audit

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Report is the result of one audit.
type Report struct {
	Keys            int64         `json:"keys_scanned"`
	Duration        time.Duration `json:"-"`
	DurationSeconds float64       `json:"duration_seconds"`
	// Complete is false when the walk stopped early (context, Redis error).
	Complete bool `json:"complete"`
	// Exact is false when more keys were seen than Options.MaxTracked, so
	// SCAN duplicates may be counted twice.
	Exact bool `json:"exact"`
	// NoTTL counts every key without a TTL, whatever the rules say.
	NoTTL Finding `json:"no_ttl"`
	// TTL holds, per TTL rule, the keys without a TTL the rule requires
	// (rule "ttl") and the keys whose TTL exceeds its max (rule "ttl_max").
	TTL []RuleFinding `json:"ttl_rules"`
	// Names holds, per naming rule, the keys breaking it.
	Names []RuleFinding `json:"names"`
	// BigKeys are keys whose MEMORY USAGE exceeds the threshold.
	BigKeys BigKeyFinding `json:"big_keys"`
}

// Finding is a count of keys with example keys (the first seen).
type Finding struct {
	Count    int64    `json:"count"`
	Examples []string `json:"examples"`
}

func (f *Finding) add(key string, max int) {
	f.Count++
	if len(f.Examples) < max {
		f.Examples = append(f.Examples, key)
	}
}

// RuleFinding is a Finding for one policy rule. Rule is a policy.Rule*
// name; Pattern the TTL rule's or require_version's pattern, if any.
type RuleFinding struct {
	Rule    string `json:"rule"`
	Pattern string `json:"pattern,omitempty"`
	Finding
}

// BigKeyFinding keeps the biggest keys as examples.
type BigKeyFinding struct {
	Checked   bool     `json:"checked"` // false with Options.SkipMemory
	Threshold int64    `json:"threshold_bytes"`
	Count     int64    `json:"count"`
	Examples  []BigKey `json:"examples"` // biggest first
}

// BigKey is one big key and its MEMORY USAGE.
type BigKey struct {
	Key   string `json:"key"`
	Bytes int64  `json:"bytes"`
}

func (b *BigKeyFinding) add(key string, bytes int64, max int) {
	b.Count++
	if len(b.Examples) < max {
		b.Examples = append(b.Examples, BigKey{key, bytes})
		return
	}
	// Replace the smallest example if this key is bigger; max is small, so
	// a linear scan beats a heap.
	smallest := 0
	for i := range b.Examples {
		if b.Examples[i].Bytes < b.Examples[smallest].Bytes {
			smallest = i
		}
	}
	if bytes > b.Examples[smallest].Bytes {
		b.Examples[smallest] = BigKey{key, bytes}
	}
}

func newReport(o Options) *Report {
	return &Report{
		Exact:   true,
		NoTTL:   Finding{Examples: []string{}},
		TTL:     []RuleFinding{},
		Names:   []RuleFinding{},
		BigKeys: BigKeyFinding{Checked: !o.SkipMemory, Threshold: o.BigKeyBytes, Examples: []BigKey{}},
	}
}

// finding returns the entry of list for rule and pattern, adding it.
func (r *Report) finding(list *[]RuleFinding, rule, pattern string) *Finding {
	for i := range *list {
		if f := &(*list)[i]; f.Rule == rule && f.Pattern == pattern {
			return &f.Finding
		}
	}
	*list = append(*list, RuleFinding{Rule: rule, Pattern: pattern, Finding: Finding{Examples: []string{}}})
	return &(*list)[len(*list)-1].Finding
}

// sort orders findings by count, largest first, so the worst is on top.
func (r *Report) sort() {
	byCount := func(a, b RuleFinding) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Rule, b.Rule), cmp.Compare(a.Pattern, b.Pattern))
	}
	slices.SortFunc(r.TTL, byCount)
	slices.SortFunc(r.Names, byCount)
	slices.SortFunc(r.BigKeys.Examples, func(a, b BigKey) int {
		return cmp.Or(cmp.Compare(b.Bytes, a.Bytes), cmp.Compare(a.Key, b.Key))
	})
}

// JSON renders the report as indented JSON.
func (r *Report) JSON() ([]byte, error) { return json.MarshalIndent(r, "", "  ") }

// textExamples is how many examples a table row shows; JSON has them all.
const textExamples = 3

// WriteText writes a fixed-width summary table.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	rate := 0.0
	if r.DurationSeconds > 0 {
		rate = float64(r.Keys) / r.DurationSeconds
	}
	fmt.Fprintf(&b, "redproxy audit: %d keys scanned in %.1fs (%.0f keys/s)", r.Keys, r.DurationSeconds, rate)
	if !r.Complete {
		b.WriteString(" - INCOMPLETE, the walk stopped early")
	}
	b.WriteString("\n")
	if !r.Exact {
		b.WriteString("note: more keys than tracked; SCAN duplicates may be counted twice\n")
	}
	b.WriteString("\n")

	type line struct{ finding, rule, count, examples string }
	lines := []line{{"FINDING", "RULE", "KEYS", "EXAMPLES"}}
	add := func(finding, rule string, count int64, examples []string) {
		lines = append(lines, line{finding, rule, strconv.FormatInt(count, 10), exampleList(examples, count)})
	}
	quoted := func(keys []string) []string {
		q := make([]string, len(keys))
		for i, k := range keys {
			q[i] = quoteIfNeeded(k)
		}
		return q
	}
	add("keys without TTL", "-", r.NoTTL.Count, quoted(r.NoTTL.Examples))
	for _, f := range r.TTL {
		what := "TTL required, none set"
		if f.Rule == "ttl_max" {
			what = "TTL above rule max"
		}
		add(what, ruleLabel(f), f.Count, quoted(f.Examples))
	}
	for _, f := range r.Names {
		add("key name breaks rule", ruleLabel(f), f.Count, quoted(f.Examples))
	}
	if r.BigKeys.Checked {
		big := make([]string, len(r.BigKeys.Examples))
		for i, k := range r.BigKeys.Examples {
			big[i] = quoteIfNeeded(k.Key) + " (" + humanBytes(k.Bytes) + ")"
		}
		add("big keys (> "+humanBytes(r.BigKeys.Threshold)+")", "memory usage", r.BigKeys.Count, big)
	} else {
		lines = append(lines, line{"big keys", "memory usage", "-", "not checked"})
	}
	var wf, wr, wc int
	for _, l := range lines {
		wf, wr, wc = max(wf, len(l.finding)), max(wr, len(l.rule)), max(wc, len(l.count))
	}
	for _, l := range lines {
		fmt.Fprintf(&b, "%-*s  %-*s  %*s  %s\n", wf, l.finding, wr, l.rule, wc, l.count, l.examples)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// String is the text table.
func (r *Report) String() string {
	var b strings.Builder
	_ = r.WriteText(&b)
	return b.String()
}

func ruleLabel(f RuleFinding) string {
	if f.Pattern != "" {
		return f.Rule + " " + f.Pattern
	}
	return f.Rule
}

// exampleList joins the first few (already quoted) examples.
func exampleList(examples []string, count int64) string {
	shown := examples[:min(len(examples), textExamples)]
	s := strings.Join(shown, ", ")
	if count > int64(len(shown)) {
		s += ", ..."
	}
	return s
}

// quoteIfNeeded keeps ordinary keys readable and makes odd ones (spaces,
// commas, binary) unambiguous.
func quoteIfNeeded(s string) string {
	for _, c := range s {
		if c <= ' ' || c == ',' || c == '"' || c > '~' {
			return strconv.Quote(s)
		}
	}
	return s
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return strconv.FormatInt(n>>20, 10) + "MB"
	case n >= 1<<20:
		return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) + "MB"
	case n >= 1<<10 && n%(1<<10) == 0:
		return strconv.FormatInt(n>>10, 10) + "KB"
	case n >= 1<<10:
		return strconv.FormatFloat(float64(n)/(1<<10), 'f', 1, 64) + "KB"
	}
	return strconv.FormatInt(n, 10) + "B"
}
