package proxy

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/tidwall/redcon"
)

// The relay's reply counter finds every top-level reply of a RESP3 stream
// however it is cut, and does not count pushes.
func TestReplyCounterAnySplit(t *testing.T) {
	stream := "+OK\r\n" +
		">3\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nk\r\n$0\r\n\r\n" + // a push: not a reply
		"$5\r\nhello\r\n" +
		"*2\r\n*1\r\n:1\r\n%1\r\n+a\r\n$-1\r\n" +
		"_\r\n" +
		"-ERR x\r\n" +
		"*0\r\n" +
		">2\r\n$7\r\nmessage\r\n$2\r\nhi\r\n" +
		"=7\r\ntxt:abc\r\n"
	const want = 7
	for step := 1; step <= len(stream); step++ {
		var c replyCounter
		var got int64
		for i := 0; i < len(stream); i += step {
			n, ok := c.feed([]byte(stream[i:min(i+step, len(stream))]))
			if !ok {
				t.Fatalf("step %d: not understood at %d", step, i)
			}
			got += n
		}
		if got != want {
			t.Fatalf("step %d: counted %d replies, want %d", step, got, want)
		}
	}
}

// A relay expects as many replies as Redis sends, and counts as many in
// Redis's stream. SUBSCRIBE queued in a RESP3 client's MULTI is answered
// +QUEUED (its pushes come inside EXEC's array), not by pushes only. A
// message a subscribed RESP3 client publishes to itself inside MULTI comes
// inside EXEC's array, as an element its header does not count (Redis 7.0).
// The relay stops counting rather than miscount (EXEC's array counts the
// pushes of a SUBSCRIBE queued in it, not a message): a count off by one
// releases the marks of later writes before their replies arrive.
func TestRelayCountsRepliesInMulti(t *testing.T) {
	rs := redistest.Start(t)
	for _, cmds := range [][][]string{
		{{"MULTI"}, {"SUBSCRIBE", "ch"}, {"EXEC"}, {"SUBSCRIBE", "ch2"}, {"PING"}},
		{{"SUBSCRIBE", "self"}, {"MULTI"}, {"PUBLISH", "self", "x"}, {"SET", "a", "1"}, {"EXEC"}, {"PING"}},
		{{"MULTI"}, {"SUBSCRIBE", "self2"}, {"PUBLISH", "self2", "x"}, {"EXEC"}, {"PING"}},
	} {
		if due, got, stream := relayCount(t, rs, cmds); due != got {
			t.Errorf("%v: relay expects %d replies, counts %d in Redis's %q", cmds, due, got, stream)
		}
	}
}

// relayCount notes cmds on a RESP3 relay's write hooks and sends them to
// Redis; it returns the replies the hooks expect, those the relay's counter
// finds in what Redis sent back, and the stream. The last command must be
// PING. Hooks that stopped counting expect what Redis sends, whatever it
// is (due = got).
func relayCount(t *testing.T, rs *redistest.Server, cmds [][]string) (due, got int64, stream []byte) {
	rw, stream := relayStream(t, rs, cmds)
	rw.received(stream)
	if !rw.countable {
		return 0, 0, stream
	}
	return rw.due, rw.counter.got, stream
}

