package guard

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/pelletier/go-toml/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/resp"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func TestLimiter(t *testing.T) {
	l := newLimiter(1, 3) // 1 line/s, bursts of 3
	type step struct {
		at         time.Duration
		ok         bool
		suppressed int64
	}
	steps := []step{
		{0, true, 0}, {0, true, 0}, {0, true, 0}, // the burst
		{0, false, 0}, {500 * time.Millisecond, false, 0}, // empty: half a token
		{time.Second, true, 2}, // one token back; says two were dropped
		{time.Second, false, 0},
		{time.Hour, true, 1}, // refills, but only up to the burst
		{time.Hour, true, 0}, {time.Hour, true, 0},
		{time.Hour, false, 0},
		{time.Hour - time.Minute, false, 0}, // a clock going back earns nothing
	}
	for i, s := range steps {
		ok, sup := l.allow(t0.Add(s.at))
		if ok != s.ok || sup != s.suppressed {
			t.Fatalf("step %d (+%v): allow = %v, %d; want %v, %d", i, s.at, ok, sup, s.ok, s.suppressed)
		}
	}
}

func TestKeyPattern(t *testing.T) {
	cases := map[string]string{
		"":    "",
		"foo": "foo",
		"session:4f9c2d1e-8a7b-4c3d-9e2f-1a2b3c4d5e6f": "session:*",
		"user:123:profile":                      "user:*:profile",
		"cache:product:v2:789":                  "cache:product:v*:*",
		"cache:product:version:v":               "cache:product:version:v",
		"tmp_import_17":                         "*",
		"session:john-smith-42":                 "session:*",
		"user:alice:profile":                    "user:alice:profile",
		"a::b:":                                 "a::b:",
		"tag:category:seven":                    "tag:category:seven",
		"bin:\x00\xff":                          "bin:*",
		"star:*":                                "star:*",
		"long:" + strings.Repeat("abcdefgh", 5): "long:*",
	}
	for key, want := range cases {
		if got := string(appendKeyPattern(nil, []byte(key))); got != want {
			t.Errorf("pattern(%q) = %q, want %q", key, got, want)
		}
	}
	long := strings.Repeat("seg:", 100)
	if got := appendKeyPattern(nil, []byte(long)); len(got) != maxKeyPattern+3 || !bytes.HasSuffix(got, []byte("...")) {
		t.Errorf("long key pattern is %d bytes: %q", len(got), got)
	}
}

func violation(rule, command, key string, o policy.Outcome) *policy.Violation {
	v := &policy.Violation{Rule: rule, Command: command, Action: policy.Enforce, Outcome: o, Msg: "ERR redproxy policy: " + rule}
	if key != "" {
		v.Key = []byte(key)
	}
	if o == policy.Reported {
		v.Action = policy.Report
	}
	return v
}

// TestTableBounds: the table never holds more than max rows; frequent rows
// survive a stream of one-off keys; every violation is either in a row or
// in Untracked.
func TestTableBounds(t *testing.T) {
	tb := newTable(3, t0)
	for i := range 50 {
		tb.add(violation(policy.RuleTTL, "hset", "session:"+strconv.Itoa(i), policy.Fixed), t0.Add(time.Duration(i)*time.Second))
		tb.add(violation(policy.RuleCommand, "keys", "", policy.Refused), t0)
		// One-off shapes: each a new row that must not push the two above out.
		tb.add(violation(policy.RuleNamespaces, "set", fmt.Sprintf("odd%c", 'a'+i%26)+strings.Repeat("z", i), policy.Reported), t0)
		if len(tb.rows) > 3 {
			t.Fatalf("%d rows after %d rounds", len(tb.rows), i)
		}
	}
	r := tb.snapshot()
	if r.Total != 150 || len(r.Rows) != 3 {
		t.Fatalf("total %d, %d rows", r.Total, len(r.Rows))
	}
	var inRows int64
	for _, row := range r.Rows {
		inRows += row.Count
	}
	if inRows+r.Untracked != r.Total {
		t.Fatalf("rows %d + untracked %d != total %d", inRows, r.Untracked, r.Total)
	}
	top := r.Rows[0]
	if top.Count != 50 || r.Rows[1].Count != 50 {
		t.Fatalf("frequent rows lost: %+v", r.Rows)
	}
	for _, row := range r.Rows[:2] {
		switch row.Rule {
		case policy.RuleTTL:
			if row.KeyPattern != "session:*" || row.ExampleKey != "session:0" || row.Fixed != 50 || row.Command != "hset" ||
				!row.First.Equal(t0) || !row.Last.Equal(t0.Add(49*time.Second)) {
				t.Errorf("ttl row: %+v", row)
			}
		case policy.RuleCommand:
			if row.KeyPattern != "" || row.Refused != 50 || row.Command != "keys" {
				t.Errorf("command row: %+v", row)
			}
		default:
			t.Errorf("unexpected frequent row %+v", row)
		}
	}
}

