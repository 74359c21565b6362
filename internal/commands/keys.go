package commands

import (
	"iter"
	"math"
	"strings"
)

// KeySpecFlags are the flags of one Redis 7 key specification.
type KeySpecFlags uint16

const (
	KeyRO            KeySpecFlags = 1 << iota // "RO": read only
	KeyRW                                     // "RW": read-write
	KeyOW                                     // "OW": overwrite, the old value is not read
	KeyRM                                     // "RM": remove
	KeyAccess                                 // "access": the value is returned or used
	KeyUpdate                                 // "update"
	KeyInsert                                 // "insert"
	KeyDelete                                 // "delete"
	KeyNotKey                                 // "not_key": a name hashed like a key (shard channels); not a key
	KeyIncomplete                             // "incomplete": the spec may miss keys
	KeyVariableFlags                          // "variable_flags": real flags depend on arguments
)

var keySpecFlagNames = [...]struct {
	f      KeySpecFlags
	redis  string
	goName string
}{
	{KeyRO, "RO", "KeyRO"},
	{KeyRW, "RW", "KeyRW"},
	{KeyOW, "OW", "KeyOW"},
	{KeyRM, "RM", "KeyRM"},
	{KeyAccess, "access", "KeyAccess"},
	{KeyUpdate, "update", "KeyUpdate"},
	{KeyInsert, "insert", "KeyInsert"},
	{KeyDelete, "delete", "KeyDelete"},
	{KeyNotKey, "not_key", "KeyNotKey"},
	{KeyIncomplete, "incomplete", "KeyIncomplete"},
	{KeyVariableFlags, "variable_flags", "KeyVariableFlags"},
}

func keySpecFlagByName(s string) KeySpecFlags {
	for _, n := range keySpecFlagNames {
		if strings.EqualFold(n.redis, s) {
			return n.f
		}
	}
	return 0
}

// String renders f as a Go expression, like Flags.String.
func (f KeySpecFlags) String() string {
	if f == 0 {
		return "0"
	}
	var parts []string
	for _, n := range keySpecFlagNames {
		if f&n.f != 0 {
			parts = append(parts, n.goName)
		}
	}
	return strings.Join(parts, " | ")
}

// BeginKind says how a key spec finds the first key.
type BeginKind uint8

const (
	BeginUnknown BeginKind = iota // keys cannot be found from the arguments alone
	BeginIndex                    // at a fixed argument index
	BeginKeyword                  // right after a keyword
)

// FindKind says how a key spec finds the remaining keys from the first.
type FindKind uint8

const (
	FindUnknown FindKind = iota
	FindRange            // a range relative to the first key
	FindKeynum           // an argument says how many keys follow
)

// KeySpec is one Redis 7 key specification (COMMAND reply element 9).
type KeySpec struct {
	Flags KeySpecFlags
	Begin BeginSearch
	Find  FindKeys
}

// BeginSearch is a key spec's begin_search part.
type BeginSearch struct {
	Kind BeginKind
	// Index is the argument position of the first key (BeginIndex).
	Index int
	// Keyword is searched case-insensitively starting at StartFrom; a
	// negative StartFrom counts from the end and searches backwards
	// (BeginKeyword).
	Keyword   string
	StartFrom int
}

// FindKeys is a key spec's find_keys part, relative to the first key found
// by BeginSearch.
type FindKeys struct {
	Kind FindKind
	// FindRange: LastKey is the last key's offset from the first (negative:
	// from the end of the arguments); when Limit > 1 and LastKey is -1, only
	// 1/Limit of the remaining arguments are keys (XREAD's key/ID halves).
	LastKey int
	KeyStep int
	Limit   int
	// FindKeynum: the argument at KeyNumIdx (offset from the first key
	// position) holds the key count; the keys start at offset FirstKey.
	KeyNumIdx int
	FirstKey  int
}

// Keys appends to dst the indices into args of the key arguments, in the
// order Redis reports them, and returns the extended slice. It interprets the
// Redis 7 key specs (plus the two cases Redis itself cannot describe with
// specs: SORT ... STORE and MIGRATE ... KEYS), falling back to legacy
// first/last/step positions for tables loaded from older servers.
//
// Malformed arguments never panic: a key count larger than the arguments, a
// missing keyword or a non-numeric count yields only the indices that exist.
// Every returned index i satisfies 1 <= i < len(args). Keys does not allocate
// as long as dst has room.
func (c *Command) Keys(args [][]byte, dst []int) []int {
	return c.keysAtMost(args, dst, math.MaxInt)
}

