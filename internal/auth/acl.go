// Package auth holds the proxy's own users: who a client is after AUTH or
// HELLO ... AUTH, which commands and keys that user may touch (a command
// ACL in Redis's syntax, checked before anything is forwarded), and which
// upstream credential the user's traffic runs with.
//
// The ACL is a subset of Redis 7's ACL SETUSER rules, with the same
// meaning:
//
//	+<command>  -<command>      allow / deny a command (all its subcommands for a container)
//	+<cmd>|<sub> -<cmd>|<sub>   allow / deny one subcommand
//	+@<category> -@<category>   allow / deny a category (@all is every command)
//	allcommands  nocommands     aliases of +@all and -@all
//	~<pattern>                  keys matching pattern may be read and written
//	%R~<pattern> %W~<pattern>   ... read only / written only (%RW~ is ~)
//	allkeys  resetkeys          ~* / forget the key patterns so far
//	&<pattern>                  pub/sub channels matching pattern may be used
//	allchannels  resetchannels  &* / forget the channel patterns so far
//
// Command rules apply in order, a later rule overriding an earlier one for
// the commands both name, as in Redis. A user with no command rules may run
// nothing; one with no key pattern may touch no key; one with no channel
// pattern may use no channel (Redis 7's acl-pubsub-default resetchannels).
//
// Channels are checked as Redis 7 checks them: the channel of PUBLISH and
// SPUBLISH and each channel of SUBSCRIBE and SSUBSCRIBE must match one of
// the user's channel patterns; each pattern of PSUBSCRIBE must be one of
// them, character for character (a client may not widen its reach with a
// broader pattern). Unsubscribing is never refused.
package auth

import (
	"bytes"
	"errors"
	"fmt"
	"strings"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/glob"
	"github.com/redproxy/redproxy/internal/resp"
)

// ErrBadACL is wrapped by every ACL parse error.
var ErrBadACL = errors.New("invalid ACL rule")

// Perm is a key permission: read, write or both.
type Perm uint8

const (
	PermRead Perm = 1 << iota
	PermWrite
)

// ACL is a compiled command and key ACL. It is immutable and safe for
// concurrent use.
type ACL struct {
	text    string
	rules   []cmdRule
	allKeys bool
	keys    []keyPattern
	// allChannels: every channel (allchannels, &*); else channels are the
	// patterns allowed, in their source form for PSUBSCRIBE's literal check.
	allChannels bool
	channels    []glob.Pattern
}

type cmdRule struct {
	allow bool
	all   bool           // +@all / -@all
	cat   commands.Flags // a category
	name  string         // a command ("set") or subcommand ("client|kill")
}

type keyPattern struct {
	perm Perm
	pat  glob.Pattern
}

// Denial says why a command was refused.
type Denial uint8

const (
	Allowed       Denial = iota
	DeniedCmd            // the command (or its category) is not allowed
	DeniedKey            // a key argument matches no pattern with the needed permission
	DeniedUnauth         // the client has not authenticated (the proxy's NOAUTH)
	DeniedChannel        // a pub/sub channel or pattern the user's channel rules do not allow
	DeniedSortBy         // SORT's BY with a pattern, for a user who may not read every key
	DeniedSortGet        // SORT's GET, likewise
)

// maxACLLen caps a rule string: it comes from the configuration, but the
// fuzzer and a careless generator should not make parsing unbounded.
const maxACLLen = 64 << 10

// ParseACL compiles rules, checking command and subcommand names against
// table (the built-in table when nil) so that a misspelt command is an
// error rather than a rule that silently never matches.
func ParseACL(rules string, table *commands.Table) (*ACL, error) {
	if table == nil {
		table = commands.Builtin()
	}
	if len(rules) > maxACLLen {
		return nil, fmt.Errorf("%w: longer than %d bytes", ErrBadACL, maxACLLen)
	}
	a := &ACL{text: strings.Join(strings.Fields(rules), " ")}
	for _, r := range strings.Fields(rules) {
		if err := a.add(r, table); err != nil {
			return nil, err
		}
	}
	return a, nil
}

