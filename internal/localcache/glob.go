package localcache

import "errors"

// matchGlob reports whether key matches a Redis-style pattern, the syntax of
// SCAN MATCH: '*' any run of bytes, '?' one byte, "[abc]", "[^abc]",
// "[a-z]" classes, and '\' escaping the next byte.
//
// Every token except '*' consumes exactly one byte, so on a mismatch it is
// enough to go back to the last '*' and let it swallow one more byte: the
// match is O(len(pattern)*len(key)) at worst and never recurses.
func matchGlob(pattern string, key []byte) bool {
	p, k := 0, 0
	star, starK := -1, 0
	for k < len(key) {
		if p < len(pattern) {
			if pattern[p] == '*' {
				star, starK = p, k
				p++
				continue
			}
			if n, ok := matchOne(pattern[p:], key[k]); ok {
				p += n
				k++
				continue
			}
		}
		if star < 0 {
			return false
		}
		starK++
		p, k = star+1, starK
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}

// matchOne matches c against the single-byte token at the start of pat and
// returns the token's length.
func matchOne(pat string, c byte) (int, bool) {
	switch pat[0] {
	case '?':
		return 1, true
	case '\\':
		if len(pat) > 1 {
			return 2, pat[1] == c
		}
		return 1, c == '\\'
	case '[':
		return matchClass(pat, c)
	}
	return 1, pat[0] == c
}

// matchClass matches c against the class "[...]" at the start of pat. An
// unclosed class runs to the end of the pattern, as in Redis.
func matchClass(pat string, c byte) (int, bool) {
	i := 1
	neg := i < len(pat) && pat[i] == '^'
	if neg {
		i++
	}
	hit := false
	for i < len(pat) && pat[i] != ']' {
		switch {
		case pat[i] == '\\' && i+1 < len(pat):
			hit = hit || pat[i+1] == c
			i += 2
		case i+2 < len(pat) && pat[i+1] == '-' && pat[i+2] != ']':
			lo, hi := pat[i], pat[i+2]
			if lo > hi {
				lo, hi = hi, lo
			}
			hit = hit || (c >= lo && c <= hi)
			i += 3
		default:
			hit = hit || pat[i] == c
			i++
		}
	}
	if i < len(pat) {
		i++
	}
	return i, hit != neg
}

// checkGlob rejects what Redis would accept but is almost surely a typo in
// a configuration: an unclosed '[' or a trailing lone '\'.
func checkGlob(p string) error {
	for i := 0; i < len(p); i++ {
		switch p[i] {
		case '\\':
			if i == len(p)-1 {
				return errors.New("pattern ends with an unescaped '\\'")
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

// patterns is a list of globs; an empty list matches nothing.
type patterns []string

func (ps patterns) match(key []byte) bool {
	for _, p := range ps {
		if matchGlob(p, key) {
			return true
		}
	}
	return false
}
