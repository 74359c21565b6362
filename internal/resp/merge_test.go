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
