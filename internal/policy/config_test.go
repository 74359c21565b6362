package policy

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pelletier/go-toml/v2"
)

func TestDurationParse(t *testing.T) {
	good := map[string]time.Duration{
		"24h":    24 * time.Hour,
		"7d":     7 * 24 * time.Hour,
		"1w":     7 * 24 * time.Hour,
		"1d12h":  36 * time.Hour,
		"90s":    90 * time.Second,
		"1h30m":  90 * time.Minute,
		"15m":    15 * time.Minute,
		"500ms":  500 * time.Millisecond,
		"0":      0,
		"1.5h":   90 * time.Minute,
		"2w3d1h": (17*24 + 1) * time.Hour,
	}
	for s, want := range good {
		var d Duration
		if err := d.UnmarshalText([]byte(s)); err != nil || d.Duration != want {
			t.Errorf("%q: got %v, %v; want %v", s, d.Duration, err, want)
		}
	}
	for _, s := range []string{"", "5", "-1h", "+1h", "1x", "d", "1.5d", "h1", "1h 30m", "99999999999w"} {
		var d Duration
		if err := d.UnmarshalText([]byte(s)); err == nil {
			t.Errorf("%q: accepted as %v", s, d.Duration)
		} else if want := "invalid duration"; s == "-1h" && err.Error() != "must not be negative, got -1h" || s == "99999999999w" && !strings.Contains(err.Error(), "too long") ||
			s != "-1h" && s != "99999999999w" && !strings.Contains(err.Error(), want) {
			t.Errorf("%q: unhelpful error %v", s, err)
		}
	}
	for _, c := range []struct {
		d    time.Duration
		want string
	}{{7 * 24 * time.Hour, "7d"}, {24 * time.Hour, "1d"}, {90 * time.Minute, "1h30m"}, {time.Hour, "1h"}, {90 * time.Second, "1m30s"}} {
		b, _ := Duration{c.d}.MarshalText()
		if string(b) != c.want {
			t.Errorf("MarshalText(%v) = %q, want %q", c.d, b, c.want)
		}
		var back Duration
		if err := back.UnmarshalText(b); err != nil || back.Duration != c.d {
			t.Errorf("round trip %v: %v, %v", c.d, back.Duration, err)
		}
	}
}

// TestDurationInTOML: a bare integer is refused rather than read as
// nanoseconds.
func TestDurationInTOML(t *testing.T) {
	var c Config
	err := toml.Unmarshal([]byte("[[ttl]]\npattern = \"a:*\"\nrequired = true\ndefault = 86400\n"), &c)
	if err == nil {
		t.Fatalf("integer TTL accepted: %+v", c.TTL)
	}
}

func TestDefaultConfig(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	var zero Config
	for name, cfg := range map[string]Config{"DefaultConfig": c, "zero Config": zero} {
		p, err := Compile(cfg)
		if err != nil {
			t.Fatal(err)
		}
		got := summaries(p.CheckBatch(batch("KEYS *", "FLUSHALL", "FLUSHDB", "SET foo bar", "HSET k f v", "SET big <204800>"), nil))
		want := []string{"refused:command", "refused:command", "refused:command", "", "", ""}
		if strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("%s: got %q, want %q", name, got, want)
		}
	}
}

