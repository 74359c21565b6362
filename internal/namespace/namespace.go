// Package namespace confines a client to a key prefix on a shared Redis.
//
// On the way in, every key of every command is prefixed; which arguments
// are keys comes from the command table's key specs (commands.Command.Keys,
// the same source the ACL, the guard and cluster slotting use), plus the
// few places Redis names keys or channels outside its key specs: SORT's BY
// and GET patterns, SCAN MATCH, KEYS, and pub/sub channel names and
// patterns. On the way out, the prefix is taken off wherever Redis sends key
// or channel names back (Strip).
//
// Commands that reach beyond a prefix (FLUSHALL, SWAPDB, CONFIG SET,
// CLUSTER, ...) are refused; FLUSHDB and RANDOMKEY are emulated within the
// prefix by scripts (Action).
//
// A Rewriter owns the memory of the rewritten commands and reuses it from
// one batch to the next, so rewriting does not allocate per command once
// it has warmed up.
package namespace

import (
	"errors"
	"fmt"
	"strings"

	"github.com/redproxy/redproxy/internal/commands"
)

// ErrBadPrefix is returned by New for a prefix that cannot confine keys.
var ErrBadPrefix = errors.New("namespace: bad prefix")

// maxPrefix bounds a prefix. It is added to every key, so it bounds how
// much larger than the client sent a rewritten request can be.
const maxPrefix = 64

// Namespace is one key prefix. It is immutable and safe for concurrent use.
type Namespace struct {
	prefix string
	// matchAll is SCAN's and KEYS's pattern for "every key of the
	// namespace": the prefix followed by '*'.
	matchAll []byte
	// flushCmd and randomCmd are the scripts FLUSHDB and RANDOMKEY run as.
	flushCmd, randomCmd []byte
}

// New validates prefix and returns its Namespace. A prefix must be
// non-empty, printable, without spaces, and without the glob characters
// (* ? [ ] \), which would turn the prefix of a SCAN MATCH or PSUBSCRIBE
// pattern into a pattern of its own, and without braces, which would move
// keys' hash tags in cluster mode.
func New(prefix string) (*Namespace, error) {
	if prefix == "" {
		return nil, fmt.Errorf("%w: empty", ErrBadPrefix)
	}
	if len(prefix) > maxPrefix {
		return nil, fmt.Errorf("%w: longer than %d bytes", ErrBadPrefix, maxPrefix)
	}
	for i := 0; i < len(prefix); i++ {
		c := prefix[i]
		if c <= ' ' || c == 0x7f {
			return nil, fmt.Errorf("%w: %q contains a space or control character", ErrBadPrefix, prefix)
		}
		if strings.IndexByte(`*?[]\{}`, c) >= 0 {
			return nil, fmt.Errorf("%w: %q contains %q (glob characters and hash-tag braces are not allowed)", ErrBadPrefix, prefix, c)
		}
	}
	ns := &Namespace{prefix: prefix, matchAll: []byte(prefix + "*")}
	ns.buildScripts()
	return ns, nil
}

// Prefix returns the namespace's key prefix.
func (ns *Namespace) Prefix() string { return ns.prefix }

// Action says what the proxy does with a rewritten command.
type Action uint8

const (
	Forward   Action = iota // send the rewritten arguments
	Refuse                  // answer Result.Err instead
	FlushDB                 // run FlushDBScript instead: only the namespace's keys go
	RandomKey               // run RandomKeyScript instead: a key of the namespace
)

// Strip says where keys or channel names come back in a command's reply.
type Strip uint8

const (
	StripNone     Strip = iota
	StripScan           // [cursor, [key ...]]
	StripKeys           // [key ...] (KEYS)
	StripBulk           // key (RANDOMKEY)
	StripFirst          // [key, ...] (BLPOP, BZPOPMIN, LMPOP, ZMPOP, ...)
	StripStreams        // [[stream, entries] ...] or {stream: entries} (XREAD)
	StripChannels       // [channel ...] (PUBSUB CHANNELS)
	StripPairs          // [channel, n, ...] or {channel: n} (PUBSUB NUMSUB)
	// StripGroupError: a reply that names no key unless it is NOGROUP's
	// error, which quotes the stream's name (XPENDING, XCLAIM, XAUTOCLAIM,
	// XGROUP's subcommands, XINFO CONSUMERS).
	StripGroupError
)

// Result is the outcome of rewriting one command.
type Result struct {
	Action Action
	Strip  Strip
	// Err is the refusal's error text, without the leading '-'.
	Err string
}

// refused lists the commands that cannot be confined to a prefix, with the
// reason given to the client. Containers ("cluster") cover every
// subcommand; a subcommand entry ("config|set") only itself.
var refused = map[string]string{
	"flushall":         "affects every namespace",
	"swapdb":           "affects every namespace",
	"dbsize":           "counts every namespace's keys",
	"debug":            "reaches past any key prefix",
	"pfdebug":          "is a debugging command",
	"pfselftest":       "is a debugging command",
	"cluster":          "manages the whole server",
	"monitor":          "shows every namespace's commands",
	"shutdown":         "stops the server for every namespace",
	"save":             "manages the whole server",
	"bgsave":           "manages the whole server",
	"bgrewriteaof":     "manages the whole server",
	"replicaof":        "manages the whole server",
	"slaveof":          "manages the whole server",
	"failover":         "manages the whole server",
	"sync":             "copies every namespace",
	"psync":            "copies every namespace",
	"module":           "manages the whole server",
	"function":         "manages libraries every namespace shares",
	"slowlog":          "shows every namespace's commands",
	"latency|reset":    "manages the whole server",
	"memory|purge":     "manages the whole server",
	"config|get":       "shows the server's settings, its passwords among them",
	"config|set":       "changes the server for every namespace",
	"config|resetstat": "changes the server for every namespace",
	"config|rewrite":   "changes the server for every namespace",
	"script|flush":     "affects every namespace's scripts",
	"script|kill":      "may stop another namespace's script",
	"client|kill":      "may name another namespace's clients",
	"client|unblock":   "may name another namespace's clients",
	"client|pause":     "pauses every namespace",
	"client|unpause":   "pauses every namespace",
	"client|tracking":  "would send invalidations that carry prefixed key names",
	"acl|setuser":      "manages the whole server",
	"acl|deluser":      "manages the whole server",
	"acl|load":         "manages the whole server",
	"acl|save":         "manages the whole server",
	"acl|log":          "shows every namespace's denials",
	"acl|list":         "manages the whole server",
	"acl|users":        "manages the whole server",
	"acl|getuser":      "manages the whole server",
	"acl|dryrun":       "manages the whole server",
}

// refusal returns why cmd cannot run in a namespace, or "".
func refusal(cmd *commands.Command) string {
	if why := refused[cmd.Name]; why != "" {
		return why
	}
	if cmd.Parent != nil {
		return refused[cmd.Parent.Name]
	}
	return ""
}

// RefusalError is the text a refused command is answered with.
func RefusalError(name, why string) string {
	return "ERR redproxy: " + strings.ToUpper(strings.ReplaceAll(name, "|", " ")) + " is not allowed in a namespace: it " + why
}
