package guard_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// relayConn is a raw client connection that reads RESP2 and RESP3 replies
// and counts the pushes between them apart.
type relayConn struct {
	t      *testing.T
	nc     net.Conn
	r      *bufio.Reader
	pushes int
}

func dialRelay(t *testing.T, p *proxytest.Proxy) *relayConn {
	nc := p.Dial(t)
	return &relayConn{t: t, nc: nc, r: bufio.NewReader(nc)}
}

// dialTracking is a RESP3 client that turned tracking on: a relay.
func dialTracking(t *testing.T, p *proxytest.Proxy) *relayConn {
	c := dialRelay(t, p)
	c.do(1, []string{"HELLO", "3"})
	equalReplies(t, c.do(1, []string{"CLIENT", "TRACKING", "ON"}), []string{"+OK"})
	return c
}

// do sends cmds in one write and returns one rendered reply per command
// that answers (skip: how many of them Redis answers nothing, from the
// end), with the pushes that came among them counted in c.pushes.
func (c *relayConn) do(answered int, cmds ...[]string) []string {
	c.t.Helper()
	var b []byte
	for _, cmd := range cmds {
		b = fmt.Appendf(b, "*%d\r\n", len(cmd))
		for _, a := range cmd {
			b = fmt.Appendf(b, "$%d\r\n%s\r\n", len(a), a)
		}
	}
	c.nc.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.nc.Write(b); err != nil {
		c.t.Fatal(err)
	}
	var out []string
	for len(out) < answered {
		s, push, err := c.read()
		if err != nil {
			c.t.Fatalf("after %q: %v", out, err)
		}
		if push {
			c.pushes++
			continue
		}
		out = append(out, s)
	}
	return out
}

