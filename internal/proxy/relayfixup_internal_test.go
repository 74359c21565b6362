package proxy

import (
	"strings"
	"testing"
)

// The reply counter cuts exactly the replies numbered in hide out of a
// RESP3 stream, however Redis's bytes are cut into reads: pushes before,
// between and inside replies pass, and so does a bulk string whose payload
// looks like a fix-up's reply.
func TestReplyCounterCutsFixupRepliesAnySplit(t *testing.T) {
	type part struct {
		bytes string
		cut   bool // a fix-up's reply
	}
	parts := []part{
		{":1\r\n", false}, // reply 0: HSET
		{":1\r\n", true},  // reply 1: its EXPIRE ... NX
		{">2\r\n$10\r\ninvalidate\r\n*1\r\n$3\r\ns:a\r\n", false},
		{"$8\r\n:1\r\n-ERR\r\n", false},                                 // reply 2: a value shaped like replies
		{"-NOPERM no\r\n", true},                                        // reply 3
		{":0\r\n", true},                                                // reply 4: EXPIRE ... LT
		{"*2\r\n:1\r\n>2\r\n$7\r\nmessage\r\n$1\r\nx\r\n:2\r\n", false}, // reply 5, a push inside it
		{">2\r\n$7\r\nmessage\r\n$1\r\ny\r\n", false},
		{":0\r\n", true}, // reply 6
		{"+OK\r\n", false},
		{"|1\r\n+ttl\r\n:3\r\n:1\r\n", true},                  // reply 8, an attribute first
		{"|1\r\n+a\r\n*1\r\n|0\r\n:1\r\n*1\r\n:2\r\n", false}, // reply 9, one inside too
	}
	var stream, want strings.Builder
	for _, p := range parts {
		stream.WriteString(p.bytes)
		if !p.cut {
			want.WriteString(p.bytes)
		}
	}
	s := stream.String()
	for step := 1; step <= len(s); step++ {
		c := replyCounter{hide: []int64{1, 3, 4, 6, 8}}
		var got strings.Builder
		for i := 0; i < len(s); i += step {
			out, ok := c.feedCut([]byte(s[i:min(i+step, len(s))]), false)
			if !ok {
				t.Fatalf("step %d: lost at %d", step, i)
			}
			got.Write(out)
		}
		if got.String() != want.String() {
			t.Fatalf("step %d: passed on %q, want %q", step, got.String(), want.String())
		}
		if len(c.hide) != 0 || c.hiding || c.got != 10 {
			t.Fatalf("step %d: hide %v hiding %v got %d", step, c.hide, c.hiding, c.got)
		}
	}
}

// With stop (the stream is no longer counted: HELLO 2 was sent after the
// fix-up), the counter reads up to the end of the last reply to cut and
// passes the rest on unread, even bytes it could not follow.
func TestReplyCounterStopsAfterLastCut(t *testing.T) {
	head := ":1\r\n:1\r\n"                  // HSET, its fix-up
	rest := "*14\r\n$6\r\nserver\r\n|x\r\n" // what HELLO 2 answers, and bytes the counter refuses
	for split := 1; split < len(head)+len(rest); split++ {
		s := []byte(head + rest)
		c := replyCounter{hide: []int64{1}}
		a, ok1 := c.feedCut(s[:split:split], true)
		got := string(a)
		b, ok2 := c.feedCut(s[split:], true)
		got += string(b)
		if !ok1 || !ok2 {
			t.Fatalf("split %d: lost", split)
		}
		if got != ":1\r\n"+rest {
			t.Fatalf("split %d: passed on %q", split, got)
		}
	}
}

// A stream the counter cannot follow while a fix-up's reply is still to be
// cut is reported lost, so the relay closes the client instead of handing
// it a reply that is not its own.
func TestReplyCounterLostWithCutOutstanding(t *testing.T) {
	c := replyCounter{hide: []int64{1}}
	if _, ok := c.feedCut([]byte(":1\r\n?x\r\n"), false); ok {
		t.Fatal("a frame of no RESP type was followed")
	}
	if len(c.hide) != 1 {
		t.Fatalf("hide %v", c.hide)
	}
}

// The errors a cut reply carried are kept for the relay to count as failed
// fix-ups (the write ran without its TTL).
func TestReplyCounterKeepsCutErrors(t *testing.T) {
	c := replyCounter{hide: []int64{1, 2}}
	out, ok := c.feedCut([]byte(":1\r\n-NOPERM this user has no permissions to run the 'expire' command\r\n:1\r\n-ERR x\r\n"), false)
	if !ok || string(out) != ":1\r\n-ERR x\r\n" {
		t.Fatalf("passed %q, ok %v", out, ok)
	}
	if len(c.failed) != 1 || !strings.HasPrefix(string(c.failed[0]), "-NOPERM this user") {
		t.Fatalf("failed %q", c.failed)
	}
}