// KeysAtMost is Keys stopping once dst holds n indices more than it came
// with, for a caller that needs only the first key or to know whether
// there is exactly one: Keys of an MGET of a million keys built a list of
// a million indices for each (found by review: 580 MB allocated for one
// 7 MB request). MIGRATE, SORT and GEORADIUS may still append more.
func (c *Command) KeysAtMost(args [][]byte, dst []int, n int) []int {
	return c.keysAtMost(args, dst, len(dst)+n)
}

// keysAtMost appends key indices to dst while len(dst) < limit.
func (c *Command) keysAtMost(args [][]byte, dst []int, limit int) []int {
	if c == nil {
		return dst
	}
	switch c.keysProc {
	case procMigrate:
		return migrateKeys(args, dst)
	case procSort:
		dst = c.specKeys(args, dst, limit)
		return sortStoreKey(args, dst)
	case procGeoradius:
		if len(c.KeySpecs) > 0 {
			dst = c.KeySpecs[0].appendKeys(args, dst)
		} else {
			dst = c.legacyKeys(args, dst, limit)
		}
		return georadiusStoreKeys(args, dst)
	}
	if len(c.KeySpecs) > 0 {
		return c.specKeys(args, dst, limit)
	}
	return c.legacyKeys(args, dst, limit)
}

func (c *Command) legacyKeys(args [][]byte, dst []int, limit int) []int {
	if c.FirstKey <= 0 {
		return dst
	}
	last := c.LastKey
	if last < 0 {
		last += len(args)
	}
	step := max(c.KeyStep, 1)
	for i := c.FirstKey; i <= last && i < len(args) && len(dst) < limit; i += step {
		dst = append(dst, i)
	}
	return dst
}

// MayCreate reports whether a key with these flags may be created or have
// its value replaced by the command: OW (overwritten), or RW together with
// INSERT or UPDATE. It over-approximates (LSET is RW|UPDATE yet needs an
// existing key), which is what a policy that must not miss a new key wants.
func (f KeySpecFlags) MayCreate() bool {
	return f&KeyOW != 0 || f&KeyRW != 0 && f&(KeyInsert|KeyUpdate) != 0
}

// Complete reports whether the spec can find every key it describes from
// the arguments alone.
func (s *KeySpec) Complete() bool {
	return s.Flags&KeyIncomplete == 0 && s.Begin.Kind != BeginUnknown && s.Find.Kind != FindUnknown
}

// AppendKeys appends to dst the indices into args of the keys this one spec
// finds, like Keys does for all of a command's specs.
func (s *KeySpec) AppendKeys(args [][]byte, dst []int) []int { return s.appendKeys(args, dst) }

func (c *Command) specKeys(args [][]byte, dst []int, limit int) []int {
	for i := range c.KeySpecs {
		if len(dst) >= limit {
			break
		}
		dst = c.KeySpecs[i].appendKeysAtMost(args, dst, limit)
	}
	return dst
}

// appendKeys applies one key spec. Specs that do not match the arguments are
// skipped while earlier and later specs still contribute, because a proxy
// would rather know some keys of a malformed call than none (Redis will
// reject the call anyway).
func (s *KeySpec) appendKeys(args [][]byte, dst []int) []int {
	return s.appendKeysAtMost(args, dst, math.MaxInt)
}

// appendKeysAtMost is appendKeys stopping once len(dst) is limit.
func (s *KeySpec) appendKeysAtMost(args [][]byte, dst []int, limit int) []int {
	if s.Flags&KeyNotKey != 0 {
		return dst
	}
	n := len(args)
	var first int
	switch s.Begin.Kind {
	case BeginIndex:
		first = s.Begin.Index
	case BeginKeyword:
		first = findKeyword(args, s.Begin.Keyword, s.Begin.StartFrom)
	}
	if first < 1 || first >= n {
		return dst
	}
	step := max(s.Find.KeyStep, 1)
	switch s.Find.Kind {
	case FindRange:
		var last int
		switch {
		case s.Find.LastKey >= 0:
			last = first + s.Find.LastKey
		case s.Find.Limit > 1:
			last = first + (n-first)/s.Find.Limit + s.Find.LastKey
		default:
			last = n + s.Find.LastKey
		}
		for i := first; i <= last && i < n && len(dst) < limit; i += step {
			dst = append(dst, i)
		}
	case FindKeynum:
		at := first + s.Find.KeyNumIdx
		if at < 1 || at >= n {
			return dst
		}
		count, ok := parseCount(args[at])
		if !ok {
			return dst
		}
		i := first + s.Find.FirstKey
		if i < 1 {
			return dst
		}
		// Counting rather than computing the last index keeps a huge count
		// from overflowing.
		for ; count > 0 && i < n && len(dst) < limit; count-- {
			dst = append(dst, i)
			i += step
		}
	}
	return dst
}

