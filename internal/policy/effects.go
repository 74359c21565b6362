package policy

import (
	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/resp"
)

// effKind is what a command does to one key's TTL.
type effKind uint8

const (
	// effCreate: the command may create the key or replace its value, and
	// either way can leave it without a TTL (HSET on a new key, SET without
	// EX on any key, MSET, *STORE destinations, ...).
	effCreate effKind = iota + 1
	// effSetTTL: the command gives the key the TTL found in args[ttl].
	effSetTTL
	// effPersist: the command removes the key's TTL on purpose (PERSIST,
	// GETEX PERSIST).
	effPersist
)

// fixKind is how enforce mode gives an effCreate key its default TTL.
type fixKind uint8

const (
	fixExpire     fixKind = iota // send EXPIRE key <default> NX after the command
	fixAppendEX                  // SET: append EX <default> to the command
	fixRestoreTTL                // RESTORE: replace the ttl argument (0 = none)
)

type ttlUnit uint8

const (
	unitSec     ttlUnit = iota // EX, SETEX, EXPIRE
	unitMs                     // PX, PSETEX, PEXPIRE, RESTORE
	unitUnixSec                // EXAT, EXPIREAT
	unitUnixMs                 // PXAT, PEXPIREAT, RESTORE ... ABSTTL
)

// keyEffect is one key argument of one command and what the command does to
// its TTL. Indices are into the command's args (args[0] is the name).
type keyEffect struct {
	key  int
	kind effKind
	// creates: the command may create this key, so naming rules apply to it.
	creates bool
	fix     fixKind // effCreate
	ttl     int     // effSetTTL, and fixRestoreTTL: index of the TTL argument
	unit    ttlUnit
	// conditional: an effSetTTL that may not give a key without a TTL one
	// even with a valid TTL argument: it can leave such a key alone (EXPIRE
	// XX or GT, SET NX or XX, RESTORE without REPLACE), fail on the key's
	// type (SET ... GET, GETEX) or be refused for its options. It is never
	// taken as the TTL of an earlier write in the batch.
	conditional bool
	// db, when not 0, is the index of the argument naming the database the
	// key is in (COPY ... DB n); 0 means the current database.
	db int
	// inherits: the key takes another key's TTL, unseen by the policy
	// (RENAME, RENAMENX, COPY); a rule's max then needs a fix-up too.
	inherits bool
}

// classifier appends the effects of one call to dst. It must tolerate any
// arguments: arity is checked by Redis, not here.
type classifier func(args [][]byte, dst []keyEffect) []keyEffect

// effectTable maps every command (Redis 7 names, subcommands "a|b") that can
// create a key or change a TTL to its classifier. Every other write command
// in the builtin table is listed in noTTLEffect; a test keeps the two lists
// complete.
var effectTable = map[string]classifier{
	// strings
	"set":         classifySet,
	"setex":       classifySetex(unitSec),
	"psetex":      classifySetex(unitMs),
	"setnx":       createAt(1),
	"getset":      createAt(1),
	"getex":       classifyGetex,
	"mset":        createPairs,
	"msetnx":      createPairs,
	"incr":        createAt(1),
	"incrby":      createAt(1),
	"incrbyfloat": createAt(1),
	"decr":        createAt(1),
	"decrby":      createAt(1),
	"append":      createAt(1),
	"setrange":    createAt(1),
	"setbit":      createAt(1),
	"bitfield":    classifyBitfield,
	"bitop":       createAt(2),
	// hashes
	"hset":         fieldPairs,
	"hsetnx":       createAt(1),
	"hmset":        fieldPairs,
	"hincrby":      createAt(1),
	"hincrbyfloat": createAt(1),
	// lists (LPUSHX/RPUSHX/LINSERT/LSET need an existing key)
	"lpush":      createAt(1),
	"rpush":      createAt(1),
	"lmove":      createAt(2),
	"blmove":     createAt(2),
	"rpoplpush":  createAt(2),
	"brpoplpush": createAt(2),
	// sets
	"sadd":        createAt(1),
	"smove":       createAt(2),
	"sunionstore": createAt(1),
	"sinterstore": createAt(1),
	"sdiffstore":  createAt(1),
	// sorted sets
	"zadd":        createUnlessXX(1),
	"zincrby":     createAt(1),
	"zunionstore": createAt(1),
	"zinterstore": createAt(1),
	"zdiffstore":  createAt(1),
	"zrangestore": createAt(1),
	// geo
	"geoadd":            createUnlessXX(1),
	"georadius":         classifyGeoStore(6),
	"georadiusbymember": classifyGeoStore(5),
	"geosearchstore":    createAt(1),
	// streams
	"xadd":          classifyXadd,
	"xgroup|create": classifyXgroupCreate,
	// hyperloglog
	"pfadd":   createAt(1),
	"pfmerge": createAt(1),
	// keyspace: the destination of COPY and RENAME takes the source's TTL,
	// which may be none.
	"copy":           classifyCopy,
	"rename":         inheritAt(2),
	"renamenx":       inheritAt(2),
	"restore":        classifyRestore,
	"restore-asking": classifyRestore,
	"sort":           classifySort,
	"persist":        persistAt(1),
	"expire":         classifyExpire(unitSec),
	"pexpire":        classifyExpire(unitMs),
	"expireat":       classifyExpire(unitUnixSec),
	"pexpireat":      classifyExpire(unitUnixMs),
}

