package policy

import (
	"os"
	"strings"
	"testing"
)

func TestCommandRules(t *testing.T) {
	cases := []struct {
		name string
		doc  string
		cmd  string
		want string
	}{
		{"default keys", "", "KEYS *", "refused:command"},
		{"default keys lower case", "", "keys user:*", "refused:command"},
		{"default flushall", "", "FLUSHALL", "refused:command"},
		{"default flushall async", "", "FLUSHALL ASYNC", "refused:command"},
		{"default flushdb", "", "FLUSHDB", "refused:command"},
		{"default shutdown", "", "SHUTDOWN NOSAVE", "refused:command"},
		{"default replicaof", "", "REPLICAOF 10.0.0.1 6379", "refused:command"},
		{"default slaveof", "", "SLAVEOF NO ONE", "refused:command"},
		{"default failover", "", "FAILOVER", "refused:command"},
		{"default cluster reset", "", "CLUSTER RESET HARD", "refused:command"},
		{"default cluster failover", "", "CLUSTER FAILOVER TAKEOVER", "refused:command"},
		{"default module load", "", "MODULE LOAD /tmp/m.so", "refused:command"},
		{"default module list", "", "MODULE LIST", ""},
		{"default cluster info", "", "CLUSTER INFO", ""},
		{"allow re-enables builtin shutdown", "[policy.commands]\nallow = [\"shutdown\"]", "SHUTDOWN NOSAVE", ""},
		{"allow container re-enables builtin subcommand", "[policy.commands]\nallow = [\"module\"]", "MODULE LOAD /tmp/m.so", ""},
		{"allow container re-enables builtin cluster reset", "[policy.commands]\nallow = [\"cluster\"]", "CLUSTER RESET HARD", ""},
		{"allow container keeps a denied subcommand", "[policy.commands]\ndeny = [\"module|load\"]\nallow = [\"module\"]", "MODULE LOAD /tmp/m.so", "refused:command"},
		{"allow subcommand re-enables builtin subcommand", "[policy.commands]\nallow = [\"cluster|failover\"]", "CLUSTER FAILOVER", ""},
		{"default scan", "", "SCAN 0 MATCH user:* COUNT 100", ""},
		{"default debug", "", "DEBUG SLEEP 0", ""},
		{"default config set", "", "CONFIG SET maxmemory 1gb", ""},
		{"default script flush", "", "SCRIPT FLUSH", ""},
		{"default function flush", "", "FUNCTION FLUSH", ""},
		{"default unknown command", "", "NOSUCHCOMMAND a", ""},
		{"deny subcommand", "[policy.commands]\ndeny = [\"config|set\"]", "CONFIG SET maxmemory 1gb", "refused:command"},
		{"deny subcommand spelt with space", "[policy.commands]\ndeny = [\"CONFIG SET\"]", "config set maxmemory 1gb", "refused:command"},
		{"deny subcommand leaves siblings", "[policy.commands]\ndeny = [\"config|set\"]", "CONFIG GET maxmemory", ""},
		{"deny container covers subcommands", "[policy.commands]\ndeny = [\"script\"]", "SCRIPT FLUSH", "refused:command"},
		{"allow subcommand of denied container", "[policy.commands]\ndeny = [\"script\"]\nallow = [\"script|load\"]", "SCRIPT LOAD return", ""},
		{"allow wins over deny", "[policy.commands]\ndeny = [\"debug\"]\nallow = [\"debug\"]", "DEBUG SLEEP 0", ""},
		{"allow re-enables builtin", "[policy.commands]\nallow = [\"keys\"]", "KEYS *", ""},
		{"deny list adds to builtin", "[policy.commands]\ndeny = [\"debug\"]", "KEYS *", "refused:command"},
		{"deny monitor", "[policy.commands]\ndeny = [\"monitor\", \"shutdown\", \"swapdb\", \"replicaof\", \"slaveof\", \"cluster|reset\", \"function|flush\"]", "MONITOR", "refused:command"},
		{"deny replicaof", "[policy.commands]\ndeny = [\"replicaof\"]", "REPLICAOF no one", "refused:command"},
		{"deny module command", "[policy.commands]\ndeny = [\"ft.dropindex\"]", "FT.DROPINDEX idx", "refused:command"},
		{"commands action report", "[policy.commands]\naction = \"report\"", "KEYS *", "reported:command"},
		{"commands action off", "[policy.commands]\naction = \"off\"", "KEYS *", ""},
		{"mode report", "[policy]\nmode = \"report\"", "FLUSHALL", "reported:command"},
		{"mode report caps rule enforce", "[policy]\nmode = \"report\"\n[policy.commands]\naction = \"enforce\"", "FLUSHALL", "reported:command"},
		{"mode off", "[policy]\nmode = \"off\"", "FLUSHALL", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := compileDoc(t, c.doc)
			out := checkBatch(t, p, []Request{line(c.cmd)})
			if got := summary(out[0]); got != c.want {
				t.Errorf("%s: got %q, want %q", c.cmd, got, c.want)
			}
		})
	}
}

