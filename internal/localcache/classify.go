package localcache

import (
	"bytes"
	"github.com/redproxy/redproxy/internal/commands"
)

// notCached lists read-only single-key commands whose reply must not be
// reused even though the command table calls them deterministic: their
// reply depends on time or on server bookkeeping rather than on the key's
// value (TTL, OBJECT, MEMORY USAGE), they read keys they do not declare
// (SORT_RO's BY and GET patterns), or they exist for their side effect
// (TOUCH updates the access time). A stream's consumer-group state (XINFO
// GROUPS/CONSUMERS/STREAM, XPENDING) changes with XREADGROUP, XACK, XCLAIM,
// XAUTOCLAIM, XSETID and XGROUP, for which Redis 7.0 sends no tracking
// invalidation, so no fence or invalidation would ever retire such a reply.
var notCached = map[string]bool{
	"ttl": true, "pttl": true, "expiretime": true, "pexpiretime": true,
	"randomkey": true, "srandmember": true, "hrandfield": true, "zrandmember": true,
	"scan": true, "sscan": true, "hscan": true, "zscan": true,
	"sort": true, "sort_ro": true, "touch": true, "memory|usage": true,
	"object|encoding": true, "object|freq": true, "object|idletime": true, "object|refcount": true,
	"dump": true, "debug": true,
	"xinfo|groups": true, "xinfo|consumers": true, "xinfo|stream": true, "xpending": true,
}

// uncacheableFlags mark commands whose reply may not be reused: anything
// that writes, may write or replicate (PFCOUNT updates its cached
// cardinality), runs a script (which may read undeclared keys), blocks,
// belongs to pub/sub or connection state, or is nondeterministic.
const uncacheableFlags = commands.Write | commands.MayReplicate | commands.CatScripting |
	commands.Blocking | commands.PubSub | commands.ConnState | commands.Nondeterministic |
	commands.NoMandatoryKeys | commands.MovableKeys

// CacheableCommand reports whether replies to cmd may be kept at all:
// read-only, deterministic commands (GET, HGET, HGETALL, HMGET, SMEMBERS,
// the ZRANGE family, LRANGE, EXISTS, STRLEN, ...). Callers on the hot path
// evaluate it once per command and keep the answer.
func CacheableCommand(cmd *commands.Command) bool {
	return cmd != nil && cmd.Flags&commands.ReadOnly != 0 && cmd.Flags&uncacheableFlags == 0 &&
		cmd.Subcommands == nil && !notCached[cmd.Name]
}

// Cacheable reports whether a reply to cmd with args may be kept, and if so
// which argument is its key: a CacheableCommand called with exactly one key
// and no blocking option.
func Cacheable(cmd *commands.Command, args [][]byte) (key []byte, ok bool) {
	if !CacheableCommand(cmd) {
		return nil, false
	}
	return CacheableKey(cmd, args)
}

// CacheableKey is Cacheable for a command already known to be a
// CacheableCommand.
func CacheableKey(cmd *commands.Command, args [][]byte) (key []byte, ok bool) {
	if cmd.IsBlocking(args) {
		return nil, false
	}
	if len(args) > 3 && (cmd.Name == "zrank" || cmd.Name == "zrevrank") {
		// WITHSCORE (Redis 7.2): a missing member is the null array *-1
		// for RESP2, where RESP3's _ is all a fill sees, and the plain
		// form's null is $-1 (found by review). Not kept, so no fill has
		// to tell them apart.
		return nil, false
	}
	var buf [2]int
	idx := cmd.KeysAtMost(args, buf[:0], 2) // one, or more than one
	if len(idx) != 1 {
		return nil, false
	}
	return args[idx[0]], true
}

// unknownKeys reports whether a write may touch keys the proxy cannot name
// from its arguments: scripts and functions (which may write undeclared
// keys, or SELECT another database), commands whose key specs Redis itself
// calls incomplete or cannot locate, and writes reaching into another
// database (MOVE, COPY ... DB).
func unknownKeys(cmd *commands.Command, args [][]byte) bool {
	if cmd.Flags&commands.CatScripting != 0 {
		return true
	}
	switch cmd.Name {
	case "move":
		return true
	case "copy":
		for i := 3; i < len(args); i++ {
			a := args[i]
			if len(a) == 2 && (a[0]|0x20) == 'd' && (a[1]|0x20) == 'b' {
				return true
			}
		}
	case "sort", "migrate":
		return false // Keys resolves SORT ... STORE and MIGRATE ... KEYS itself
	}
	if len(cmd.KeySpecs) == 0 {
		return cmd.Flags&commands.MovableKeys != 0
	}
	for _, ks := range cmd.KeySpecs {
		if ks.Flags&commands.KeyRO != 0 && ks.Flags&commands.KeyVariableFlags == 0 {
			continue // keys it only reads do not matter here
		}
		if ks.Flags&commands.KeyIncomplete != 0 || ks.Begin.Kind == commands.BeginUnknown ||
			ks.Find.Kind == commands.FindUnknown && ks.Flags&commands.KeyNotKey == 0 {
			return true
		}
	}
	return false
}

// flushKind says whether a write empties whole databases. DEBUG RELOAD and
// DEBUG LOADAOF count as FLUSHALL: they replace every database with the
// file's, and Redis's own invalidation of them arrived a moment after the
// reply, through which hits answered the values from before (found by a
// probe). DEBUG's other subcommands (SLEEP, OBJECT, ...) write nothing.
func flushKind(cmd *commands.Command, args [][]byte) string {
	switch cmd.Name {
	case "flushall", "flushdb", "swapdb":
		return cmd.Name
	case "debug":
		if len(args) > 1 && (bytes.EqualFold(args[1], []byte("reload")) || bytes.EqualFold(args[1], []byte("loadaof"))) {
			return "flushall"
		}
	}
	return ""
}