func (a *ACL) add(r string, table *commands.Table) error {
	lr := strings.ToLower(r)
	switch lr {
	case "allcommands":
		a.rules = append(a.rules, cmdRule{allow: true, all: true})
		return nil
	case "nocommands":
		a.rules = append(a.rules, cmdRule{all: true})
		return nil
	case "allkeys":
		a.allKeys, a.keys = true, nil
		return nil
	case "resetkeys":
		a.allKeys, a.keys = false, nil
		return nil
	case "on", "off", "nopass", "resetpass", "reset":
		return fmt.Errorf("%w %q: user state and passwords are set by the [[users]] fields (enabled, password_sha256), not in acl", ErrBadACL, r)
	case "allchannels":
		a.allChannels, a.channels = true, nil
		return nil
	case "resetchannels":
		a.allChannels, a.channels = false, nil
		return nil
	}
	switch r[0] {
	case '+', '-':
		return a.addCommandRule(r, table)
	case '~':
		return a.addKey(r, r[1:], PermRead|PermWrite)
	case '%':
		perms, pat, ok := strings.Cut(r[1:], "~")
		if !ok || perms == "" {
			return fmt.Errorf("%w %q: a key permission rule is %%R~pattern, %%W~pattern or %%RW~pattern", ErrBadACL, r)
		}
		var p Perm
		for _, c := range strings.ToUpper(perms) {
			switch c {
			case 'R':
				p |= PermRead
			case 'W':
				p |= PermWrite
			default:
				return fmt.Errorf("%w %q: unknown key permission %q (use R, W or RW)", ErrBadACL, r, c)
			}
		}
		return a.addKey(r, pat, p)
	case '&':
		return a.addChannel(r, r[1:])
	case '>', '<', '#', '!':
		return fmt.Errorf("%w %q: passwords are set by password_sha256, not in acl (and must not be written in the file in plain text)", ErrBadACL, redactRule(r))
	case '(':
		return fmt.Errorf("%w %q: selectors are not supported by the proxy", ErrBadACL, r)
	}
	return fmt.Errorf("%w %q: not a rule the proxy knows (see README, Security)", ErrBadACL, r)
}

// redactRule hides what follows a password rule's marker.
func redactRule(r string) string { return r[:1] + "..." }

func (a *ACL) addKey(r, pat string, p Perm) error {
	if pat == "" {
		return fmt.Errorf("%w %q: empty key pattern", ErrBadACL, r)
	}
	if err := glob.Check(pat); err != nil {
		return fmt.Errorf("%w %q: %v", ErrBadACL, r, err)
	}
	if pat == "*" && p == PermRead|PermWrite {
		a.allKeys = true
		return nil
	}
	a.keys = append(a.keys, keyPattern{perm: p, pat: glob.Compile(pat)})
	return nil
}

func (a *ACL) addChannel(r, pat string) error {
	if pat == "" {
		return fmt.Errorf("%w %q: empty channel pattern", ErrBadACL, r)
	}
	if a.allChannels {
		// As Redis: the pattern would have no effect, which is most likely
		// not what was meant.
		return fmt.Errorf("%w %q: a channel pattern after allchannels (or &*) has no effect; start with resetchannels to list channels", ErrBadACL, r)
	}
	if err := glob.Check(pat); err != nil {
		return fmt.Errorf("%w %q: %v", ErrBadACL, r, err)
	}
	if pat == "*" {
		a.allChannels, a.channels = true, nil
		return nil
	}
	a.channels = append(a.channels, glob.Compile(pat))
	return nil
}

func (a *ACL) addCommandRule(r string, table *commands.Table) error {
	allow := r[0] == '+'
	name := strings.ToLower(r[1:])
	if strings.HasPrefix(name, "@") {
		if name == "@all" {
			a.rules = append(a.rules, cmdRule{allow: allow, all: true})
			return nil
		}
		cat, ok := commands.Category(name)
		if !ok {
			return fmt.Errorf("%w %q: unknown category (known: all, %s)", ErrBadACL, r, strings.Join(commands.Categories(), ", "))
		}
		a.rules = append(a.rules, cmdRule{allow: allow, cat: cat})
		return nil
	}
	if name == "" {
		return fmt.Errorf("%w %q: missing command name", ErrBadACL, r)
	}
	top, sub, hasSub := strings.Cut(name, "|")
	c := table.Get(top)
	if c == nil {
		return fmt.Errorf("%w %q: unknown command %q", ErrBadACL, r, top)
	}
	if hasSub {
		if c.Subcommands == nil {
			return fmt.Errorf("%w %q: %q has no subcommands (Redis's old first-argument rules are not supported)", ErrBadACL, r, top)
		}
		if table.Get(name) == nil {
			return fmt.Errorf("%w %q: unknown subcommand %q of %q", ErrBadACL, r, sub, top)
		}
	}
	a.rules = append(a.rules, cmdRule{allow: allow, name: name})
	return nil
}

