// Package commands answers, for every client command the proxy sees, the
// questions routing and policy need: is it a write, which arguments are keys,
// can it block the connection, does it touch per-connection state, is it a
// pub/sub or transaction command.
//
// The data comes from Redis itself: either the upstream's COMMAND reply (Load)
// or a table generated from a real Redis 7 COMMAND reply and compiled in
// (Builtin). Lookups run on every command, so Lookup, Keys, IsBlocking, Is and
// ArityOK never allocate.
package commands

//go:generate go run ./gen -o builtin_gen.go

import (
	"bytes"
	"strconv"
	"strings"
	"sync"
)

// Flags is a bit set of Redis command flags, the proxy-relevant ACL
// categories, the command tips that matter for caching, and a few flags that
// redproxy derives itself (documented on each).
type Flags uint64

const (
	Write       Flags = 1 << iota // "write"
	ReadOnly                      // "readonly"
	Denyoom                       // "denyoom"
	Admin                         // "admin"
	PubSub                        // "pubsub"
	NoScript                      // "noscript"
	Blocking                      // "blocking": the command may block (see IsBlocking for the exact answer)
	Loading                       // "loading"
	Stale                         // "stale"
	Fast                          // "fast"
	MovableKeys                   // "movablekeys"
	NoMulti                       // "no_multi"
	SkipMonitor                   // "skip_monitor"
	AllowBusy                     // "allow_busy"

	CatKeyspace    // "@keyspace"
	CatRead        // "@read"
	CatWrite       // "@write"
	CatDangerous   // "@dangerous"
	CatConnection  // "@connection"
	CatTransaction // "@transaction"
	CatScripting   // "@scripting"
	CatBlocking    // "@blocking"
	CatPubSub      // "@pubsub"
	CatSlow        // "@slow"

	NoAuth          // "no_auth"
	MayReplicate    // "may_replicate"
	NoMandatoryKeys // "no_mandatory_keys"
	NoAsyncLoading  // "no_async_loading"
	SkipSlowlog     // "skip_slowlog"
	Asking          // "asking"
	CatAdmin        // "@admin"
	CatFast         // "@fast"

	// Nondeterministic is the "nondeterministic_output" command tip: the
	// reply can differ between identical calls on identical data, so it must
	// never be served from a cache.
	Nondeterministic
	// NondeterministicOrder is the "nondeterministic_output_order" tip: the
	// reply is a set whose element order is not stable.
	NondeterministicOrder

	// ConnState is derived by redproxy, not reported by Redis: the command
	// changes server state that belongs to the client connection (selected
	// DB, auth, protocol, name, tracking, reply mode, transactions,
	// subscriptions, ...). A proxy multiplexing clients over shared upstream
	// connections must emulate, pin or refuse these.
	ConnState

	// The data-type ACL categories, which the proxy's user ACLs
	// (internal/auth) select commands by.
	CatString      // "@string"
	CatList        // "@list"
	CatHash        // "@hash"
	CatSet         // "@set"
	CatSortedSet   // "@sortedset"
	CatBitmap      // "@bitmap"
	CatHyperLogLog // "@hyperloglog"
	CatGeo         // "@geo"
	CatStream      // "@stream"
)

// flagNames maps each flag to the Redis spelling it is parsed from and to its
// Go identifier (String prints the latter so the generator can emit it).
var flagNames = [...]struct {
	f      Flags
	redis  string
	goName string
}{
	{Write, "write", "Write"},
	{ReadOnly, "readonly", "ReadOnly"},
	{Denyoom, "denyoom", "Denyoom"},
	{Admin, "admin", "Admin"},
	{PubSub, "pubsub", "PubSub"},
	{NoScript, "noscript", "NoScript"},
	{Blocking, "blocking", "Blocking"},
	{Loading, "loading", "Loading"},
	{Stale, "stale", "Stale"},
	{Fast, "fast", "Fast"},
	{MovableKeys, "movablekeys", "MovableKeys"},
	{NoMulti, "no_multi", "NoMulti"},
	{SkipMonitor, "skip_monitor", "SkipMonitor"},
	{AllowBusy, "allow_busy", "AllowBusy"},
	{CatKeyspace, "@keyspace", "CatKeyspace"},
	{CatRead, "@read", "CatRead"},
	{CatWrite, "@write", "CatWrite"},
	{CatDangerous, "@dangerous", "CatDangerous"},
	{CatConnection, "@connection", "CatConnection"},
	{CatTransaction, "@transaction", "CatTransaction"},
	{CatScripting, "@scripting", "CatScripting"},
	{CatBlocking, "@blocking", "CatBlocking"},
	{CatPubSub, "@pubsub", "CatPubSub"},
	{CatSlow, "@slow", "CatSlow"},
	{NoAuth, "no_auth", "NoAuth"},
	{MayReplicate, "may_replicate", "MayReplicate"},
	{NoMandatoryKeys, "no_mandatory_keys", "NoMandatoryKeys"},
	{NoAsyncLoading, "no_async_loading", "NoAsyncLoading"},
	{SkipSlowlog, "skip_slowlog", "SkipSlowlog"},
	{Asking, "asking", "Asking"},
	{CatAdmin, "@admin", "CatAdmin"},
	{CatFast, "@fast", "CatFast"},
	{Nondeterministic, "nondeterministic_output", "Nondeterministic"},
	{NondeterministicOrder, "nondeterministic_output_order", "NondeterministicOrder"},
	{ConnState, "", "ConnState"},
	{CatString, "@string", "CatString"},
	{CatList, "@list", "CatList"},
	{CatHash, "@hash", "CatHash"},
	{CatSet, "@set", "CatSet"},
	{CatSortedSet, "@sortedset", "CatSortedSet"},
	{CatBitmap, "@bitmap", "CatBitmap"},
	{CatHyperLogLog, "@hyperloglog", "CatHyperLogLog"},
	{CatGeo, "@geo", "CatGeo"},
	{CatStream, "@stream", "CatStream"},
}

