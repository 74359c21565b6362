package redistest

import (
	"math/rand/v2"
	"strconv"
)

// TaggedValue is a value of n random bytes, CRLFs and '$' among them,
// that names key and n at both ends (when n leaves room for both), so a
// reply cut short, shifted, or another key's shows in a byte compare.
func TaggedValue(rng *rand.Rand, key string, n int) []byte {
	v := make([]byte, n)
	for i := range v {
		v[i] = "\r\n$*ab"[rng.IntN(6)]
	}
	tag := key + ":" + strconv.Itoa(n) + ";"
	copy(v, tag)
	if n >= 2*len(tag) {
		copy(v[n-len(tag):], tag)
	}
	return v
}

// FirstDifference is the index of the first byte where a and b differ,
// or the shorter one's length: where to look when a long reply is wrong.
func FirstDifference(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
