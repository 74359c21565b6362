package policy

import (
	"bytes"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redproxy/redproxy/internal/commands"
)

// Action is what a rule does with a violation. Actions are ordered: a mode
// or --policy-mode caps every rule at its own level.
type Action uint8

const (
	Off     Action = iota // the rule is not checked
	Report                // log and count, forward unchanged
	Enforce               // refuse, rewrite or add the TTL fix-up
)

// inherit marks an empty action in the config: use the scope's mode.
const inherit Action = 255

func (a Action) String() string {
	switch a {
	case Off:
		return "off"
	case Report:
		return "report"
	case Enforce:
		return "enforce"
	}
	return "Action(" + strconv.Itoa(int(a)) + ")"
}

// ParseAction parses "enforce", "report" or "off" (for --policy-mode).
func ParseAction(s string) (Action, error) {
	a, err := parseAction(s)
	if err == nil && a == inherit {
		err = fmt.Errorf("empty action (use enforce, report or off)")
	}
	return a, err
}

func parseAction(s string) (Action, error) {
	switch s {
	case "":
		return inherit, nil
	case "enforce":
		return Enforce, nil
	case "report":
		return Report, nil
	case "off":
		return Off, nil
	}
	return Off, fmt.Errorf("invalid action %q (use enforce, report or off)", s)
}

// Outcome is what happened to a command because of one violation.
type Outcome uint8

const (
	Reported Outcome = iota + 1 // forwarded unchanged (report mode)
	Refused                     // answered with Violation.Message, not forwarded
	Fixed                       // forwarded with a fix (rewritten args or an EXPIRE fix-up)
)

func (o Outcome) String() string {
	switch o {
	case Reported:
		return "reported"
	case Refused:
		return "refused"
	case Fixed:
		return "fixed"
	}
	return "Outcome(" + strconv.Itoa(int(o)) + ")"
}

// Rule names, as they appear in Violation.Rule, in messages and in metrics.
// The set is fixed, so they are safe as metric label values.
const (
	RuleCommand    = "command"
	RuleTTL        = "ttl"     // a key left without a required TTL
	RuleTTLMax     = "ttl_max" // a TTL longer than the rule's max
	RuleNamespaces = "namespaces"
	RuleRegex      = "regex"
	RuleKeyLength  = "max_key_length"
	RuleVersion    = "require_version"
	RuleValueSize  = "value_size"
	// RuleUnclassified is not a rule but a finding: a command whose effect
	// on keys the policy cannot fully work out (unknown to the command
	// table, or a write whose key specifications are incomplete), so its
	// keys may escape the TTL and naming rules. Always reported, never
	// refused.
	RuleUnclassified = "unclassified"
	msgPrefix        = "ERR redproxy policy: "
	maxKeyInMessage  = 100
)

// Request is one command as the guard sees it.
type Request struct {
	Cmd      *commands.Command // nil for commands the table does not know
	Args     [][]byte          // Args[0] is the command name
	User     string            // authenticated user, "" before AUTH ("default" after AUTH without a user name)
	Listener string            // listener name
	// Denied says the proxy refuses the request before it runs (the user's
	// ACL): it gives no key a TTL, so the look-ahead does not trust it.
	Denied bool
}

// Violation is one broken rule. Values are never included.
type Violation struct {
	Rule    string // one of the Rule constants
	Pattern string // the TTL rule or require_version pattern involved, else ""
	Scope   string // the scope whose rules applied, "" for the global rules
	Action  Action // Report or Enforce
	Outcome Outcome
	// UnderEnforce is what enforce does about it: Refused or Fixed, or
	// Reported for a finding no mode acts on (RuleUnclassified). Under
	// enforce it is Outcome; under report mode the policy report shows
	// it, so that staging says what turning enforce on will change.
	UnderEnforce Outcome
	Command      string // lower-case command name, subcommands as "config|set"
	Key          []byte // a copy of the key involved, nil for command and value rules
	// Msg is the client-facing error text, read through Message: build
	// makes it on first use where it names the key. Most violations are
	// fixed or reported, and their text is wanted only for a new row of
	// the policy report (log lines do not carry it): built for each
	// (fmt, the key quoted), it was most of the policy's cost (found
	// by a probe: a reported MSET of ten keys took four times the proxy's
	// CPU of an MSET without rules).
	Msg   string
	build func(*Violation) string
	names *nameRules // a naming violation's rules
	how   string     // a TTL violation: what the client can do about it
}

