// Package route decides which named upstream a command goes to when
// [[route]] and [[channel_route]] are configured: by its keys (the first
// route whose glob matches a key wins; keys matching none go to the
// default upstream, index 0), by its channels for PUBLISH and PUBSUB
// NUMSUB, to every upstream for the commands that concern the whole
// keyspace (SCAN, DBSIZE, KEYS, FLUSHALL, ...), and how the replies of a
// command split over several upstreams come back together.
//
// A Table is immutable: a reload builds a new one and swaps it whole, so
// a batch is routed by one set of routes from start to end.
package route

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/glob"
	"github.com/redproxy/redproxy/internal/resp"
)

// Default is the index of the default upstream, [upstream].
const Default = 0

// Rule sends what matches Pattern to the upstream named Upstream, or, for
// a key rule with Upstreams, spreads it over those by Ring.
type Rule struct {
	Pattern   string
	Upstream  string
	Upstreams []string
	Ring      RingConfig
}

type rule struct {
	pat  glob.Pattern
	up   int
	ring *Ring // non-nil: the key's upstream is ring.Pick(key), not up
}

// pick is the upstream of s, which matched r.
func (r *rule) pick(s []byte) int {
	if r.ring != nil {
		return r.ring.Pick(s)
	}
	return r.up
}

// Table is a compiled set of routes over a fixed list of upstreams.
type Table struct {
	names    []string
	keys     []rule
	channels []rule
}

// ErrUnknownUpstream: a rule names an upstream the table does not have.
var ErrUnknownUpstream = errors.New("route: unknown upstream")

// New compiles keyRules and channelRules over names, the upstreams in
// index order (names[Default] is the default upstream).
func New(names []string, keyRules, channelRules []Rule) (*Table, error) {
	t := &Table{names: names}
	index := make(map[string]int, len(names))
	for i, n := range names {
		index[n] = i
	}
	compile := func(rs []Rule, rings bool) ([]rule, error) {
		out := make([]rule, 0, len(rs))
		for _, r := range rs {
			if err := glob.Check(r.Pattern); err != nil {
				return nil, fmt.Errorf("route: pattern %q: %w", r.Pattern, err)
			}
			c := rule{pat: glob.Compile(r.Pattern)}
			if len(r.Upstreams) > 0 {
				if !rings {
					return nil, fmt.Errorf("route: pattern %q: only key routes spread over several upstreams", r.Pattern)
				}
				ups := make([]int, len(r.Upstreams))
				for j, n := range r.Upstreams {
					i, ok := index[n]
					if !ok {
						return nil, fmt.Errorf("%w %q (pattern %q)", ErrUnknownUpstream, n, r.Pattern)
					}
					ups[j] = i
				}
				ring, err := NewRing(ups, r.Ring)
				if err != nil {
					return nil, fmt.Errorf("pattern %q: %w", r.Pattern, err)
				}
				c.up, c.ring = ups[0], ring
			} else {
				i, ok := index[r.Upstream]
				if !ok {
					return nil, fmt.Errorf("%w %q (pattern %q)", ErrUnknownUpstream, r.Upstream, r.Pattern)
				}
				c.up = i
			}
			out = append(out, c)
		}
		return out, nil
	}
	var err error
	if t.keys, err = compile(keyRules, true); err != nil {
		return nil, err
	}
	if t.channels, err = compile(channelRules, false); err != nil {
		return nil, err
	}
	return t, nil
}

// Len is the number of upstreams.
func (t *Table) Len() int { return len(t.names) }

// Name is upstream i's name.
func (t *Table) Name(i int) string { return t.names[i] }

// Key is the upstream of key, and the index of the route that chose it
// (-1: no route matched; the default upstream).
func (t *Table) Key(key []byte) (up, rule int) { return match(t.keys, key) }

// Channel is the upstream of a pub/sub channel: the first
// [[channel_route]] matching it, except for Redis's keyspace notification
// channels (notification), which no channel route moves.
func (t *Table) Channel(ch []byte) int {
	up, _, _ := t.channel(ch)
	return up
}

