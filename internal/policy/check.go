package policy

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/redproxy/redproxy/internal/commands"
)

// CheckBatch decides every request of one batch: a pipeline read in one go,
// or a MULTI ... EXEC block. It looks ahead within the batch, so a write
// followed later by an EXPIRE (or SET ... EX) of the same key needs no fix.
// It appends exactly one Decision per request to out[:0], reusing out's
// storage (including the slices inside its Decisions): callers that keep a
// Decision beyond the next call must copy it. It does not allocate unless it
// finds a violation (or a batch has more than a few TTL writes).
func (p *Policy) CheckBatch(reqs []Request, out []Decision) []Decision {
	out, _ = p.CheckTx(reqs, out, nil, nil)
	return out
}

// CheckTx is CheckBatch for a batch that goes on with a client's
// transaction, whose earlier batches left TTL requirements open
// (Decision.Open) for the keys open. It sets settled[j] when a request of
// this batch, before its first boundary (in the same database and
// transaction as the write), certainly gives key open[j] a TTL. closed
// reports that the batch has a boundary, past which no later request can
// settle what is left: EXEC, a SELECT, a DISCARD.
// settled must be as long as open. A requirement is checked against the
// policy in force when its write was queued; a policy that is off
// settles nothing.
func (p *Policy) CheckTx(reqs []Request, out []Decision, open [][]byte, settled []bool) (decs []Decision, closed bool) {
	out = resetDecisions(out, len(reqs))
	if p == nil || p.ceiling == Off {
		clear(settled)
		return out, len(open) > 0 && anyBoundary(reqs)
	}
	c := checkers.Get().(*checker)
	c.p, c.reqs, c.out = p, reqs, out
	c.pending = c.pendingBuf[:0]
	c.setters = c.setterBuf[:0]
	c.seg = 0
	for i := range reqs {
		c.checkOne(i)
	}
	c.resolvePending()
	for j := range open {
		// Request -1: every request of the batch comes after the write.
		_, settled[j] = c.ttlSetLater(-1, 0, open[j])
	}
	closed = c.seg > 0
	c.release()
	return out, closed
}

func anyBoundary(reqs []Request) bool {
	for i := range reqs {
		if len(reqs[i].Args) > 0 && boundary(&reqs[i]) {
			return true
		}
	}
	return false
}

// checkers recycles checker state: it holds buffers that would otherwise be
// allocated on every batch (the classifiers are called through a map of
// functions, so escape analysis cannot keep the buffers on the stack).
var checkers = sync.Pool{New: func() any { return new(checker) }}

func (c *checker) release() {
	c.p, c.reqs, c.out = nil, nil, nil
	// Drop pointers into the policy, so a replaced one can be freed. Only
	// what was used: clearing all of pendingBuf on every batch was 1.5 % of
	// the proxy's CPU at GET -P 1 (one command a batch, none pending).
	if cap(c.pending) > len(c.pendingBuf) {
		clear(c.pendingBuf[:]) // grown past it: all of it was filled first
	}
	clear(c.pending)
	c.pending, c.setters = nil, nil
	c.mapBuilt = false
	if len(c.setterMap) > 1024 {
		c.setterMap = nil // do not keep a huge batch's map alive
	}
	clear(c.setterMap)
	checkers.Put(c)
}

func resetDecisions(out []Decision, n int) []Decision {
	if cap(out) < n {
		out = slices.Grow(out[:0], n)
	}
	out = out[:n]
	for i := range out {
		d := &out[i]
		d.Refuse = nil
		d.Violations = d.Violations[:0]
		d.Args = nil
		d.Expires = d.Expires[:0]
		d.TTLFrom = 0
		d.CutOff = false
		d.Open = d.Open[:0]
	}
	return out
}

// checker is the state of one CheckBatch call.
type checker struct {
	p    *Policy
	reqs []Request
	out  []Decision

	// pending are keys that would be left without a required TTL unless a
	// later request of the batch sets one.
	pending    []pendingTTL
	pendingBuf [16]pendingTTL
	// setters are keys certainly given a TTL by some request, for that
	// look-ahead.
	setters   []keyRef
	setterBuf [16]keyRef
	setterMap map[segKey]int // key -> last request setting it; built for big batches
	mapBuilt  bool
	// seg numbers the stretches of the batch between boundaries (see
	// boundary): a TTL set in another stretch is not trusted.
	seg int

	effBuf [8]keyEffect
	keyBuf [8]int
}