// read reads one frame: a reply, or a push (push true).
func (c *relayConn) read() (s string, push bool, err error) {
	line, err := c.r.ReadString('\n')
	if err != nil {
		return "", false, err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return "", false, fmt.Errorf("empty line")
	}
	switch line[0] {
	case '+', '-', ':', '_', ',', '#':
		return line, false, nil
	case '|': // an attribute, then the value it describes
		n, _ := strconv.Atoi(line[1:])
		for range 2 * n {
			if _, _, err := c.read(); err != nil {
				return "", false, err
			}
		}
		s, push, err := c.read()
		return "|" + s, push, err
	case '$', '=':
		n, _ := strconv.Atoi(line[1:])
		if n < 0 {
			return "$(nil)", false, nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(c.r, buf); err != nil {
			return "", false, err
		}
		return "$" + string(buf[:n]), false, nil
	case '*', '%', '~', '>':
		n, _ := strconv.Atoi(line[1:])
		if line[0] == '%' {
			n *= 2
		}
		parts := make([]string, 0, n)
		for len(parts) < n {
			p, inner, err := c.read()
			if err != nil {
				return "", false, err
			}
			if inner && line[0] != '>' {
				c.pushes++ // Redis 7.0 puts some pushes inside a reply
				continue
			}
			parts = append(parts, p)
		}
		return "*[" + strings.Join(parts, " ") + "]", line[0] == '>', nil
	}
	return "", false, fmt.Errorf("unexpected %q", line)
}

// A relayed client (CLIENT TRACKING: rueidis and redis-py's client-side
// caching track on every connection) gets its writes' TTL fix-ups as on a
// shared connection: sent behind the write, their replies cut from the
// raw stream, so the client reads exactly Redis's replies to what it sent,
// with the invalidation pushes among them. They were not sent (the reply
// would have reached the client), and keys a policy gives a default TTL
// were left with none.
func TestRelayWriteGetsItsFixup(t *testing.T) {
	for _, tc := range []struct {
		name string
		resp int
		tier bool
	}{{"resp3", 3, false}, {"resp2", 2, false}, {"resp3 tier", 3, true}} {
		t.Run(tc.name, func(t *testing.T) {
			p := proxytest.Start(t, nil, func(c *config.Config) {
				c.Policy = holesPolicy()
				c.LocalCache.Enabled = tc.tier
			})
			direct := p.Redis.Client(t)
			c := dialRelay(t, p)
			if tc.resp == 3 {
				c.do(1, []string{"HELLO", "3"})
			}
			nilReply := "$(nil)"
			if tc.resp == 3 {
				nilReply = "_"
			}
			equalReplies(t, c.do(2, []string{"CLIENT", "TRACKING", "ON"}, []string{"HGET", "s:a", "f"}), []string{"+OK", nilReply})
			if err := direct.HSet(ctx, "s:a", "f", "old").Err(); err != nil {
				t.Fatal(err)
			}
			// One write: the replies of the writes with fix-ups between
			// others, a reply shaped like a fix-up's (INCR's), a value
			// shaped like replies, and the invalidation of s:a.
			got := c.do(8,
				[]string{"HSET", "s:a", "f", "v"},
				[]string{"INCR", "s:n"},
				[]string{"SET", "s:text", ":1\r\n-ERR"},
				[]string{"GET", "s:text"},
				[]string{"LPUSH", "s:l", "x", "y"},
				[]string{"GET", "s:none"},
				[]string{"SET", "l:ok", "v", "EX", "10"},
				[]string{"SADD", "s:set", "m"},
			)
			equalReplies(t, got, []string{":0", ":1", "+OK", "$:1\r\n-ERR", ":2", nilReply, "+OK", ":1"})
			for _, k := range []string{"s:a", "s:n", "s:text", "s:l", "s:set"} {
				if d := pttl(t, direct, k); d <= 0 {
					t.Errorf("PTTL %s = %v: no TTL fix-up", k, d)
				}
			}
			// Nothing left over in the stream: the next reply is PING's.
			equalReplies(t, c.do(1, []string{"PING"}), []string{"+PONG"})
			if tc.resp == 3 && c.pushes == 0 {
				t.Errorf("no invalidation push for s:a: the test did not put one among the replies")
			}
			for _, name := range []string{"hset", "incr", "lpush", "sadd"} {
				if fixed, reported := ttlOutcomes(t, p, name); fixed != 1 || reported != 0 {
					t.Errorf("%s: report says fixed=%d reported=%d, want fixed=1", name, fixed, reported)
				}
			}
		})
	}
}

// Where a fix-up's reply could not be cut, none is sent and the violation
// is reported: after a command that ends the counting of replies (CLIENT
// REPLY, HELLO); fix-ups sent before such a command in the same write are
// cut from what comes before its reply.
func TestRelayFixupOnlyWhereItsReplyIsCut(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Policy = holesPolicy() })
	direct := p.Redis.Client(t)

	c := dialTracking(t, p)

	// HELLO 2 after a fixed write, then a write after it.
	got := c.do(3, []string{"HSET", "s:b", "f", "v"}, []string{"HELLO", "2"}, []string{"HSET", "s:c", "f", "v"})
	if got[0] != ":1" || !strings.HasPrefix(got[1], "*[$server $redis") || got[2] != ":1" {
		t.Fatalf("replies %q", got)
	}
	if d := pttl(t, direct, "s:b"); d <= 0 {
		t.Errorf("PTTL s:b = %v: the fix-up sent before HELLO was lost", d)
	}
	if d := pttl(t, direct, "s:c"); d != -1 {
		t.Errorf("PTTL s:c = %v: a fix-up was sent on an uncounted stream", d)
	}
	equalReplies(t, c.do(1, []string{"PING"}), []string{"+PONG"})

	// CLIENT REPLY OFF: the write before it is fixed, the one after not
	// (its reply, and a fix-up's, would be muted).
	d := dialRelay(t, p)
	d.do(1, []string{"HELLO", "3"})
	d.do(1, []string{"CLIENT", "TRACKING", "ON"})
	got = d.do(3, []string{"HSET", "s:d", "f", "v"}, []string{"CLIENT", "REPLY", "OFF"}, []string{"HSET", "s:e", "f", "v"},
		[]string{"CLIENT", "REPLY", "ON"}, []string{"PING"})
	equalReplies(t, got, []string{":1", "+OK", "+PONG"})
	if ttl := pttl(t, direct, "s:d"); ttl <= 0 {
		t.Errorf("PTTL s:d = %v", ttl)
	}
	if ttl := pttl(t, direct, "s:e"); ttl != -1 {
		t.Errorf("PTTL s:e = %v", ttl)
	}

	if fixed, reported := ttlOutcomes(t, p, "hset"); fixed != 2 || reported != 2 {
		t.Errorf("report says fixed=%d reported=%d, want fixed=2 (s:b, s:d) reported=2 (s:c, s:e)", fixed, reported)
	}
}