// Category returns the flag of a Redis ACL category, named with or without
// its '@' ("read", "@sortedset"), case-insensitively. Every category Redis 7
// defines has one; ok is false for anything else.
func Category(name string) (f Flags, ok bool) {
	if !strings.HasPrefix(name, "@") {
		name = "@" + name
	}
	for _, n := range flagNames {
		if strings.HasPrefix(n.redis, "@") && strings.EqualFold(n.redis, name) {
			return n.f, true
		}
	}
	return 0, false
}

// Categories lists the ACL category names (without '@') that Category
// knows, in a fixed order.
func Categories() []string {
	var out []string
	for _, n := range flagNames {
		if strings.HasPrefix(n.redis, "@") {
			out = append(out, n.redis[1:])
		}
	}
	return out
}

// flagByRedisName returns the flag for a Redis flag, "@category" or tip name
// (case-insensitive), or 0 if redproxy does not track it.
func flagByRedisName(s string) Flags {
	for _, n := range flagNames {
		if n.redis != "" && strings.EqualFold(n.redis, s) {
			return n.f
		}
	}
	return 0
}

// String renders f as a Go expression ("Write | Denyoom | CatWrite"), which is
// readable in logs and lets the generator emit flags by name. Bits without a
// name are printed as a hex Flags conversion.
func (f Flags) String() string {
	if f == 0 {
		return "0"
	}
	var b strings.Builder
	for _, n := range flagNames {
		if f&n.f == 0 {
			continue
		}
		if b.Len() > 0 {
			b.WriteString(" | ")
		}
		b.WriteString(n.goName)
		f &^= n.f
	}
	if f != 0 {
		if b.Len() > 0 {
			b.WriteString(" | ")
		}
		b.WriteString("Flags(0x")
		b.WriteString(strconv.FormatUint(uint64(f), 16))
		b.WriteString(")")
	}
	return b.String()
}

// Command describes one Redis command or subcommand.
type Command struct {
	Name  string // lower case; subcommands are "container|sub" like Redis 7
	Arity int    // Redis semantics: >0 exact argument count, <0 minimum; counts the name(s)
	Flags Flags

	// Legacy key positions (first, last, step), used only when KeySpecs is
	// empty, e.g. for tables loaded from Redis < 7. LastKey < 0 counts from
	// the end.
	FirstKey, LastKey, KeyStep int

	// KeySpecs are the Redis 7 key specifications, in the order Redis reports
	// them. Keys interprets them generically.
	KeySpecs []KeySpec

	// Subcommands is non-nil for container commands (CLIENT, CONFIG, ...);
	// keys are the lower-case subcommand names ("setname"). Treat as read-only.
	Subcommands map[string]*Command
	// Parent is the container command of a subcommand, else nil.
	Parent *Command

	subIndex nameIndex // case-insensitive, allocation-free view of Subcommands
	keysProc keysProc
	block    blockKind
}

type keysProc uint8

const (
	procSpecs     keysProc = iota // key specs, else legacy positions
	procSort                      // SORT: key specs plus the STORE destination Redis marks "unknown"
	procMigrate                   // MIGRATE: single key or the KEYS form, parsed like Redis does
	procGeoradius                 // GEORADIUS[BYMEMBER]: every STORE/STOREDIST value, not only the first
)