type keyRef struct{ req, arg, seg int }

type segKey struct {
	seg int
	key string
}

type pendingTTL struct {
	req  int
	seg  int
	eff  keyEffect
	rule *ttlRule
	rs   *ruleset
}

// boundary reports whether req separates what runs before it from what runs
// after it, so that a TTL set after it cannot be trusted for a key written
// before it: a change of database (SELECT, SWAPDB, MOVE), the start or end
// of a transaction (MULTI, EXEC, DISCARD, which may commit nothing), the end
// of the connection or of its state (QUIT, RESET), a switch to pub/sub,
// MONITOR or a relay (SUBSCRIBE, CLIENT TRACKING), or a blocking command,
// after which a client that went away gets nothing more sent. So are the
// commands the proxy runs apart once what came before them is answered
// (those Redis runs while busy: SCRIPT KILL, FUNCTION KILL, SHUTDOWN; and
// CLIENT UNBLOCK): a client closed for its output limit there gets
// nothing more sent either. Every other command that changes the
// connection's state counts too: a few commands too many only cost a
// harmless fix-up.
func boundary(req *Request) bool {
	cmd := req.Cmd
	if cmd == nil {
		return false
	}
	if cmd.Flags&(commands.ConnState|commands.AllowBusy) != 0 || cmd.IsBlocking(req.Args) {
		return true
	}
	return cmd.Name == "swapdb" || cmd.Name == "move" || cmd.Name == "client|unblock"
}

func (c *checker) act(a Action) Action { return min(a, c.p.ceiling) }

func (c *checker) checkOne(i int) {
	req := &c.reqs[i]
	d := &c.out[i]
	if len(req.Args) == 0 {
		return
	}
	if boundary(req) {
		c.seg++
	}
	rs := c.p.global
	if len(c.p.scopes) > 0 {
		rs = c.p.rulesFor(req.User, req.Listener)
	}

	if a := c.act(rs.cmdAction); a != Off {
		if denied, hint := rs.denied(req); denied {
			name := commandName(req)
			msg := fmt.Sprintf("%s%s is disabled", msgPrefix, displayName(name))
			if hint != "" {
				msg += "; " + hint
			}
			if c.violate(d, a, rs.cmdWould, false, Violation{Rule: RuleCommand, Scope: rs.scope, Command: name, Msg: msg}) {
				return
			}
		}
	}
	if req.Cmd == nil {
		// Unknown to the table: no key positions. Redis answers it, or, for
		// a module command the table lacks, runs it unchecked.
		if rs.keyRules {
			c.unclassified(d, rs, req, "is unknown to the command table")
		}
		return
	}

	if !req.Cmd.ArityOK(len(req.Args)) && req.Cmd.Subcommands == nil {
		// Redis refuses it for its argument count before it does anything,
		// and in MULTI at queue time: its error is the client's, not a
		// policy refusal (found by a probe: SETEX k 7200 without a value
		// was refused as exceeding a rule's max TTL).
		return
	}

	if a := c.act(rs.values.action); a != Off && req.Cmd.Is(commands.Write) && !carriesCode(req.Cmd) {
		if idx := c.oversizeArg(req, rs.values.max); idx > 0 {
			msg := fmt.Sprintf("%svalue of %d bytes exceeds %d (rule %q); store large objects elsewhere and keep a reference in Redis",
				msgPrefix, len(req.Args[idx]), rs.values.max, RuleValueSize)
			// The write's first key, so the report shows which keys carry
			// the blobs (a row without one left a user's trial guessing).
			var key []byte
			if ks := c.keys(req); len(ks) > 0 {
				key = slices.Clone(req.Args[ks[0]])
			}
			if c.violate(d, a, rs.values.would, false, Violation{Rule: RuleValueSize, Scope: rs.scope, Command: req.Cmd.Name, Key: key, Msg: msg}) {
				return
			}
		}
	}

	if !rs.keyRules {
		return
	}
	nameAction := c.act(rs.names.action)
	checkNames := rs.names.on() && nameAction != Off
	var effs []keyEffect
	switch f := effectTable[req.Cmd.Name]; {
	case f != nil:
		effs = f(req.Args, c.effBuf[:0])
	case scriptCommands[req.Cmd.Name]:
		if checkNames {
			for _, k := range c.keys(req) {
				if c.checkName(d, rs, nameAction, req, req.Args[k]) {
					return
				}
			}
		}
		return
	case req.Cmd.Is(commands.Write) && !noEffect[req.Cmd.Name]:
		var complete bool
		effs, complete = c.specEffects(req)
		if !complete {
			c.unclassified(d, rs, req, "writes keys its key specifications do not fully describe; the keys found were taken as created")
		}
	}
	for _, e := range effs {
		key := req.Args[e.key]
		if e.creates && checkNames && c.checkName(d, rs, nameAction, req, key) {
			return
		}
		rule := rs.ttlFor(key)
		switch {
		case e.kind == effSetTTL:
			if rule != nil && rule.max > 0 && c.act(rule.action) != Off && c.checkMax(d, i, rs, rule, e) {
				return
			}
			ttl := req.Args[e.ttl]
			if d.Args != nil {
				ttl = d.Args[e.ttl] // clamped to the rule's max
			}
			if !e.conditional && !req.Denied && c.ttlCertain(ttl, e.unit) {
				c.setters = append(c.setters, keyRef{req: i, arg: e.key, seg: c.seg})
			}
		case rule != nil && rule.required && c.act(rule.action) != Off:
			c.pending = append(c.pending, pendingTTL{req: i, seg: c.seg, eff: e, rule: rule, rs: rs})
		}
	}
}