// exampleConfig is the seeds' policy the proxy ships in config.example.toml.
func exampleConfig(t testing.TB) policy.Config {
	t.Helper()
	var file struct {
		Policy policy.Config `toml:"policy"`
	}
	file.Policy = policy.DefaultConfig()
	data := readFile(t, "../policy/testdata/policy.example.toml")
	if err := toml.Unmarshal(data, &file); err != nil {
		t.Fatal(err)
	}
	return file.Policy
}

type logSink struct{ bytes.Buffer }

func newTestGuard(t *testing.T, c policy.Config, o Options) (*Guard, *prometheus.Registry, *logSink) {
	t.Helper()
	reg := prometheus.NewRegistry()
	sink := &logSink{}
	o.Registerer = reg
	o.Logger = slog.New(slog.NewJSONHandler(&sink.Buffer, nil))
	g, err := New(c, o)
	if err != nil {
		t.Fatal(err)
	}
	return g, reg, sink
}

// TestRecord: every violation is counted by rule and action and reported;
// log lines are rate-limited and say how many were dropped; values and
// whole keys never reach the log.
func TestRecord(t *testing.T) {
	now := t0
	g, reg, sink := newTestGuard(t, policy.DefaultConfig(), Options{LogRate: 1, LogBurst: 2, Now: func() time.Time { return now }})
	client := &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 5555}
	for range 5 {
		g.Record(violation(policy.RuleTTL, "hset", "session:secret-token-9", policy.Fixed), client, "app")
	}
	now = now.Add(time.Second)
	g.Record(violation(policy.RuleCommand, "keys", "", policy.Refused), client, "app")
	g.Record(violation(policy.RuleValueSize, "set", "", policy.Reported), client, "app")

	// Read from the registry the proxy exposes on /metrics.
	if n := metricValue(t, reg, "redproxy_policy_violations_total", "rule", "ttl", "action", "enforce"); n != 5 {
		t.Errorf("ttl/enforce counter = %v", n)
	}
	if n := metricValue(t, reg, "redproxy_policy_violations_total", "rule", "value_size", "action", "report"); n != 1 {
		t.Errorf("value_size/report counter = %v", n)
	}
	// Refused apart: of the six enforce violations, five were fixed.
	if n := metricValue(t, reg, "redproxy_policy_refusals_total", "rule", "command"); n != 1 {
		t.Errorf("command refusals = %v, want 1", n)
	}
	if n := metricValue(t, reg, "redproxy_policy_refusals_total", "rule", "ttl"); n != 0 {
		t.Errorf("ttl refusals = %v, want 0 (the five were fixed)", n)
	}
	if n := seriesCount(t, reg, "redproxy_policy_refusals_total"); n != len(allRules) {
		t.Errorf("refusal series = %d; want one per rule from the start", n)
	}
	if n := seriesCount(t, reg, "redproxy_policy_violations_total"); n != 2*len(allRules) {
		t.Errorf("violation series = %d; want every rule x {enforce, report}", n)
	}
	lines := strings.Split(strings.TrimSpace(sink.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("want 2 burst lines + 1 after refill, got %d:\n%s", len(lines), sink.String())
	}
	var third map[string]any
	if err := json.Unmarshal([]byte(lines[2]), &third); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"msg": "policy violation", "level": "WARN", "rule": "command", "action": "enforce",
		"outcome": "refused", "command": "keys", "client": "10.1.2.3:5555", "user": "app", "suppressed": 3.0}
	for k, v := range want {
		if third[k] != v {
			t.Errorf("log %s = %v, want %v (line %s)", k, third[k], v, lines[2])
		}
	}
	if !strings.Contains(lines[0], `"key_pattern":"session:*"`) {
		t.Errorf("first line lacks the key pattern: %s", lines[0])
	}
	if strings.Contains(sink.String(), "secret") {
		t.Errorf("a key reached the log:\n%s", sink.String())
	}
	if n := metricValue(t, reg, "redproxy_policy_log_lines_suppressed_total"); n != 4 {
		t.Errorf("suppressed counter = %v, want 4", n)
	}
	rep := g.Report()
	if rep.Total != 7 || len(rep.Rows) != 3 || rep.Rows[0].Count != 5 || rep.Rows[0].ExampleKey != "session:secret-token-9" {
		t.Errorf("report %+v", rep)
	}

	g.FixupFailed([]byte("-ERR syntax error\r\n"), nil, client)
	g.FixupFailed(nil, errors.New("connection reset"), client)
	if n := metricValue(t, reg, "redproxy_policy_fixup_failures_total"); n != 2 {
		t.Errorf("fix-up failures = %v", n)
	}
	if !strings.Contains(sink.String(), `"reason":"ERR syntax error"`) || !strings.Contains(sink.String(), `"reason":"connection reset"`) {
		t.Errorf("fix-up failures not logged:\n%s", sink.String())
	}
	// The report's rows count fixes as sent; it says how many failed.
	rep = g.Report()
	if rep.FixupFailures != 2 {
		t.Errorf("report fixup_failures = %d, want 2", rep.FixupFailures)
	}
	var text strings.Builder
	if err := rep.WriteText(&text, time.Now()); err != nil || !strings.Contains(text.String(), "2 TTL fix-ups failed") {
		t.Errorf("report text (%v):\n%s", err, text.String())
	}
	g.ResetReport()
	if rep := g.Report(); rep.FixupFailures != 0 {
		t.Errorf("after ResetReport: fixup_failures = %d", rep.FixupFailures)
	}
}