// A cut reply of the proxy's own bookkeeping (a CLIENT CACHING sent
// again, an EXEC refusal's DISCARD) is cut like a fix-up's, but its error
// is no failed fix-up: it was logged and counted as one (found by review).
func TestReplyCounterOwnCutErrorsAreNotFixups(t *testing.T) {
	c := replyCounter{hide: []int64{1, 3}, own: []int64{1}}
	out, ok := c.feedCut([]byte(":1\r\n-BUSY Redis is busy running a script\r\n:2\r\n-NOPERM no expire\r\n:3\r\n"), false)
	if !ok || string(out) != ":1\r\n:2\r\n:3\r\n" {
		t.Fatalf("passed %q, ok %v", out, ok)
	}
	if len(c.failed) != 1 || !strings.HasPrefix(string(c.failed[0]), "-NOPERM") || len(c.own) != 0 {
		t.Fatalf("failed %q, own left %v", c.failed, c.own)
	}
}

// FuzzReplyCounterCut: for any sequence of replies and pushes, any choice
// of replies to cut, and any split into reads, the counter passes on
// exactly the frames not cut, in order.
func FuzzReplyCounterCut(f *testing.F) {
	frames := []struct {
		bytes string
		push  bool
	}{
		{":1\r\n", false},
		{"-ERR x\r\n", false},
		{"+OK\r\n", false},
		{"$5\r\n:1\r\n>\r\n", false},
		{"_\r\n", false},
		{"*2\r\n:1\r\n$-1\r\n", false},
		{"%1\r\n+k\r\n*1\r\n:2\r\n", false},
		{"*2\r\n:1\r\n>2\r\n$7\r\nmessage\r\n$1\r\nx\r\n:3\r\n", false}, // a push inside
		{">2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nk\r\n", true},
		{">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$3\r\n:1\n\r\n", true},
		{"$0\r\n\r\n", false},
		{"|1\r\n+key-popularity\r\n%0\r\n:5\r\n", false},
		{"*2\r\n|1\r\n+a\r\n:1\r\n:2\r\n:3\r\n", false},
	}
	f.Add([]byte{0, 0x80, 8, 3, 0x81, 9, 0x82}, []byte{3, 1, 7})
	f.Add([]byte{7, 0x87, 8, 0x80}, []byte{1})
	f.Fuzz(func(t *testing.T, pick, splits []byte) {
		var stream, want []byte
		var hide []int64
		var replies int64
		for _, p := range pick {
			fr := frames[int(p&0x7f)%len(frames)]
			stream = append(stream, fr.bytes...)
			cut := p&0x80 != 0 && !fr.push
			if cut {
				hide = append(hide, replies)
			} else {
				want = append(want, fr.bytes...)
			}
			if !fr.push {
				replies++
			}
		}
		c := replyCounter{hide: hide}
		var got []byte
		for i, k := 0, 0; i < len(stream); k++ {
			n := len(stream) - i
			if k < len(splits) {
				n = min(n, int(splits[k])+1)
			}
			piece := append([]byte(nil), stream[i:i+n]...)
			out, ok := c.feedCut(piece, false)
			if !ok {
				t.Fatalf("lost on %q", stream)
			}
			got = append(got, out...)
			i += n
		}
		if string(got) != string(want) || c.got != replies || len(c.hide) != 0 {
			t.Fatalf("stream %q hide %v: passed %q, want %q (got %d of %d replies, %v left)", stream, hide, got, want, c.got, replies, c.hide)
		}
	})
}

// BenchmarkReplyCounterMessages: what counting costs a relay carrying a
// flood of pub/sub messages (RESP3 pushes of a 100-byte payload), which it
// counts whenever the policy may send fix-ups.
func BenchmarkReplyCounterMessages(b *testing.B) {
	msg := ">3\r\n$7\r\nmessage\r\n$7\r\nchannel\r\n$100\r\n" + strings.Repeat("x", 100) + "\r\n"
	chunk := []byte(strings.Repeat(msg, 32<<10/len(msg)))
	var c replyCounter
	b.SetBytes(int64(len(chunk)))
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := c.feedCut(chunk, false); !ok {
			b.Fatal("lost")
		}
	}
}
