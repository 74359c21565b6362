package guard

import (
	"bytes"
	"cmp"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redproxy/redproxy/internal/policy"
)

// table counts violations by rule, command and key pattern since start, for
// GET /policy/report. Its memory is bounded: past max rows, the row with the
// lowest count is evicted to make room (its count moves to Untracked), so
// the frequent violations an operator needs to see stay while one-off keys
// come and go.
type table struct {
	mu        sync.Mutex
	max       int
	rows      map[string]*Row
	total     int64
	untracked int64
	// fixupFailures counts TTL fix-ups Redis refused or never answered
	// (Guard.FixupFailed): their rows say "fixed", which the fix-up was
	// sent to do, not what it did, since a failure is learnt only from a
	// reply that no longer names its row.
	fixupFailures int64
	since         time.Time
	buf           []byte // row key scratch, under mu
	// shapes counts, for each row key with one literal segment of its
	// key pattern starred, the rows created that share it: past
	// maxLiteralRows, a new key of that shape joins the starred row
	// (collapse). Cleared when it outgrows maxShapes.
	shapes    map[string]int
	maxShapes int
}

// maxLiteralRows is how many rows of one shape that differ in a segment of
// letters alone ("user:alice", "user:bob") the report keeps before that
// segment counts as an identifier for new keys ("user:*"): a word of the
// application's own ("cache:profile", "cache:feed") seldom comes in more
// than a few dozen, names of users and tenants do, and filled the report
// (a user's trial: 1000 rows of "user:<name>", the frequent ones evicted).
const maxLiteralRows = 32

// Row is one line of the report: the violations of one rule by one command
// on keys of one shape.
type Row struct {
	Rule       string `json:"rule"`
	Pattern    string `json:"pattern,omitempty"` // the TTL rule or require_version glob involved
	Scope      string `json:"scope,omitempty"`
	Command    string `json:"command"`
	KeyPattern string `json:"key_pattern,omitempty"` // the key with its variable segments as "*"
	ExampleKey string `json:"example_key,omitempty"`
	// Message is what the client got (refused), or would get under enforce.
	Message  string `json:"message"`
	Count    int64  `json:"count"`
	Refused  int64  `json:"refused"`
	Fixed    int64  `json:"fixed"`
	Reported int64  `json:"reported"`
	// UnderEnforce is what enforce does with such a command: "refused",
	// "fixed" (a default TTL given, a TTL clamped), or "reported" for a
	// finding no mode acts on. In report mode it tells a fix from a
	// refusal, which Message alone does not: Message is the error a
	// refused command gets.
	UnderEnforce string    `json:"under_enforce"`
	First        time.Time `json:"first_seen"`
	Last         time.Time `json:"last_seen"`
}

func newTable(max int, now time.Time) *table {
	return &table{max: max, rows: map[string]*Row{}, since: now, shapes: map[string]int{}, maxShapes: 8 * max}
}

// collapse returns the key of the row that a new row key b (its key
// pattern from kp) joins instead, when one of its literal segments has
// been seen with more than maxLiteralRows values; nil when none has. Else
// it counts b in each of its shapes.
func (t *table) collapse(b []byte, kp int) []byte {
	pattern := b[kp:]
	var shapes [8]string
	n := 0
	for start := 0; start <= len(pattern) && n < len(shapes); {
		end := bytes.IndexByte(pattern[start:], ':')
		if end < 0 {
			end = len(pattern)
		} else {
			end += start
		}
		if seg := pattern[start:end]; len(seg) > 0 && string(seg) != "*" && string(seg) != "v*" {
			shape := make([]byte, 0, len(b))
			shape = append(append(append(shape, b[:kp+start]...), '*'), pattern[end:]...)
			if t.shapes[string(shape)] >= maxLiteralRows {
				return shape
			}
			shapes[n] = string(shape)
			n++
		}
		start = end + 1
	}
	if len(t.shapes)+n > t.maxShapes {
		clear(t.shapes)
	}
	for _, sh := range shapes[:n] {
		t.shapes[sh]++
	}
	return nil
}

func (t *table) add(v *policy.Violation, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.total++
	b := append(t.buf[:0], v.Rule...)
	b = append(b, 0)
	b = append(b, v.Command...)
	b = append(b, 0)
	b = append(b, v.Scope...)
	b = append(b, 0)
	kp := len(b)
	b = appendKeyPattern(b, v.Key)
	t.buf = b
	r := t.rows[string(b)] // no allocation for the lookup
	if r == nil {
		if starred := t.collapse(b, kp); starred != nil {
			b = starred
			r = t.rows[string(b)]
		}
	}
	if r == nil {
		if len(t.rows) >= t.max {
			t.evictSmallest()
		}
		r = &Row{
			Rule: v.Rule, Pattern: v.Pattern, Scope: v.Scope, Command: v.Command,
			KeyPattern: string(b[kp:]), ExampleKey: exampleKey(v.Key), Message: v.Message(), First: now,
		}
		t.rows[string(b)] = r
	}
	r.Count++
	if v.UnderEnforce != 0 {
		r.UnderEnforce = v.UnderEnforce.String()
	}
	switch v.Outcome {
	case policy.Refused:
		r.Refused++
	case policy.Fixed:
		r.Fixed++
	default:
		r.Reported++
	}
	r.Last = now
}