// String returns the rules as configured (whitespace normalised).
func (a *ACL) String() string { return a.text }

// matches reports whether rule r names cmd (nil: a command the table does
// not know, which only @all names).
func (r *cmdRule) matches(cmd *commands.Command) bool {
	switch {
	case r.all:
		return true
	case cmd == nil:
		return false
	case r.cat != 0:
		return cmd.Flags&r.cat != 0
	case r.name == cmd.Name:
		return true
	default:
		return cmd.Parent != nil && r.name == cmd.Parent.Name
	}
}

// CommandAllowed reports whether the command rules allow cmd. Commands
// Redis lets run before authentication (AUTH, HELLO, QUIT, RESET: the
// no_auth flag) are always allowed, as in Redis.
func (a *ACL) CommandAllowed(cmd *commands.Command) bool {
	if cmd != nil && cmd.Flags&commands.NoAuth != 0 {
		return true
	}
	allowed := false
	for i := range a.rules {
		if a.rules[i].matches(cmd) {
			allowed = a.rules[i].allow
		}
	}
	return allowed
}

// KeyAllowed reports whether key may be used with permission need. A need
// of 0 (a key the command neither reads nor writes, as EXISTS) is allowed
// by any pattern the key matches, as in Redis.
func (a *ACL) KeyAllowed(key []byte, need Perm) bool {
	if a.allKeys {
		return true
	}
	for i := range a.keys {
		k := &a.keys[i]
		if k.perm&need == need && k.pat.Match(key) {
			return true
		}
	}
	return false
}

// ChannelAllowed reports whether a channel may be published or subscribed
// to: it matches one of the channel patterns.
func (a *ACL) ChannelAllowed(ch []byte) bool {
	if a.allChannels {
		return true
	}
	for i := range a.channels {
		if a.channels[i].Match(ch) {
			return true
		}
	}
	return false
}

// ChannelPatternAllowed reports whether PSUBSCRIBE may subscribe to
// pattern: it must be one of the channel patterns as written, since a
// pattern that merely matches an allowed one could match far more.
func (a *ACL) ChannelPatternAllowed(pattern []byte) bool {
	if a.allChannels {
		return true
	}
	for i := range a.channels {
		if a.channels[i].String() == string(pattern) {
			return true
		}
	}
	return false
}

// AllChannels reports whether every channel is allowed.
func (a *ACL) AllChannels() bool { return a.allChannels }

// channelsDenied checks the channels of the pub/sub commands Redis 7
// checks (publishing and subscribing; never unsubscribing).
func (a *ACL) channelsDenied(cmd *commands.Command, args [][]byte) bool {
	if a.allChannels || len(args) < 2 {
		return false
	}
	switch cmd.Name {
	case "publish", "spublish":
		return !a.ChannelAllowed(args[1])
	case "subscribe", "ssubscribe":
		for _, ch := range args[1:] {
			if !a.ChannelAllowed(ch) {
				return true
			}
		}
	case "psubscribe":
		for _, p := range args[1:] {
			if !a.ChannelPatternAllowed(p) {
				return true
			}
		}
	}
	return false
}

// readsAllKeys reports whether every key may be read (~* or %R~*).
func (a *ACL) readsAllKeys() bool {
	if a.allKeys {
		return true
	}
	for i := range a.keys {
		if k := &a.keys[i]; k.perm&PermRead != 0 && k.pat.String() == "*" {
			return true
		}
	}
	return false
}

// AllKeys reports whether every key is allowed with every permission.
func (a *ACL) AllKeys() bool { return a.allKeys }

// NeedFor returns the permission a key spec's flags call for, Redis's way:
// ACCESS reads; INSERT, DELETE and UPDATE write. OW and RM without those
// flags ask for nothing more than a matching pattern.
func NeedFor(f commands.KeySpecFlags) Perm {
	var p Perm
	if f&commands.KeyAccess != 0 {
		p |= PermRead
	}
	if f&(commands.KeyInsert|commands.KeyDelete|commands.KeyUpdate) != 0 {
		p |= PermWrite
	}
	return p
}