// findKeyword returns the index after the keyword, or 0 if absent. The
// keyword is compared as Redis's key spec search does (strcasecmp: see
// optionFold), so "STREAMS\x00" is XREAD's STREAMS. Like Redis,
// a positive startFrom searches forwards and never matches the last argument
// (no key could follow it); a negative one searches backwards from
// len(args)+startFrom down to index 2.
func findKeyword(args [][]byte, keyword string, startFrom int) int {
	n := len(args)
	if startFrom > 0 {
		for i := startFrom; i < n-1; i++ {
			if optionFold(keyword, args[i]) {
				return i + 1
			}
		}
		return 0
	}
	for i := n + startFrom; i > 1; i-- {
		if i < n && optionFold(keyword, args[i]) {
			return i + 1
		}
	}
	return 0
}

// parseCount parses a non-negative decimal key count. Values beyond any
// possible argument count saturate, which the caller clips anyway.
func parseCount(b []byte) (int, bool) {
	if len(b) == 0 {
		return 0, false
	}
	v := 0
	for _, ch := range b {
		if ch < '0' || ch > '9' {
			return 0, false
		}
		if v < 1<<40 {
			v = v*10 + int(ch-'0')
		}
	}
	return v, true
}

// SortOption is an option of SORT and SORT_RO that names something.
type SortOption uint8

const (
	SortBy    SortOption = iota + 1 // BY pattern: keys read (or "nosort")
	SortGet                         // GET pattern: keys read ("#": the element)
	SortStore                       // STORE destination: the key written
)

// SortOptions yields SORT's BY, GET and STORE options with the index of
// each one's value, in order, as Redis's SORT reads them: LIMIT's two
// values and every option's value are skipped, so "BY store" is not a
// STORE. The one walk of SORT's options for the key specs (STORE), the
// ACL (BY and GET read keys) and namespaces (their patterns are prefixed).
func SortOptions(args [][]byte) iter.Seq2[SortOption, int] {
	return func(yield func(SortOption, int) bool) {
		for i := 2; i < len(args); i++ {
			var opt SortOption
			switch a := args[i]; {
			case optionFold("limit", a):
				i += 2
				continue
			case optionFold("by", a):
				opt = SortBy
			case optionFold("get", a):
				opt = SortGet
			case optionFold("store", a):
				opt = SortStore
			default:
				continue
			}
			if i+1 >= len(args) {
				return // an option with no value names nothing
			}
			i++
			if !yield(opt, i) {
				return
			}
		}
	}
}

// sortStoreKey adds SORT's STORE destination, which Redis's key specs mark as
// unknown because the option may appear anywhere. The last STORE wins, as in
// Redis.
func sortStoreKey(args [][]byte, dst []int) []int {
	store := 0
	for opt, i := range SortOptions(args) {
		if opt == SortStore {
			store = i
		}
	}
	if store > 0 {
		dst = append(dst, store)
	}
	return dst
}

// georadiusStoreKeys adds the value of every STORE and STOREDIST option of
// GEORADIUS and GEORADIUSBYMEMBER. Redis writes only the last one, but its
// key specs find only the first of each keyword: "STORE x STORE other"
// named x as the key while Redis wrote other, outside the client's
// namespace and ACL (found by review). Naming every one is the safe side:
// a namespace prefixes them all, the ACL checks them all. The scan is
// Redis's own (georadiusGetKeys): from index 5, an option and its value.
func georadiusStoreKeys(args [][]byte, dst []int) []int {
	for i := 5; i < len(args)-1; i++ {
		if optionFold("store", args[i]) || optionFold("storedist", args[i]) {
			dst = append(dst, i+1)
			i++
		}
	}
	return dst
}