// Message is the client-facing error text without the leading '-',
// starting with "ERR redproxy policy: ". For reported and fixed violations
// it is what enforce mode without a fix would have answered.
func (v *Violation) Message() string {
	if v.Msg == "" && v.build != nil {
		v.Msg = v.build(v)
	}
	return v.Msg
}

// Expire is a TTL fix-up: after forwarding the command, the guard sends
// EXPIRE Key Seconds NX on the same upstream connection and keeps its reply
// from the client. NX leaves a TTL the key already had alone.
type Expire struct {
	Key     []byte // aliases the request's Args
	Seconds int64
	// LT sends EXPIRE ... LT instead of NX: it lowers a TTL above Seconds
	// (a rule's max) and leaves a lower one alone. It follows the NX
	// fix-up of a key that takes another key's TTL (RENAME, COPY), so the
	// key never lacks a TTL when it runs (LT would give one).
	LT bool
	// DB, when not nil, is the database the key is in, as the command named
	// it (COPY ... DB n; aliases the request's Args): the guard sends the
	// EXPIRE between SELECT DB and a SELECT back to the current database.
	DB []byte
}

// Args returns the fix-up's EXPIRE command (without the SELECTs around it
// that a DB needs).
func (e Expire) Args() [][]byte {
	mode := []byte("NX")
	if e.LT {
		mode = []byte("LT")
	}
	return [][]byte{[]byte("EXPIRE"), e.Key, strconv.AppendInt(nil, e.Seconds, 10), mode}
}

// Decision is the verdict on one request.
type Decision struct {
	// Refuse, when not nil, is the violation to answer with (as an error
	// reply with Refuse.Message); the command must not be forwarded, and Args
	// and Expires are empty.
	Refuse *Violation
	// Violations lists every violation found, whatever its outcome, for
	// logging and metrics.
	Violations []Violation
	// Args, when not nil, replaces the request's args (a TTL added or
	// clamped). Unchanged arguments alias the request's.
	Args [][]byte
	// Expires are fix-ups to send after the command.
	Expires []Expire
	// TTLFrom, when not 0, is the later request of the batch the
	// look-ahead trusted to give this write's key its TTL instead of a
	// fix-up. The two must reach Redis together: if the connection ended
	// between them, the key would keep no TTL.
	TTLFrom int
	// CutOff: the write's key found no later command setting its TTL,
	// and none of the batch's boundaries (SELECT, MULTI, EXEC...) came
	// after it, so the batch's end alone cut the look-ahead short: what
	// the client sent next may set the TTL (resp.Reader.Extend).
	CutOff bool
	// Open lists the Violations that are such cut-off TTL requirements.
	// Inside a client's transaction a later batch of it may still set
	// the TTL, so the session may forward the write as sent and leave
	// them to CheckTx and the transaction's end (a MULTI typed command by
	// command). Refused (no default) and reported ones are listed unless
	// anything else refuses the request: Refuse is then the only answer.
	// Fixed ones (a default) are listed only when every violation of the
	// request is open (AllOpen), so that forwarding the request as sent
	// loses no other fix. With Open set, Refuse, Args and Expires are
	// still the answer outside a transaction; with AllOpen, Args and
	// Expires hold only the open ones' fixes, which a forwarded write
	// leaves for later (OpenTTL.Fix).
	Open []OpenTTL
}

// OpenTTL is one open TTL requirement (Decision.Open).
type OpenTTL struct {
	V int // the index of its Violation
	// Fix, for one fixed under enforce with a default, is what to send
	// once nothing later in the transaction can set the TTL: EXPIRE key
	// default NX, and for a key that took another's TTL EXPIRE key max
	// LT. The keys alias the request's args.
	Fix []Expire
}

// AllOpen reports whether every violation of d is open: the request may
// be forwarded as sent, its requirements carried (Decision.Open).
func (d *Decision) AllOpen() bool { return len(d.Open) > 0 && len(d.Open) == len(d.Violations) }

// Policy is a compiled, immutable policy, safe for concurrent use. Reload
// builds a new one and swaps the pointer. A nil *Policy allows everything.
type Policy struct {
	global  *ruleset
	scopes  []scopeRules
	mode    Action // policy.mode as compiled (enforce when empty)
	ceiling Action
	now     func() time.Time // for EXAT/PXAT/EXPIREAT; replaced in tests
}

type scopeRules struct {
	users, listeners []string
	rs               *ruleset
}