// channel is ch's upstream and the index of the rule that chose it (-1:
// none, the default upstream), a key route when byKey, else a channel
// route.
//
// Redis publishes "__keyspace@<db>__:<key>" itself, on the server holding
// <key>: the channel goes where the key does, by the key routes, or a
// subscriber through the proxy never hears of the key's changes (found
// by review: routed as any channel name, SUBSCRIBE __keyspace@0__:queue:a
// subscribed on [upstream] while queue:a's notifications were published
// on 'queue'). A [[channel_route]] cannot send it elsewhere, where Redis
// never publishes it. "__keyevent@<db>__:<event>" is published by every
// upstream holding keys; it goes to [upstream] (a client's PUBLISH to it
// included), and subscribing to it is refused when keys live on other
// upstreams too (Subscribe, Pattern).
func (t *Table) channel(ch []byte) (up, rule int, byKey bool) {
	if space, at, ok := notification(ch); ok {
		if !space {
			return Default, -1, false
		}
		up, rule = t.Key(ch[at:])
		return up, rule, true
	}
	up, rule = match(t.channels, ch)
	return up, rule, false
}

// Keyspace notification channels, as Redis names them.
const (
	keyspacePrefix = "__keyspace@"
	keyeventPrefix = "__keyevent@"
	notifySep      = "__:"
)

// notification reports whether ch is a keyspace ("__keyspace@<db>__:<key>",
// space) or keyevent ("__keyevent@<db>__:<event>") notification channel,
// <db> a number, and where its key or event starts. Read as a pattern, a
// channel that parses so matches only such channels: its prefix up to at
// holds no glob metacharacter.
func notification(ch []byte) (space bool, at int, ok bool) {
	var rest []byte
	switch {
	case bytes.HasPrefix(ch, []byte(keyspacePrefix)):
		space, rest = true, ch[len(keyspacePrefix):]
	case bytes.HasPrefix(ch, []byte(keyeventPrefix)):
		rest = ch[len(keyeventPrefix):]
	default:
		return false, 0, false
	}
	i := 0
	for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' {
		i++
	}
	if i == 0 || !bytes.HasPrefix(rest[i:], []byte(notifySep)) {
		return false, 0, false
	}
	return space, len(ch) - len(rest) + i + len(notifySep), true
}

// keysSpread reports whether some key route sends keys to another upstream
// than [upstream]: keyspace notifications are then published on several.
func (t *Table) keysSpread() bool {
	for _, r := range t.keys {
		if r.up != Default || r.ring != nil {
			return true
		}
	}
	return false
}

// Subscribe is the upstream a SUBSCRIBE of channel ch subscribes on
// (Channel), or a Refusal for a "__keyevent@<db>__:<event>" channel when
// keys live on several upstreams: each publishes the events of its own
// keys, and one subscribed connection hears one upstream.
func (t *Table) Subscribe(ch []byte) (int, error) {
	if space, _, ok := notification(ch); ok && !space && t.keysSpread() {
		return Default, errNotifySpread
	}
	return t.Channel(ch), nil
}

// Pattern is the upstream a PSUBSCRIBE pattern subscribes on: the one it
// routes to as if it were a channel name. A Refusal instead when the
// pattern may match channels another upstream gets: subscribed on one
// upstream, it would never hear their messages, published on theirs.
//
// The check is conservative, on literal prefixes (what comes before the
// first of * ? [ \): a pattern and a channel_route of another upstream
// may match a common channel only if one's prefix is a prefix of the
// other's. And a pattern on a named upstream must lie within one of its
// routes (a route "p*" whose p starts the pattern's prefix, or the very
// same pattern): channels no route matches go to [upstream]. A pattern
// without metacharacters matches one channel, routed like it.
//
// Keyspace notification patterns (found by review) are checked against
// the key routes instead, since their channels go by key (channel): a
// pattern "__keyspace@<db>__:<keys>" (<db> a number) as <keys> would be
// against [[channel_route]]s; "__keyevent@<db>__:<events>" is [upstream]'s
// and refused when keys live on several upstreams (Subscribe); and any
// other pattern that may match notification channels ("*", "__key*",
// "__keyspace@*__:*"), when keys live on several upstreams, is refused
// too, or subscribed on [upstream] only, where every notification then is.
func (t *Table) Pattern(pat []byte) (up int, err error) {
	if space, at, ok := notification(pat); ok {
		if !space {
			if t.keysSpread() {
				return Default, errNotifySpread
			}
			return Default, nil
		}
		up, _ = t.Key(pat[at:])
		if who, why := within(t.keys, pat[at:], up, "route "); who >= 0 {
			if why == "" {
				why = "the keys no route matches"
			}
			return up, errKeyspacePattern(t.names[who], why, t.names[up])
		}
		return up, nil
	}
	up, _, _ = t.channel(pat)
	if mayNotify(pat) {
		if t.keysSpread() {
			return up, errNotifySpread
		}
		// Every notification is [upstream]'s: the pattern must be too.
		if up != Default {
			return up, errPattern(t.names[Default], "keyspace notifications", t.names[up])
		}
	}
	if who, why := within(t.channels, pat, up, "channel_route "); who >= 0 {
		if why == "" {
			why = "the channels no channel_route matches"
		}
		return up, errPattern(t.names[who], why, t.names[up])
	}
	return up, nil
}