// noTTLEffect lists the write commands that neither create a key nor change
// a TTL, so that a new write command added to the command table fails a test
// until someone decides where it belongs.
var noTTLEffect = []string{
	"blmpop", "blpop", "brpop", "bzmpop", "bzpopmax", "bzpopmin", "lmpop", "lpop", "rpop",
	"spop", "zmpop", "zpopmax", "zpopmin", "getdel",
	"del", "unlink", "hdel", "lrem", "ltrim", "srem", "zrem", "zremrangebylex",
	"zremrangebyrank", "zremrangebyscore", "xdel", "xtrim",
	"linsert", "lpushx", "rpushx", "lset", // need an existing key, keep its TTL
	"move",    // the key keeps its TTL in the other database
	"migrate", // the key leaves this server
	"pfdebug", "swapdb", "flushall", "flushdb",
	"xack", "xautoclaim", "xclaim", "xsetid", "xreadgroup",
	"xgroup|setid", "xgroup|createconsumer", "xgroup|delconsumer", "xgroup|destroy",
	"function|flush", "function|delete", "function|restore", "function|load",
}

// noEffect is noTTLEffect as a set, for the look-up that decides whether a
// write command the effect table lacks needs the key-spec fallback.
var noEffect = func() map[string]bool {
	m := make(map[string]bool, len(noTTLEffect))
	for _, n := range noTTLEffect {
		m[n] = true
	}
	return m
}()

// scriptCommands declare keys that the script may create; only their names
// can be checked (see the package documentation).
var scriptCommands = map[string]bool{"eval": true, "evalsha": true, "fcall": true}

func createAt(i int) classifier {
	return func(args [][]byte, dst []keyEffect) []keyEffect { return appendCreate(args, dst, i) }
}

// inheritAt is createAt for a key that takes another key's TTL.
func inheritAt(i int) classifier {
	return func(args [][]byte, dst []keyEffect) []keyEffect {
		if i < len(args) {
			dst = append(dst, keyEffect{key: i, kind: effCreate, creates: true, inherits: true})
		}
		return dst
	}
}

func appendCreate(args [][]byte, dst []keyEffect, i int) []keyEffect {
	if i < len(args) {
		dst = append(dst, keyEffect{key: i, kind: effCreate, creates: true})
	}
	return dst
}

func persistAt(i int) classifier {
	return func(args [][]byte, dst []keyEffect) []keyEffect {
		if i < len(args) {
			dst = append(dst, keyEffect{key: i, kind: effPersist})
		}
		return dst
	}
}

// classifySetex: SETEX/PSETEX key ttl value. Any other argument count is an
// arity error.
func classifySetex(unit ttlUnit) classifier {
	return func(args [][]byte, dst []keyEffect) []keyEffect {
		if len(args) < 3 {
			return dst
		}
		return append(dst, keyEffect{key: 1, kind: effSetTTL, creates: true, ttl: 2, unit: unit, conditional: len(args) != 4})
	}
}

