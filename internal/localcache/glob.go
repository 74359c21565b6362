package localcache

import rglob "github.com/redproxy/redproxy/internal/glob"

// matchGlob reports whether key matches a Redis-style pattern (SCAN MATCH
// syntax), as every other key rule of the proxy does.
func matchGlob(pattern string, key []byte) bool { return rglob.Match(pattern, key) }

// checkGlob rejects what Redis would accept but is almost surely a typo in
// a configuration: an unclosed '[' or a trailing lone '\'.
func checkGlob(p string) error { return rglob.Check(p) }

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