func keysRefused(g *Guard) bool {
	args := [][]byte{[]byte("KEYS"), []byte("*")}
	d := g.Policy().CheckBatch([]policy.Request{{Cmd: commands.Builtin().Lookup(args), Args: args}}, nil)
	return d[0].Refuse != nil
}

// TestReload: a bad source keeps the policy in force and says why; a good
// one replaces it; --policy-mode applies to what is loaded later.
func TestReload(t *testing.T) {
	var src func() (policy.Config, error)
	g, reg, sink := newTestGuard(t, policy.DefaultConfig(), Options{})
	if err := g.Reload(); !errors.Is(err, ErrNoSource) {
		t.Fatalf("reload without source: %v", err)
	}
	g.SetSource(func() (policy.Config, error) { return src() })
	before := g.Policy()
	if !keysRefused(g) {
		t.Fatal("default policy allows KEYS")
	}

	src = func() (policy.Config, error) {
		return policy.Config{Commands: policy.CommandRules{Deny: []string{"no-such-command"}}}, nil
	}
	err := g.Reload()
	if err == nil || !strings.Contains(err.Error(), `unknown command "no-such-command"`) {
		t.Fatalf("bad policy: %v", err)
	}
	src = func() (policy.Config, error) { return policy.Config{}, errors.New("p.toml:3: syntax error") }
	if err := g.Reload(); err == nil {
		t.Fatal("failing source accepted")
	}
	if g.Policy() != before || !keysRefused(g) {
		t.Fatal("a failed reload changed the policy")
	}
	if rep := g.Report(); rep.Policy.LastReloadError != "p.toml:3: syntax error" {
		t.Fatalf("report does not say why: %+v", rep.Policy)
	}

	src = func() (policy.Config, error) {
		return policy.Config{Commands: policy.CommandRules{Allow: []string{"keys"}}}, nil
	}
	if err := g.Reload(); err != nil || keysRefused(g) || g.Report().Policy.LastReloadError != "" {
		t.Fatalf("good reload: %v, keys refused %v", err, keysRefused(g))
	}
	if e, ok := metricValue(t, reg, "redproxy_policy_reloads_total", "result", "error"), metricValue(t, reg, "redproxy_policy_reloads_total", "result", "ok"); e != 2 || ok != 1 {
		t.Fatalf("reloads: %v errors, %v ok", e, ok)
	}
	// Reloaded again unchanged (every SIGHUP reloads the policy): counted,
	// but not logged as a policy loaded.
	if err := g.Reload(); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(sink.String(), `"msg":"policy loaded"`); n != 1 {
		t.Fatalf("%d 'policy loaded' lines for one change and one unchanged reload:\n%s", n, sink.String())
	}
	if ok := metricValue(t, reg, "redproxy_policy_reloads_total", "result", "ok"); ok != 2 {
		t.Fatalf("unchanged reload not counted: %v ok", ok)
	}

	// --policy-mode=report survives a reload.
	src = func() (policy.Config, error) { return policy.DefaultConfig(), nil }
	g.SetForcedMode(policy.Report)
	if keysRefused(g) {
		t.Fatal("report mode refuses")
	}
	if err := g.Reload(); err != nil || keysRefused(g) {
		t.Fatalf("forced mode lost on reload: %v", err)
	}
	g.SetForcedMode(policy.Enforce)
	if !keysRefused(g) {
		t.Fatal("enforce did not come back")
	}
}