func TestCommandMessages(t *testing.T) {
	p := compileDoc(t, "[policy.commands]\ndeny = [\"config|set\", \"debug\"]")
	cases := map[string]string{
		"KEYS *":                 "ERR redproxy policy: KEYS is disabled; use SCAN 0 MATCH pattern COUNT 100",
		"FLUSHALL":               "ERR redproxy policy: FLUSHALL is disabled; delete by pattern with SCAN 0 MATCH prefix:* COUNT 100 and UNLINK",
		"flushdb":                "ERR redproxy policy: FLUSHDB is disabled; delete by pattern with SCAN 0 MATCH prefix:* COUNT 100 and UNLINK",
		"config set maxmemory 1": "ERR redproxy policy: CONFIG SET is disabled; change the Redis configuration through your operators, not the application",
		"DEBUG SLEEP 0":          "ERR redproxy policy: DEBUG is disabled; run it with redis-cli against the server itself",
	}
	for c, want := range cases {
		out := checkBatch(t, p, []Request{line(c)})
		r := out[0].Refuse
		if r == nil || r.Message() != want {
			t.Errorf("%s: got %+v, want %q", c, r, want)
			continue
		}
		if r.Rule != RuleCommand || r.Key != nil || r.Action != Enforce {
			t.Errorf("%s: violation %+v", c, *r)
		}
	}
	out := checkBatch(t, p, []Request{line("config set maxmemory 1")})
	if got := out[0].Refuse.Command; got != "config|set" {
		t.Errorf("Command = %q, want config|set", got)
	}
}

func TestForcedMode(t *testing.T) {
	p := compileDoc(t, ttlDoc)
	reqs := batch("KEYS *", "SET l:k v", "SET s:k v", "EXPIRE s:other 99999999")

	got := summaries(checkBatch(t, p, reqs))
	want := []string{"refused:command", "refused:ttl", "fixed:ttl args=[SET s:k v EX 86400]", "fixed:ttl_max args=[EXPIRE s:other 604800]"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("enforce:\n got %q\nwant %q", got, want)
	}

	got = summaries(checkBatch(t, p.ForcedMode(Report), reqs))
	want = []string{"reported:command", "reported:ttl", "reported:ttl", "reported:ttl_max"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("forced report:\n got %q\nwant %q", got, want)
	}
	// Forcing back up cannot raise what a lower force capped.
	got = summaries(checkBatch(t, p.ForcedMode(Report).ForcedMode(Enforce), reqs))
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("report then enforce:\n got %q\nwant %q", got, want)
	}
	for i, s := range summaries(checkBatch(t, p.ForcedMode(Off), reqs)) {
		if s != "" {
			t.Errorf("forced off: request %d: %q", i, s)
		}
	}
	// The original is untouched.
	if s := summary(checkBatch(t, p, reqs[:1])[0]); s != "refused:command" {
		t.Errorf("original policy changed: %q", s)
	}
	var nilPolicy *Policy
	if d := nilPolicy.CheckBatch(reqs, nil); len(d) != len(reqs) || d[0].Refuse != nil {
		t.Errorf("nil policy: %+v", d)
	}
}

func summaries(ds []Decision) []string {
	s := make([]string, len(ds))
	for i, d := range ds {
		s[i] = summary(d)
	}
	return s
}

const namesDoc = `
[policy.names]
namespaces = ["session", "cache", "states"]
max_key_length = 40
require_version = ["cache:*"]
`

