package resp

import "testing"

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