// A write queued in a relayed client's MULTI gets its fix-up right behind
// the EXEC (queued with it, Redis would answer QUEUED and put its reply
// inside EXEC's), whether the transaction came in one write or typed
// command by command; the client reads exactly Redis's replies. Not
// after DISCARD, and not when the transaction queued a SELECT (after EXEC
// the connection's database depends on whether EXEC ran).
func TestRelayTransactionFixupsFollowExec(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Policy = holesPolicy() })
	direct := p.Redis.Client(t)
	c := dialTracking(t, p)

	got := c.do(4, []string{"MULTI"}, []string{"HSET", "s:m", "f", "v"}, []string{"INCR", "s:m2"}, []string{"EXEC"})
	equalReplies(t, got, []string{"+OK", "+QUEUED", "+QUEUED", "*[:1 :1]"})
	equalReplies(t, c.do(1, []string{"MULTI"}), []string{"+OK"})
	equalReplies(t, c.do(1, []string{"RPUSH", "s:typed", "a"}), []string{"+QUEUED"})
	equalReplies(t, c.do(2, []string{"EXEC"}, []string{"PING"}), []string{"*[:1]", "+PONG"})
	for _, k := range []string{"s:m", "s:m2", "s:typed"} {
		if d := pttl(t, direct, k); d <= 0 {
			t.Errorf("PTTL %s = %v: no fix-up behind EXEC", k, d)
		}
	}

	got = c.do(4, []string{"MULTI"}, []string{"HSET", "s:gone", "f", "v"}, []string{"DISCARD"}, []string{"PING"})
	equalReplies(t, got, []string{"+OK", "+QUEUED", "+OK", "+PONG"})
	got = c.do(5, []string{"MULTI"}, []string{"SELECT", "0"}, []string{"HSET", "s:sel", "f", "v"}, []string{"EXEC"}, []string{"PING"})
	equalReplies(t, got, []string{"+OK", "+QUEUED", "+QUEUED", "*[+OK :1]", "+PONG"})
	if d := pttl(t, direct, "s:sel"); d != -1 {
		t.Errorf("PTTL s:sel = %v: a fix-up was sent behind a transaction that SELECTed", d)
	}
	// Renamed in the transaction: the fix-up would name a key that is
	// gone; reported instead.
	got = c.do(5, []string{"MULTI"}, []string{"SADD", "s:tmp", "m"}, []string{"RENAME", "s:tmp", "s:final"}, []string{"EXEC"}, []string{"PING"})
	equalReplies(t, got, []string{"+OK", "+QUEUED", "+QUEUED", "*[:1 +OK]", "+PONG"})
	if n, _ := direct.Exists(ctx, "s:gone").Result(); n != 0 {
		t.Errorf("s:gone exists after DISCARD")
	}
	if fixed, reported := ttlOutcomes(t, p, "hset"); fixed != 1 || reported != 2 {
		t.Errorf("hset: report says fixed=%d reported=%d, want fixed=1 (s:m) reported=2 (s:gone, s:sel)", fixed, reported)
	}
	if fixed, _ := ttlOutcomes(t, p, "rpush"); fixed != 1 {
		t.Errorf("rpush: report says fixed=%d", fixed)
	}
	if fixed, _ := ttlOutcomes(t, p, "sadd"); fixed != 0 {
		t.Errorf("sadd: report says fixed=%d for a fix-up not sent", fixed)
	}
}