func TestNameRules(t *testing.T) {
	p := compileDoc(t, namesDoc)
	cases := []struct{ cmd, want string }{
		{"SET session:1 v", ""},
		{"SET cache:product:v2:1 v", ""},
		{"SET states:all:v14 v", ""},
		{"SET foo bar", "refused:namespaces"},
		{"SET user:1 v", "refused:namespaces"},
		{"SET session v", "refused:namespaces"}, // no ':' at all
		{"SET cache:product:1 v", "refused:require_version"},
		{"SET cache:product:v:1 v", "refused:require_version"},
		{"SET cache:product:vx2:1 v", "refused:require_version"},
		{"SET session:" + strings.Repeat("a", 40) + " v", "refused:max_key_length"},
		{"HSET foo f v", "refused:namespaces"},
		{"MSET session:1 a foo b", "refused:namespaces"},
		{"SETEX foo 10 v", "refused:namespaces"},
		{"COPY session:1 foo", "refused:namespaces"},
		{"SUNIONSTORE foo session:1", "refused:namespaces"},
		// Reads, deletes and TTL changes of existing keys are not creations.
		{"GET foo", ""},
		{"DEL foo", ""},
		{"UNLINK foo", ""},
		{"EXPIRE foo 10", ""},
		{"HGET foo f", ""},
		{"COPY foo session:1", ""},
		// Scripts: the declared keys count as created.
		// (EVAL script numkeys key... arg...; the script here is "return".)
		{"EVAL return 1 foo", "refused:namespaces"},
		{"EVALSHA abc 2 session:1 foo", "refused:namespaces"},
		{"FCALL f 1 foo", "refused:namespaces"},
		{"EVAL return 1 session:1 foo", ""}, // foo is an argument, not a key
		{"EVAL_RO return 1 foo", ""},
		{"EVAL return 0 foo", ""},
	}
	for _, c := range cases {
		out := checkBatch(t, p, []Request{line(c.cmd)})
		if got := summary(out[0]); got != c.want {
			t.Errorf("%s: got %q, want %q", c.cmd, got, c.want)
		}
	}

	out := checkBatch(t, p, []Request{line("SET foo bar")})
	want := `ERR redproxy policy: key "foo" does not match naming rule "namespaces"; start it with one of: session, cache, states, followed by ':'`
	if r := out[0].Refuse; r == nil || r.Message() != want || string(r.Key) != "foo" {
		t.Errorf("got %+v, want %q", r, want)
	}
	out = checkBatch(t, p, []Request{line("SET cache:product:1 v")})
	if r := out[0].Refuse; r == nil || r.Pattern != "cache:*" || !strings.Contains(r.Message(), `naming rule "require_version"`) {
		t.Errorf("version violation: %+v", r)
	}
	long := "session:" + strings.Repeat("a", 200)
	out = checkBatch(t, p, []Request{cmd("SET", long, "v")})
	if r := out[0].Refuse; r == nil || !strings.Contains(r.Message(), "is 208 bytes, longer than 40") || strings.Contains(r.Message(), long) {
		t.Errorf("long key message must give the length and cut the key: %+v", r)
	}
}

func TestNameRegex(t *testing.T) {
	p := compileDoc(t, "[policy.names]\nregex = '[a-z]+:[0-9]+'\naction = \"report\"")
	cases := []struct{ cmd, want string }{
		{"SET a:1 v", ""},
		{"SET abc:123 v", ""},
		{"SET a:b v", "reported:regex"},
		{"SET A:1 v", "reported:regex"},
		{"SET xa:1y v", "reported:regex"}, // anchored: the whole key must match
	}
	for _, c := range cases {
		out := checkBatch(t, p, []Request{line(c.cmd)})
		if got := summary(out[0]); got != c.want {
			t.Errorf("%s: got %q, want %q", c.cmd, got, c.want)
		}
	}
	// The message shows the pattern as configured, not its anchored form.
	out := checkBatch(t, p, []Request{line("SET A:1 v")})
	want := `ERR redproxy policy: key "A:1" does not match naming rule "regex": the whole key must match [a-z]+:[0-9]+`
	if vs := out[0].Violations; len(vs) != 1 || vs[0].Message() != want {
		t.Errorf("violations %+v, want the message %q", vs, want)
	}
}

func TestCheckKeyNameAndTTLRule(t *testing.T) {
	p := compileDoc(t, namesDoc+ttlDoc)
	if v := p.CheckKeyName([]byte("session:1")); v != nil {
		t.Errorf("good key: %+v", v)
	}
	v := p.CheckKeyName([]byte("foo"))
	if v == nil || v.Rule != RuleNamespaces || v.Outcome != Reported || string(v.Key) != "foo" {
		t.Errorf("bad key: %+v", v)
	}
	if v := p.ForcedMode(Off).CheckKeyName([]byte("foo")); v != nil {
		t.Errorf("off: %+v", v)
	}
	r, ok := p.TTLRule([]byte("s:1"))
	if !ok || r.Pattern != "s:*" || !r.Required || r.Default.Hours() != 24 || r.Max.Hours() != 168 || r.Action != Enforce {
		t.Errorf("TTLRule(s:1) = %+v, %v", r, ok)
	}
	if r, ok := p.TTLRule([]byte("r:1")); !ok || r.Action != Report {
		t.Errorf("TTLRule(r:1) = %+v, %v", r, ok)
	}
	if _, ok := p.TTLRule([]byte("p:1")); ok {
		t.Errorf("TTLRule(p:1) matched")
	}
}

