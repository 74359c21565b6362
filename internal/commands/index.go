package commands

import "sort"

// nameIndex is a small open-addressing hash table keyed by lower-case names
// and probed with names in any case. A Go map would need a lower-cased copy
// of the client's bytes (an allocation, or a fixed-size buffer that caps name
// length); hashing and comparing case-folded bytes directly needs neither.
type nameIndex struct {
	slots []indexEntry
	mask  uint32
}

type indexEntry struct {
	key string // lower case
	cmd *Command
}

func newNameIndex(n int) nameIndex {
	size := 8
	for size < 2*n { // load factor <= 1/2 keeps probe chains short
		size <<= 1
	}
	return nameIndex{slots: make([]indexEntry, size), mask: uint32(size - 1)}
}

func (x *nameIndex) empty() bool { return len(x.slots) == 0 }

// put adds or replaces key (already lower case).
func (x *nameIndex) put(key string, c *Command) {
	h := foldHash(key) & x.mask
	for {
		e := &x.slots[h]
		if e.cmd == nil || e.key == key {
			e.key, e.cmd = key, c
			return
		}
		h = (h + 1) & x.mask
	}
}

func lookupName[T string | []byte](x *nameIndex, name T) *Command {
	if len(x.slots) == 0 {
		return nil
	}
	h := foldHash(name) & x.mask
	for {
		e := &x.slots[h]
		if e.cmd == nil {
			return nil
		}
		if equalFold(e.key, name) {
			return e.cmd
		}
		h = (h + 1) & x.mask
	}
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + ('a' - 'A')
	}
	return c
}

// foldHash is FNV-1a over ASCII-lower-cased bytes.
func foldHash[T string | []byte](s T) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h ^= uint32(lower(s[i]))
		h *= 16777619
	}
	return h
}

// EqualFold reports whether the argument b is the option word lowerKey as
// Redis reads option words: without case, up to b's first NUL byte (see
// optionFold). It is the one comparison for option words (policy, key
// specs, namespaces, mirror); it is not for command names.
func EqualFold(lowerKey string, b []byte) bool { return optionFold(lowerKey, b) }

// equalFold reports whether b equals the lower-case ASCII string lowerKey,
// ignoring ASCII case in b. Redis compares command names and keywords the
// same way (strcasecmp).
func equalFold[T string | []byte](lowerKey string, b T) bool {
	if len(lowerKey) != len(b) {
		return false
	}
	for i := 0; i < len(b); i++ {
		if lower(b[i]) != lowerKey[i] {
			return false
		}
	}
	return true
}

func sortCommands(cmds []*Command) {
	sort.Slice(cmds, func(i, j int) bool { return cmds[i].Name < cmds[j].Name })
}