// ruleset is the rules that apply to one scope, with every action resolved
// against that scope's mode.
type ruleset struct {
	scope     string
	cmdAction Action
	// cmdWould, and would in each rule, is the action with policy.mode
	// enforce and no --policy-mode cap: what the policy report says
	// enforce will do (Violation.UnderEnforce).
	cmdWould Action
	cmd      map[string]bool // command name -> denied
	// cmdLens and cmdFirst are the lengths and first letters of cmd's
	// names (nameBits): most commands match neither, and skip the map.
	cmdLens  uint64
	cmdFirst uint32
	ttl      []ttlRule
	names    nameRules
	values   valueRules
	keyRules bool // any TTL or naming rule is on: classify keys
}

type ttlRule struct {
	glob
	required  bool
	def, max  int64 // seconds; 0 = none
	maxRefuse bool
	action    Action
	would     Action
}

type nameRules struct {
	action     Action
	would      Action
	namespaces map[string]bool
	nsList     string // for messages
	re         *regexp.Regexp
	reText     string // the configured pattern, for messages (re is anchored)
	maxLen     int
	version    []glob
}

func (n *nameRules) on() bool {
	return n.action != Off && (len(n.namespaces) > 0 || n.re != nil || n.maxLen > 0 || len(n.version) > 0)
}

type valueRules struct {
	action Action
	would  Action
	max    int
}

// builtinDeny are refused unless allowed: the seeds' KEYS * and FLUSHALL
// anti-patterns, FLUSHDB which does the same to one database, and the
// commands that stop Redis or change what it is (replication, cluster
// membership, loaded modules), which no application sends through a proxy
// in front of it: a client of the quick start, with no policy, stopped
// its Redis with SHUTDOWN NOSAVE by accident (found by review). The rest of
// the admin commands (DEBUG, CONFIG SET, which some libraries send at
// start, MONITOR, ...) are left to the deny list.
var builtinDeny = []string{"keys", "flushall", "flushdb",
	"shutdown", "replicaof", "slaveof", "failover", "cluster|reset", "cluster|failover",
	"module|load", "module|loadex", "module|unload"}

// denied reports whether one of layers (nil ones skipped) lists name in
// its deny list.
func denied(name string, layers ...*CommandRules) bool {
	for _, l := range layers {
		if l == nil {
			continue
		}
		for _, d := range l.Deny {
			if normalizeCommand(d) == name {
				return true
			}
		}
	}
	return false
}

// Compile validates c and builds the policy.
func Compile(c Config) (*Policy, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	mode := resolve(mustAction(c.Mode), Enforce)
	p := &Policy{mode: mode, ceiling: Enforce, now: time.Now}
	p.global = compileRules("", mode, Enforce, &c.Commands, nil, c.TTL, &c.Names, c.Values)
	for i, s := range c.Scopes {
		name := s.Name
		if name == "" {
			name = fmt.Sprintf("scope[%d]", i)
		}
		smode, would := mode, Enforce
		if s.Mode != "" {
			smode = mustAction(s.Mode)
			would = smode
		}
		ttl := c.TTL
		if s.TTL != nil {
			ttl = s.TTL
		}
		names := &c.Names
		if s.Names != nil {
			names = s.Names
		}
		values := c.Values
		if s.Values != nil {
			values = s.Values
		}
		p.scopes = append(p.scopes, scopeRules{
			users:     s.Users,
			listeners: s.Listeners,
			rs:        compileRules(name, smode, would, &c.Commands, s.Commands, ttl, names, values),
		})
	}
	return p, nil
}

func mustAction(s string) Action {
	a, err := parseAction(s)
	if err != nil {
		panic(err) // Validate ran first
	}
	return a
}

// resolve applies a mode to a rule's action: empty means the mode, and the
// mode is a ceiling.
func resolve(a, mode Action) Action {
	if a == inherit || a > mode {
		return mode
	}
	return a
}