type blockKind uint8

const (
	blockNever  blockKind = iota
	blockAlways           // blocks whenever it runs (BLPOP, WAIT, ...)
	blockOption           // blocks only with a BLOCK option (XREAD, XREADGROUP)
)

// Is reports whether every bit of f is set on c. A nil command has no flags.
func (c *Command) Is(f Flags) bool {
	return c != nil && c.Flags&f == f
}

// ArityOK reports whether a call with nargs arguments (name included) meets
// the command's arity. An arity of 0 means Redis did not say, so anything goes.
func (c *Command) ArityOK(nargs int) bool {
	switch {
	case c == nil:
		return false
	case c.Arity > 0:
		return nargs == c.Arity
	case c.Arity < 0:
		return nargs >= -c.Arity
	default:
		return true
	}
}

// IsBlocking reports whether running c with args can block the connection
// until some event happens (so it must not share a pipelined upstream
// connection): the blocking list/zset pops and moves, WAIT and WAITAOF, and
// XREAD/XREADGROUP only when they carry a BLOCK option. (Inside MULTI
// nothing blocks; tracking that is the caller's business.)
func (c *Command) IsBlocking(args [][]byte) bool {
	if c == nil {
		return false
	}
	switch c.block {
	case blockAlways:
		return true
	case blockOption:
		return hasBlockOption(args)
	default:
		return false
	}
}

// hasBlockOption scans the options of XREAD/XREADGROUP up to STREAMS. It
// skips option values so that a group, consumer or count named "block" is
// not mistaken for the option, and stops at STREAMS because key names and
// IDs after it are data.
func hasBlockOption(args [][]byte) bool {
	for i := 1; i < len(args); i++ {
		a := args[i]
		switch {
		case optionFold("block", a):
			return true
		case optionFold("streams", a):
			return false
		case optionFold("group", a):
			i += 2 // group name and consumer name
		case optionFold("count", a):
			i++
		}
	}
	return false
}

// connStateCommands lists commands that change per-connection server state;
// see ConnState. Names are Redis 7 style.
var connStateCommands = []string{
	"auth", "hello", "select", "reset", "quit", "readonly", "readwrite", "asking",
	"multi", "exec", "discard", "watch", "unwatch",
	"subscribe", "psubscribe", "ssubscribe", "unsubscribe", "punsubscribe", "sunsubscribe",
	"monitor",
	"client|setname", "client|setinfo", "client|tracking", "client|caching", "client|reply",
	"client|no-evict", "client|no-touch",
	// SCRIPT DEBUG YES|SYNC makes the connection's next EVAL run in the
	// Lua debugger.
	"script|debug",
}

// alwaysBlocking lists commands that block without carrying Redis's
// "blocking" flag (WAIT waits for replicas, WAITAOF for fsyncs).
var alwaysBlocking = []string{"wait", "waitaof"}

// Table is an immutable set of commands indexed for allocation-free,
// case-insensitive lookup. It is safe for concurrent use.
type Table struct {
	cmds  []*Command // top-level commands, sorted by name
	index nameIndex
}

// newTable indexes cmds (top-level commands with their Subcommands attached)
// and fills in what redproxy derives from names. It takes ownership of cmds.
func newTable(cmds []*Command) *Table {
	t := &Table{cmds: cmds}
	sortCommands(t.cmds)
	t.index = newNameIndex(len(cmds))
	for _, c := range cmds {
		finish(c)
		t.index.put(c.Name, c)
		if len(c.Subcommands) == 0 {
			continue
		}
		c.subIndex = newNameIndex(len(c.Subcommands))
		for key, s := range c.Subcommands {
			s.Parent = c
			finish(s)
			c.subIndex.put(key, s)
		}
	}
	return t
}

// finish sets the name-derived behaviour of one command.
func finish(c *Command) {
	for _, n := range connStateCommands {
		if c.Name == n {
			c.Flags |= ConnState
		}
	}
	switch {
	case c.Name == "xread" || c.Name == "xreadgroup":
		c.block = blockOption
	case c.Flags&Blocking != 0:
		c.block = blockAlways
	}
	for _, n := range alwaysBlocking {
		if c.Name == n {
			c.block = blockAlways
		}
	}
	switch c.Name {
	case "sort":
		c.keysProc = procSort
	case "migrate":
		c.keysProc = procMigrate
	case "georadius", "georadiusbymember":
		c.keysProc = procGeoradius
	}
}

