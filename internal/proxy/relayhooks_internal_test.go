package proxy

import (
	"bytes"
	"context"
	"net"
	"strconv"
	"strings"
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
			before := c.got
			_, ok := c.feedCut([]byte(stream[i:min(i+step, len(stream))]), false)
			n := c.got - before
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
// +QUEUED, its pushes coming inside EXEC's array as its elements: the
// relay stops counting there. A message a subscribed RESP3 client
// publishes to itself inside MULTI comes inside EXEC's array too, as an
// element its length does not count (Redis 7.0): out of band, counted.
// A count off by one releases the marks of later writes before their
// replies arrive.
func TestRelayCountsRepliesInMulti(t *testing.T) {
	rs := redistest.Start(t)
	for _, tc := range []struct {
		cmds      [][]string
		countable bool
	}{
		{[][]string{{"MULTI"}, {"SUBSCRIBE", "ch"}, {"EXEC"}, {"SUBSCRIBE", "ch2"}, {"PING"}}, false},
		{[][]string{{"SUBSCRIBE", "self"}, {"MULTI"}, {"PUBLISH", "self", "x"}, {"SET", "a", "1"}, {"EXEC"}, {"PING"}}, true},
		{[][]string{{"MULTI"}, {"SUBSCRIBE", "self2"}, {"PUBLISH", "self2", "x"}, {"EXEC"}, {"PING"}}, false},
		// rueidis's cached read (DoCache) on the connection that carries
		// its subscriptions.
		{[][]string{{"CLIENT", "TRACKING", "ON", "OPTIN"}, {"SUBSCRIBE", "ch"},
			{"CLIENT", "CACHING", "YES"}, {"MULTI"}, {"PTTL", "k"}, {"GET", "k"}, {"EXEC"}, {"PING"}}, true},
	} {
		rw, stream := relayStream(t, rs, tc.cmds)
		rw.received(stream)
		switch {
		case rw.countable != tc.countable:
			t.Errorf("%v: counting %v, want %v, on Redis's %q", tc.cmds, rw.countable, tc.countable, stream)
		case rw.countable && rw.due != rw.counter.got:
			t.Errorf("%v: relay expects %d replies, counts %d in Redis's %q", tc.cmds, rw.due, rw.counter.got, stream)
		}
	}
}

// Redis 7.0 writes some keyspace notifications to the client whose
// command caused them inside that command's reply, where the reply's
// length does not count them: the counter must not take them for
// elements (found by review: it counted one reply more per push, with the
// stream still countable, so a later write's marks went early).
func TestRelayCountsPushesInsideReplies(t *testing.T) {
	rs := redistest.Start(t, "--enable-debug-command", "local")
	c := rs.Client(t)
	for _, cmd := range [][]any{
		{"CONFIG", "SET", "notify-keyspace-events", "KEA"},
		{"DEBUG", "SET-ACTIVE-EXPIRE", "0"},
	} {
		if err := c.Do(context.Background(), cmd...).Err(); err != nil {
			t.Fatal(cmd, err)
		}
	}
	for _, tc := range []struct {
		name  string
		setup [][]any
		cmd   []string
	}{
		{"MGET meets an expired key", [][]any{{"SET", "a", "1"}, {"SET", "e1", "x", "PX", "1"}}, []string{"MGET", "a", "e1", "a"}},
		{"SORT GET meets an expired key", [][]any{{"RPUSH", "l", "1"}, {"SET", "w_1", "x", "PX", "1"}}, []string{"SORT", "l", "BY", "nosort", "GET", "w_*"}},
		{"ZPOPMIN with a count", [][]any{{"ZADD", "z", "1", "a", "2", "b", "3", "c"}}, []string{"ZPOPMIN", "z", "2"}},
		{"ZMPOP", [][]any{{"ZADD", "z2", "1", "a"}}, []string{"ZMPOP", "1", "z2", "MIN", "COUNT", "5"}},
		{"XREADGROUP with a new consumer", [][]any{{"XADD", "x", "*", "f", "v"}, {"XGROUP", "CREATE", "x", "g", "0"}}, []string{"XREADGROUP", "GROUP", "g", "c1", "STREAMS", "x", ">"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, cmd := range tc.setup {
				if err := c.Do(context.Background(), cmd...).Err(); err != nil {
					t.Fatal(cmd, err)
				}
			}
			time.Sleep(10 * time.Millisecond) // the PX 1 keys expire
			rw, stream := relayStream(t, rs, [][]string{{"PSUBSCRIBE", "__key*"}, tc.cmd, {"SET", "k", "v"}, {"PING"}})
			if !pushInsideReply(stream) {
				t.Fatalf("no push inside a reply in Redis's %q: the case tests nothing", stream)
			}
			rw.received(stream)
			if !rw.countable || rw.due != rw.counter.got {
				t.Errorf("counting %v: relay expects %d replies, counts %d in Redis's %q", rw.countable, rw.due, rw.counter.got, stream)
			}
		})
	}
}

// pushInsideReply reports whether a RESP3 stream has a push inside an
// aggregate, written recursively as an independent check of the counter.
func pushInsideReply(stream []byte) bool {
	found := false
	var frame func(depth int) (push bool)
	frame = func(depth int) bool {
		i := bytes.Index(stream, []byte("\r\n"))
		line := string(stream[:i])
		stream = stream[i+2:]
		n, _ := strconv.Atoi(line[1:])
		switch line[0] {
		case '$', '=', '!':
			if n >= 0 {
				stream = stream[n+2:]
			}
		case '*', '~', '%', '>':
			if line[0] == '%' {
				n *= 2
			}
			found = found || line[0] == '>' && depth > 0
			for k := 0; k < n; k++ {
				if frame(depth + 1) {
					k-- // not one of the elements
				}
			}
		}
		return line[0] == '>' && depth > 0
	}
	for len(stream) > 0 {
		frame(0)
	}
	return found
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
		hello.feedCut(buf[:k], false)
		n = hello.got
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
	srv := &Server{tier: &tierState{}}
	srv.initCommands(table, "")
	sess := &Session{srv: srv, resp3: true, sessionBatch: &sessionBatch{cmds: srv.cmdSet()}}
	rw := newRelayWrites(sess, relayPubSub)
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

// The relay takes a client as inside MULTI exactly when Redis does:
// MULTI, EXEC, DISCARD and RESET with an argument are refused for their
// arity and change nothing. Each case is checked against Redis by the
// answer to a closing PING (+QUEUED inside MULTI). Taking "EXEC x" as the
// end released the queued writes' marks before they ran; taking
// "MULTI x" as a start held a relayed client's writes' marks forever.
func TestRelayTransactionStateFollowsArity(t *testing.T) {
	rs := redistest.Start(t)
	for _, cmds := range [][]string{
		{"MULTI x"},
		{"MULTI", "EXEC x"},
		{"MULTI", "DISCARD x"},
		{"MULTI", "RESET x"},
		{"MULTI", "MULTI x"},
		{"MULTI", "EXEC"},
		{"MULTI", "DISCARD"},
		{"MULTI", "RESET"},
		{"MULTI", "EXEC x", "EXEC"},
	} {
		var noted [][]string
		var raw []byte
		for _, c := range append(cmds, "PING") {
			args := strings.Fields(c)
			noted = append(noted, args)
			raw = redcon.AppendArray(raw, len(args))
			for _, a := range args {
				raw = redcon.AppendBulkString(raw, a)
			}
		}
		rw := relayNoted(noted[:len(cmds)])

		nc, err := net.DialTimeout("tcp", rs.Addr(), 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		nc.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := nc.Write(raw); err != nil {
			t.Fatal(err)
		}
		var stream []byte
		buf := make([]byte, 4096)
		for !bytes.HasSuffix(stream, []byte("+PONG\r\n")) && !bytes.HasSuffix(stream, []byte("+QUEUED\r\n")) {
			k, err := nc.Read(buf)
			if err != nil {
				t.Fatalf("%q: reading Redis's replies (have %q): %v", cmds, stream, err)
			}
			stream = append(stream, buf[:k]...)
		}
		nc.Close()
		redisInMulti := bytes.HasSuffix(stream, []byte("+QUEUED\r\n"))
		if rw.inMulti != redisInMulti {
			t.Errorf("%q: relay takes the client as in MULTI: %v; Redis: %v (%q)", cmds, rw.inMulti, redisInMulti, stream)
		}
	}
}