// migrateKeys handles MIGRATE host port key|"" db timeout [COPY] [REPLACE]
// [AUTH pw] [AUTH2 user pw] [KEYS key ...]. Redis's KEYS key spec searches
// backwards for the keyword and can be fooled by a password spelled "keys";
// walking the options forwards cannot. The key argument is a key unless it is
// empty and a KEYS option follows, mirroring Redis.
func migrateKeys(args [][]byte, dst []int) []int {
	if len(args) <= 3 {
		return dst
	}
	if len(args[3]) == 0 {
		for i := 6; i < len(args); i++ {
			a := args[i]
			switch {
			case optionFold("auth", a):
				i++
			case optionFold("auth2", a):
				i += 2
			case optionFold("keys", a):
				for j := i + 1; j < len(args); j++ {
					dst = append(dst, j)
				}
				return dst
			}
		}
	}
	return append(dst, 3)
}

// KeyRef is one key argument of a call with the flags of the key spec that
// found it, for checks that depend on how a key is used (ACL read and write
// key patterns).
type KeyRef struct {
	Index int // into args
	Flags KeySpecFlags
}

// KeyRefs appends to dst the key arguments of a call, like Keys, each with
// its key spec's flags. SORT's STORE destination is an overwrite (OW |
// UPDATE) and MIGRATE's keys are read and deleted (RW | ACCESS | DELETE),
// as Redis's own key extraction reports them. Tables without key specs
// (Redis < 7) yield RW | ACCESS | UPDATE for a write command's keys and RO
// | ACCESS otherwise.
func (c *Command) KeyRefs(args [][]byte, dst []KeyRef) []KeyRef {
	if c == nil {
		return dst
	}
	var idx [8]int
	add := func(keys []int, f KeySpecFlags) {
		for _, i := range keys {
			dst = append(dst, KeyRef{Index: i, Flags: f})
		}
	}
	switch {
	case c.keysProc == procMigrate:
		add(migrateKeys(args, idx[:0]), KeyRW|KeyAccess|KeyDelete)
		return dst
	case c.keysProc == procGeoradius:
		if len(c.KeySpecs) > 0 {
			add(c.KeySpecs[0].appendKeys(args, idx[:0]), c.KeySpecs[0].Flags)
		} else {
			add(c.legacyKeys(args, idx[:0], len(args)), KeyRO|KeyAccess)
		}
		add(georadiusStoreKeys(args, idx[:0]), KeyOW|KeyUpdate)
		return dst
	case len(c.KeySpecs) > 0:
		for k := range c.KeySpecs {
			s := &c.KeySpecs[k]
			f := s.Flags
			if f&KeyVariableFlags != 0 {
				f = variableKeyFlags(c.Name, args, f)
			}
			add(s.appendKeys(args, idx[:0]), f)
		}
		if c.keysProc == procSort {
			add(sortStoreKey(args, idx[:0]), KeyOW|KeyUpdate)
		}
		return dst
	}
	f := KeyRO | KeyAccess
	if c.Flags&Write != 0 {
		f = KeyRW | KeyAccess | KeyUpdate
	}
	add(c.legacyKeys(args, idx[:0], len(args)), f)
	return dst
}

// variableKeyFlags resolves the flags of a key spec marked variable_flags
// from the arguments, as Redis's own key extraction does: SET only reads
// its key with GET (else it overwrites it), BITFIELD only writes with SET
// or INCRBY.
func variableKeyFlags(name string, args [][]byte, f KeySpecFlags) KeySpecFlags {
	switch name {
	case "set":
		for i := 3; i < len(args); i++ {
			if optionFold("get", args[i]) {
				return KeyRW | KeyAccess | KeyUpdate
			}
		}
		return KeyOW | KeyUpdate
	case "bitfield":
		for i := 2; i < len(args); i++ {
			rem := len(args) - i - 1
			switch {
			case optionFold("get", args[i]) && rem >= 2:
				i += 2
			case (optionFold("set", args[i]) || optionFold("incrby", args[i])) && rem >= 3:
				return KeyRW | KeyAccess | KeyUpdate
			case optionFold("overflow", args[i]) && rem >= 1:
				i++
			}
		}
		return KeyRO | KeyAccess
	}
	return f
}