func TestHandlers(t *testing.T) {
	now := t0
	var srcErr error
	g, _, _ := newTestGuard(t, policy.DefaultConfig(), Options{Now: func() time.Time { return now },
		Source: func() (policy.Config, error) { return policy.DefaultConfig(), srcErr }})
	g.Record(violation(policy.RuleCommand, "flushall", "", policy.Refused), nil, "default")
	for range 3 {
		g.Record(violation(policy.RuleTTL, "hset", "session:1", policy.Reported), nil, "default")
	}
	now = now.Add(90 * time.Second)

	rec := httptest.NewRecorder()
	g.ReportHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/policy/report", nil))
	text := rec.Body.String()
	for _, want := range []string{
		"redproxy policy report: 4 violations since 2026-01-02T03:04:05Z (1m30s ago)",
		"COUNT  RULE",
		"    3  ttl      reported=3  hset      session:*    session:1    1m30s ago\n",
		"    1  command  refused=1   flushall  -            -            1m30s ago\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("text report lacks %q:\n%s", want, text)
		}
	}

	rec = httptest.NewRecorder()
	g.ReportHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/policy/report?format=json", nil))
	var rep Report
	if err := json.Unmarshal(rec.Body.Bytes(), &rep); err != nil || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("json: %v %s", err, rec.Body.String())
	}
	if rep.Total != 4 || len(rep.Rows) != 2 || rep.Rows[0].Rule != "ttl" || rep.Rows[0].Reported != 3 || rep.Policy.ForcedMode != "enforce" {
		t.Fatalf("json report %+v", rep)
	}

	// ?format=text forces text over Accept; an unknown format is refused
	// (a probe's ?format=xml got the text report silently).
	req := httptest.NewRequest("GET", "/policy/report?format=text", nil)
	req.Header.Set("Accept", "application/json")
	rec = httptest.NewRecorder()
	g.ReportHandler().ServeHTTP(rec, req)
	if !strings.HasPrefix(rec.Body.String(), "redproxy policy report:") {
		t.Errorf("?format=text with Accept: application/json: %q", rec.Body.String())
	}
	rec = httptest.NewRecorder()
	g.ReportHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/policy/report?format=JSON", nil))
	if rec.Header().Get("Content-Type") != "application/json" {
		t.Errorf("?format=JSON: %q", rec.Body.String())
	}
	rec = httptest.NewRecorder()
	g.ReportHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/policy/report?format=xml", nil))
	if rec.Code != http.StatusBadRequest {
		t.Errorf("?format=xml: %d %q, want 400", rec.Code, rec.Body.String())
	}

	rec = httptest.NewRecorder()
	g.ReloadHandler().ServeHTTP(rec, httptest.NewRequest("POST", "/policy/reload", nil))
	if rec.Code != http.StatusOK || rec.Body.String() != "policy reloaded\n" {
		t.Fatalf("reload: %d %q", rec.Code, rec.Body.String())
	}
	// Under --policy-mode=report the answer says the cap stays (a user's
	// trial switched the file to enforce and reloaded, to no effect).
	g.SetForcedMode(policy.Report)
	rec = httptest.NewRecorder()
	g.ReloadHandler().ServeHTTP(rec, httptest.NewRequest("POST", "/policy/reload", nil))
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "--policy-mode=report caps every policy rule until redproxy restarts without it") {
		t.Fatalf("reload under --policy-mode=report: %d %q", rec.Code, rec.Body.String())
	}
	g.SetForcedMode(policy.Enforce)
	srcErr = errors.New("p.toml:9: policy.ttl[0].max: must be >= default")
	rec = httptest.NewRecorder()
	g.ReloadHandler().ServeHTTP(rec, httptest.NewRequest("POST", "/policy/reload", nil))
	if rec.Code != http.StatusUnprocessableEntity || !strings.Contains(rec.Body.String(), "previous policy stays in force") ||
		!strings.Contains(rec.Body.String(), "policy.ttl[0].max") {
		t.Fatalf("bad reload: %d %s", rec.Code, rec.Body.String())
	}
}