// specEffects classifies a write command the effect table does not know (a
// module command, or one newer than the table) from its key specifications:
// every key of a spec that may create or overwrite it (commands.KeySpecFlags
// MayCreate) is taken as created, to be fixed with EXPIRE ... NX. complete
// is false when the specs cannot describe every key: a spec marked
// incomplete or found only at run time, or no specs at all (servers before
// Redis 7, modules that declare only key positions), in which case every
// key the legacy positions name is taken as created.
func (c *checker) specEffects(req *Request) (effs []keyEffect, complete bool) {
	effs = c.effBuf[:0]
	specs := req.Cmd.KeySpecs
	if len(specs) == 0 {
		keys := c.keys(req)
		for _, k := range keys {
			effs = append(effs, keyEffect{key: k, kind: effCreate, creates: true})
		}
		return effs, len(keys) == 0 && req.Cmd.Flags&commands.MovableKeys == 0
	}
	complete = true
	for j := range specs {
		s := &specs[j]
		if !s.Complete() {
			complete = false
		}
		if !s.Flags.MayCreate() {
			continue
		}
		for _, k := range s.AppendKeys(req.Args, c.keyBuf[:0]) {
			effs = append(effs, keyEffect{key: k, kind: effCreate, creates: true})
		}
	}
	return effs, complete
}

// unclassified reports a command whose effect on keys the policy cannot
// work out, so that its TTL and naming rules may go unchecked. It is
// reported whatever the mode: nothing was found to refuse or fix.
func (c *checker) unclassified(d *Decision, rs *ruleset, req *Request, why string) {
	name := commandName(req)
	if len(name) > maxKeyInMessage {
		name = name[:maxKeyInMessage]
	}
	msg := fmt.Sprintf("%scommand %s %s; TTL and naming rules cannot be fully checked for it", msgPrefix, displayName(name), why)
	c.violate(d, Report, Report, false, Violation{Rule: RuleUnclassified, Scope: rs.scope, Command: name, Msg: msg})
}

// ttlCertain reports whether a TTL argument certainly gives a key a TTL: a
// number Redis accepts, neither zero nor negative nor in the past (which
// delete the key, or are refused by SET), and not so large that Redis
// refuses it as overflowing.
func (c *checker) ttlCertain(arg []byte, unit ttlUnit) bool {
	n, ok := parseInt(arg)
	if !ok || n <= 0 {
		return false
	}
	nowMs := c.p.now().UnixMilli()
	if beyondRedis(n, unit, nowMs) {
		return false
	}
	switch unit {
	case unitSec, unitMs:
		return true
	case unitUnixSec:
		return n*1000 > nowMs
	case unitUnixMs:
		return n > nowMs
	}
	return false
}