// Lookup finds the command for a client call; args[0] is the command name in
// any case. For container commands (CLIENT, CONFIG, OBJECT, ...) it resolves
// the subcommand from args[1]; when args[1] is missing or not a known
// subcommand it returns the container itself, whose Subcommands field is
// non-nil, so callers can still forward and let Redis report the error,
// unless NULName finds a NUL byte in the name it did not know.
// It returns nil for unknown commands and never allocates.
func (t *Table) Lookup(args [][]byte) *Command {
	if t == nil || len(args) == 0 {
		return nil
	}
	c := lookupName(&t.index, args[0])
	if c == nil || len(args) < 2 || c.subIndex.empty() {
		return c
	}
	if s := lookupName(&c.subIndex, args[1]); s != nil {
		return s
	}
	return c
}

// NULName reports which name of args holds a NUL byte, given cmd, what
// Lookup found for args: 0 for the command name (cmd is nil: unknown), 1
// for the subcommand name of a container (cmd is the container: the
// subcommand is unknown); -1 when neither does, which is the case for
// every name Lookup found, since no command is named with a NUL.
//
// Such a command must never reach Redis. Redis finds a command by hashing
// its whole name, NUL bytes included, but compares the names in the
// hash's bucket with strcasecmp, which stops at the first NUL: so
// "KEYS\x00<suffix>" runs as KEYS whenever the whole name happens to hash
// into KEYS's bucket (about one suffix in 256; for a subcommand, whose
// dict is small, "CONFIG SET\x00<suffix>" runs as CONFIG SET about one
// time in 8), and otherwise is an unknown command. Lookup, like the
// proxy's policy and handlers, compares whole names and cannot tell which
// command Redis will run, so the caller answers it as Redis does when the
// name misses (an unknown command or subcommand error) and forwards
// nothing. It never allocates.
func NULName(cmd *Command, args [][]byte) int {
	switch {
	case len(args) == 0:
		return -1
	case cmd == nil:
		if hasNUL(args[0]) {
			return 0
		}
	case cmd.Subcommands != nil && len(args) > 1:
		if hasNUL(args[1]) {
			return 1
		}
	}
	return -1
}

func hasNUL(b []byte) bool { return bytes.IndexByte(b, 0) >= 0 }

// Get finds a command by name, any case; "client|setname" (or "client
// setname") names a subcommand. For configuration and tests, not the hot path.
func (t *Table) Get(name string) *Command {
	if t == nil {
		return nil
	}
	top, sub, hasSub := strings.Cut(name, "|")
	if !hasSub {
		top, sub, hasSub = strings.Cut(name, " ")
	}
	c := lookupName(&t.index, top)
	if c == nil || !hasSub {
		return c
	}
	return lookupName(&c.subIndex, sub)
}

// Commands returns the top-level commands sorted by name. The slice is a
// copy; the commands are shared and must not be modified.
func (t *Table) Commands() []*Command {
	if t == nil {
		return nil
	}
	return append([]*Command(nil), t.cmds...)
}

// Len returns the number of top-level commands.
func (t *Table) Len() int {
	if t == nil {
		return 0
	}
	return len(t.cmds)
}

var (
	builtinOnce  sync.Once
	builtinTable *Table
)

// builtinRows is filled by the generated builtin_gen.go. It is assigned in an
// init function rather than declared there so that this package still
// compiles, and the generator (which imports it) still runs, when the
// generated file is missing.
var builtinRows []row

// row is one generated command; subcommands are rows named "container|sub".
type row struct {
	name              string
	arity             int
	flags             Flags
	first, last, step int
	specs             []KeySpec
}

// Builtin returns the compiled-in table, generated from a real Redis 7
// COMMAND reply. It is the fallback when the upstream cannot be asked. The
// same table is returned on every call.
func Builtin() *Table {
	builtinOnce.Do(func() {
		builtinTable = newTable(commandsFromRows(builtinRows))
	})
	return builtinTable
}

func commandsFromRows(rows []row) []*Command {
	byName := make(map[string]*Command, len(rows))
	var top []*Command
	for _, r := range rows {
		c := &Command{
			Name: r.name, Arity: r.arity, Flags: r.flags,
			FirstKey: r.first, LastKey: r.last, KeyStep: r.step,
			KeySpecs: r.specs,
		}
		byName[r.name] = c
		if !strings.Contains(r.name, "|") {
			top = append(top, c)
		}
	}
	for _, c := range byName {
		parent, sub, ok := strings.Cut(c.Name, "|")
		if !ok {
			continue
		}
		p := byName[parent]
		if p == nil {
			continue // generator guarantees parents; ignore orphans rather than panic
		}
		if p.Subcommands == nil {
			p.Subcommands = make(map[string]*Command)
		}
		p.Subcommands[sub] = c
	}
	return top
}
