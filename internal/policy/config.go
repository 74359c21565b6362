package policy

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/config/units"
)

// Config is the [policy] section of the redproxy configuration. The zero
// value is the default policy (see DefaultConfig): every field left out of a
// config file keeps a safe meaning.
type Config struct {
	// Mode is "enforce" (default when empty), "report" or "off". It is both
	// the action of every rule that does not name its own and the ceiling of
	// those that do: a rule can only lower it.
	Mode     string       `toml:"mode"`
	Commands CommandRules `toml:"commands"`
	// TTL rules, first match wins (document order).
	TTL   []TTLRule `toml:"ttl"`
	Names NameRules `toml:"names"`
	// Values is nil when the config has no [policy.values] table: the rule is
	// off. A present table with no max_value_bytes uses DefaultMaxValueBytes.
	Values *ValueRules `toml:"values"`
	// Scopes override the rules above for some users or listeners; the first
	// matching scope (document order) applies.
	Scopes []Scope `toml:"scope"`
}

// CommandRules refuse whole commands. KEYS, FLUSHALL and FLUSHDB are always
// denied unless allowed here (see the package documentation).
type CommandRules struct {
	Action string   `toml:"action"` // "" = the mode
	Deny   []string `toml:"deny"`   // command names, lower or upper case; subcommands as "config|set"
	Allow  []string `toml:"allow"`  // wins over Deny and over the built-in denials
}

// TTLRule is one [[policy.ttl]] entry.
type TTLRule struct {
	Pattern  string `toml:"pattern"` // Redis glob on the key, e.g. "session:*"
	Required bool   `toml:"required"`
	// Default is the TTL given to a key that would otherwise have none; zero
	// means such writes are refused. Only meaningful with Required.
	Default Duration `toml:"default"`
	// Max caps TTLs set explicitly (SET EX, EXPIRE, ...); zero = no cap.
	Max       Duration `toml:"max"`
	MaxAction string   `toml:"max_action"` // "clamp" (default) or "refuse"
	Action    string   `toml:"action"`     // "" = the mode
}

// NameRules constrain the names of keys a command may create. Every field
// left empty is off.
type NameRules struct {
	Action string `toml:"action"`
	// Namespaces are the allowed first segments (before the first ':').
	Namespaces []string `toml:"namespaces"`
	// Regex must match the whole key (it is anchored for you).
	Regex        string `toml:"regex"`
	MaxKeyLength int    `toml:"max_key_length"` // bytes; 0 = no limit
	// RequireVersion lists globs whose keys must carry a "v<N>" segment, the
	// {module}:{scope}:v{N} convention for cache keys.
	RequireVersion []string `toml:"require_version"`
}

// ValueRules refuse or report large values.
type ValueRules struct {
	Action        string         `toml:"action"`
	MaxValueBytes units.ByteSize `toml:"max_value_bytes"` // 0 = DefaultMaxValueBytes
}

// LimitInForce is the value-size limit, DefaultMaxValueBytes where the
// table sets none: what the policy enforces and what redproxy check shows.
func (v ValueRules) LimitInForce() units.ByteSize {
	if v.MaxValueBytes == 0 {
		return DefaultMaxValueBytes
	}
	return v.MaxValueBytes
}

// Scope is one [[policy.scope]] entry: rules for some users and/or listeners.
// A section set here replaces the global one wholesale, except commands,
// whose lists are layered on top of the global lists. Sections left out
// (nil) inherit the global section.
type Scope struct {
	Name      string   `toml:"name"` // shown in logs and violations; defaults to "scope[i]"
	Users     []string `toml:"users"`
	Listeners []string `toml:"listeners"`
	Mode      string   `toml:"mode"` // "" = the global mode

	Commands *CommandRules `toml:"commands"`
	TTL      []TTLRule     `toml:"ttl"` // nil = inherit; `ttl = []` = no TTL rules in this scope
	Names    *NameRules    `toml:"names"`
	Values   *ValueRules   `toml:"values"`
}

// DefaultMaxValueBytes is the value-size limit when [policy.values] does not
// set one: the seeds' "large blobs (>100KB)" anti-pattern.
const DefaultMaxValueBytes = 100 * units.KB