// reset empties the table and starts its period at now.
func (t *table) reset(now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	clear(t.rows)
	clear(t.shapes)
	t.total, t.untracked, t.fixupFailures, t.since = 0, 0, 0, now
}

func (t *table) fixupFailed() {
	t.mu.Lock()
	t.fixupFailures++
	t.mu.Unlock()
}

func (t *table) evictSmallest() {
	var minKey string
	var minRow *Row
	for k, r := range t.rows {
		if minRow == nil || r.Count < minRow.Count || (r.Count == minRow.Count && r.Last.Before(minRow.Last)) {
			minKey, minRow = k, r
		}
	}
	if minRow != nil {
		t.untracked += minRow.Count
		delete(t.rows, minKey)
	}
}

// Report is the body of GET /policy/report.
type Report struct {
	Since time.Time `json:"since"`
	// Total counts every violation; Untracked those in rows evicted to keep
	// the table bounded.
	Total     int64 `json:"total"`
	Untracked int64 `json:"untracked"`
	// FixupFailures counts the TTL fix-ups since Since that Redis refused
	// (an upstream user without EXPIRE, a key gone wrong type) or that a
	// lost connection left unanswered: the keys may have no TTL although
	// their rows count them fixed. The log names each (rate-limited).
	FixupFailures int64      `json:"fixup_failures"`
	Policy        PolicyInfo `json:"policy"`
	Rows          []Row      `json:"rows"` // most frequent first
}

// PolicyInfo says which policy is in force.
type PolicyInfo struct {
	// Mode is policy.mode as loaded; rules may lower it, --policy-mode
	// caps it (ForcedMode).
	Mode string `json:"mode"`
	// ForcedMode is --policy-mode ("enforce" means as configured).
	ForcedMode      string    `json:"forced_mode"`
	LoadedAt        time.Time `json:"loaded_at"`
	LastReloadError string    `json:"last_reload_error,omitempty"`
}

func (t *table) snapshot() Report {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := Report{Since: t.since, Total: t.total, Untracked: t.untracked, FixupFailures: t.fixupFailures, Rows: make([]Row, 0, len(t.rows))}
	for _, row := range t.rows {
		r.Rows = append(r.Rows, *row)
	}
	slices.SortFunc(r.Rows, func(a, b Row) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Rule, b.Rule),
			cmp.Compare(a.Command, b.Command), cmp.Compare(a.KeyPattern, b.KeyPattern), cmp.Compare(a.Scope, b.Scope))
	})
	return r
}