// within checks that what glob pattern pat matches, among names routed
// by rules, all goes to upstream up (see Pattern). It returns -1 if so,
// else the upstream some of it may go to, and the rule sending it there
// (kind and pattern; "" for the default route).
func within(rules []rule, pat []byte, up int, kind string) (int, string) {
	lit, exact := literalPrefix(string(pat))
	if exact {
		return -1, ""
	}
	covered := up == Default
	for _, r := range rules {
		src := r.pat.String()
		q, _ := literalPrefix(src)
		if r.ring != nil {
			// Its keys are spread over several upstreams: a pattern
			// that may match one of them hears only part of them.
			if strings.HasPrefix(lit, q) || strings.HasPrefix(q, lit) {
				other := r.up
				for _, u := range r.ring.Upstreams() {
					if u != up {
						other = u
						break
					}
				}
				return other, kind + strconv.Quote(src)
			}
			continue
		}
		if r.up == up {
			covered = covered || src == string(pat) || len(q) == len(src)-1 && src[len(q)] == '*' && strings.HasPrefix(lit, q)
			continue
		}
		if strings.HasPrefix(lit, q) || strings.HasPrefix(q, lit) {
			return r.up, kind + strconv.Quote(src)
		}
	}
	if !covered {
		return Default, ""
	}
	return -1, ""
}

// mayNotify reports whether glob pattern pat, which notification does not
// parse, may still match keyspace or keyevent notification channels: its
// literal prefix and theirs are one a prefix of the other ("*", "__k*",
// "__keyspace@*__:*", "__keyspace@0[__:]*"). Without metacharacters it is
// one channel, and not a notification one.
func mayNotify(pat []byte) bool {
	lit, exact := literalPrefix(string(pat))
	if exact {
		return false
	}
	for _, p := range []string{keyspacePrefix, keyeventPrefix} {
		if strings.HasPrefix(p, lit) || strings.HasPrefix(lit, p) {
			return true
		}
	}
	return false
}

// literalPrefix is p up to its first glob metacharacter; exact when it
// has none.
func literalPrefix(p string) (string, bool) {
	if i := strings.IndexAny(p, "*?[\\"); i >= 0 {
		return p[:i], false
	}
	return p, true
}

// errPattern refuses a PSUBSCRIBE pattern that may match channels of
// upstream other (named by why) while it subscribes on upstream on. (The
// pattern is the client's bytes: not echoed in an error line.)
func errPattern(other, why, on string) error {
	return &Refusal{[]byte("-ERR redproxy: a pattern of this PSUBSCRIBE may match channels of upstream '" + other + "' (" + why + ") but would subscribe on '" + on + "', and never hear them; subscribe to patterns within one channel_route, or to channels\r\n")}
}

// errKeyspacePattern refuses a PSUBSCRIBE keyspace notification pattern
// that may match keys of upstream other (by why), whose notifications are
// published there, while it subscribes on upstream on.
func errKeyspacePattern(other, why, on string) error {
	return &Refusal{[]byte("-ERR redproxy: a keyspace pattern of this PSUBSCRIBE may match keys of upstream '" + other + "' (" + why + "), whose notifications Redis publishes there, but would subscribe on '" + on + "', and never hear them; subscribe to keyspace patterns within one route, or to __keyspace@<db>__:<key> channels\r\n")}
}

// errNotifySpread refuses a subscription to keyevent notifications, or a
// pattern that may match notification channels, while keys live on
// several upstreams: each publishes its own keys' notifications, and a
// subscribed connection is on one upstream.
var errNotifySpread error = &Refusal{[]byte("-ERR redproxy: with routes each upstream publishes the keyspace notifications of its own keys, and one subscribed connection hears one upstream: __keyevent@ channels and patterns that may match notification channels of several upstreams are refused; subscribe to __keyspace@<db>__:<key> channels, or keyspace patterns within one route\r\n")}

