package commands

// ParseScanCursor reads SCAN's cursor argument as Redis 7.0 does (C's
// strtoul, checked for range and trailing bytes): an optional sign then
// decimal digits, a minus sign negating modulo 2^64, so "-1" is 2^64-1 and
// "+5" is 5; the empty string is 0. A leading space, trailing bytes, a
// sign with no digits and a value past 2^64-1 are invalid. Where the proxy
// plans SCAN itself (cluster mode, keys split over upstreams) a cursor
// Redis takes must not be refused: clients that start from "-1" or send a
// signed cursor would fail only through the proxy.
func ParseScanCursor(s []byte) (cursor uint64, ok bool) {
	if len(s) == 0 {
		return 0, true
	}
	neg := false
	switch s[0] {
	case '-':
		neg = true
		s = s[1:]
	case '+':
		s = s[1:]
	}
	if len(s) == 0 {
		return 0, false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if cursor > (1<<64-1-d)/10 {
			return 0, false
		}
		cursor = cursor*10 + d
	}
	if neg {
		cursor = -cursor
	}
	return cursor, true
}