// violate records v on d with action a; would is the rule's action under
// policy.mode enforce (Violation.UnderEnforce). fixable says the caller
// can apply a fix under enforce (it does so only if violate returns
// false). It returns true when the request is refused.
func (c *checker) violate(d *Decision, a, would Action, fixable bool, v Violation) bool {
	v.Action = a
	v.UnderEnforce = underEnforce(would, fixable)
	v.Outcome = outcome(a, fixable)
	d.Violations = append(d.Violations, v)
	if v.Outcome == Refused {
		d.Refuse = &v
		d.Args = nil
		d.Expires = d.Expires[:0]
		d.Open = d.Open[:0] // refused whatever follows
		return true
	}
	return false
}

// outcome is what action a does with a violation: reports it, or under
// enforce fixes it where it can and refuses it otherwise.
func outcome(a Action, fixable bool) Outcome {
	switch {
	case a == Report:
		return Reported
	case fixable:
		return Fixed
	}
	return Refused
}

// underEnforce is Violation.UnderEnforce for a rule whose action with
// policy.mode enforce would be would.
func underEnforce(would Action, fixable bool) Outcome {
	if would != Enforce {
		return Reported // a rule whose own action is report stays so
	}
	return outcome(Enforce, fixable)
}

// violateOpen records v, a TTL requirement the batch's end left unmet
// (Decision.Open), with action a and no fix: refused under enforce, but
// a transaction may still set the TTL in a later batch. Unlike violate it
// keeps the fixes of the request's other keys, which the request needs
// if it is forwarded.
func (c *checker) violateOpen(d *Decision, a, would Action, fixable bool, v Violation) {
	v.Action = a
	v.UnderEnforce = underEnforce(would, fixable)
	v.Outcome = outcome(a, false)
	if v.Outcome == Refused {
		refuse := v
		d.Refuse = &refuse
	}
	d.Open = append(d.Open, OpenTTL{V: len(d.Violations)})
	d.Violations = append(d.Violations, v)
}

// denied applies the command lists: the exact name first, then for a
// subcommand its container ("config" covers "config|set").
func (rs *ruleset) denied(req *Request) (bool, string) {
	var name string
	if req.Cmd != nil {
		name = req.Cmd.Name
		if d, ok := rs.listed(name); ok {
			return d, denyHints[name]
		}
		if req.Cmd.Parent != nil {
			if d, ok := rs.listed(req.Cmd.Parent.Name); ok {
				return d, denyHints[name]
			}
		}
		return false, ""
	}
	// Unknown to the table (a module command, or a newer Redis): match the
	// name as sent. The buffer keeps this allocation-free.
	var buf [32]byte
	arg := req.Args[0]
	if len(arg) > len(buf) {
		return false, ""
	}
	for i, ch := range arg {
		if 'A' <= ch && ch <= 'Z' {
			ch += 'a' - 'A'
		}
		buf[i] = ch
	}
	d, _ := rs.listed(string(buf[:len(arg)]))
	return d, ""
}

// listed looks name up in the command lists. The lookup by name was 1.2 %
// of the proxy's CPU at SET -P 16 (pprof), for commands that are in no
// list; a name whose length or first letter no listed name has is not.
func (rs *ruleset) listed(name string) (denied, ok bool) {
	l, f := nameBits(name)
	if rs.cmdLens&l == 0 || rs.cmdFirst&f == 0 {
		return false, false
	}
	denied, ok = rs.cmd[name]
	return denied, ok
}

// nameBits returns a bit for name's length (names of 63 bytes or more share
// one) and one for its first byte (a to z; any other shares one).
func nameBits(name string) (length uint64, first uint32) {
	length = 1 << min(len(name), 63)
	first = 1 << 31
	if len(name) > 0 && 'a' <= name[0] && name[0] <= 'z' {
		first = 1 << (name[0] - 'a')
	}
	return length, first
}