func TestValidate(t *testing.T) {
	cases := []struct {
		name string
		doc  string
		want []string // every error expected, in any order
	}{
		{"bad mode", `mode = "strict"`, []string{`policy.mode: invalid action "strict" (use enforce, report or off)`}},
		{"bad command action", "[commands]\naction = \"block\"", []string{"policy.commands.action: invalid action"}},
		{"unknown command", "[commands]\ndeny = [\"flushal\", \"config|sett\", \"\"]\nallow = [\"keyz\"]", []string{
			`policy.commands.deny[0]: unknown command "flushal"`,
			`policy.commands.deny[1]: unknown command "config|sett"`,
			`policy.commands.deny[2]: must not be empty`,
			`policy.commands.allow[0]: unknown command "keyz"`,
		}},
		{"ttl rule errors", `
[[ttl]]
pattern = ""
[[ttl]]
pattern = "a:*"
required = true
default = "2h"
max = "1h"
[[ttl]]
pattern = "b:*"
default = "1h"
[[ttl]]
pattern = "c:[abc"
max = "1500ms"
max_action = "cut"
action = "always"
[[ttl]]
pattern = "d:*"
max_action = "refuse"
[[ttl]]
pattern = "a:*"
`, []string{
			`policy.ttl[0].pattern: must not be empty`,
			`policy.ttl[1].max: must be >= default (2h), got 1h`,
			`policy.ttl[2].default: has no effect without required = true`,
			`policy.ttl[3].pattern: pattern has an unclosed '['`,
			`policy.ttl[3].max: must be a whole number of seconds, got 1.5s`,
			`policy.ttl[3].max_action: invalid value "cut"`,
			`policy.ttl[3].action: invalid action "always"`,
			`policy.ttl[4].max_action: set without max`,
			`policy.ttl[5].pattern: "a:*" is already policy.ttl[1]`,
		}},
		{"unreachable after catch-all", "[[ttl]]\npattern = \"*\"\nrequired = true\n[[ttl]]\npattern = \"a:*\"\n", []string{
			`policy.ttl[1].pattern: policy.ttl[0] matches every key first`,
		}},
		{"names", "[names]\nnamespaces = [\"session:\", \"\"]\nregex = \"(\"\nmax_key_length = -1\nrequire_version = [\"x:\\\\\"]\naction = \"no\"", []string{
			`policy.names.action: invalid action "no"`,
			`policy.names.namespaces[0]: "session:" contains ':'`,
			`policy.names.namespaces[1]: must not be empty`,
			`policy.names.regex: error parsing regexp`,
			`policy.names.max_key_length: must not be negative`,
			`policy.names.require_version[0]: pattern ends with an unescaped '\'`,
		}},
		{"values", "[values]\nmax_value_bytes = -1\naction = \"x\"", []string{
			`policy.values.max_value_bytes: must not be negative`,
			`policy.values.action: invalid action "x"`,
		}},
		{"scopes", `
[[scope]]
name = "a"
mode = "loud"
[[scope]]
name = "a"
users = [""]
[scope.commands]
allow = ["nope"]
[[scope.ttl]]
pattern = "x:*"
default = "1d"
[scope.names]
regex = "["
[scope.values]
action = "y"
`, []string{
			`policy.scope[0]: needs users or listeners`,
			`policy.scope[0].mode: invalid action "loud"`,
			`policy.scope[1].name: "a" is already the name of policy.scope[0]`,
			`policy.scope[1].users[0]: must not be empty`,
			`policy.scope[1].commands.allow[0]: unknown command "nope"`,
			`policy.scope[1].ttl[0].default: has no effect without required = true`,
			`policy.scope[1].names.regex: error parsing regexp`,
			`policy.scope[1].values.action: invalid action "y"`,
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var cfg Config
			if err := toml.NewDecoder(strings.NewReader(c.doc)).DisallowUnknownFields().Decode(&cfg); err != nil {
				t.Fatalf("decode: %v", err)
			}
			err := cfg.Validate()
			if err == nil {
				t.Fatalf("no error, want %q", c.want)
			}
			var got []string
			for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
				var pe *Error
				if !errors.As(e, &pe) || pe.Key == "" {
					t.Errorf("error %q is not a *policy.Error with a key", e)
				}
				got = append(got, e.Error())
			}
			if len(got) != len(c.want) {
				t.Errorf("got %d errors, want %d:\n%s", len(got), len(c.want), strings.Join(got, "\n"))
			}
			for _, w := range c.want {
				found := false
				for _, g := range got {
					found = found || strings.HasPrefix(g, w)
				}
				if !found {
					t.Errorf("missing error %q in:\n%s", w, strings.Join(got, "\n"))
				}
			}
			if _, err := Compile(cfg); err == nil {
				t.Errorf("Compile accepted an invalid config")
			}
		})
	}
}

func TestParseAction(t *testing.T) {
	for s, want := range map[string]Action{"enforce": Enforce, "report": Report, "off": Off} {
		if a, err := ParseAction(s); err != nil || a != want || a.String() != s {
			t.Errorf("ParseAction(%q) = %v, %v", s, a, err)
		}
	}
	for _, s := range []string{"", "Enforce", "on"} {
		if _, err := ParseAction(s); err == nil {
			t.Errorf("ParseAction(%q) accepted", s)
		}
	}
}