// WriteText writes the report as a fixed-width table for terminals.
func (r *Report) WriteText(w io.Writer, now time.Time) error {
	var b strings.Builder
	fmt.Fprintf(&b, "redproxy policy report: %d violations since %s (%s ago)", r.Total,
		r.Since.UTC().Format(time.RFC3339), age(now, r.Since))
	// Which mode is on, when it is not enforce (a user's trial, with mode
	// = "report" in the file, found it said nowhere).
	if r.Policy.Mode != "" && r.Policy.Mode != policy.Enforce.String() {
		fmt.Fprintf(&b, "; policy mode %s", r.Policy.Mode)
	}
	if r.Policy.ForcedMode != "" && r.Policy.ForcedMode != policy.Enforce.String() {
		fmt.Fprintf(&b, "; --policy-mode=%s", r.Policy.ForcedMode)
	}
	b.WriteString("\n")
	if r.Policy.LastReloadError != "" {
		fmt.Fprintf(&b, "last reload failed, previous policy kept: %s\n", r.Policy.LastReloadError)
	}
	if r.Untracked > 0 {
		fmt.Fprintf(&b, "%d violations were in rows dropped to bound memory\n", r.Untracked)
	}
	if r.FixupFailures > 0 {
		fmt.Fprintf(&b, "%d TTL fix-ups failed (refused by Redis or lost with a connection; see the log): "+
			"their keys may have no TTL, which `redproxy audit` finds\n", r.FixupFailures)
	}
	if len(r.Rows) == 0 {
		b.WriteString("no violations\n")
		_, err := io.WriteString(w, b.String())
		return err
	}
	b.WriteString("\n")
	lines := [][]string{{"COUNT", "RULE", "OUTCOMES", "COMMAND", "KEY PATTERN", "EXAMPLE KEY", "LAST SEEN"}}
	for _, row := range r.Rows {
		rule := row.Rule
		if row.Pattern != "" {
			rule += " " + row.Pattern
		}
		if row.Scope != "" {
			rule += " (" + row.Scope + ")"
		}
		lines = append(lines, []string{
			strconv.FormatInt(row.Count, 10), rule, outcomes(&row), commandColumn(row.Command),
			dash(row.KeyPattern), dash(quoteIfNeeded(row.ExampleKey)), age(now, row.Last) + " ago",
		})
	}
	widths := make([]int, len(lines[0]))
	for _, l := range lines {
		for i, c := range l {
			widths[i] = max(widths[i], len(c))
		}
	}
	for _, l := range lines {
		for i, c := range l {
			switch {
			case i == 0:
				fmt.Fprintf(&b, "%*s", widths[i], c)
			case i == len(l)-1:
				b.WriteString("  " + c)
			default:
				fmt.Fprintf(&b, "  %-*s", widths[i], c)
			}
		}
		b.WriteString("\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func outcomes(r *Row) string {
	var parts []string
	for _, o := range []struct {
		name string
		n    int64
	}{{"refused", r.Refused}, {"fixed", r.Fixed}, {"reported", r.Reported}} {
		if o.n > 0 {
			parts = append(parts, o.name+"="+strconv.FormatInt(o.n, 10))
		}
	}
	out := strings.Join(parts, ",")
	// What only reported commands would get under enforce: a fix and a
	// refusal read the same otherwise.
	if r.Reported > 0 && r.UnderEnforce != "" && r.UnderEnforce != policy.Reported.String() {
		out += " (enforce: " + r.UnderEnforce + ")"
	}
	return out
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func age(now, t time.Time) string {
	d := now.Sub(t)
	if d < time.Second {
		return "0s"
	}
	return d.Truncate(time.Second).String()
}

// maxKeyPattern and maxExampleKey bound what one row keeps of a key.
const (
	maxKeyPattern = 128
	maxExampleKey = 128
)

// appendKeyPattern appends key with every ':'-separated segment that looks
// like an identifier (has a digit, '@', '.' or a non-printable byte, or is
// long) replaced by "*", so "session:4f9c..." and "session:8a7b..." share
// the pattern "session:*" and one row of the report. A version segment
// keeps its "v" ("cache:p:v2:789" is "cache:p:v*:*"), which a user's trial
// missed in the report. Segments are not split further: the words of one
// that holds an identifier ("secret-token-9", "john-smith-42") would put
// parts of keys in the log, which key patterns keep out. Identifiers made
// of letters alone ("user:alice") cannot be told from words: they keep
// rows of their own until their number shows them (table.collapse).
func appendKeyPattern(dst, key []byte) []byte {
	if len(key) == 0 {
		return dst
	}
	start := len(dst)
	for {
		seg, rest, more := bytes.Cut(key, colon)
		dst = appendSegment(dst, seg)
		if len(dst)-start > maxKeyPattern {
			return append(dst[:start+maxKeyPattern], "..."...)
		}
		if !more {
			return dst
		}
		dst = append(dst, ':')
		key = rest
	}
}

var colon = []byte(":")

func appendSegment(dst, seg []byte) []byte {
	switch {
	case len(seg) > 32:
		return append(dst, '*')
	case version(seg):
		return append(dst, "v*"...)
	case identifier(seg):
		return append(dst, '*')
	}
	return append(dst, seg...)
}

// version reports whether a segment is a version: "v" and digits.
func version(seg []byte) bool { return len(seg) > 1 && seg[0] == 'v' && allDigits(seg[1:]) }

// identifier reports whether a segment of a key looks like an identifier:
// it has a digit, '@', '.' or a byte that is not printable ASCII.
func identifier(seg []byte) bool {
	for _, c := range seg {
		// '@' and '.': e-mail addresses and host names are identifiers too.
		if c >= '0' && c <= '9' || c < ' ' || c > '~' || c == '*' || c == '@' || c == '.' {
			return true
		}
	}
	return false
}

func allDigits(b []byte) bool {
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

func exampleKey(key []byte) string {
	if len(key) > maxExampleKey {
		return string(key[:maxExampleKey]) + "..."
	}
	return string(key)
}

// quoteIfNeeded keeps ordinary keys readable and makes odd ones (spaces,
// binary) unambiguous in the text table.
// commandColumn is a command's name for the text report. An unknown
// command's name is whatever a client sent: quoted when it holds bytes a
// terminal would act on, and cut, so that neither an escape sequence nor
// 200 random bytes reach an operator's terminal or widen the table (found
// by a user's trial).
func commandColumn(name string) string {
	const most = 40
	q := quoteIfNeeded(name)
	if len(q) > most {
		q = q[:most-3] + "..."
	}
	return q
}

func quoteIfNeeded(s string) string {
	for _, c := range s {
		if c <= ' ' || c == '"' || c > '~' {
			return strconv.Quote(s)
		}
	}
	return s
}
