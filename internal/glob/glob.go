// Package glob matches keys against Redis glob patterns, the syntax of
// SCAN MATCH and KEYS: * ? [abc] [^a] [a-z] and \ to escape. The policy,
// the stampede rules and the local tier all select keys this way, so a
// pattern means the same thing everywhere, and the same as in redis-cli.
package glob

import (
	"errors"
	"strings"
)

// Pattern is a compiled pattern. Most rule patterns are a literal prefix
// followed by '*', which matches without the general matcher.
type Pattern struct {
	src    string
	kind   globKind
	prefix string // globPrefix: src without the trailing '*'; globExact: src unescaped
}

type globKind uint8

const (
	globAny    globKind = iota // "*"
	globPrefix                 // "session:*"
	globExact                  // "config:main"
	globFull                   // anything else
)

// Compile prepares p for matching. Check it first to reject typos.
func Compile(p string) Pattern {
	g := Pattern{src: p, kind: globFull}
	switch special := strings.IndexAny(p, "*?[\\"); {
	case p == "*":
		g.kind = globAny
	case special < 0:
		g.kind, g.prefix = globExact, p
	case special == len(p)-1 && p[special] == '*':
		g.kind, g.prefix = globPrefix, p[:special]
	}
	return g
}

// Match reports whether key matches the pattern.
func (g *Pattern) Match(key []byte) bool {
	switch g.kind {
	case globAny:
		return true
	case globPrefix:
		return len(key) >= len(g.prefix) && string(key[:len(g.prefix)]) == g.prefix
	case globExact:
		return string(key) == g.prefix
	}
	return Match(g.src, key)
}

// String returns the pattern as written.
func (g *Pattern) String() string { return g.src }

// Check rejects patterns that Redis would accept but that are almost
// certainly typos in a rule: an unclosed '[' or a trailing '\'.
func Check(p string) error {
	for i := 0; i < len(p); i++ {
		switch p[i] {
		case '\\':
			if i == len(p)-1 {
				return errors.New("pattern ends with an unescaped '\\'")
			}
			i++
		case '[':
			j := i + 1
			if j < len(p) && p[j] == '^' {
				j++
			}
			for ; j < len(p) && p[j] != ']'; j++ {
				if p[j] == '\\' {
					j++
				}
			}
			if j >= len(p) {
				return errors.New("pattern has an unclosed '['")
			}
			i = j
		}
	}
	return nil
}

// Match matches s against the uncompiled pattern p. Every token but '*' consumes one
// byte, so remembering the last '*' and retrying from one byte further is
// enough: this runs in O(len(p)*len(s)) at worst and never recurses.
func Match(p string, s []byte) bool {
	px, sx := 0, 0
	starP, starS := -1, 0
	for sx < len(s) {
		if px < len(p) {
			switch c := p[px]; c {
			case '*':
				starP, starS = px, sx
				px++
				continue
			case '?':
				px++
				sx++
				continue
			case '[':
				if n, ok := matchClass(p[px:], s[sx]); ok {
					px += n
					sx++
					continue
				}
			case '\\':
				lit, n := byte('\\'), 1
				if px+1 < len(p) {
					lit, n = p[px+1], 2
				}
				if lit == s[sx] {
					px += n
					sx++
					continue
				}
			default:
				if c == s[sx] {
					px++
					sx++
					continue
				}
			}
		}
		if starP < 0 {
			return false
		}
		starS++
		px, sx = starP+1, starS
	}
	for px < len(p) && p[px] == '*' {
		px++
	}
	return px == len(p)
}

// matchClass matches c against the class at the start of p ("[...]") and
// returns the class's length. An unclosed class runs to the end of p, as in
// Redis.
func matchClass(p string, c byte) (int, bool) {
	i := 1
	negate := i < len(p) && p[i] == '^'
	if negate {
		i++
	}
	found := false
	for i < len(p) && p[i] != ']' {
		switch {
		case p[i] == '\\' && i+1 < len(p):
			if p[i+1] == c {
				found = true
			}
			i += 2
		case i+2 < len(p) && p[i+1] == '-' && p[i+2] != ']':
			lo, hi := p[i], p[i+2]
			if lo > hi {
				lo, hi = hi, lo
			}
			if c >= lo && c <= hi {
				found = true
			}
			i += 3
		default:
			if p[i] == c {
				found = true
			}
			i++
		}
	}
	if i < len(p) {
		i++ // the closing ']'
	}
	return i, found != negate
}