func compileRules(scope string, mode, enforceMode Action, global, local *CommandRules, ttl []TTLRule, names *NameRules, values *ValueRules) *ruleset {
	rs := &ruleset{scope: scope, cmd: map[string]bool{}}
	for _, n := range builtinDeny {
		rs.cmd[n] = true
	}
	cmdAction := mustAction(global.Action)
	for _, layer := range []*CommandRules{global, local} {
		if layer == nil {
			continue
		}
		for _, n := range layer.Deny {
			rs.cmd[normalizeCommand(n)] = true
		}
		for _, n := range layer.Allow {
			n = normalizeCommand(n)
			rs.cmd[n] = false
			// Allowing a container allows the subcommands refused by
			// default (allow = ["module"] lets MODULE LOAD through, as it
			// did before they were), not those the configuration denies.
			for _, b := range builtinDeny {
				if parent, _, sub := strings.Cut(b, "|"); sub && parent == n && !denied(b, global, local) {
					rs.cmd[b] = false
				}
			}
		}
		if layer.Action != "" {
			cmdAction = mustAction(layer.Action)
		}
	}
	for n := range rs.cmd {
		l, f := nameBits(n)
		rs.cmdLens |= l
		rs.cmdFirst |= f
	}
	rs.cmdAction = resolve(cmdAction, mode)
	rs.cmdWould = resolve(cmdAction, enforceMode)

	for _, r := range ttl {
		rs.ttl = append(rs.ttl, ttlRule{
			glob:      compileGlob(r.Pattern),
			required:  r.Required,
			def:       int64(r.Default.Duration / time.Second),
			max:       int64(r.Max.Duration / time.Second),
			maxRefuse: r.MaxAction == "refuse",
			action:    resolve(mustAction(r.Action), mode),
			would:     resolve(mustAction(r.Action), enforceMode),
		})
	}

	n := &rs.names
	n.action = resolve(mustAction(names.Action), mode)
	n.would = resolve(mustAction(names.Action), enforceMode)
	if len(names.Namespaces) > 0 {
		n.namespaces = map[string]bool{}
		for _, ns := range names.Namespaces {
			n.namespaces[ns] = true
		}
		n.nsList = strings.Join(names.Namespaces, ", ")
	}
	if names.Regex != "" {
		n.re = regexp.MustCompile(`^(?:` + names.Regex + `)$`)
		n.reText = names.Regex
	}
	n.maxLen = names.MaxKeyLength
	for _, g := range names.RequireVersion {
		n.version = append(n.version, compileGlob(g))
	}

	if values != nil {
		rs.values.action = resolve(mustAction(values.Action), mode)
		rs.values.would = resolve(mustAction(values.Action), enforceMode)
		rs.values.max = int(values.LimitInForce())
	}

	rs.keyRules = n.on()
	for _, r := range rs.ttl {
		if r.action != Off && (r.required || r.max > 0) {
			rs.keyRules = true
		}
	}
	return rs
}

// ForcedMode returns a copy of p in which no rule acts above a: with Report,
// every enforce becomes report (--policy-mode=report); with Off nothing is
// checked.
func (p *Policy) ForcedMode(a Action) *Policy {
	if p == nil {
		return nil
	}
	q := *p
	q.ceiling = min(p.ceiling, a)
	return &q
}

// Mode is the global mode this policy was compiled with (policy.mode,
// enforce when empty), capped by ForcedMode: what INFO reports as in
// force. Scopes may have modes of their own.
func (p *Policy) Mode() Action {
	if p == nil {
		return Off
	}
	return min(p.mode, p.ceiling)
}

// FixesTTL reports whether a request may be given a TTL fix-up under p
// (Decision.Expires): some TTL rule, global or scoped, has a default and
// is enforced.
func (p *Policy) FixesTTL() bool {
	if p == nil || p.ceiling < Enforce {
		return false
	}
	fixes := func(rs *ruleset) bool {
		for i := range rs.ttl {
			if rs.ttl[i].def > 0 && rs.ttl[i].action == Enforce {
				return true
			}
		}
		return false
	}
	if fixes(p.global) {
		return true
	}
	for _, s := range p.scopes {
		if fixes(s.rs) {
			return true
		}
	}
	return false
}

// MaxValueBytes is the global value-size limit, 0 when that rule is off.
func (p *Policy) MaxValueBytes() int64 {
	if p == nil || p.global.values.action == Off {
		return 0
	}
	return int64(p.global.values.max)
}

// TTLInfo describes the TTL rule that applies to a key.
type TTLInfo struct {
	Pattern  string
	Required bool
	Default  time.Duration // 0 = none
	Max      time.Duration // 0 = none
	Action   Action
}