// request builds a resp.Request as the reader would.
func request(words ...string) resp.Request {
	args := make([][]byte, len(words))
	for i, w := range words {
		args[i] = []byte(w)
	}
	return resp.Request{Args: args, Raw: resp.AppendCommand(nil, args...)}
}

// typicalBatch breaks no rule of the example policy.
func typicalBatch() []resp.Request {
	return []resp.Request{
		request("GET", "product:123"),
		request("SETEX", "product:123", "3600", `{"id":123}`),
		request("MULTI"),
		request("HSET", "session:abc", "user_id", "42"),
		request("EXPIRE", "session:abc", "86400"),
		request("EXEC"),
		request("MGET", "product:1", "product:2", "product:3"),
		request("EVALSHA", "2b0b4bb0d5c2e1a8c7e3f0d9a6b5c4d3e2f1a0b9", "1", "ratelimit:sliding:1", "1", "2", "3"),
		request("PING"),
	}
}

// TestBatchSteadyStateAllocs: deciding a batch that breaks no rule
// allocates nothing once the connection's buffers have grown.
func TestBatchSteadyStateAllocs(t *testing.T) {
	tbl := commands.Builtin()
	reqs := typicalBatch()
	for name, c := range map[string]policy.Config{"default": policy.DefaultConfig(), "example": exampleConfig(t)} {
		p, err := policy.Compile(c)
		if err != nil {
			t.Fatal(err)
		}
		var b Batch
		b.Prepare(p, tbl, reqs, "default", "127.0.0.1:6380", nil)
		for i := range reqs {
			if d := b.Decision(i); d != nil {
				t.Fatalf("%s: request %d broke a rule: %+v", name, i, d.Violations)
			}
		}
		allocs := testing.AllocsPerRun(100, func() {
			b.Prepare(p, tbl, reqs, "default", "127.0.0.1:6380", nil)
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocations per batch", name, allocs)
		}
	}
}

func BenchmarkBatchPrepare(b *testing.B) {
	tbl := commands.Builtin()
	reqs := typicalBatch()
	p, err := policy.Compile(exampleConfig(b))
	if err != nil {
		b.Fatal(err)
	}
	var bt Batch
	b.ReportAllocs()
	for b.Loop() {
		bt.Prepare(p, tbl, reqs, "default", "127.0.0.1:6380", nil)
	}
}

// TestBatchEncode: rewrites and fix-ups are valid RESP, and those handed out
// earlier in the batch stay intact when the scratch space runs out.
func TestBatchEncode(t *testing.T) {
	var b Batch
	b.Prepare(nil, commands.Builtin(), nil, "", "", nil)
	var got [][]byte
	var want []string
	for i := range 200 {
		v := strings.Repeat("v", i*7)
		got = append(got, b.Encode([][]byte{[]byte("SET"), []byte("k" + strconv.Itoa(i)), []byte(v), []byte("EX"), []byte("60")}))
		want = append(want, fmt.Sprintf("*5\r\n$3\r\nSET\r\n$%d\r\nk%d\r\n$%d\r\n%s\r\n$2\r\nEX\r\n$2\r\n60\r\n", len(strconv.Itoa(i))+1, i, len(v), v))
		fx := b.Fixups([]policy.Expire{{Key: []byte("session:" + strconv.Itoa(i)), Seconds: 86400}, {Key: []byte("h"), Seconds: 5}})
		if len(fx) != 2 {
			t.Fatalf("%d fix-ups", len(fx))
		}
		got = append(got, fx...)
		key := "session:" + strconv.Itoa(i)
		want = append(want, fmt.Sprintf("*4\r\n$6\r\nEXPIRE\r\n$%d\r\n%s\r\n$5\r\n86400\r\n$2\r\nNX\r\n", len(key), key),
			"*4\r\n$6\r\nEXPIRE\r\n$1\r\nh\r\n$1\r\n5\r\n$2\r\nNX\r\n")
	}
	for i := range got {
		if string(got[i]) != want[i] {
			t.Fatalf("encoding %d = %q, want %q", i, got[i], want[i])
		}
	}
	// Appending to a handed-out slice must not write into the next one.
	a := b.Encode([][]byte{[]byte("PING")})
	next := b.Encode([][]byte{[]byte("ECHO"), []byte("x")})
	_ = append(a, "garbage"...)
	if string(next) != "*2\r\n$4\r\nECHO\r\n$1\r\nx\r\n" {
		t.Fatalf("slice capacity not capped: %q", next)
	}

	v := &policy.Violation{Msg: "ERR redproxy policy: key \"a\r\nb\" bad"}
	if r := string(AppendRefusal([]byte("+OK\r\n"), v)); r != "+OK\r\n-ERR redproxy policy: key \"a  b\" bad\r\n" {
		t.Fatalf("refusal %q", r)
	}
}

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// metricValue returns the value of the counter series name{labels...} in
// reg (labels as name, value pairs), or -1 when there is none.
func metricValue(t testing.TB, reg prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	v, found, err := metrics.CounterSum(reg, name, labels...)
	if err != nil {
		t.Fatal(err)
	}
	if !found {
		return -1
	}
	return v
}

func seriesCount(t testing.TB, reg prometheus.Gatherer, name string) int {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return len(mf.GetMetric())
		}
	}
	return 0
}

