package commands

import (
	"math"
	"strconv"
	"testing"
)

// The cases and their answers were taken from redis-server 7.0.15: each
// valid cursor below, sent to an empty database, got cursor 0 back, and
// each invalid one "ERR invalid cursor".
func TestParseScanCursorAsRedis(t *testing.T) {
	valid := map[string]uint64{
		"0":                     0,
		"17":                    17,
		"":                      0,
		"-0":                    0,
		"+5":                    5,
		"-1":                    math.MaxUint64,
		"18446744073709551615":  math.MaxUint64,
		"-18446744073709551615": 1,
		"007":                   7,
	}
	for in, want := range valid {
		got, ok := ParseScanCursor([]byte(in))
		if !ok || got != want {
			t.Errorf("ParseScanCursor(%q) = %d, %v; want %d, true", in, got, ok, want)
		}
	}
	for _, in := range []string{" 5", "5 ", "18446744073709551616", "-18446744073709551616",
		"99999999999999999999", "0x10", "-", "+", "+-1", "1.5", "abc"} {
		if got, ok := ParseScanCursor([]byte(in)); ok {
			t.Errorf("ParseScanCursor(%q) = %d, true; want invalid", in, got)
		}
	}
}

// FuzzParseScanCursor checks the parser against strconv: the digits after
// an optional sign read by ParseUint, the minus sign negating modulo 2^64.
func FuzzParseScanCursor(f *testing.F) {
	for _, s := range []string{"0", "-1", "+5", "", "18446744073709551616", " 1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, ok := ParseScanCursor([]byte(s))
		digits, neg := s, false
		if len(s) > 0 && (s[0] == '-' || s[0] == '+') {
			digits, neg = s[1:], s[0] == '-'
		}
		want, err := strconv.ParseUint(digits, 10, 64)
		wantOK := err == nil
		if s == "" {
			want, wantOK = 0, true
		}
		if neg {
			want = -want
		}
		if ok != wantOK || ok && got != want {
			t.Fatalf("ParseScanCursor(%q) = %d, %v; strconv says %d, %v", s, got, ok, want, wantOK)
		}
	})
}
