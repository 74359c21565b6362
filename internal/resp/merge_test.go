package resp

import (
	"strings"
	"testing"
)

// WAIT's counts merge to the least, WAITAOF's [numlocal, numreplicas]
// element by element; anything else is unexpected.
func TestMergeMin(t *testing.T) {
	bad := func(r []byte) []byte { return append([]byte("bad:"), r...) }
	for _, tc := range []struct {
		replies []string
		want    string
	}{
		{[]string{":2\r\n", ":0\r\n", ":1\r\n"}, ":0\r\n"},
		{[]string{":3\r\n"}, ":3\r\n"},
		{[]string{"*2\r\n:1\r\n:2\r\n", "*2\r\n:0\r\n:5\r\n"}, "*2\r\n:0\r\n:2\r\n"},
		{[]string{"*2\r\n:1\r\n:1\r\n", "*2\r\n:1\r\n:0\r\n", "*2\r\n:1\r\n:3\r\n"}, "*2\r\n:1\r\n:0\r\n"},
		{[]string{":1\r\n", "$1\r\n1\r\n"}, "bad:$1\r\n1\r\n"},
		{[]string{"*2\r\n:1\r\n:1\r\n", "*1\r\n:1\r\n"}, "bad:*1\r\n:1\r\n"},
		{[]string{"*1\r\n+OK\r\n"}, "bad:*1\r\n+OK\r\n"},
	} {
		replies := make([][]byte, len(tc.replies))
		for i, r := range tc.replies {
			replies[i] = []byte(r)
		}
		if got := string(MergeMin(replies, bad)); got != tc.want {
			t.Errorf("MergeMin(%q) = %q, want %q", tc.replies, got, tc.want)
		}
	}
}

// BenchmarkMergeMGET: 100,000 values of 100 bytes from 1,000 parts. The
// merged reply grew by appends, so a large MGET's reply was copied about
// twice over and left as much garbage.
func BenchmarkMergeMGET(b *testing.B) {
	const parts, per = 1000, 100
	value := []byte("$100\r\n" + strings.Repeat("v", 100) + "\r\n")
	replies := make([][]byte, parts)
	var pos [][2]int
	for p := range replies {
		r := AppendArray(nil, per)
		for i := range per {
			r = append(r, value...)
			pos = append(pos, [2]int{p, i})
		}
		replies[p] = r
	}
	b.ReportAllocs()
	for range b.N {
		MergeMGET(replies, pos, func(r []byte) []byte { b.Fatalf("unexpected %q", r); return nil })
	}
}

// PlanMGET and PlanConcat: Len is the length AppendTo writes, AppendTo
// appends to what dst holds, and a part that is not an array (or is one
// too short for its keys) is named as bad.
func TestPlanMergedLength(t *testing.T) {
	parts := [][]byte{
		[]byte("*2\r\n$1\r\na\r\n$-1\r\n"),
		[]byte("*3\r\n$2\r\nbb\r\n$3\r\nccc\r\n:7\r\n"),
	}
	pos := [][2]int{{1, 2}, {0, 0}, {1, 0}, {0, 1}, {1, 1}}
	m, bad := PlanMGET(parts, pos)
	if bad != nil {
		t.Fatalf("PlanMGET: bad %q", bad)
	}
	got := m.AppendTo([]byte("x"))
	if want := "x*5\r\n:7\r\n$1\r\na\r\n$2\r\nbb\r\n$-1\r\n$3\r\nccc\r\n"; string(got) != want || m.Len() != len(want)-1 {
		t.Errorf("MGET: %q (Len %d), want %q", got, m.Len(), want)
	}
	c, bad := PlanConcat(parts)
	if bad != nil {
		t.Fatalf("PlanConcat: bad %q", bad)
	}
	got = c.AppendTo(nil)
	if want := "*5\r\n$1\r\na\r\n$-1\r\n$2\r\nbb\r\n$3\r\nccc\r\n:7\r\n"; string(got) != want || c.Len() != len(want) {
		t.Errorf("Concat: %q (Len %d), want %q", got, c.Len(), want)
	}
	// Ten or more elements: a two-digit header.
	many := AppendArray(nil, 12)
	var manyPos [][2]int
	for i := range 12 {
		many = append(many, ":1\r\n"...)
		manyPos = append(manyPos, [2]int{0, i})
	}
	if m, _ := PlanMGET([][]byte{many}, manyPos); m.Len() != len(m.AppendTo(nil)) {
		t.Errorf("12 elements: Len %d, wrote %d", m.Len(), len(m.AppendTo(nil)))
	}
	if m, _ := PlanMGET(parts, nil); string(m.AppendTo(nil)) != "*0\r\n" || m.Len() != 4 {
		t.Errorf("MGET of no keys: %q (Len %d), want *0", m.AppendTo(nil), m.Len())
	}
	if _, bad := PlanMGET(parts, [][2]int{{0, 2}}); string(bad) != string(parts[0]) {
		t.Errorf("a position past part 0's elements: bad %q", bad)
	}
	if _, bad := PlanConcat([][]byte{parts[0], []byte("-ERR x\r\n")}); string(bad) != "-ERR x\r\n" {
		t.Errorf("a part that is not an array: bad %q", bad)
	}
	// PlanArrays answers a part's error, or unexpected's reply, instead.
	unexpected := func(r []byte) []byte { return append([]byte("bad:"), r...) }
	if _, r := PlanArrays([][]byte{parts[0], []byte("-ERR x\r\n")}, pos, false, unexpected); string(r) != "-ERR x\r\n" {
		t.Errorf("PlanArrays with a failed part: %q", r)
	}
	if _, r := PlanArrays([][]byte{parts[0], []byte(":1\r\n")}, nil, true, unexpected); string(r) != "bad::1\r\n" {
		t.Errorf("PlanArrays with a part not an array: %q", r)
	}
	if m, r := PlanArrays(parts, pos, false, unexpected); r != nil || m.Len() != len(m.AppendTo(nil)) {
		t.Errorf("PlanArrays of good parts: reply %q, Len %d", r, m.Len())
	}
}