// DefaultConfig is the policy used when the configuration has no [policy]
// section: enforce mode with only the built-in command denials (KEYS,
// FLUSHALL, FLUSHDB); no TTL, naming or value-size rules.
func DefaultConfig() Config {
	return Config{Mode: "enforce"}
}

// Duration is a TTL written in TOML as a string: Go durations ("90s",
// "15m", "24h", "1h30m") plus "d" (24h) and "w" (7d) units, e.g. "7d". It is
// a struct so that a bare TOML integer reaches UnmarshalText and is rejected
// for lacking a unit instead of silently meaning nanoseconds.
type Duration struct{ time.Duration }

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(text []byte) error {
	v, err := parseDuration(string(text))
	if err != nil {
		return err
	}
	d.Duration = v
	return nil
}

// MarshalText writes whole days as "Nd" so a round trip reads like the input.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

func (d Duration) String() string { return units.FormatDuration(d.Duration) }

func parseDuration(s string) (time.Duration, error) {
	if strings.HasPrefix(s, "-") {
		// As the other sections say it (a user's trial read "invalid
		// duration" for a plain "-5s").
		return 0, fmt.Errorf("must not be negative, got %s", s)
	}
	d, err := units.ParseDuration(s)
	if errors.Is(err, units.ErrDurationTooLong) {
		return 0, fmt.Errorf("duration %q is too long: %w", s, err)
	}
	if err != nil {
		return 0, fmt.Errorf("invalid duration %q (use e.g. \"90s\", \"15m\", \"24h\", \"7d\", \"1w\")", s)
	}
	return d, nil
}

// Error is one invalid setting; Validate returns several joined with
// errors.Join. Key is the dotted path such as "policy.ttl[2].max", so the
// config loader can point at the line.
type Error struct {
	Key string
	Msg string
}

func (e *Error) Error() string { return e.Key + ": " + e.Msg }

// Validate reports every invalid setting at once (errors.Join of *Error).
func (c Config) Validate() error {
	var v validator
	v.config(c)
	return errors.Join(v.errs...)
}

type validator struct {
	errs []error
	tbl  *commands.Table
}

func (v *validator) bad(key, format string, args ...any) {
	v.errs = append(v.errs, &Error{Key: key, Msg: fmt.Sprintf(format, args...)})
}

func (v *validator) config(c Config) {
	v.tbl = commands.Builtin()
	v.mode("policy.mode", c.Mode)
	v.commands("policy.commands", &c.Commands)
	v.ttl("policy.ttl", c.TTL)
	v.names("policy.names", &c.Names)
	if c.Values != nil {
		v.values("policy.values", c.Values)
	}
	names := map[string]string{}
	for i, s := range c.Scopes {
		p := fmt.Sprintf("policy.scope[%d]", i)
		if s.Name != "" {
			if prev, dup := names[s.Name]; dup {
				v.bad(p+".name", "%q is already the name of %s", s.Name, prev)
			}
			names[s.Name] = p
		}
		if len(s.Users) == 0 && len(s.Listeners) == 0 {
			v.bad(p, "needs users or listeners to say whom it applies to")
		}
		for j, u := range s.Users {
			if u == "" {
				v.bad(fmt.Sprintf("%s.users[%d]", p, j), "must not be empty")
			}
		}
		for j, l := range s.Listeners {
			if l == "" {
				v.bad(fmt.Sprintf("%s.listeners[%d]", p, j), "must not be empty")
			}
		}
		v.mode(p+".mode", s.Mode)
		if s.Commands != nil {
			v.commands(p+".commands", s.Commands)
		}
		v.ttl(p+".ttl", s.TTL)
		if s.Names != nil {
			v.names(p+".names", s.Names)
		}
		if s.Values != nil {
			v.values(p+".values", s.Values)
		}
	}
}

func (v *validator) mode(key, s string) {
	if _, err := parseAction(s); err != nil {
		v.bad(key, "%v", err)
	}
}

func (v *validator) commands(p string, c *CommandRules) {
	v.mode(p+".action", c.Action)
	check := func(list string, names []string) {
		for i, n := range names {
			key := fmt.Sprintf("%s.%s[%d]", p, list, i)
			if err := checkCommandName(v.tbl, n); err != nil {
				v.bad(key, "%v", err)
			}
		}
	}
	check("deny", c.Deny)
	check("allow", c.Allow)
}

