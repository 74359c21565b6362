package commands

// optionFold reports whether the argument b is the option word w as Redis
// reads option words: with strcasecmp (or an equivalent byte-by-byte
// C-string test, as SET's NX or XADD's "~"), which compares ASCII letters
// without case and stops at the first NUL byte of the argument. So to
// Redis "STORE\x00xyz" is STORE: SORT ... STORE\x00 s stores into s, COPY
// ... DB\x00 1 copies to database 1, GETEX k PERSIST\x00 removes k's TTL,
// and the key specs' keyword search (XREAD STREAMS\x00, MIGRATE KEYS\x00)
// finds the keys after it (checked against redis-server 7.0.15). A
// whole-argument compare missed those options while Redis acted on them:
// keys created without their required TTL, fix-ups sent to the wrong key,
// keys left out of the namespace and the ACL (found by review).
//
// Only option words are compared this way. Command and subcommand names
// are found by a hash of the whole name (see lookupName), and numbers are
// parsed with their length (string2ll refuses "100\x00"); neither stops at
// a NUL. w must not contain NUL; its letters may be in either case.
func optionFold(w string, b []byte) bool {
	if len(b) < len(w) {
		return false // strcasecmp meets b's end (NUL) against a letter of w
	}
	if len(b) > len(w) && b[len(w)] != 0 {
		return false
	}
	for i := 0; i < len(w); i++ {
		if lower(b[i]) != lower(w[i]) {
			return false // a NUL in b before len(w) differs from w's letter
		}
	}
	return true
}