// An unknown command's name is whatever a client sent: the text report
// quotes it where it holds control or non-ASCII bytes and cuts a long one,
// so no escape sequence reaches an operator's terminal and random bytes do
// not widen the table.
func TestReportTextEscapesCommandNames(t *testing.T) {
	g, _, _ := newTestGuard(t, policy.DefaultConfig(), Options{Now: func() time.Time { return t0 }})
	client := &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 5555}
	garbage := string([]byte{0xff, 0xfe, 0x00, 0x07}) + strings.Repeat("\x9b", 200)
	for _, name := range []string{"\x1b[31mred!", garbage, "set"} {
		g.Record(violation(policy.RuleUnclassified, name, "", policy.Reported), client, "app")
	}
	var b strings.Builder
	r := g.Report()
	if err := r.WriteText(&b, t0); err != nil {
		t.Fatal(err)
	}
	text := b.String()
	if strings.ContainsAny(text, "\x1b\x00\x07\x9b") || !utf8.ValidString(text) {
		t.Errorf("the report holds raw control or invalid bytes:\n%q", text)
	}
	if !strings.Contains(text, `"\x1b[31mred!"`) {
		t.Errorf("the escape sequence is not shown quoted:\n%s", text)
	}
	for _, line := range strings.Split(text, "\n") {
		if len(line) > 200 {
			t.Errorf("a line of %d bytes: %q", len(line), line)
		}
	}
}