// createPairs: MSET/MSETNX key value [key value ...]. A key without its
// value Redis refuses ("wrong number of arguments") before it writes
// anything: no effect, so the client gets that error, not a policy
// refusal (found by a probe).
func createPairs(args [][]byte, dst []keyEffect) []keyEffect {
	if len(args)%2 == 0 {
		return dst
	}
	for i := 1; i+1 < len(args); i += 2 {
		dst = append(dst, keyEffect{key: i, kind: effCreate, creates: true})
	}
	return dst
}

// fieldPairs: HSET/HMSET key field value [field value ...], refused by
// Redis with a field without its value, as createPairs.
func fieldPairs(args [][]byte, dst []keyEffect) []keyEffect {
	if len(args)%2 == 1 {
		return dst
	}
	return appendCreate(args, dst, 1)
}

// ttlOption recognises the TTL options shared by SET and GETEX.
func ttlOption(a []byte) (ttlUnit, bool) {
	switch {
	case eqFold(a, "ex"):
		return unitSec, true
	case eqFold(a, "px"):
		return unitMs, true
	case eqFold(a, "exat"):
		return unitUnixSec, true
	case eqFold(a, "pxat"):
		return unitUnixMs, true
	}
	return 0, false
}

// classifySet: SET key value [NX|XX] [GET] [EX|PX|EXAT|PXAT n|KEEPTTL].
// Without a TTL option SET discards the key's TTL, with KEEPTTL it keeps an
// existing one but still creates a new key without. With a TTL option SET
// either sets that TTL or is refused, so it never leaves the key without
// one. As in Redis, a repeated option wins over the earlier one, so the last
// TTL option is the one checked against a rule's max.
//
// Options are parsed the way Redis parses them only to decide whether the
// SET certainly sets the TTL (for the look-ahead); whether it creates a key
// without a TTL depends on nothing but the absence of a TTL option, so a
// parse that disagrees with Redis cannot open a hole. Options that
// conflict (NX with XX, two TTL units, KEEPTTL with a TTL) Redis refuses
// with a syntax error, and in MULTI at EXEC, where the transaction's
// other commands still run: a SET of such options alone has no effect,
// so the client gets Redis's error (found by a probe: "needs a TTL", and
// inside MULTI an EXECABORT that ran nothing). Not beside an option
// Redis 7.0 does not know, which may be one a later Redis has: Redis
// 8.4's IFEQ takes the next argument as its value, so SET k v IFEQ
// KEEPTTL EX n sets a TTL of n (found by review); such a SET is
// classified by what it would do.
func classifySet(args [][]byte, dst []keyEffect) []keyEffect {
	if len(args) < 3 {
		return dst
	}
	var nx, xx, get, keep, unknown, conflict bool
	ttl, unit := 0, ttlUnit(0)
	for i := 3; i < len(args); i++ {
		a := args[i]
		if u, ok := ttlOption(a); ok && i+1 < len(args) {
			if keep || (ttl > 0 && u != unit) {
				conflict = true
			}
			ttl, unit = i+1, u
			i++
			continue
		}
		switch {
		case eqFold(a, "nx"):
			conflict = conflict || xx
			nx = true
		case eqFold(a, "xx"):
			conflict = conflict || nx
			xx = true
		case eqFold(a, "get"):
			get = true
		case eqFold(a, "keepttl"):
			conflict = conflict || ttl > 0
			keep = true
		default:
			unknown = true
		}
	}
	if conflict && !unknown {
		return dst
	}
	bad := unknown || conflict
	if ttl > 0 {
		return append(dst, keyEffect{key: 1, kind: effSetTTL, creates: true, ttl: ttl, unit: unit, conditional: nx || xx || get || bad})
	}
	fix := fixAppendEX
	if keep {
		fix = fixExpire
	}
	return append(dst, keyEffect{key: 1, kind: effCreate, creates: true, fix: fix})
}