// denyHints name the safe alternative for each command commonly denied.
var denyHints = map[string]string{
	"keys":             "use SCAN 0 MATCH pattern COUNT 100",
	"flushall":         "delete by pattern with SCAN 0 MATCH prefix:* COUNT 100 and UNLINK",
	"flushdb":          "delete by pattern with SCAN 0 MATCH prefix:* COUNT 100 and UNLINK",
	"debug":            "run it with redis-cli against the server itself",
	"shutdown":         "stop Redis through its service manager",
	"config|set":       "change the Redis configuration through your operators, not the application",
	"monitor":          "use SLOWLOG GET or the proxy's metrics; MONITOR slows Redis down",
	"swapdb":           "use separate key prefixes instead of swapping databases",
	"replicaof":        "replication is changed by operators, not through the proxy",
	"slaveof":          "replication is changed by operators, not through the proxy",
	"cluster|reset":    "reset cluster nodes with redis-cli against the node itself",
	"failover":         "fail over through your operators or Sentinel, not the application",
	"cluster|failover": "fail over through your operators, with redis-cli against the replica",
	"config|resetstat": "read the counters as deltas; reset them through your operators",
	"config|rewrite":   "change the Redis configuration through your operators, not the application",
	"client|pause":     "CLIENT PAUSE stops every client of Redis; pause writers in the application instead",
	"save":             "SAVE blocks Redis for every client; persistence is for operators (BGSAVE)",
	"acl|setuser":      "manage Redis users through your operators, not the application",
	"acl|deluser":      "manage Redis users through your operators, not the application",
	"acl|load":         "manage Redis users through your operators, not the application",
	"acl|save":         "manage Redis users through your operators, not the application",
	"module|load":      "load modules in the Redis configuration",
	"module|loadex":    "load modules in the Redis configuration",
	"module|unload":    "unload modules through your operators",
	"script|flush":     "loaded scripts cost little; load once with SCRIPT LOAD and call EVALSHA",
	"function|flush":   "remove one library with FUNCTION DELETE",
}

// commandName is the lower-case name for violations.
func commandName(req *Request) string {
	if req.Cmd != nil {
		return req.Cmd.Name
	}
	return strings.ToLower(string(req.Args[0]))
}

// displayName writes "config|set" as "CONFIG SET" for messages.
func displayName(name string) string {
	return strings.ToUpper(strings.ReplaceAll(name, "|", " "))
}

// keys lists req's key positions, only for the rules that need the list:
// a request may name a million keys.
func (c *checker) keys(req *Request) []int {
	return req.Cmd.Keys(req.Args, c.keyBuf[:0])
}

// oversizeArg returns the index of the first non-key argument longer than
// max, or 0. Every non-key argument of a write counts as a value: it is the
// simplest rule that cannot be dodged by argument position, and the other
// arguments (options, scores, field names) are never that large.
// carriesCode reports whether cmd's arguments are a library's code (FUNCTION
// LOAD, FUNCTION RESTORE's payload): writes, but not values stored under a
// key, so the value-size rule leaves them alone (a 100 KB library was
// refused as a "large object"; found by review). EVAL's script was never
// counted: EVAL is not flagged a write.
func carriesCode(cmd *commands.Command) bool {
	return cmd.Parent != nil && cmd.Parent.Name == "function"
}

func (c *checker) oversizeArg(req *Request, max int) int {
	var keys []int
	for i := 1; i < len(req.Args); i++ {
		if len(req.Args[i]) <= max {
			continue
		}
		if keys == nil {
			keys = c.keys(req)
		}
		if !slices.Contains(keys, i) {
			return i
		}
	}
	return 0
}

func (c *checker) checkName(d *Decision, rs *ruleset, a Action, req *Request, key []byte) bool {
	rule, pattern := rs.names.check(key)
	if rule == "" {
		return false
	}
	return c.violate(d, a, rs.names.would, false, Violation{Rule: rule, Pattern: pattern, Scope: rs.scope, Command: req.Cmd.Name, Key: slices.Clone(key),
		names: &rs.names, build: nameMessage})
}

// What a client can do about a write that needs a TTL (Violation.how).
const (
	ttlHowExpire  = "EXPIRE the key in the same MULTI, or in the same pipeline sent in one write"
	ttlHowSetNX   = "use SET key value NX EX <seconds> instead, or " + ttlHowExpire
	ttlHowGetSet  = "use SET key value GET EX <seconds> instead, or " + ttlHowExpire
	ttlHowEX      = "set EX on the write, or " + ttlHowExpire
	ttlHowRestore = "give RESTORE a ttl, or " + ttlHowExpire
)

// ttlMessage and persistMessage are the texts of TTL violations
// (Violation.build).
func ttlMessage(v *Violation) string {
	return fmt.Sprintf("%skey %s needs a TTL (rule %q); %s", msgPrefix, quoteKey(v.Key), v.Pattern, v.how)
}

func persistMessage(v *Violation) string {
	return fmt.Sprintf("%skey %s must keep its TTL (rule %q); %s would remove it", msgPrefix, quoteKey(v.Key), v.Pattern, displayName(v.Command))
}

