package resp

// ParseInt takes what Redis's string2ll takes: all of int64 (it stopped at
// 18 digits, so HELLO and SELECT of a 19-digit number got "not an
// integer" where Redis answers NOPROTO or "out of range"; found by
// review), and nothing else.

import (
	"math"
	"testing"
)

func TestParseIntAsString2ll(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0", 0, true}, {"7", 7, true}, {"-7", -7, true},
		{"999999999999999999", 999999999999999999, true},
		{"1000000000000000000", 1000000000000000000, true},
		{"-1000000000000000000", -1000000000000000000, true},
		{"9223372036854775807", math.MaxInt64, true},
		{"-9223372036854775808", math.MinInt64, true},
		{"9223372036854775808", 0, false}, {"-9223372036854775809", 0, false},
		{"9999999999999999999", 0, false}, {"99999999999999999999", 0, false},
		{"", 0, false}, {"-", 0, false}, {"-0", 0, false}, {"01", 0, false},
		{"0000000000000000001", 0, false}, {"+1", 0, false}, {" 1", 0, false},
		{"1.5", 0, false}, {"922337203685477580a", 0, false}, {"-922337203685477580a", 0, false},
	} {
		if got, ok := ParseInt([]byte(c.in)); got != c.want || ok != c.ok {
			t.Errorf("ParseInt(%q) = %d, %v; want %d, %v", c.in, got, ok, c.want, c.ok)
		}
	}
}
