package stampede

import (
	"errors"

	rglob "github.com/redproxy/redproxy/internal/glob"
)

// pattern is a rule's key pattern, in Redis's SCAN MATCH syntax.
type pattern = rglob.Pattern

func compilePattern(p string) pattern { return rglob.Compile(p) }

// checkGlob rejects what is almost certainly a typo: an empty pattern, an
// unclosed '[' or a trailing '\'.
func checkGlob(p string) error {
	if p == "" {
		return errors.New(`must not be empty (use e.g. "cache:*")`)
	}
	return rglob.Check(p)
}