func match(rs []rule, s []byte) (int, int) {
	for i := range rs {
		if rs[i].pat.Match(s) {
			return rs[i].pick(s), i
		}
	}
	return Default, -1
}

// describe names the route that chose rule's upstream, for errors.
func (t *Table) describe(up, rule int) string {
	if rule < 0 {
		return "the default route -> " + t.names[up]
	}
	return "route " + strconv.Quote(t.keys[rule].pat.String()) + " -> " + t.names[up]
}

// describeChannel names the channel route (the key route, byKey, for a
// keyspace notification channel) that chose rule's upstream.
func (t *Table) describeChannel(up, rule int, byKey bool) string {
	if byKey {
		return t.describe(up, rule)
	}
	if rule < 0 {
		return "the default route -> " + t.names[up]
	}
	return "channel_route " + strconv.Quote(t.channels[rule].pat.String()) + " -> " + t.names[up]
}

// Channels is the upstream of a command that names channels rather than
// keys, by [[channel_route]]: PUBLISH and SPUBLISH (their channel), PUBSUB
// NUMSUB and SHARDNUMSUB (their channels, which must share one upstream:
// a CrossError names two routes otherwise). ok is false for any other
// command, and for a NUMSUB naming no channel.
func (t *Table) Channels(name string, args [][]byte) (up int, ok bool, err error) {
	switch name {
	case "publish", "spublish":
		if len(args) < 2 {
			return Default, false, nil
		}
		return t.Channel(args[1]), true, nil
	case "pubsub|numsub", "pubsub|shardnumsub":
		if len(args) < 3 {
			return Default, false, nil
		}
		up, r0, k0 := t.channel(args[2])
		for _, ch := range args[3:] {
			if u, r, k := t.channel(ch); u != up {
				return up, true, &CrossError{Command: name, Channels: true, A: t.describeChannel(up, r0, k0), B: t.describeChannel(u, r, k)}
			}
		}
		return up, true, nil
	}
	return Default, false, nil
}

// Upstream is where one command of a transaction goes: its channels'
// upstream for the commands that name channels (Channels), else its keys'
// (Keys); errors as theirs.
func (t *Table) Upstream(cmd *commands.Command, args [][]byte, scratch *[]int) (up int, keyed bool, err error) {
	if up, ok, err := t.Channels(cmd.Name, args); ok {
		return up, true, err
	}
	return t.Keys(cmd, args, scratch)
}

// Merge says how the replies of a command sent to several upstreams
// become its one reply.
type Merge uint8

const (
	One          Merge = iota // one part, its reply as is
	MGET                      // array elements put back in key order
	Sum                       // integers added (DEL, EXISTS, DBSIZE, ...)
	AllOK                     // the first reply if none failed, else the first error
	Concat                    // arrays concatenated (KEYS)
	FirstNonNull              // RANDOMKEY
	AllOnes                   // SCRIPT EXISTS: 1 only where every upstream has it
	Scan                      // SCAN: the upstream's cursor rewritten
)

// Part is what goes to one upstream. Raw nil means the command as the
// client sent it.
type Part struct {
	Upstream int
	Raw      []byte
}

// Plan is where one command goes.
type Plan struct {
	// Local, when set, is the reply: nothing goes upstream.
	Local []byte
	Merge Merge
	// parts are where the command goes; a plan with one part keeps it in
	// single instead, so routing most commands allocates nothing.
	parts  []Part
	single Part
	one    bool
	// Pos locates element k of the reply of a split MGET (key k's) or
	// PUBSUB NUMSUB (channel k/2's name and count): part, element.
	Pos [][2]int
	// upstreams is how many there are, for SCAN's next cursor.
	upstreams int
}

// Single is the plan of a command sent as it is to upstream up.
func Single(up int) Plan { return Plan{one: true, single: Part{Upstream: up}} }

// Len is the number of parts.
func (p *Plan) Len() int {
	if p.one {
		return 1
	}
	return len(p.parts)
}

// Part is part k, which the caller may redirect (a transaction's commands
// go where its first key does).
func (p *Plan) Part(k int) *Part {
	if p.one {
		return &p.single
	}
	return &p.parts[k]
}

