package proxy

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/tidwall/redcon"
)

// The framer takes the marker's answer, and only it, out of a relay's
// stream cut anywhere: in every two-piece cut, and in random cuts of many
// pieces, of a stream with messages of every size around the answer.
func TestRelayFramerTakesOutOnlyTheAnswer(t *testing.T) {
	msg := func(ch, payload string) []byte {
		b := redcon.AppendArray(nil, 3)
		b = redcon.AppendBulkString(b, "message")
		b = redcon.AppendBulkString(b, ch)
		return redcon.AppendBulkString(b, payload)
	}
	token := "redproxy-relay-exit-0123456789abcdef0123456789abcdef"
	plain := redcon.AppendBulkString(nil, token)
	pong := append([]byte("*2\r\n$4\r\npong\r\n"), plain...)
	// Replies that look like the answer but are not: another token, a
	// client's own PING, the same bytes inside a message.
	near := redcon.AppendBulkString(nil, strings.Replace(token, "0", "1", 1))
	var before, after []byte
	before = append(before, msg("x", "1")...)
	before = append(before, near...)
	before = append(before, msg("x", strings.Repeat("p", 40<<10))...)
	before = append(before, msg("x", string(pong))...)
	before = append(before, "*2\r\n$4\r\npong\r\n$0\r\n\r\n"...)
	before = append(before, "+OK\r\n:0\r\n"...)
	after = append(after, msg("x", "2")...)
	after = append(after, msg("x", string(plain))...)

	cases := []struct {
		name   string
		answer []byte
		tail   []byte
		which  int
		rest   bool
	}{
		{"subscribed", pong, after, 1, true},
		{"left", plain, nil, 0, false},
		{"plain with more after it", plain, msg("x", "2"), 0, true},
	}
	for _, tc := range cases {
		stream := append(append(append([]byte(nil), before...), tc.answer...), tc.tail...)
		want := append(append([]byte(nil), before...), tc.tail...)
		run := func(cuts []int) {
			var f relayFramer
			var got []byte
			which, rest := -1, false
			prev := 0
			for _, c := range append(cuts, len(stream)) {
				out, w, r, err := f.feed(stream[prev:c], [2][]byte{plain, pong})
				if err != nil {
					t.Fatalf("%s, cuts %v: %v", tc.name, cuts, err)
				}
				got = append(got, out...)
				if w >= 0 {
					if which >= 0 {
						t.Fatalf("%s, cuts %v: two answers", tc.name, cuts)
					}
					which, rest = w, r
				} else if which >= 0 && len(out) > 0 {
					rest = true
				}
				prev = c
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s, cuts %v: passed on %d bytes, want %d", tc.name, cuts, len(got), len(want))
			}
			if which != tc.which || rest != tc.rest {
				t.Fatalf("%s, cuts %v: which %d rest %v, want %d %v", tc.name, cuts, which, rest, tc.which, tc.rest)
			}
		}
		for c := 0; c <= len(stream); c++ {
			if c < 200 || c > len(stream)-400 || c%97 == 0 {
				run([]int{c})
			}
		}
		rng := rand.New(rand.NewPCG(1, uint64(len(stream))))
		for range 2000 {
			var cuts []int
			for c := rng.IntN(64); c < len(stream); c += 1 + rng.IntN(80) {
				cuts = append(cuts, c)
			}
			run(cuts)
		}
	}

	// No marker asked: the stream passes whole, answer-like bytes too.
	var f relayFramer
	stream := append(append([]byte(nil), before...), plain...)
	out, which, _, err := f.feed(stream, [2][]byte{})
	if err != nil || which >= 0 || !bytes.Equal(out, stream) {
		t.Fatalf("no marker: which %d err %v, passed %d of %d bytes", which, err, len(out), len(stream))
	}
}

// Redis Cluster's own sunsubscribe is noticed wherever the stream is cut;
// a message that merely carries the same bytes is not.
func TestRelayFramerNoticesSunsubscribe(t *testing.T) {
	unsub := redcon.AppendArray(nil, 3)
	unsub = redcon.AppendBulkString(unsub, "sunsubscribe")
	unsub = redcon.AppendBulkString(unsub, "orders:7")
	unsub = redcon.AppendInt(unsub, 0)
	lookalike := redcon.AppendArray(nil, 3)
	lookalike = redcon.AppendBulkString(lookalike, "smessage")
	lookalike = redcon.AppendBulkString(lookalike, "orders:7")
	lookalike = redcon.AppendBulkString(lookalike, string(unsub))
	for _, tc := range []struct {
		stream []byte
		want   bool
	}{{append(append([]byte(nil), lookalike...), unsub...), true}, {lookalike, false}} {
		for c := 0; c <= len(tc.stream); c++ {
			var f relayFramer
			out1, _, _, err1 := f.feed(tc.stream[:c], [2][]byte{})
			got := append([]byte(nil), out1...)
			out2, _, _, err2 := f.feed(tc.stream[c:], [2][]byte{})
			got = append(got, out2...)
			if err1 != nil || err2 != nil || !bytes.Equal(got, tc.stream) {
				t.Fatalf("cut %d: %v %v, passed %q", c, err1, err2, got)
			}
			if f.sunsubscribed != tc.want {
				t.Fatalf("cut %d: sunsubscribed = %v, want %v", c, f.sunsubscribed, tc.want)
			}
		}
	}
}