// Check decides a call: cmd is table.Lookup(args) (nil for an unknown
// command). scratch is a buffer for key positions that the caller may keep
// between calls to avoid allocating; the grown buffer is returned.
func (a *ACL) Check(cmd *commands.Command, args [][]byte, scratch []commands.KeyRef) (Denial, []commands.KeyRef) {
	if !a.CommandAllowed(cmd) {
		return DeniedCmd, scratch
	}
	if cmd != nil && a.channelsDenied(cmd, args) {
		return DeniedChannel, scratch
	}
	if a.allKeys {
		return Allowed, scratch
	}
	if cmd == nil {
		// A command the table does not know (a module's, a newer Redis's,
		// or any when the built-in table stands in for the upstream's):
		// its keys cannot be found, so a user held to key patterns may
		// not run it. Allowed, "GETDEL secret" took a key outside
		// ~cache:* for a user with +@all (found by review).
		return DeniedKey, scratch
	}
	scratch = cmd.KeyRefs(args, scratch[:0])
	for _, k := range scratch {
		if k.Flags&commands.KeyNotKey != 0 {
			continue
		}
		if !a.KeyAllowed(args[k.Index], NeedFor(k.Flags)) {
			return DeniedKey, scratch
		}
	}
	if (cmd.Name == "sort" || cmd.Name == "sort_ro") && !a.readsAllKeys() {
		// As Redis 7: BY with a pattern and GET read keys no spec names,
		// so they need read access to every key. Redis would refuse them
		// itself, but the proxy's own credential may read every key.
		// Redis checks them after the key specs, as it reads the options.
		return sortPatternDenial(args, cmd.Name == "sort_ro"), scratch
	}
	return Allowed, scratch
}

// sortPatternDenial walks SORT's options as Redis's sortCommandGeneric
// does, and returns the denial of the first that reads keys by pattern:
// a BY whose pattern has a "*" (without one Redis does not sort and reads
// nothing), or any GET (even "#"). An option Redis answers with a syntax
// error before that is left to Redis, which reads nothing for it.
func sortPatternDenial(args [][]byte, readonly bool) Denial {
	for j := 2; j < len(args); j++ {
		left := len(args) - j - 1
		switch a := args[j]; {
		case commands.EqualFold("asc", a), commands.EqualFold("desc", a), commands.EqualFold("alpha", a):
		case commands.EqualFold("limit", a) && left >= 2:
			if _, ok := resp.ParseInt(args[j+1]); !ok {
				return Allowed
			}
			if _, ok := resp.ParseInt(args[j+2]); !ok {
				return Allowed
			}
			j += 2
		case !readonly && commands.EqualFold("store", a) && left >= 1:
			j++
		case commands.EqualFold("by", a) && left >= 1:
			if bytes.IndexByte(args[j+1], '*') >= 0 {
				return DeniedSortBy
			}
			j++
		case commands.EqualFold("get", a) && left >= 1:
			return DeniedSortGet
		default:
			return Allowed
		}
	}
	return Allowed
}

// NoPermError is the text of Redis's error for a denial (without the
// leading '-' and the CRLF): "NOPERM User app has no permissions to run
// the 'set' command", "NOPERM No permissions to access a key" or "NOPERM
// No permissions to access a channel" (Redis 7.2's texts). name is
// the command as the client wrote it when the table does not know it.
func NoPermError(user string, cmd *commands.Command, name string, d Denial) string {
	switch d {
	case DeniedKey:
		return "NOPERM No permissions to access a key"
	case DeniedChannel:
		return "NOPERM No permissions to access a channel"
	case DeniedSortBy:
		return "ERR BY option of SORT denied due to insufficient ACL permissions."
	case DeniedSortGet:
		return "ERR GET option of SORT denied due to insufficient ACL permissions."
	case DeniedUnauth:
		return "NOAUTH Authentication required."
	}
	if cmd != nil {
		name = cmd.Name
	} else {
		name = strings.ToLower(name)
		if len(name) > 128 {
			name = name[:128]
		}
		name = strings.Map(func(r rune) rune {
			if r < ' ' || r > '~' {
				return '?'
			}
			return r
		}, name)
	}
	return "NOPERM User " + user + " has no permissions to run the '" + name + "' command"
}