// fanOut lists the keyless commands that go to every upstream, and how
// their replies combine: the same list as cluster mode's, for the same
// reasons (internal/cluster).
var fanOut = map[string]Merge{
	"dbsize":           Sum,
	"keys":             Concat,
	"randomkey":        FirstNonNull,
	"flushall":         AllOK,
	"flushdb":          AllOK,
	"script|load":      AllOK,
	"script|flush":     AllOK,
	"script|exists":    AllOnes,
	"function|load":    AllOK,
	"function|delete":  AllOK,
	"function|flush":   AllOK,
	"function|restore": AllOK,
	// Each upstream has the subscribers of its own channels
	// ([[channel_route]]); PUBSUB NUMSUB goes by its channels (Plan).
	"pubsub|channels":      Concat,
	"pubsub|shardchannels": Concat,
	"pubsub|numpat":        Sum,
}

// FansOut reports whether the command named name goes to every upstream.
func FansOut(name string) bool {
	_, ok := fanOut[name]
	return ok || name == "scan"
}

// Keys is the upstream all of args' keys route to. keyed is false for a
// command without keys; when the keys route to different upstreams, err
// (a CrossError) names two of the routes; for a command routes cannot run
// as asked, err is a Refusal. ErrorReply answers either.
// scratch, when not nil, holds the key positions between calls.
func (t *Table) Keys(cmd *commands.Command, args [][]byte, scratch *[]int) (up int, keyed bool, err error) {
	if err := refused(cmd.Name, args); err != nil {
		return Default, true, err
	}
	var keys []int
	if scratch != nil {
		keys = cmd.Keys(args, (*scratch)[:0])
		*scratch = keys
	} else {
		keys = cmd.Keys(args, nil)
	}
	if len(keys) == 0 {
		return Default, false, nil
	}
	up, r0 := t.Key(args[keys[0]])
	for _, k := range keys[1:] {
		if u, r := t.Key(args[k]); u != up {
			return up, true, &CrossError{Command: cmd.Name, A: t.describe(up, r0), B: t.describe(u, r)}
		}
	}
	return up, true, nil
}

// CrossError: one command's keys route to different upstreams, and it is
// not one that can be split.
type CrossError struct {
	Command  string
	Channels bool   // the command's channels, not keys
	A, B     string // the two routes, described
}

func (e *CrossError) Error() string {
	what := "keys"
	if e.Channels {
		what = "channels"
	}
	return "CROSSROUTE redproxy: the " + what + " of '" + strings.ToUpper(strings.ReplaceAll(e.Command, "|", " ")) + "' go to different upstreams (" + e.A + "; " + e.B + "); send them separately"
}

// Reply is e as a RESP error.
func (e *CrossError) Reply() []byte { return []byte("-" + e.Error() + "\r\n") }

// Plan decides where one command goes, outside a transaction. cmd may be
// nil (a command unknown to the proxy: the default upstream answers it).
func (t *Table) Plan(cmd *commands.Command, args [][]byte, scratch *[]int) Plan {
	if cmd == nil {
		return Single(Default)
	}
	name := cmd.Name
	if name == "scan" {
		return t.planScan(args)
	}
	if m, ok := fanOut[name]; ok {
		p := Plan{Merge: m, parts: make([]Part, t.Len())}
		for i := range p.parts {
			p.parts[i].Upstream = i
		}
		return p
	}
	if up, ok, err := t.Channels(name, args); ok {
		if err == nil {
			return Single(up)
		}
		// PUBSUB NUMSUB over several upstreams: each counts its own.
		return t.splitChannels(args)
	}
	up, _, err := t.Keys(cmd, args, scratch)
	if err == nil {
		return Single(up)
	}
	switch name {
	case "mget":
		return t.split(args, MGET, 1)
	case "del", "unlink", "exists", "touch":
		return t.split(args, Sum, 1)
	case "mset":
		return t.split(args, AllOK, 2)
	}
	return Plan{Local: ErrorReply(err)}
}