// checkMax applies a rule's max to an explicit TTL. It returns true when the
// request is refused.
func (c *checker) checkMax(d *Decision, i int, rs *ruleset, rule *ttlRule, e keyEffect) bool {
	req := &c.reqs[i]
	n, ok := parseInt(req.Args[e.ttl])
	if !ok || n <= 0 || beyondRedis(n, e.unit, c.p.now().UnixMilli()) {
		// Redis rejects it (or deletes the key, or, for RESTORE, creates
		// none): no long TTL either way. Clamped, a TTL past Redis's range
		// (EX 9223372036854775) became a valid hour and the write Redis
		// refuses ran (found by a probe).
		return false
	}
	// Compare in the command's own unit: converting n to a Duration could
	// overflow. ttl is only for the message, in the command's unit where a
	// whole number of seconds would hide the excess (PX 3600001 against a
	// max of 3600s read "TTL of 3600s").
	var over bool
	var left, clamped int64 // left: the TTL asked for, in the command's unit
	switch e.unit {
	case unitSec:
		over, left, clamped = n > rule.max, n, rule.max
	case unitMs:
		over, left, clamped = n > rule.max*1000, n, rule.max*1000
	case unitUnixSec:
		now := c.p.now().Unix()
		over, left, clamped = n-now > rule.max, n-now, now+rule.max
	case unitUnixMs:
		now := c.p.now().UnixMilli()
		over, left, clamped = n-now > rule.max*1000, n-now, now+rule.max*1000
	}
	if !over {
		return false
	}
	ttl := secsText(left)
	if e.unit == unitMs || e.unit == unitUnixMs {
		ttl = msText(left)
	}
	key := req.Args[e.key]
	msg := fmt.Sprintf("%sTTL of %s for key %s exceeds the maximum of %ds (rule %q)", msgPrefix, ttl, quoteKey(key), rule.max, rule.String())
	a := c.act(rule.action)
	v := Violation{Rule: RuleTTLMax, Pattern: rule.String(), Scope: rs.scope, Command: req.Cmd.Name, Key: slices.Clone(key), Msg: msg}
	if c.violate(d, a, rule.would, !rule.maxRefuse, v) {
		return true
	}
	if a == Enforce {
		c.setArg(d, req, e.ttl, strconv.AppendInt(nil, clamped, 10))
	}
	return false
}

// beyondRedis reports whether Redis refuses a TTL of n in unit as out of
// range at nowMs ("invalid expire time"): seconds it cannot turn into
// milliseconds, and relative times whose deadline overflows. (For RESTORE's
// relative TTL Redis creates no key instead: the same overflow.)
func beyondRedis(n int64, unit ttlUnit, nowMs int64) bool {
	switch unit {
	case unitSec:
		return n > (math.MaxInt64-nowMs)/1000
	case unitMs:
		return n > math.MaxInt64-nowMs
	case unitUnixSec:
		return n > math.MaxInt64/1000
	}
	return false
}

// setArg rewrites one argument, copying the args on the first change.
func (c *checker) setArg(d *Decision, req *Request, i int, val []byte) {
	if d.Args == nil {
		d.Args = slices.Clone(req.Args)
	}
	d.Args[i] = val
}