// checkCommandName accepts a name the builtin command table knows, so typos
// in a deny list fail at startup instead of silently allowing the command.
// Names with a dot are module commands (FT.SEARCH), which the table cannot
// know.
func checkCommandName(tbl *commands.Table, name string) error {
	n := normalizeCommand(name)
	switch {
	case n == "":
		return errors.New("must not be empty")
	case strings.Contains(n, "."):
		return nil
	case tbl.Get(n) == nil:
		return fmt.Errorf("unknown command %q (write subcommands as \"config|set\")", name)
	}
	return nil
}

// normalizeCommand lower-cases a command name and writes "config set" as
// Redis 7 does, "config|set".
func normalizeCommand(s string) string {
	return strings.Join(strings.Fields(strings.ToLower(strings.ReplaceAll(s, "|", " "))), "|")
}

func (v *validator) ttl(p string, rules []TTLRule) {
	seen := map[string]int{}
	catchAll := -1
	for i, r := range rules {
		k := fmt.Sprintf("%s[%d]", p, i)
		switch {
		case r.Pattern == "":
			v.bad(k+".pattern", "must not be empty (use \"*\" for every key)")
		default:
			if err := checkGlob(r.Pattern); err != nil {
				v.bad(k+".pattern", "%v", err)
			}
			if j, dup := seen[r.Pattern]; dup {
				v.bad(k+".pattern", "%q is already %s[%d]; the first match wins, so this rule would never apply", r.Pattern, p, j)
			} else if catchAll >= 0 {
				v.bad(k+".pattern", "%s[%d] matches every key first (pattern \"*\"), so this rule would never apply", p, catchAll)
			}
			seen[r.Pattern] = i
			if r.Pattern == "*" && catchAll < 0 {
				catchAll = i
			}
		}
		v.mode(k+".action", r.Action)
		switch r.MaxAction {
		case "", "clamp", "refuse":
		default:
			v.bad(k+".max_action", "invalid value %q (use \"clamp\" or \"refuse\")", r.MaxAction)
		}
		if r.MaxAction != "" && r.Max.Duration == 0 {
			v.bad(k+".max_action", "set without max")
		}
		v.ttlValue(k+".default", r.Default.Duration)
		v.ttlValue(k+".max", r.Max.Duration)
		if r.Default.Duration > 0 && !r.Required {
			v.bad(k+".default", "has no effect without required = true")
		}
		if r.Max.Duration > 0 && r.Default.Duration > r.Max.Duration {
			v.bad(k+".max", "must be >= default (%v), got %v", r.Default, r.Max)
		}
	}
}

// ttlValue requires whole seconds: the fix-ups are EXPIRE/EX in seconds, and
// a sub-second default or max would be rounded to something else.
func (v *validator) ttlValue(key string, d time.Duration) {
	switch {
	case d < 0:
		v.bad(key, "must not be negative")
	case d%time.Second != 0:
		v.bad(key, "must be a whole number of seconds, got %v", d)
	}
}

func (v *validator) names(p string, n *NameRules) {
	v.mode(p+".action", n.Action)
	for i, ns := range n.Namespaces {
		k := fmt.Sprintf("%s.namespaces[%d]", p, i)
		switch {
		case ns == "":
			v.bad(k, "must not be empty")
		case strings.Contains(ns, ":"):
			v.bad(k, "%q contains ':'; list only the first segment (\"session\", not \"session:\")", ns)
		}
	}
	if n.Regex != "" {
		if _, err := regexp.Compile(n.Regex); err != nil {
			v.bad(p+".regex", "%v", err)
		}
	}
	if n.MaxKeyLength < 0 {
		v.bad(p+".max_key_length", "must not be negative")
	}
	for i, g := range n.RequireVersion {
		k := fmt.Sprintf("%s.require_version[%d]", p, i)
		if g == "" {
			v.bad(k, "must not be empty")
		} else if err := checkGlob(g); err != nil {
			v.bad(k, "%v", err)
		}
	}
}

func (v *validator) values(p string, r *ValueRules) {
	v.mode(p+".action", r.Action)
	if r.MaxValueBytes < 0 {
		v.bad(p+".max_value_bytes", "must not be negative (use action = \"off\" to disable)")
	}
}
