package upstream

import (
	"bytes"
	"runtime"
	"sync/atomic"
	"testing"
)

// Trim gives back a reply buffer grown past keep and keeps a smaller one.
func TestCallTrim(t *testing.T) {
	c := NewCall()
	c.addReply(bytes.Repeat([]byte("x"), 100<<10))
	c.Reset()
	c.Trim(64 << 10)
	if cap(c.out) != 0 {
		t.Fatalf("kept %d bytes of replies after Trim", cap(c.out))
	}
	c.addReply([]byte("+OK\r\n"))
	c.Reset()
	kept := cap(c.out)
	c.Trim(64 << 10)
	if kept == 0 || cap(c.out) != kept {
		t.Fatalf("small reply buffer: %d before Trim, %d after", kept, cap(c.out))
	}
}

// A reply added whole (a router filling a Call) past SetMaxReply is
// digested too, its head counted against the reply limit, and replies
// around it are kept; past the limit, digests are dropped like replies.
func TestCallDigestsLongReplies(t *testing.T) {
	long := append([]byte("$200\r\n"), bytes.Repeat([]byte("y"), 200)...)
	long = append(long, "\r\n"...)
	c := NewCall()
	c.SetMaxReply(100)
	c.SetReplyLimit(100)
	c.AddReply([]byte("+OK\r\n"))
	c.AddReply(long)
	c.AddReply([]byte(":1\r\n"))
	c.AddReply(long) // 5 + 64 + 4 + 64 > 100: over the limit
	if r, err := c.Reply(0); err != nil || string(r) != "+OK\r\n" {
		t.Fatalf("reply 0: %q, %v", r, err)
	}
	if _, err := c.Reply(1); err != ErrDigested {
		t.Fatalf("reply 1: %v, want ErrDigested", err)
	}
	want := DigestOf(long)
	if d, ok := c.Digest(1); !ok || d.Len != int64(len(long)) || d.Sum != want.Sum || !bytes.Equal(d.Head, long[:DigestHead]) {
		t.Fatalf("digest 1: %v %+v, want %+v", ok, d, want)
	}
	if r, err := c.Reply(2); err != nil || string(r) != ":1\r\n" {
		t.Fatalf("reply 2: %q, %v", r, err)
	}
	if _, err := c.Reply(3); err != ErrOutputLimit {
		t.Fatalf("reply 3: %v, want ErrOutputLimit", err)
	}
	if _, ok := c.Digest(3); ok {
		t.Fatal("a digest past the limit")
	}
	c.Reset()
	c.AddReply(long)
	if r, err := c.Reply(0); err != nil || !bytes.Equal(r, long) {
		t.Fatalf("after Reset, no SetMaxReply: %q, %v", r, err)
	}
}

// AddReplyAppend keeps, digests, counts and drops a reply exactly as
// AddReply of the same frame: the same replies, errors and digests from a
// Call filled either way, around the reply limit, the shared budget and
// SetMaxReply.
func TestCallAddReplyAppendIsAddReply(t *testing.T) {
	long := append([]byte("$200\r\n"), bytes.Repeat([]byte("y"), 200)...)
	long = append(long, "\r\n"...)
	frames := [][]byte{[]byte("+OK\r\n"), long, []byte(":1\r\n"), long, []byte("+x\r\n")}
	for _, c := range []struct {
		name           string
		limit, maxRepl int
		budget         bool
	}{
		{"no limits", 0, 0, false},
		{"reply limit", 300, 0, false},
		{"reply limit and budget", 300, 0, true},
		{"digests", 100, 100, false},
	} {
		fill := func(byAppend bool) *Call {
			call := NewCall()
			if c.maxRepl > 0 {
				call.SetMaxReply(c.maxRepl)
			}
			if c.limit > 0 {
				call.SetReplyLimit(c.limit)
			}
			if c.budget {
				call.SetReplyBudget(new(atomic.Int64))
			}
			for _, f := range frames {
				if byAppend {
					call.AddReplyAppend(len(f), func(dst []byte) []byte { return append(dst, f...) })
				} else {
					call.AddReply(f)
				}
			}
			return call
		}
		want, got := fill(false), fill(true)
		for i := range frames {
			wr, werr := want.Reply(i)
			gr, gerr := got.Reply(i)
			wd, wok := want.Digest(i)
			gd, gok := got.Digest(i)
			if !bytes.Equal(wr, gr) || werr != gerr || wok != gok || wd.Sum != gd.Sum || wd.Len != gd.Len {
				t.Errorf("%s: reply %d: AddReply %q, %v, digest %v %+v; AddReplyAppend %q, %v, digest %v %+v",
					c.name, i, wr, werr, wok, wd, gr, gerr, gok, gd)
			}
		}
	}
}

// AddReplyAppend grows the reply buffer with room to spare, as append
// does: grown by each reply alone, a pipeline of large merged replies
// copied everything kept for each one (past bufpool.MaxSize the buffer
// is exact), allocating 30 times what they hold here.
func TestCallAddReplyAppendGrowsGeometrically(t *testing.T) {
	reply := append([]byte("$200000\r\n"), bytes.Repeat([]byte("z"), 200000)...)
	reply = append(reply, "\r\n"...)
	const replies = 60
	c := NewCall()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range replies {
		c.AddReplyAppend(len(reply), func(dst []byte) []byte { return append(dst, reply...) })
	}
	runtime.ReadMemStats(&after)
	kept := replies * len(reply)
	if got, _ := c.Reply(replies - 1); !bytes.Equal(got, reply) {
		t.Fatalf("last reply: %d bytes, want %d", len(got), len(reply))
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > uint64(10*kept) {
		t.Fatalf("%d replies of %d bytes allocated %d bytes (%.1f times what they hold)", replies, len(reply), alloc, float64(alloc)/float64(kept))
	}
}