// relayStream notes cmds on a fresh RESP3 relay's write hooks (writes are
// only counted: they would need a live tier) and returns the hooks and
// what Redis answers to cmds, up to the last command's +PONG.
func relayStream(t *testing.T, rs *redistest.Server, cmds [][]string) (*relayWrites, []byte) {
	rw := relayNoted(cmds)
	var raw []byte
	for _, c := range cmds {
		raw = redcon.AppendArray(raw, len(c))
		for _, a := range c {
			raw = redcon.AppendBulkString(raw, a)
		}
	}

	nc, err := net.DialTimeout("tcp", rs.Addr(), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(5 * time.Second))
	var hello replyCounter
	if _, err := nc.Write([]byte("*2\r\n$5\r\nHELLO\r\n$1\r\n3\r\n")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	for n := int64(0); n == 0; {
		k, err := nc.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		n, _ = hello.feed(buf[:k])
	}
	if _, err := nc.Write(raw); err != nil {
		t.Fatal(err)
	}
	var stream []byte
	for !bytes.HasSuffix(stream, []byte("+PONG\r\n")) {
		k, err := nc.Read(buf)
		if err != nil {
			t.Fatalf("reading Redis's replies (have %q): %v", stream, err)
		}
		stream = append(stream, buf[:k]...)
	}
	return rw, stream
}

// relayNoted returns a fresh RESP3 relay's write hooks with cmds noted.
func relayNoted(cmds [][]string) *relayWrites {
	table := commands.Builtin()
	sess := &Session{srv: &Server{table: table, tier: &tierState{}}, resp3: true, sessionBatch: &sessionBatch{}}
	rw := newRelayWrites(sess)
	for _, c := range cmds {
		args := make([][]byte, len(c))
		for i, a := range c {
			args[i] = []byte(a)
		}
		if cmd := table.Lookup(args); !mayWrite(cmd) {
			rw.note(cmd, args, false)
		} else {
			rw.due++
		}
	}
	return rw
}

// A RESP3 subscriber's (P|S)(UN)SUBSCRIBE is answered by pushes only, or
// refused with one error; the counter takes either for the command's one
// reply and keeps counting, so a subscriber's writes are released when
// their replies arrive. Each case is also fed cut at every byte, and the
// counter must agree however the stream is cut.
func TestRelayCountsSubscribeAnswers(t *testing.T) {
	rs := redistest.Start(t)
	if err := rs.Client(t).Do(context.Background(), "ACL", "SETUSER", "narrow", "on", ">pw", "~*", "+@all", "resetchannels", "&allowed:*").Err(); err != nil {
		t.Fatal(err)
	}
	for _, cmds := range [][][]string{
		{{"SUBSCRIBE", "a", "b", "a"}, {"SET", "k", "v"}, {"PSUBSCRIBE", "p*"}, {"SSUBSCRIBE", "s"}, {"GET", "k"},
			{"UNSUBSCRIBE"}, {"PUNSUBSCRIBE"}, {"SUNSUBSCRIBE"}, {"UNSUBSCRIBE"}, {"PUNSUBSCRIBE"}, {"SUNSUBSCRIBE"}, {"PING"}},
		{{"UNSUBSCRIBE"}, {"UNSUBSCRIBE", "x", "y"}, {"SUBSCRIBE", "x"}, {"PUBLISH", "x", "hello"}, {"UNSUBSCRIBE", "x", "x"}, {"PING"}},
		// Refused: arity, then ACL. An error where pushes were due.
		{{"SUBSCRIBE", "a"}, {"SUBSCRIBE"}, {"SET", "k", "v"}, {"PSUBSCRIBE"}, {"SSUBSCRIBE"}, {"UNSUBSCRIBE"}, {"PING"}},
		{{"AUTH", "narrow", "pw"}, {"SUBSCRIBE", "allowed:1"}, {"SUBSCRIBE", "denied"}, {"SET", "k", "v"},
			{"PSUBSCRIBE", "denied*"}, {"SUBSCRIBE", "allowed:2", "allowed:1"}, {"UNSUBSCRIBE"}, {"PING"}},
		// Messages, one to itself, between the confirmations.
		{{"SUBSCRIBE", "self"}, {"PUBLISH", "self", "1"}, {"SUBSCRIBE", "self", "other"}, {"PUBLISH", "self", "2"},
			{"PSUBSCRIBE", "s*"}, {"PUBLISH", "self", "3"}, {"UNSUBSCRIBE", "self"}, {"PUBLISH", "self", "4"}, {"PING"}},
	} {
		rw, stream := relayStream(t, rs, cmds)
		rw.received(stream)
		if !rw.countable {
			t.Errorf("%v: stopped counting on Redis's %q", cmds, stream)
			continue
		}
		if rw.due != rw.counter.got || len(rw.counter.subs) != 0 {
			t.Errorf("%v: expects %d replies, counts %d (%d subscribe commands open) in Redis's %q", cmds, rw.due, rw.counter.got, len(rw.counter.subs), stream)
			continue
		}
		for cut := 1; cut < len(stream); cut++ {
			again := relayNoted(cmds)
			again.received(stream[:cut])
			again.received(stream[cut:])
			if !again.countable || again.counter.got != rw.due {
				t.Fatalf("%v cut at %d: counted %d (still counting: %v), want %d", cmds, cut, again.counter.got, again.countable, rw.due)
			}
		}
	}
}