// ttlOutcomes sums /policy/report's TTL rows of command (one per key).
func ttlOutcomes(t *testing.T, p *proxytest.Proxy, command string) (fixed, reported int64) {
	t.Helper()
	for _, row := range reportJSON(t, p.Guard()).Rows {
		if row.Rule == policy.RuleTTL && row.Command == command {
			fixed += int64(row.Fixed)
			reported += int64(row.Reported)
		}
	}
	return fixed, reported
}

// Many relayed clients pipelining writes with fix-ups, reads and pushes at
// once each read exactly their own replies, in order.
func TestRelayFixupsUnderConcurrency(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) {
		c.Policy = holesPolicy()
		c.LocalCache.Enabled = true
	})
	const clients, rounds, per = 8, 30, 20
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for id := range clients {
		wg.Go(func() {
			c := dialTracking(t, p)
			for r := range rounds {
				var cmds [][]string
				var want []string
				for i := range per {
					k := fmt.Sprintf("s:%d:%d:%d", id, r, i)
					switch i % 3 {
					case 0:
						cmds = append(cmds, []string{"HSET", k, "f", k})
						want = append(want, ":1")
					case 1:
						cmds = append(cmds, []string{"INCRBY", k, strconv.Itoa(i + 1000*id)})
						want = append(want, ":"+strconv.Itoa(i+1000*id))
					case 2:
						// Read a key another client writes, to get
						// invalidations from keys it changes.
						other := fmt.Sprintf("s:%d:%d:%d", (id+1)%clients, r, i-2)
						cmds = append(cmds, []string{"ECHO", k}, []string{"HGET", other, "f"})
						want = append(want, "$"+k, "")
					}
				}
				tx := fmt.Sprintf("s:tx:%d:%d", id, r)
				cmds = append(cmds, []string{"MULTI"}, []string{"HSET", tx, "f", "v"}, []string{"EXEC"})
				want = append(want, "+OK", "+QUEUED", "*[:1]")
				got := c.do(len(cmds), cmds...)
				for i := range got {
					if want[i] != "" && got[i] != want[i] {
						errs <- fmt.Errorf("client %d round %d reply %d = %q, want %q (all %q)", id, r, i, got[i], want[i], got)
						return
					}
					if want[i] == "" && got[i] != "_" && !strings.HasPrefix(got[i], "$s:") {
						errs <- fmt.Errorf("client %d round %d reply %d = %q, want another client's value", id, r, i, got[i])
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	direct := p.Redis.Client(t)
	for id := range clients {
		for _, k := range []string{fmt.Sprintf("s:%d:%d:%d", id, rounds-1, 1), fmt.Sprintf("s:tx:%d:%d", id, rounds-1)} {
			if d := pttl(t, direct, k); d <= 0 {
				t.Errorf("PTTL %s = %v", k, d)
			}
		}
	}
}

// A RESP3 subscriber may write on its connection (rueidis multiplexes its
// subscriptions there): the confirmations and messages are pushes, and its
// writes get their fix-ups as a tracking client's do.
func TestRelaySubscriberWriteGetsItsFixup(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Policy = holesPolicy() })
	direct := p.Redis.Client(t)
	c := dialRelay(t, p)
	c.do(1, []string{"HELLO", "3"})
	got := c.do(3, []string{"SUBSCRIBE", "ch"}, []string{"HSET", "s:p", "f", "v"}, []string{"PUBLISH", "ch", "hi"},
		[]string{"SUBSCRIBE", "ch2"}, []string{"RPUSH", "s:q", "a"})
	equalReplies(t, got, []string{":1", ":1", ":1"})
	for _, k := range []string{"s:p", "s:q"} {
		if d := pttl(t, direct, k); d <= 0 {
			t.Errorf("PTTL %s = %v: no TTL fix-up", k, d)
		}
	}
	equalReplies(t, c.do(1, []string{"PING"}), []string{"+PONG"})
	if c.pushes != 3 {
		t.Errorf("%d pushes, want 3 (two confirmations, one message)", c.pushes)
	}
}

// A fix-up Redis refuses (here the upstream user may not run EXPIRE) is
// cut like any other; the write ran without its TTL, which is counted in
// redproxy_policy_fixup_failures_total and logged, as a failed fix-up in a
// client's own MULTI is. (On a shared connection the write and its fix-up
// go in one MULTI and fail together.) Found by review: the error was cut
// without a trace.
func TestRelayFixupFailureIsCounted(t *testing.T) {
	rs := redistest.Start(t)
	admin := rs.Client(t)
	if err := admin.Do(ctx, "ACL", "SETUSER", "noexpire", "on", ">pw", "~*", "&*", "+@all", "-expire").Err(); err != nil {
		t.Fatal(err)
	}
	p := proxytest.Start(t, rs, func(c *config.Config) {
		c.Policy = holesPolicy()
		c.Upstream.Username, c.Upstream.Password = "noexpire", "pw"
	})
	c := dialRelay(t, p)
	equalReplies(t, c.do(1, []string{"AUTH", "noexpire", "pw"}), []string{"+OK"})
	c.do(1, []string{"HELLO", "3"})
	equalReplies(t, c.do(1, []string{"CLIENT", "TRACKING", "ON"}), []string{"+OK"})
	equalReplies(t, c.do(3, []string{"HSET", "s:a", "f", "v"}, []string{"HGET", "s:a", "f"}, []string{"PING"}), []string{":1", "$v", "+PONG"})
	if d := pttl(t, admin, "s:a"); d != -1 {
		t.Errorf("PTTL s:a = %v: the test's upstream user was to refuse EXPIRE", d)
	}
	if n := metricValue(t, p.Metrics.Registry, "redproxy_policy_fixup_failures_total"); n != 1 {
		t.Errorf("redproxy_policy_fixup_failures_total = %v, want 1", n)
	}
	if rep := p.Guard().Report(); rep.FixupFailures != 1 {
		t.Errorf("report fixup_failures = %d, want 1", rep.FixupFailures)
	}
}

// A RESP3 attribute (DEBUG PROTOCOL attrib) is part of the reply it
// precedes: the relay keeps counting through it, and a fix-up behind it is
// cut as any other. Found by review: the counter took it for bytes it could
// not follow and closed the client, which lost its replies.
func TestRelayFixupBehindAttribute(t *testing.T) {
	rs := redistest.Start(t, "--enable-debug-command", "yes")
	p := proxytest.Start(t, rs, func(c *config.Config) { c.Policy = holesPolicy() })
	c := dialTracking(t, p)
	got := c.do(4, []string{"DEBUG", "PROTOCOL", "attrib"}, []string{"HSET", "s:a", "f", "v"}, []string{"HGET", "s:a", "f"}, []string{"PING"})
	if !strings.HasPrefix(got[0], "|$Some real reply") {
		t.Errorf("DEBUG PROTOCOL attrib answered %q", got[0])
	}
	equalReplies(t, got[1:], []string{":1", "$v", "+PONG"})
	if d := pttl(t, rs.Client(t), "s:a"); d <= 0 {
		t.Errorf("PTTL s:a = %v", d)
	}
	c.nc.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := c.r.ReadByte(); err == nil || err == io.EOF {
		t.Errorf("after the replies: %v, want nothing more and the connection open", err)
	}
}