// TTLRule returns the first global TTL rule matching key, if any (for the
// keyspace audit).
func (p *Policy) TTLRule(key []byte) (TTLInfo, bool) {
	if p == nil {
		return TTLInfo{}, false
	}
	r := p.global.ttlFor(key)
	if r == nil {
		return TTLInfo{}, false
	}
	return TTLInfo{
		Pattern:  r.String(),
		Required: r.required,
		Default:  time.Duration(r.def) * time.Second,
		Max:      time.Duration(r.max) * time.Second,
		Action:   min(r.action, p.ceiling),
	}, true
}

// CheckKeyName checks key against the global naming rules, as if a command
// were creating it; nil when it passes or the rules are off.
func (p *Policy) CheckKeyName(key []byte) *Violation {
	if p == nil {
		return nil
	}
	a := min(p.global.names.action, p.ceiling)
	if a == Off {
		return nil
	}
	rule, pattern := p.global.names.check(key)
	if rule == "" {
		return nil
	}
	under := Refused
	if p.global.names.would != Enforce {
		under = Reported
	}
	return &Violation{Rule: rule, Pattern: pattern, Action: a, Outcome: Reported, UnderEnforce: under, Key: slices.Clone(key),
		names: &p.global.names, build: nameMessage}
}

func (rs *ruleset) ttlFor(key []byte) *ttlRule {
	for i := range rs.ttl {
		if rs.ttl[i].Match(key) {
			return &rs.ttl[i]
		}
	}
	return nil
}

// rulesFor picks the first scope matching the request, else the global
// rules.
func (p *Policy) rulesFor(user, listener string) *ruleset {
	for i := range p.scopes {
		s := &p.scopes[i]
		if (len(s.users) == 0 || slices.Contains(s.users, user)) &&
			(len(s.listeners) == 0 || slices.Contains(s.listeners, listener)) {
			return s.rs
		}
	}
	return p.global
}

// check returns the first naming rule key breaks (and the version rule's
// pattern), or "" (nameMessage says it in words).
func (n *nameRules) check(key []byte) (rule, pattern string) {
	if n.maxLen > 0 && len(key) > n.maxLen {
		return RuleKeyLength, ""
	}
	if len(n.namespaces) > 0 {
		ns, _, found := bytes.Cut(key, []byte{':'})
		if !found || !n.namespaces[string(ns)] {
			return RuleNamespaces, ""
		}
	}
	if n.re != nil && !n.re.Match(key) {
		return RuleRegex, ""
	}
	for i := range n.version {
		if n.version[i].Match(key) && !hasVersionSegment(key) {
			return RuleVersion, n.version[i].String()
		}
	}
	return "", ""
}

// nameMessage is the text of a naming violation (Violation.build).
func nameMessage(v *Violation) string {
	n, key := v.names, v.Key
	switch v.Rule {
	case RuleKeyLength:
		return fmt.Sprintf("%skey %s is %d bytes, longer than %d (naming rule %q)",
			msgPrefix, quoteKey(key), len(key), n.maxLen, RuleKeyLength)
	case RuleNamespaces:
		return fmt.Sprintf("%skey %s does not match naming rule %q; start it with one of: %s, followed by ':'",
			msgPrefix, quoteKey(key), RuleNamespaces, n.nsList)
	case RuleRegex:
		// The pattern as configured: the anchored form read
		// "(^(?:^[a-z:]+$)$)" to a user's trial.
		return fmt.Sprintf("%skey %s does not match naming rule %q: the whole key must match %s",
			msgPrefix, quoteKey(key), RuleRegex, n.reText)
	}
	return fmt.Sprintf("%skey %s does not match naming rule %q; keys matching %q need a version segment, as in {module}:{scope}:v1",
		msgPrefix, quoteKey(key), RuleVersion, v.Pattern)
}

// hasVersionSegment reports whether some ':'-separated segment is v<digits>.
func hasVersionSegment(key []byte) bool {
	for len(key) > 0 {
		seg := key
		if i := indexByte(key, ':'); i >= 0 {
			seg, key = key[:i], key[i+1:]
		} else {
			key = nil
		}
		if len(seg) >= 2 && (seg[0] == 'v' || seg[0] == 'V') {
			ok := true
			for _, c := range seg[1:] {
				if c < '0' || c > '9' {
					ok = false
					break
				}
			}
			if ok {
				return true
			}
		}
	}
	return false
}

func indexByte(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}

// quoteKey quotes a key for a message, cut to a readable length.
func quoteKey(key []byte) string {
	if len(key) > maxKeyInMessage {
		return strconv.Quote(string(key[:maxKeyInMessage])) + "..."
	}
	return strconv.Quote(string(key))
}
