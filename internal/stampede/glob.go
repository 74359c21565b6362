package stampede

import (
	"errors"
	"strings"
)

// pattern is a Redis glob (the syntax of SCAN MATCH): * ? [abc] [^a] [a-z],
// and \ escapes. Cache patterns are nearly always "prefix*", which is
// matched without the general matcher.
type pattern struct {
	src    string
	prefix string // src without its final '*', when that is its only special character
	simple bool
}

func compilePattern(p string) pattern {
	if i := strings.IndexAny(p, `*?[\`); i == len(p)-1 && p[i] == '*' {
		return pattern{src: p, prefix: p[:i], simple: true}
	}
	return pattern{src: p}
}

func (p *pattern) match(key []byte) bool {
	if p.simple {
		return len(key) >= len(p.prefix) && string(key[:len(p.prefix)]) == p.prefix
	}
	return globMatch(p.src, key)
}

// checkGlob rejects what is almost certainly a typo: an empty pattern, an
// unclosed '[' or a trailing '\'.
func checkGlob(p string) error {
	if p == "" {
		return errors.New(`must not be empty (use e.g. "cache:*")`)
	}
	for i := 0; i < len(p); i++ {
		switch p[i] {
		case '\\':
			if i == len(p)-1 {
				return errors.New(`pattern ends with an unescaped '\'`)
			}
			i++
		case '[':
			j := i + 1
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

// globMatch reports whether s matches the glob p. It backtracks only to the
// last '*', so it runs in O(len(p)·len(s)) and never recurses.
func globMatch(p string, s []byte) bool {
	pi, si := 0, 0
	star, starS := -1, 0
	for si < len(s) {
		if pi < len(p) {
			if p[pi] == '*' {
				star, starS = pi, si
				pi++
				continue
			}
			if n := matchOne(p[pi:], s[si]); n > 0 {
				pi += n
				si++
				continue
			}
		}
		if star < 0 {
			return false
		}
		starS++
		pi, si = star+1, starS
	}
	for pi < len(p) && p[pi] == '*' {
		pi++
	}
	return pi == len(p)
}

// matchOne matches one byte c against the token at the start of p (not
// '*'), returning the token's length, or 0 when c does not match.
func matchOne(p string, c byte) int {
	switch p[0] {
	case '?':
		return 1
	case '\\':
		if len(p) > 1 {
			if p[1] == c {
				return 2
			}
			return 0
		}
		if c == '\\' {
			return 1
		}
		return 0
	case '[':
		return matchClass(p, c)
	}
	if p[0] == c {
		return 1
	}
	return 0
}

// matchClass matches c against "[...]" at the start of p.
func matchClass(p string, c byte) int {
	i := 1
	negate := i < len(p) && p[i] == '^'
	if negate {
		i++
	}
	matched := false
	for ; i < len(p) && p[i] != ']'; i++ {
		switch {
		case p[i] == '\\' && i+1 < len(p):
			i++
			if p[i] == c {
				matched = true
			}
		case i+2 < len(p) && p[i+1] == '-' && p[i+2] != ']':
			lo, hi := p[i], p[i+2]
			if lo > hi {
				lo, hi = hi, lo
			}
			if c >= lo && c <= hi {
				matched = true
			}
			i += 2
		default:
			if p[i] == c {
				matched = true
			}
		}
	}
	if i < len(p) {
		i++ // the closing ']'
	}
	if matched != negate {
		return i
	}
	return 0
}
