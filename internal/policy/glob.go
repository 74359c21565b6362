package policy

import rglob "github.com/redproxy/redproxy/internal/glob"

// glob is a key pattern of a rule, in Redis's SCAN MATCH syntax.
type glob = rglob.Pattern

func compileGlob(p string) glob { return rglob.Compile(p) }

func checkGlob(p string) error { return rglob.Check(p) }