func TestValueRule(t *testing.T) {
	p := compileDoc(t, "[policy.values]\n")
	cases := []struct{ cmd, want string }{
		{"SET k <102400>", ""},
		{"SET k <102401>", "refused:value_size"},
		{"SET k v EX 10", ""},
		{"SETEX k 10 <204800>", "refused:value_size"},
		{"MSET a 1 b <204800>", "refused:value_size"},
		{"HSET h f <204800>", "refused:value_size"},
		{"LPUSH l a <204800>", "refused:value_size"},
		{"APPEND k <204800>", "refused:value_size"},
		{"SETRANGE k 0 <204800>", "refused:value_size"},
		{"XADD s * f <204800>", "refused:value_size"},
		{"RESTORE k 0 <204800>", "refused:value_size"},
		{"SADD s <204800>", "refused:value_size"},
		// Not writes: reads with large arguments and scripts pass.
		{"SISMEMBER s <204800>", ""},
		{"PUBLISH ch <204800>", ""},
		{"EVAL <204800> 0", ""},
		// Writes whose argument is a library's code, not a stored value.
		{"FUNCTION LOAD <204800>", ""},
		{"FUNCTION RESTORE <204800>", ""},
		// A large key is not a value (the naming rules limit key length).
		{"SET <204800> v", ""},
	}
	for _, c := range cases {
		out := checkBatch(t, p, []Request{line(c.cmd)})
		if got := summary(out[0]); got != c.want {
			t.Errorf("%s: got %q, want %q", c.cmd, got, c.want)
		}
	}
	out := checkBatch(t, p, []Request{line("SET k <204800>")})
	want := `ERR redproxy policy: value of 204800 bytes exceeds 102400 (rule "value_size"); store large objects elsewhere and keep a reference in Redis`
	// The key names the write (for the report's key pattern); the value
	// never reaches the message.
	if r := out[0].Refuse; r == nil || r.Message() != want || string(r.Key) != "k" || strings.Contains(r.Message(), "xxx") {
		t.Errorf("got %+v, want %q on key k", r, want)
	}

	small := compileDoc(t, "[policy.values]\nmax_value_bytes = \"1KB\"\naction = \"report\"")
	out = checkBatch(t, small, batch("SET k <1025>", "SET k <1024>"))
	if got := summaries(out); got[0] != "reported:value_size" || got[1] != "" {
		t.Errorf("1KB report: %q", got)
	}
	if small.MaxValueBytes() != 1024 || p.MaxValueBytes() != 102400 {
		t.Errorf("MaxValueBytes = %d, %d", small.MaxValueBytes(), p.MaxValueBytes())
	}
	none := compileDoc(t, "")
	if s := summary(checkBatch(t, none, []Request{line("SET k <204800>")})[0]); s != "" || none.MaxValueBytes() != 0 {
		t.Errorf("no [policy.values]: %q, max %d", s, none.MaxValueBytes())
	}
}

const scopeDoc = `
[policy.commands]
deny = ["debug"]

[[policy.ttl]]
pattern = "s:*"
required = true

[[policy.scope]]
name = "batch"
users = ["batch-job"]
mode = "report"

[[policy.scope]]
name = "tests"
listeners = ["test"]
ttl = []
[policy.scope.commands]
allow = ["flushdb"]

[[policy.scope]]
name = "ops"
users = ["ops"]
listeners = ["admin"]
[policy.scope.commands]
allow = ["keys", "debug"]
[policy.scope.values]
max_value_bytes = "1KB"
`

