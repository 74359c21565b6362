package proxy

import (
	"testing"

	"github.com/redproxy/redproxy/internal/resp"
)

// requeueCmd puts back what each blocking pop's reply says was popped, in
// the order and at the end it came from, RESP2 and RESP3 alike.
func TestRequeueCmd(t *testing.T) {
	args := func(a ...string) [][]byte {
		out := make([][]byte, len(a))
		for i, s := range a {
			out[i] = []byte(s)
		}
		return out
	}
	want := func(a ...string) string { return string(resp.AppendCommandStrings(nil, a...)) }
	for _, tc := range []struct {
		name  string
		args  [][]byte
		reply string
		want  string
	}{
		{"blpop", args("BLPOP", "q", "0"), "*2\r\n$1\r\nq\r\n$3\r\njob\r\n", want("LPUSH", "q", "job")},
		{"brpop", args("BRPOP", "q", "0"), "*2\r\n$1\r\nq\r\n$3\r\njob\r\n", want("RPUSH", "q", "job")},
		{"blpop", args("BLPOP", "q", "0"), "*-1\r\n", ""},
		{"blpop", args("BLPOP", "q", "0"), "_\r\n", ""},
		{"bzpopmin", args("BZPOPMIN", "z", "0"), "*3\r\n$1\r\nz\r\n$1\r\nm\r\n$3\r\n1.5\r\n", want("ZADD", "z", "NX", "1.5", "m")},
		{"bzpopmax", args("BZPOPMAX", "z", "0"), "*3\r\n$1\r\nz\r\n$1\r\nm\r\n,1.5\r\n", want("ZADD", "z", "NX", "1.5", "m")},
		{"blmpop", args("BLMPOP", "0", "1", "q", "LEFT", "COUNT", "2"), "*2\r\n$1\r\nq\r\n*2\r\n$1\r\na\r\n$1\r\nb\r\n", want("LPUSH", "q", "b", "a")},
		{"blmpop", args("BLMPOP", "0", "2", "p", "q", "right"), "*2\r\n$1\r\nq\r\n*2\r\n$1\r\na\r\n$1\r\nb\r\n", want("RPUSH", "q", "b", "a")},
		{"bzmpop", args("BZMPOP", "0", "1", "z", "MIN", "COUNT", "2"), "*2\r\n$1\r\nz\r\n*2\r\n*2\r\n$1\r\na\r\n$1\r\n1\r\n*2\r\n$1\r\nb\r\n,2\r\n",
			want("ZADD", "z", "NX", "1", "a", "2", "b")},
		{"blmove", args("BLMOVE", "s", "d", "LEFT", "RIGHT", "0"), "$1\r\na\r\n", ""},
	} {
		got := ""
		if back := requeueCmd(tc.name, tc.args, []byte(tc.reply)); back != nil {
			got = string(resp.AppendCommand(nil, back...))
		}
		if got != tc.want {
			t.Errorf("%s %q: %q, want %q", tc.name, tc.reply, got, tc.want)
		}
	}
}