// DELETE /policy/report empties the report and starts its period anew;
// GET then shows only what came after.
func TestReportResetByDelete(t *testing.T) {
	now := t0
	g, _, _ := newTestGuard(t, policy.DefaultConfig(), Options{Now: func() time.Time { return now }})
	client := &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 5555}
	for range 3 {
		g.Record(violation(policy.RuleCommand, "keys", "", policy.Refused), client, "app")
	}
	now = now.Add(time.Hour)
	h := g.ReportHandler()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("DELETE", "/policy/report", nil))
	if w.Code != 200 || !strings.Contains(w.Body.String(), "emptied") {
		t.Fatalf("DELETE: %d %q", w.Code, w.Body.String())
	}
	if r := g.Report(); r.Total != 0 || len(r.Rows) != 0 || !r.Since.Equal(now) {
		t.Fatalf("after DELETE: total %d, %d rows, since %v; want an empty report since %v", r.Total, len(r.Rows), r.Since, now)
	}
	g.Record(violation(policy.RuleTTL, "set", "session:1", policy.Fixed), client, "app")
	w = httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/policy/report", nil))
	if body := w.Body.String(); !strings.Contains(body, "1 violations") || strings.Contains(body, "keys") {
		t.Fatalf("GET after DELETE and one violation:\n%s", body)
	}
}

// Identifiers of letters alone ("user:alice") cannot be told from words by
// their look: each keeps a row of its own until maxLiteralRows of one
// shape have been seen, then new ones share the starred row, so a stream
// of user names no longer fills the report and evicts the frequent rows.
// A few words of the application's own keep their rows.
func TestTableCollapsesLetterIdentifiers(t *testing.T) {
	tb := newTable(1000, t0)
	name := func(i int) string { // letters only: "a", "b", ..., "ba", ...
		s := ""
		for {
			s = string(rune('a'+i%26)) + s
			if i /= 26; i == 0 {
				return s
			}
		}
	}
	const users = 500
	for i := range users {
		tb.add(violation(policy.RuleTTL, "hset", "user:"+name(i)+":profile", policy.Fixed), t0)
	}
	for _, w := range []string{"profile", "feed", "settings", "cart"} {
		for range 3 {
			tb.add(violation(policy.RuleTTL, "set", "cache:"+w, policy.Fixed), t0)
		}
	}
	r := tb.snapshot()
	var hsetRows, starred int64
	for _, row := range r.Rows {
		switch {
		case row.Command == "hset" && row.KeyPattern == "user:*:profile":
			starred = row.Count
			hsetRows++
		case row.Command == "hset":
			hsetRows++
			if row.Count != 1 {
				t.Errorf("literal row %+v", row)
			}
		case row.Command == "set" && row.Count != 3:
			t.Errorf("a word's row lost counts: %+v", row)
		}
	}
	if hsetRows != maxLiteralRows+1 || starred != users-maxLiteralRows {
		t.Errorf("%d hset rows, the starred one counting %d; want %d and %d", hsetRows, starred, maxLiteralRows+1, users-maxLiteralRows)
	}
	if len(r.Rows) != int(hsetRows)+4 || r.Untracked != 0 || r.Total != users+12 {
		t.Errorf("%d rows, untracked %d, total %d", len(r.Rows), r.Untracked, r.Total)
	}
	// Reset starts the count of shapes again.
	tb.reset(t0)
	tb.add(violation(policy.RuleTTL, "hset", "user:zed:profile", policy.Fixed), t0)
	if r := tb.snapshot(); len(r.Rows) != 1 || r.Rows[0].KeyPattern != "user:zed:profile" {
		t.Errorf("after reset: %+v", r.Rows)
	}
}