// resolvePending decides, once the whole batch is known, the keys that would
// be left without a required TTL.
func (c *checker) resolvePending() {
	for _, pt := range c.pending {
		d := &c.out[pt.req]
		if d.Refuse != nil && len(d.Open) == 0 {
			continue // refused already, for a reason no later batch changes
		}
		req := &c.reqs[pt.req]
		key := req.Args[pt.eff.key]
		// A key in another database cannot be given its TTL by a later
		// command, which runs in this one.
		if pt.eff.db == 0 {
			if from, ok := c.ttlSetLater(pt.req, pt.seg, key); ok {
				d.TTLFrom = max(d.TTLFrom, from)
				continue
			}
		}
		cutOff := pt.eff.db == 0 && pt.seg == c.seg
		d.CutOff = d.CutOff || cutOff
		rule := pt.rule
		a := c.act(rule.action)
		v := Violation{Rule: RuleTTL, Pattern: rule.String(), Scope: pt.rs.scope, Command: req.Cmd.Name, Key: slices.Clone(key)}
		fixable := false
		if pt.eff.kind == effPersist {
			v.build = persistMessage
		} else {
			// "set EX on the write" only where the command takes EX: an
			// HSET or INCR does not (a user's trial).
			// A MULTI may set it in a later command (a transaction typed
			// command by command is carried to its end); a pipeline only
			// within what the proxy reads at once.
			v.how, v.build = ttlHowExpire, ttlMessage
			switch {
			case req.Cmd.Name == "setnx":
				v.how = ttlHowSetNX
			case req.Cmd.Name == "getset":
				v.how = ttlHowGetSet
			case pt.eff.fix == fixAppendEX:
				v.how = ttlHowEX
			case pt.eff.fix == fixRestoreTTL:
				v.how = ttlHowRestore
			}
			fixable = rule.def > 0
		}
		if cutOff && (a == Report || !fixable) {
			c.violateOpen(d, a, rule.would, fixable, v)
			continue
		}
		if c.violate(d, a, rule.would, fixable, v) || a != Enforce {
			continue
		}
		if cutOff {
			// Fixed now outside a transaction; inside one, a later batch
			// may still set the TTL, and the fix waits for its end.
			fix := expireFixups(nil, Expire{Key: key, Seconds: rule.def}, rule, pt.eff.inherits)
			d.Open = append(d.Open, OpenTTL{V: len(d.Violations) - 1, Fix: fix})
		}
		switch pt.eff.fix {
		case fixExpire:
			e := Expire{Key: key, Seconds: rule.def}
			if pt.eff.db != 0 {
				e.DB = req.Args[pt.eff.db]
			}
			d.Expires = expireFixups(d.Expires, e, rule, pt.eff.inherits)
		case fixAppendEX:
			if d.Args == nil {
				d.Args = slices.Clone(req.Args)
			}
			d.Args = append(d.Args, []byte("EX"), strconv.AppendInt(nil, rule.def, 10))
		case fixRestoreTTL:
			ms := rule.def * 1000
			if pt.eff.unit == unitUnixMs {
				ms += c.p.now().UnixMilli()
			}
			c.setArg(d, req, pt.eff.ttl, strconv.AppendInt(nil, ms, 10))
		}
	}
	for _, pt := range c.pending {
		// A fixed requirement stays open only with nothing else on the
		// request: forwarded as sent, it would lose the other fixes.
		if d := &c.out[pt.req]; len(d.Open) > 0 && !d.AllOpen() {
			d.Open = slices.DeleteFunc(d.Open, func(o OpenTTL) bool { return o.Fix != nil })
		}
	}
}

// expireFixups appends the fix-up e (EXPIRE key default NX) and, for a key
// that took another's TTL (inherits), EXPIRE key max LT: the TTL it took
// may be above the rule's max, lowered once the NX fix-up has made sure
// it has one.
func expireFixups(dst []Expire, e Expire, rule *ttlRule, inherits bool) []Expire {
	dst = append(dst, e)
	if inherits && rule.max > 0 {
		lt := e
		lt.Seconds, lt.LT = rule.max, true
		dst = append(dst, lt)
	}
	return dst
}

// ttlSetLater reports whether a request after req in the same stretch of
// the batch (seg), not refused, certainly gives key a TTL, and which.
func (c *checker) ttlSetLater(req, seg int, key []byte) (int, bool) {
	const linearLimit = 32
	if len(c.setters) <= linearLimit {
		for _, s := range c.setters {
			if s.req > req && s.seg == seg && c.out[s.req].Refuse == nil && string(c.reqs[s.req].Args[s.arg]) == string(key) {
				return s.req, true
			}
		}
		return 0, false
	}
	if !c.mapBuilt {
		// Setters are never refused after the first pass, so the map can be
		// built once per batch.
		c.mapBuilt = true
		if c.setterMap == nil {
			c.setterMap = make(map[segKey]int, len(c.setters))
		}
		for _, s := range c.setters {
			if c.out[s.req].Refuse == nil {
				c.setterMap[segKey{s.seg, string(c.reqs[s.req].Args[s.arg])}] = s.req
			}
		}
	}
	last, ok := c.setterMap[segKey{seg, string(key)}]
	return last, ok && last > req
}

func secsText(n int64) string { return strconv.FormatInt(n, 10) + "s" }

// msText writes a TTL in milliseconds as seconds when it is whole seconds.
func msText(n int64) string {
	if n%1000 == 0 {
		return secsText(n / 1000)
	}
	return strconv.FormatInt(n, 10) + "ms"
}
