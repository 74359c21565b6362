package proxy

import (
	"bytes"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/tidwall/redcon"
)

// The framer takes the answers to its question, and only them, out of a
// relay's stream cut anywhere: in every two-piece cut, and in random cuts
// of many pieces, of a stream with replies of every kind around them
// (errors of the client's own commands, -BUSY before the question, long
// messages, messages that carry the answers' bytes, messages between the
// two answers).
func TestRelayFramerTakesOutOnlyTheAnswers(t *testing.T) {
	msg := func(ch, payload string) []byte {
		b := redcon.AppendArray(nil, 3)
		b = redcon.AppendBulkString(b, "message")
		b = redcon.AppendBulkString(b, ch)
		return redcon.AppendBulkString(b, payload)
	}
	hexTag := "0123456789abcdef0123456789abcdef"
	token := "redproxy-relay-exit-" + hexTag
	q := relayQuestion{tag: []byte(hexTag)}
	q.plain = redcon.AppendBulkString(nil, token)
	q.pong = append([]byte("*2\r\n$4\r\npong\r\n"), q.plain...)
	tagErr := []byte("-ERR unknown command 'redproxy-exit-" + hexTag + "', with args beginning with: \r\n")
	// Redis 6 quotes with backticks; a server may quote the name alone.
	tagErr6 := []byte("-ERR unknown command `redproxy-exit-" + hexTag + "`, with args beginning with: \r\n")
	tagErrName := []byte("-ERR unknown command 'redproxy-exit-" + hexTag + "'\r\n")
	busy := []byte("-BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.\r\n")
	other := strings.Replace(token, "0", "1", 1)
	var before, between, after []byte
	before = append(before, msg("x", "1")...)
	before = append(before, redcon.AppendBulkString(nil, other)...)
	before = append(before, "-ERR unknown command 'redproxy-exit', with args beginning with: '"+other+"' \r\n"...)
	before = append(before, busy...)
	before = append(before, "-ERR "+strings.Repeat("e", 2000)+"\r\n"...)
	before = append(before, msg("x", strings.Repeat("p", 40<<10))...)
	before = append(before, msg("x", string(q.pong))...)
	before = append(before, msg("x", string(tagErr))...)
	before = append(before, "*2\r\n$4\r\npong\r\n$0\r\n\r\n"...)
	before = append(before, "+OK\r\n:0\r\n"...)
	between = append(between, msg("x", "2")...)
	between = append(between, msg("x", string(q.plain))...)
	after = append(after, msg("x", "3")...)

	cases := []struct {
		name   string
		tag    []byte
		answer []byte
		tail   []byte
		which  int
		rest   bool
	}{
		{"subscribed", tagErr, q.pong, after, answerSubscribed, true},
		{"left", tagErr, q.plain, nil, answerUnsubscribed, false},
		{"left, Redis 6", tagErr6, q.plain, nil, answerUnsubscribed, false},
		{"left, the name alone quoted", tagErrName, q.plain, nil, answerUnsubscribed, false},
		{"plain with more after it", tagErr, q.plain, after, answerUnsubscribed, true},
		{"busy", tagErr, busy, nil, answerRetry, false},
		{"denied", tagErr, []byte("-NOPERM this user has no permissions to run the 'ping' command\r\n"), nil, answerError, false},
	}
	for _, tc := range cases {
		var stream, want []byte
		for _, part := range [][]byte{before, tc.tag, between, tc.answer, tc.tail} {
			stream = append(stream, part...)
		}
		for _, part := range [][]byte{before, between, tc.tail} {
			want = append(want, part...)
		}
		run := func(cuts []int) {
			var f relayFramer
			f.ask(&q)
			var got []byte
			which, rest := answerNone, false
			prev := 0
			for _, c := range append(cuts, len(stream)) {
				out, w, r, err := f.feed(stream[prev:c])
				if err != nil {
					t.Fatalf("%s, cuts %v: %v", tc.name, cuts, err)
				}
				got = append(got, out...)
				if w != answerNone {
					if which != answerNone {
						t.Fatalf("%s, cuts %v: two answers", tc.name, cuts)
					}
					which, rest = w, r
				} else if which != answerNone && c > prev {
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
			if c < 3000 || c > len(stream)-3000 || c%97 == 0 {
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

	// No question asked: the stream passes whole, the answers' bytes too,
	// and with no copy.
	var f relayFramer
	stream := append(append(append([]byte(nil), before...), tagErr...), q.plain...)
	out, which, _, err := f.feed(stream)
	if err != nil || which != answerNone || !bytes.Equal(out, stream) || &out[0] != &stream[0] {
		t.Fatalf("no question: which %d err %v, passed %d of %d bytes", which, err, len(out), len(stream))
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
			out1, _, _, err1 := f.feed(tc.stream[:c])
			got := append([]byte(nil), out1...)
			out2, _, _, err2 := f.feed(tc.stream[c:])
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

// A relay that will not leave stops framing, and what the framer held of a
// reply cut by a read is passed on first, not lost.
func TestRelayFramerOffKeepsCutReply(t *testing.T) {
	m := redcon.AppendArray(nil, 3)
	m = redcon.AppendBulkString(m, "message")
	m = redcon.AppendBulkString(m, "x")
	m = redcon.AppendBulkString(m, "hello")
	for c := 1; c < len(m); c++ {
		ex := &relayExit{framing: true}
		got, _, _, err := ex.received(m[:c])
		got = append([]byte(nil), got...)
		ex.off.Store(true) // a RESET, say, relayed meanwhile
		out, _, _, err2 := ex.received(m[c:])
		got = append(got, out...)
		if err != nil || err2 != nil || !bytes.Equal(got, m) {
			t.Fatalf("cut %d: passed %q, %v %v", c, got, err, err2)
		}
		if ex.framing {
			t.Fatalf("cut %d: still framing", c)
		}
	}
}

// RESP3: the second answer is CLIENT INFO's, the next reply after the tag
// error that is not a push, whatever its length; the stream around it
// passes whole, cut anywhere.
func TestRelayFramerRESP3Answers(t *testing.T) {
	push := func(kind, ch, payload string) []byte {
		b := append([]byte(nil), ">3\r\n"...)
		b = redcon.AppendBulkString(b, kind)
		b = redcon.AppendBulkString(b, ch)
		return redcon.AppendBulkString(b, payload)
	}
	hexTag := "00112233445566778899aabbccddeeff"
	q := relayQuestion{resp3: true, tag: []byte(hexTag)}
	tagErr := []byte("-ERR unknown command 'redproxy-exit-" + hexTag + "', with args beginning with: \r\n")
	info := func(flags, sub string) []byte {
		txt := "txt:id=7 addr=127.0.0.1:5 laddr=127.0.0.1:6 fd=8 name= age=0 idle=0 flags=" + flags + " db=0 sub=" + sub + " psub=0 ssub=0 multi=-1 cmd=client|info user=default redir=-1 resp=3"
		return []byte("=" + strconv.Itoa(len(txt)) + "\r\n" + txt + "\r\n")
	}
	before := append(push("message", "x", "1"), "$1\r\nv\r\n-ERR other\r\n"...)
	before = append(before, info("P", "1")...) // a client's own CLIENT INFO
	between := push("message", "x", string(info("N", "0")))
	long := []byte("=5000\r\ntxt:" + strings.Repeat("n", 4996) + "\r\n")
	for _, tc := range []struct {
		name   string
		answer []byte
		which  int
	}{
		{"left", info("N", "0"), answerUnsubscribed},
		{"subscribed", info("P", "1"), answerSubscribed},
		{"count without flag", info("N", "2"), answerSubscribed},
		{"busy", []byte("-BUSY Redis is busy\r\n"), answerRetry},
		{"loading", []byte("-LOADING Redis is loading the dataset in memory\r\n"), answerRetry},
		{"denied", []byte("-NOPERM this user has no permissions to run the 'client|info' command\r\n"), answerError},
		{"too long", long, answerError},
	} {
		var stream, want []byte
		for _, part := range [][]byte{before, tagErr, between, tc.answer} {
			stream = append(stream, part...)
		}
		want = append(append(want, before...), between...)
		for c := 0; c <= len(stream); c++ {
			var f relayFramer
			f.ask(&q)
			var got []byte
			which := answerNone
			for _, piece := range [][]byte{stream[:c], stream[c:]} {
				out, w, _, err := f.feed(piece)
				if err != nil {
					t.Fatalf("%s, cut %d: %v", tc.name, c, err)
				}
				got = append(got, out...)
				if w != answerNone {
					which = w
				}
			}
			if !bytes.Equal(got, want) || which != tc.which {
				t.Fatalf("%s, cut %d: which %d (want %d), passed %d bytes (want %d)", tc.name, c, which, tc.which, len(got), len(want))
			}
		}
	}
}