// classifyGetex: GETEX key [EX|PX|EXAT|PXAT n|PERSIST]; it never creates,
// and fails on a key that holds no string, so its TTL is conditional.
// Redis (7.0.15) takes a repeated TTL option of the same unit and applies
// the last, as SET does, so the last is the one checked against a rule's
// max: checking the first let GETEX k EX 100 EX 99999999 escape it (found
// by review). Redis refuses with a syntax error TTL options of different
// units, PERSIST with a TTL option, an option without its value and
// unknown options. For the conflicts (two units, PERSIST with a TTL)
// such a GETEX has no effect and the client
// gets Redis's error (found by a probe: "must keep its TTL"), unless an
// option Redis 7.0 does not know comes with them (as for SET, a later
// Redis's option may take the next argument); such a GETEX, and any with
// an option Redis 7.0 does not know, is still classified by what it would do
// (PERSIST first, as the refused effect, else the last TTL), so a parse
// that disagrees with a later Redis cannot open a hole.
func classifyGetex(args [][]byte, dst []keyEffect) []keyEffect {
	ttl, unit, persist, conflict, unknown := 0, ttlUnit(0), false, false, false
	for i := 2; i < len(args); i++ {
		if u, ok := ttlOption(args[i]); ok && i+1 < len(args) {
			conflict = conflict || persist || ttl > 0 && u != unit
			ttl, unit = i+1, u
			i++
			continue
		}
		if eqFold(args[i], "persist") {
			conflict = conflict || ttl > 0
			persist = true
		} else {
			unknown = true
		}
	}
	if conflict && !unknown {
		return dst
	}
	switch {
	case persist:
		return append(dst, keyEffect{key: 1, kind: effPersist})
	case ttl > 0:
		return append(dst, keyEffect{key: 1, kind: effSetTTL, ttl: ttl, unit: unit, conditional: true})
	}
	return dst
}

// classifyBitfield: only SET and INCRBY operations create the key; a
// BITFIELD of GETs is a read. No type, offset or value token can be spelt
// "set" or "incrby", so scanning every token is safe.
func classifyBitfield(args [][]byte, dst []keyEffect) []keyEffect {
	for i := 2; i < len(args); i++ {
		if eqFold(args[i], "set") || eqFold(args[i], "incrby") {
			return appendCreate(args, dst, 1)
		}
	}
	return dst
}

// createUnlessXX: ZADD/GEOADD key [NX|XX] [GT|LT] [CH] [INCR] ...; XX only
// updates existing members of an existing key.
func createUnlessXX(i int) classifier {
	return func(args [][]byte, dst []keyEffect) []keyEffect {
		for j := i + 1; j < len(args); j++ {
			a := args[j]
			switch {
			case eqFold(a, "xx"):
				return dst
			case eqFold(a, "nx"), eqFold(a, "gt"), eqFold(a, "lt"), eqFold(a, "ch"), eqFold(a, "incr"):
			default:
				return appendCreate(args, dst, i) // first score or longitude: options are over
			}
		}
		return appendCreate(args, dst, i)
	}
}

// classifyGeoStore: GEORADIUS[BYMEMBER] ... [STORE key] [STOREDIST key],
// options starting at index from.
func classifyGeoStore(from int) classifier {
	return func(args [][]byte, dst []keyEffect) []keyEffect {
		for i := from; i+1 < len(args); i++ {
			switch {
			case eqFold(args[i], "store"), eqFold(args[i], "storedist"):
				dst = append(dst, keyEffect{key: i + 1, kind: effCreate, creates: true})
				i++
			case eqFold(args[i], "count"):
				i++
			}
		}
		return dst
	}
}

// classifyXadd: XADD key [NOMKSTREAM] [MAXLEN|MINID [=|~] n [LIMIT c]] id ...
func classifyXadd(args [][]byte, dst []keyEffect) []keyEffect {
	for i := 2; i < len(args); i++ {
		a := args[i]
		switch {
		case eqFold(a, "nomkstream"):
			return dst
		case eqFold(a, "maxlen"), eqFold(a, "minid"):
			if i+1 < len(args) && (eqFold(args[i+1], "=") || eqFold(args[i+1], "~")) { // Redis: next[0] == '~' && next[1] == '\0'
				i++
			}
			i++
		case eqFold(a, "limit"):
			i++
		default:
			return appendCreate(args, dst, 1) // the entry ID: options are over
		}
	}
	return dst
}

// classifyXgroupCreate: XGROUP CREATE key group id [MKSTREAM] [ENTRIESREAD n].
func classifyXgroupCreate(args [][]byte, dst []keyEffect) []keyEffect {
	for i := 5; i < len(args); i++ {
		if eqFold(args[i], "mkstream") {
			return append(dst, keyEffect{key: 2, kind: effCreate, creates: true})
		}
	}
	return dst
}