// refused is the error for a command routes cannot run as asked, or nil.
func refused(name string, args [][]byte) error {
	switch name {
	case "swapdb":
		// Run on each upstream it would swap one part of the keyspace at
		// a time, and one upstream refusing (a cluster) leaves it half
		// swapped: the atomic switch SWAPDB exists for cannot be had.
		return &Refusal{errSwapDB}
	case "sort", "sort_ro":
		// Keys named by BY and GET patterns may route elsewhere; read on
		// the sorted key's upstream they were silently missing (nil
		// values, a wrong order). Redis Cluster refuses them likewise.
		for opt, i := range commands.SortOptions(args) {
			if opt == commands.SortGet && string(args[i]) != "#" || opt == commands.SortBy && bytes.IndexByte(args[i], '*') >= 0 {
				return &Refusal{errSortPatterns}
			}
		}
	}
	return nil
}

// Refusal is a command routes cannot run as asked; its reply says why.
type Refusal struct{ reply []byte }

func (e *Refusal) Error() string { return string(bytes.TrimSuffix(e.reply[1:], []byte("\r\n"))) }

// Reply is e as a RESP error.
func (e *Refusal) Reply() []byte { return e.reply }

// ErrorReply is the RESP error reply for an error of Keys (a CrossError or
// a Refusal); nil for nil.
func ErrorReply(err error) []byte {
	var r interface{ Reply() []byte }
	if errors.As(err, &r) {
		return r.Reply()
	}
	return nil
}

var (
	errSwapDB       = []byte("-ERR redproxy: SWAPDB cannot swap atomically across routed upstreams; swap on each Redis directly, or move keys with a script\r\n")
	errSortPatterns = []byte("-CROSSROUTE redproxy: with routes, SORT's BY and GET patterns may name keys on other upstreams; sort without them (BY nosort) and read the keys with MGET\r\n")
)

// split sends one command per upstream of a multi-key command whose keys
// are args[1], args[1+stride], ... (with stride-1 values after each), in
// the order each upstream first appears.
func (t *Table) split(args [][]byte, m Merge, stride int) Plan {
	p := Plan{Merge: m}
	if (len(args)-1)%stride != 0 {
		return Plan{Local: []byte("-ERR wrong number of arguments for '" + string(bytes.ToLower(args[0])) + "' command\r\n")}
	}
	var groups [][][]byte
	for i := 1; i < len(args); i += stride {
		up, _ := t.Key(args[i])
		g := p.group(up, &groups, args[:1])
		if m == MGET {
			p.Pos = append(p.Pos, [2]int{g, len(groups[g]) - 1})
		}
		groups[g] = append(groups[g], args[i:i+stride]...)
	}
	p.encode(groups)
	return p
}

// group is the index of the part for upstream up, added, with its command
// starting with head, when up has none yet: parts go in the order each
// upstream first appears.
func (p *Plan) group(up int, groups *[][][]byte, head [][]byte) int {
	for j := range p.parts {
		if p.parts[j].Upstream == up {
			return j
		}
	}
	*groups = append(*groups, slices.Clone(head))
	p.parts = append(p.parts, Part{Upstream: up})
	return len(p.parts) - 1
}

// encode makes each part's command from its group of arguments.
func (p *Plan) encode(groups [][][]byte) {
	for g := range groups {
		p.parts[g].Raw = resp.AppendCommand(nil, groups[g]...)
	}
}

// splitChannels sends a PUBSUB NUMSUB (or SHARDNUMSUB) naming channels of
// several upstreams to each of them with its own channels, in the order
// each upstream first appears; the replies, a channel and its count per
// channel, are put back in the client's order as a split MGET's are.
func (t *Table) splitChannels(args [][]byte) Plan {
	p := Plan{Merge: MGET}
	var groups [][][]byte
	for _, ch := range args[2:] {
		g := p.group(t.Channel(ch), &groups, args[:2])
		e := 2 * (len(groups[g]) - 2)
		p.Pos = append(p.Pos, [2]int{g, e}, [2]int{g, e + 1})
		groups[g] = append(groups[g], ch)
	}
	p.encode(groups)
	return p
}

// Scan cursors carry the upstream's index in their low bits and the
// upstream's own cursor above them.
const (
	cursorBits     = 6
	maxInnerCursor = 1<<(64-cursorBits) - 1
)

var (
	errBadCursor = []byte("-ERR invalid cursor\r\n")
	scanDone     = []byte("*2\r\n$1\r\n0\r\n*0\r\n")
)