func TestScopes(t *testing.T) {
	p := compileDoc(t, scopeDoc)
	reqs := func(user, listener string, lines ...string) []Request {
		r := batch(lines...)
		for i := range r {
			r[i].User, r[i].Listener = user, listener
		}
		return r
	}
	cases := []struct {
		name, user, listener string
		batch                []string
		want                 []string
		scope                string
	}{
		{"global", "app", "main", []string{"SET s:1 v", "FLUSHDB", "DEBUG SLEEP 0", "SET k <2048>"},
			[]string{"refused:ttl", "refused:command", "refused:command", ""}, ""},
		{"report scope", "batch-job", "main", []string{"SET s:1 v", "FLUSHDB"},
			[]string{"reported:ttl", "reported:command"}, "batch"},
		{"first matching scope wins", "batch-job", "test", []string{"FLUSHDB"},
			[]string{"reported:command"}, "batch"},
		{"listener scope", "app", "test", []string{"FLUSHDB", "FLUSHALL", "DEBUG SLEEP 0", "SET s:1 v"},
			[]string{"", "refused:command", "refused:command", ""}, "tests"},
		{"user and listener", "ops", "admin", []string{"KEYS *", "DEBUG SLEEP 0", "SET s:1 v", "SET k <2048>"},
			[]string{"", "", "refused:ttl", "refused:value_size"}, "ops"},
		{"user without listener", "ops", "main", []string{"KEYS *", "SET k <2048>"},
			[]string{"refused:command", ""}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out := checkBatch(t, p, reqs(c.user, c.listener, c.batch...))
			for i, d := range out {
				if got := summary(d); got != c.want[i] {
					t.Errorf("%s: got %q, want %q", c.batch[i], got, c.want[i])
				}
				for _, v := range d.Violations {
					if v.Scope != c.scope {
						t.Errorf("%s: scope %q, want %q", c.batch[i], v.Scope, c.scope)
					}
				}
			}
		})
	}
}

func TestDecisionReuse(t *testing.T) {
	p := compileDoc(t, ttlDoc)
	out := p.CheckBatch(batch("KEYS *", "SET s:k v", "HSET s:h f v"), nil)
	if summary(out[0]) == "" || out[1].Args == nil || len(out[2].Expires) != 1 {
		t.Fatalf("first batch: %q", summaries(out))
	}
	out = p.CheckBatch(batch("GET a", "SET s:k v EX 10", "PING"), out)
	for i, s := range summaries(out) {
		if s != "" || out[i].Refuse != nil {
			t.Errorf("reused decision %d kept old state: %q", i, s)
		}
	}
}

func TestExpireArgs(t *testing.T) {
	got := joinArgs(Expire{Key: []byte("session:1"), Seconds: 86400}.Args())
	if got != "EXPIRE session:1 86400 NX" {
		t.Errorf("got %q", got)
	}
}

// TestCheckBatchDoesNotAllocate: the common path (no violation) must stay
// allocation-free, since it runs on every command.
func TestCheckBatchDoesNotAllocate(t *testing.T) {
	p := compileDoc(t, ttlDoc+`
[policy.names]
namespaces = ["session", "s"]
require_version = ["cache:*"]
max_key_length = 100
[policy.values]
`)
	reqs := batch("GET session:1", "SET session:1 v EX 100", "HSET s:x f v", "EXPIRE s:x 100",
		"MULTI", "INCR s:c", "EXPIRE s:c 60", "EXEC", "DEL session:1", "SCAN 0")
	out := p.CheckBatch(reqs, nil)
	for i, s := range summaries(out) {
		if s != "" {
			t.Fatalf("request %d not clean: %q", i, s)
		}
	}
	allocs := testing.AllocsPerRun(100, func() { out = p.CheckBatch(reqs, out) })
	if allocs != 0 {
		t.Errorf("CheckBatch allocated %.1f times per clean batch", allocs)
	}
}

// Every command the example denies is refused with a hint that names what
// to do instead, not the bare "is disabled".
func TestExampleDeniesWithHints(t *testing.T) {
	doc, err := os.ReadFile("testdata/policy.example.toml")
	if err != nil {
		t.Fatal(err)
	}
	cfg := parseConfig(t, string(doc))
	if len(cfg.Commands.Deny) < 10 {
		t.Fatalf("the example denies %v", cfg.Commands.Deny)
	}
	p := examplePolicy(t)
	for _, name := range cfg.Commands.Deny {
		words := strings.Fields(strings.ToUpper(strings.ReplaceAll(name, "|", " ")))
		out := checkBatch(t, p, []Request{cmd(append(words, "x")...)})
		r := out[0].Refuse
		prefix := "ERR redproxy policy: " + strings.Join(words, " ") + " is disabled; "
		if r == nil || !strings.HasPrefix(r.Message(), prefix) || len(r.Message()) < len(prefix)+10 {
			t.Errorf("%s: refusal %+v, want %q and a hint", name, r, prefix)
		}
	}
}