// classifyRestore: RESTORE key ttl payload [REPLACE] [ABSTTL] ...; ttl 0
// means no TTL.
func classifyRestore(args [][]byte, dst []keyEffect) []keyEffect {
	if len(args) < 4 {
		return dst
	}
	unit := unitMs
	for i := 4; i < len(args); i++ {
		if eqFold(args[i], "absttl") {
			unit = unitUnixMs
		}
	}
	if string(args[2]) == "0" {
		return append(dst, keyEffect{key: 1, kind: effCreate, creates: true, fix: fixRestoreTTL, ttl: 2, unit: unit})
	}
	// It fails on an existing key without REPLACE, and on a bad payload.
	return append(dst, keyEffect{key: 1, kind: effSetTTL, creates: true, ttl: 2, unit: unit, conditional: true})
}

// classifyCopy: COPY source destination [DB n] [REPLACE]. The destination
// takes the source's TTL, which may be none; with DB it is created in
// database n, where its fix-up must go too.
func classifyCopy(args [][]byte, dst []keyEffect) []keyEffect {
	if len(args) < 3 {
		return dst
	}
	db := 0
	for i := 3; i+1 < len(args); i++ {
		if eqFold(args[i], "db") {
			db = i + 1
			i++
		}
	}
	return append(dst, keyEffect{key: 2, kind: effCreate, creates: true, db: db, inherits: true})
}

// classifySort: SORT key [BY p] [LIMIT o c] [GET p ...] [ASC|DESC] [ALPHA]
// [STORE dest]. Option values are skipped so a pattern spelt "store" is not
// taken for the option.
func classifySort(args [][]byte, dst []keyEffect) []keyEffect {
	store := 0
	for i := 2; i < len(args); i++ {
		switch a := args[i]; {
		case eqFold(a, "by"), eqFold(a, "get"):
			i++
		case eqFold(a, "limit"):
			i += 2
		case eqFold(a, "store"):
			if i+1 < len(args) {
				store = i + 1
			}
			i++
		}
	}
	if store > 0 {
		dst = append(dst, keyEffect{key: store, kind: effCreate, creates: true})
	}
	return dst
}

// classifyExpire: EXPIRE key n [NX|XX|GT|LT]. XX and GT never act on a key
// without a TTL (GT treats "no TTL" as infinite); NX and LT always do, and
// leave a key that has a TTL with one. Redis refuses NX with any other
// option, GT with LT, and unknown options.
func classifyExpire(unit ttlUnit) classifier {
	return func(args [][]byte, dst []keyEffect) []keyEffect {
		if len(args) < 3 {
			return dst
		}
		var nx, xx, gt, lt, bad bool
		for i := 3; i < len(args); i++ {
			switch a := args[i]; {
			case eqFold(a, "nx"):
				nx = true
			case eqFold(a, "xx"):
				xx = true
			case eqFold(a, "gt"):
				gt = true
			case eqFold(a, "lt"):
				lt = true
			default:
				bad = true
			}
		}
		if nx && (xx || gt || lt) || gt && lt {
			// Refused by Redis in every version ("not compatible"): the
			// client gets that error, not a policy refusal (found by a
			// probe).
			return dst
		}
		return append(dst, keyEffect{key: 1, kind: effSetTTL, ttl: 2, unit: unit, conditional: xx || gt || bad})
	}
}

// eqFold reports whether the argument a is the lower-case option word w
// as Redis reads it: without case and up to a's first NUL, so "STORE\x00"
// is SORT's STORE. Redis parses option words with strcasecmp; a compare of
// the whole argument missed SORT's STORE\x00, COPY's DB\x00 and GETEX's
// PERSIST\x00, which Redis acts on (found by review). commands.EqualFold is
// the one option comparison the proxy uses; see there.
func eqFold(a []byte, w string) bool { return commands.EqualFold(w, a) }

// parseInt parses a decimal integer argument exactly as Redis's string2ll
// does (EXPIRE, SET EX, GETEX EX, RESTORE, ... read their numbers with
// it): resp.ParseInt. It must take no more and no less than Redis: taking
// "0100" trusted EXPIRE k 0100 to give k its TTL, which Redis refuses
// (found by review), and refusing a number Redis takes (a 19-digit
// PEXPIREAT) would skip a rule's max for it.
func parseInt(b []byte) (int64, bool) { return resp.ParseInt(b) }