func (t *Table) planScan(args [][]byte) Plan {
	if len(args) < 2 {
		return Plan{Local: []byte("-ERR wrong number of arguments for 'scan' command\r\n")}
	}
	cursor, ok := commands.ParseScanCursor(args[1])
	if !ok {
		return Plan{Local: errBadCursor}
	}
	up := int(cursor & (1<<cursorBits - 1))
	if up >= t.Len() {
		// Made up (SCAN -1, which Redis reads as 2^64-1) or from before a
		// reload that removed upstreams: Redis answers any cursor with a
		// page, never an error, and the walk it ends is the client's.
		return Plan{Local: scanDone}
	}
	inner := append([][]byte{args[0], strconv.AppendUint(nil, cursor>>cursorBits, 10)}, args[2:]...)
	return Plan{Merge: Scan, one: true, single: Part{Upstream: up, Raw: resp.AppendCommand(nil, inner...)}, upstreams: t.Len()}
}

// Reply builds the command's reply from its parts' replies, in the parts'
// order. A split command fails as a whole with the first error any part
// got, though the other parts ran (docs/COMPATIBILITY.md), as in cluster
// mode.
func (p *Plan) Reply(replies [][]byte) []byte {
	if p.Local != nil {
		return p.Local
	}
	if p.Merge == Scan {
		return scanReply(p.single.Upstream, p.upstreams, replies[0])
	}
	if p.Merge == One || len(replies) == 1 && p.Merge != MGET {
		return replies[0]
	}
	if p.Merge != FirstNonNull {
		if err := resp.FirstError(replies); err != nil {
			return err
		}
	}
	switch p.Merge {
	case MGET:
		return resp.MergeMGET(replies, p.Pos, errUnexpected)
	case Sum:
		return resp.MergeSum(replies, errUnexpected)
	case AllOK:
		return replies[0]
	case Concat:
		return resp.MergeConcat(replies, errUnexpected)
	case FirstNonNull:
		return resp.MergeFirstNonNull(replies, 0)
	case AllOnes:
		return resp.MergeAllOnes(replies, errUnexpected)
	}
	return replies[0]
}

// Merged is Reply of a split MGET or KEYS, planned rather than built
// (resp.Merged), for the caller to write where the client's replies are
// kept; ok is false for any other plan, or replies Reply answers with an
// error, whose reply Reply builds.
func (p *Plan) Merged(replies [][]byte) (m resp.Merged, ok bool) {
	if p.Local != nil || !(p.Merge == MGET || p.Merge == Concat && len(replies) > 1) {
		return m, false
	}
	m, reply := resp.PlanArrays(replies, p.Pos, p.Merge == Concat, errUnexpected)
	return m, reply == nil
}

// scanReply rewrites upstream up's SCAN reply so its cursor names the
// upstream: its next cursor, or when it is done the next upstream's
// start, or 0 after the last upstream.
func scanReply(up, n int, r []byte) []byte {
	if resp.IsError(r) {
		return r
	}
	e, ok := resp.ArrayElements(r)
	if !ok || len(e) != 2 {
		return errUnexpected(r)
	}
	inner, ok := bulkUint(e[0])
	if !ok {
		return errUnexpected(r)
	}
	var cursor uint64
	switch {
	case inner > maxInnerCursor:
		return []byte("-ERR redproxy: an upstream's SCAN cursor is too large to carry the upstream with routes\r\n")
	case inner != 0:
		cursor = inner<<cursorBits | uint64(up)
	case up+1 < n:
		cursor = uint64(up + 1)
	}
	c := strconv.FormatUint(cursor, 10)
	out := resp.AppendArray(nil, 2)
	out = append(out, '$')
	out = strconv.AppendInt(out, int64(len(c)), 10)
	out = append(out, "\r\n"+c+"\r\n"...)
	return append(out, e[1]...)
}

// bulkUint reads a bulk (or simple) string holding an unsigned integer.
func bulkUint(b []byte) (uint64, bool) {
	if len(b) < 3 {
		return 0, false
	}
	var s []byte
	switch b[0] {
	case '$':
		nl := bytes.IndexByte(b, '\n')
		if nl < 0 || nl+1 > len(b)-2 {
			return 0, false
		}
		s = b[nl+1 : len(b)-2]
	case '+':
		s = b[1 : len(b)-2]
	default:
		return 0, false
	}
	v, err := strconv.ParseUint(string(s), 10, 64)
	return v, err == nil
}

func errUnexpected(r []byte) []byte {
	return []byte("-ERR redproxy: unexpected reply from an upstream: " + strconv.Quote(string(r[:min(len(r), 64)])) + "\r\n")
}