// TestHugeReadCostsTheGuardNothing: deciding an MGET of a million keys
// under the shipped policy allocates next to nothing. The guard listed
// every key of every request for the policy, which reads the list only
// for a few rules: 42 MB allocated for this request, the last 8 MB of it
// kept by the connection until it idled (found by review).
func TestHugeReadCostsTheGuardNothing(t *testing.T) {
	const n = 1_000_000
	args := make([][]byte, 0, n+1)
	args = append(args, []byte("MGET"))
	for i := range n {
		args = append(args, []byte("product:"+strconv.Itoa(i)))
	}
	reqs := []resp.Request{{Args: args}}
	p, err := policy.Compile(exampleConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	var b Batch
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	b.Prepare(p, commands.Builtin(), reqs, "default", "127.0.0.1:6380", nil)
	runtime.ReadMemStats(&after)
	if d := b.Decision(0); d != nil {
		t.Fatalf("the MGET broke a rule: %+v", d.Violations)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<10 {
		t.Fatalf("deciding an MGET of %d keys allocated %d bytes", n, alloc)
	}
}

// The "policy loaded" line names the mode in force, as INFO does: the
// loaded policy's, capped by --policy-mode. It named the cap alone, so a
// reload to mode = "report" or "off" logged policy_mode=enforce (found by
// review).
func TestReloadLogsTheModeInForce(t *testing.T) {
	g, _, sink := newTestGuard(t, policy.DefaultConfig(), Options{})
	var mode string
	g.SetSource(func() (policy.Config, error) {
		c := policy.DefaultConfig()
		c.Mode = mode
		return c, nil
	})
	for _, mode = range []string{"report", "off", "enforce"} {
		sink.Reset()
		if err := g.Reload(); err != nil {
			t.Fatal(err)
		}
		if want := `"policy_mode":"` + mode + `"`; !strings.Contains(sink.String(), want) {
			t.Fatalf("reload to mode %q logged:\n%s", mode, sink.String())
		}
	}
	g.SetForcedMode(policy.Report)
	mode = "off"
	sink.Reset()
	if err := g.Reload(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(sink.String(), `"policy_mode":"off","forced_mode":"report"`) {
		t.Fatalf("reload under --policy-mode=report logged:\n%s", sink.String())
	}
}

// TestRecordSaysWhatEnforceWouldDo: under --policy-mode=report a command
// an enforcing policy refuses is logged as reported, and the line says it
// would be refused under enforce; one a report rule only reports says
// nothing more.
func TestRecordSaysWhatEnforceWouldDo(t *testing.T) {
	g, _, sink := newTestGuard(t, policy.DefaultConfig(), Options{})
	g.SetForcedMode(policy.Report)
	args := [][]byte{[]byte("KEYS"), []byte("*")}
	d := g.Policy().CheckBatch([]policy.Request{{Cmd: commands.Builtin().Lookup(args), Args: args}}, nil)
	if d[0].Refuse != nil || len(d[0].Violations) != 1 {
		t.Fatalf("KEYS under --policy-mode=report: %+v", d[0])
	}
	g.Record(&d[0].Violations[0], nil, "app")
	g.Record(violation(policy.RuleValueSize, "set", "", policy.Reported), nil, "app") // UnderEnforce unset: Reported
	lines := strings.Split(strings.TrimSpace(sink.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 lines:\n%s", sink.String())
	}
	if !strings.Contains(lines[0], `"outcome":"reported","command":"keys","under_enforce":"refused"`) {
		t.Errorf("the KEYS line does not say enforce refuses it: %s", lines[0])
	}
	if strings.Contains(lines[1], "under_enforce") {
		t.Errorf("a report rule's line says what enforce does: %s", lines[1])
	}
}

// BenchmarkRecord: one fixed TTL violation of a key as redis-benchmark
// names them, the log rate-limited away as under load.
func BenchmarkRecord(b *testing.B) {
	g, err := New(policy.DefaultConfig(), Options{Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	client := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5555}
	vs := make([]*policy.Violation, 64)
	for i := range vs {
		vs[i] = violation(policy.RuleTTL, "mset", fmt.Sprintf("key:%012d", i*7919), policy.Fixed)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		g.Record(vs[i&63], client, "default")
		i++
	}
}
