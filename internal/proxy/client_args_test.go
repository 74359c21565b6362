package proxy_test

import (
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// The CLIENT subcommands the proxy answers itself check their arguments
// as Redis does: it answered +OK to "CLIENT NO-EVICT maybe" and "CLIENT
// TRACKING maybe" (found by the differential test). Each reply must be
// Redis's own, byte for byte as the test client decodes it.
func TestClientModeArgumentsAsRedis(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	cmds := [][]string{
		{"CLIENT", "NO-EVICT", "maybe"},
		{"CLIENT", "NO-EVICT", "on"},
		{"CLIENT", "NO-EVICT", "OFF"},
		{"CLIENT", "TRACKING", "maybe"},
		{"CLIENT", "TRACKING", "maybe", "bogus"},
		{"CLIENT", "TRACKING", "off"},
		{"CLIENT", "TRACKING", "off", "bogus"},
		{"CLIENT", "TRACKING", "off", "BCAST"},
		{"CLIENT", "TRACKING", "off", "PREFIX", "a", "optin", "OPTOUT", "noloop"},
		{"CLIENT", "TRACKING", "off", "PREFIX"},
		{"CLIENT", "TRACKING", "off", "PREFIX", "redirect"},
		{"CLIENT", "TRACKING", "off", "BCAST", "PREFIX", "redirect"},
	}
	viaProxy, direct := dialRaw(t, p.Addr), dialRaw(t, p.Redis.Addr())
	for _, cmd := range cmds {
		if got, want := fmt.Sprint(viaProxy.do(cmd...)), fmt.Sprint(direct.do(cmd...)); got != want {
			t.Errorf("%v: proxy %q, Redis %q", cmd, got, want)
		}
	}
	// REDIRECT names a Redis connection id, which a proxy client's is not:
	// refused with OFF too, where Redis checks the id as well.
	for _, arg := range []string{"abc", "1", ""} {
		v := fmt.Sprint(viaProxy.do("CLIENT", "TRACKING", "off", "REDIRECT", arg))
		if !strings.Contains(v, "REDIRECT is not supported") {
			t.Errorf("CLIENT TRACKING off REDIRECT %q: %s", arg, v)
		}
	}
}

// sameAsRedis sends each write of writes to the proxy and to Redis, reads
// the replies each write must draw (counts), and compares them.
func sameAsRedis(t *testing.T, p *proxytest.Proxy, proto string, writes [][][]string, counts []int, between func()) {
	t.Helper()
	viaProxy, direct := dialRaw(t, p.Addr), dialRaw(t, p.Redis.Addr())
	for _, c := range []*rawConn{viaProxy, direct} {
		if proto == "3" {
			c.do("HELLO", "3")
		}
	}
	for i, w := range writes {
		viaProxy.send(w...)
		direct.send(w...)
		if between != nil {
			between()
		}
		for n := 0; n < counts[i]; n++ {
			got, _ := viaProxy.readReply()
			want, _ := direct.readReply()
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("write %d %v, reply %d: proxy %v, Redis %v", i, w, n, got, want)
			}
		}
	}
}

// A client without a name has none inside MULTI either: EXEC answered
// CLIENT GETNAME with the name the proxy gives its pinned connections
// (found by the differential test). A name the client sets inside the
// transaction is answered, and the connection is named back before the
// next client gets it. With routes the proxy holds MULTI and replays it
// at EXEC, on a pinned connection as well.
func TestClientGetnameInsideMulti(t *testing.T) {
	t.Run("pinned", func(t *testing.T) { getnameInsideMulti(t, proxytest.Start(t, nil, nil), true) })
	// A held MULTI refuses CLIENT SETNAME, as every command changing the
	// connection (docs/COMPATIBILITY.md, Routes).
	t.Run("held", func(t *testing.T) { getnameInsideMulti(t, startRouted(t, nil).p, false) })
}

func getnameInsideMulti(t *testing.T, p *proxytest.Proxy, setname bool) {
	for _, proto := range []string{"2", "3"} {
		writes, counts := [][][]string{{{"MULTI"}, {"CLIENT", "GETNAME"}, {"EXEC"}}}, []int{3}
		if setname {
			writes = append(writes, [][]string{{"MULTI"}, {"CLIENT", "SETNAME", "n1"}, {"CLIENT", "GETNAME"}, {"EXEC"}})
			counts = append(counts, 4)
		}
		sameAsRedis(t, p, proto, writes, counts, nil)
	}
	// The next transactions get the connections back, named as before.
	for range 3 {
		c := dialRaw(t, p.Addr)
		c.send([]string{"MULTI"}, []string{"CLIENT", "GETNAME"}, []string{"EXEC"})
		c.readReply()
		c.readReply()
		if v, _ := c.readReply(); fmt.Sprint(v) != "[<nil>]" {
			t.Fatalf("EXEC of a later client = %v, want [<nil>]", v)
		}
	}
	if !setname {
		return
	}
	// Named n1 on Redis: only the two direct connections.
	rc := p.Redis.Client(t)
	redistest.Eventually(t, 5*time.Second, func() bool { return strings.Count(rc.ClientList(ctx).Val(), "name=n1 ") == 2 },
		"a pinned connection kept the name a client gave it inside MULTI:\n%s", rc.ClientList(ctx).Val())
}

// CLIENT REPLY OFF mutes a subscriber's replies but not its pub/sub
// confirmations (pushes, never muted, on RESP2 too). The relay's own
// connection was dialled without the client's reply mode, so its PING was
// answered; and an UNSUBSCRIBE the proxy answers itself, for a client not
// subscribed, was muted (both found by the differential test).
func TestReplyOffAndPubSubAsRedis(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	pub := p.Redis.Client(t)
	for _, proto := range []string{"2", "3"} {
		t.Run("RESP"+proto, func(t *testing.T) {
			sameAsRedis(t, p, proto, [][][]string{
				{{"CLIENT", "REPLY", "OFF"}, {"UNSUBSCRIBE"}, {"PUNSUBSCRIBE", "x"}, {"CLIENT", "REPLY", "ON"}},
				{{"CLIENT", "REPLY", "SKIP"}, {"UNSUBSCRIBE", "a"}, {"PING"}},
			}, []int{3, 2}, nil)
			sameAsRedis(t, p, proto, [][][]string{
				{{"CLIENT", "REPLY", "OFF"}, {"SUBSCRIBE", "off" + proto}, {"PING"}},
			}, []int{2}, func() {
				redistest.Eventually(t, 5*time.Second, func() bool {
					return pub.PubSubNumSub(ctx, "off"+proto).Val()["off"+proto] == 2
				}, "the two subscribers never subscribed")
				pub.Publish(ctx, "off"+proto, "m")
			})
		})
	}
}

// CLIENT LIST TYPE and ID filter the proxy's clients (they were ignored:
// "CLIENT LIST TYPE pubsub" listed everyone), and CLIENT KILL TYPE kills
// only clients of that type (TYPE pubsub killed every client, TYPE normal
// the subscribers too). Bad filters get Redis's own errors.
func TestClientListAndKillByType(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	admin, plain, sub := dialRaw(t, p.Addr), dialRaw(t, p.Addr), dialRaw(t, p.Addr)
	idOf := func(c *rawConn) string { return fmt.Sprint(c.do("CLIENT", "ID")) }
	adminID, plainID, subID := idOf(admin), idOf(plain), idOf(sub)
	sub.do("SUBSCRIBE", "ch")
	ids := func(args ...string) []string {
		t.Helper()
		v := admin.do(append([]string{"CLIENT", "LIST"}, args...)...)
		s, isString := v.(string)
		if !isString {
			t.Fatalf("CLIENT LIST %v = %v", args, v)
		}
		var out []string
		for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
			if f := strings.Fields(line); len(f) > 0 {
				out = append(out, strings.TrimPrefix(f[0], "id="))
			}
		}
		return out
	}
	redistest.Eventually(t, 5*time.Second, func() bool { return fmt.Sprint(ids("TYPE", "pubsub")) == "["+subID+"]" },
		"CLIENT LIST TYPE pubsub = %v, want [%s]", ids("TYPE", "pubsub"), subID)
	if got, want := fmt.Sprint(ids("TYPE", "normal")), fmt.Sprint([]string{adminID, plainID}); got != want {
		t.Errorf("CLIENT LIST TYPE normal = %s, want %s", got, want)
	}
	if got := fmt.Sprint(ids("TYPE", "replica")); got != "[]" {
		t.Errorf("CLIENT LIST TYPE replica = %s, want none", got)
	}
	// Redis lists the IDs in the order given, repeats too; the whole list
	// in connection order (a map's order made both flaky).
	if got, want := fmt.Sprint(ids("ID", subID, plainID, "9999", subID)), fmt.Sprint([]string{subID, plainID, subID}); got != want {
		t.Errorf("CLIENT LIST ID = %s, want %s", got, want)
	}
	if got, want := fmt.Sprint(ids()), fmt.Sprint([]string{adminID, plainID, subID}); got != want {
		t.Errorf("CLIENT LIST = %s, want %s", got, want)
	}
	direct := dialRaw(t, p.Redis.Addr())
	for _, bad := range [][]string{{"TYPE", "bogus"}, {"ID", "abc"}, {"ID", "1", "abc"}, {"foo"}, {"TYPE"}, {"ID"}, {"TYPE", "normal", "x"}} {
		cmd := append([]string{"CLIENT", "LIST"}, bad...)
		if got, want := fmt.Sprint(admin.do(cmd...)), fmt.Sprint(direct.do(cmd...)); got != want {
			t.Errorf("%v: proxy %q, Redis %q", cmd, got, want)
		}
	}
	if n := admin.do("CLIENT", "KILL", "TYPE", "pubsub"); n != int64(1) {
		t.Fatalf("CLIENT KILL TYPE pubsub = %v, want 1 (the subscriber)", n)
	}
	if v := plain.do("PING"); v != "PONG" {
		t.Fatalf("a normal client after CLIENT KILL TYPE pubsub: %v", v)
	}
	if n := admin.do("CLIENT", "KILL", "TYPE", "normal"); n != int64(1) {
		t.Fatalf("CLIENT KILL TYPE normal = %v, want 1 (not itself)", n)
	}
}

// Redis skips the two bytes after a bulk string unread, so a request
// whose bulks are not ended by CRLF runs there; the proxy answered a
// protocol error and closed (found by the differential test). Through the
// proxy such requests now run as on Redis, the write with them included.
func TestBulkNotEndedByCRLFAsRedis(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	wire := "*3\r\n$3\r\nSET\r\n$4\r\ncrlf\r\n$1\r\nvxx*1\r\n$4\r\nPINGab*2\r\n$4\r\nECHO\r\n$3\r\nabcd\r\n*2\r\n$3\r\nGET\r\n$4\r\ncrlf\r\n"
	viaProxy, direct := dialRaw(t, p.Addr), dialRaw(t, p.Redis.Addr())
	for _, c := range []*rawConn{viaProxy, direct} {
		if _, err := c.nc.Write([]byte(wire)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 4 {
		got, _ := viaProxy.readReply()
		want, _ := direct.readReply()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("reply %d: proxy %v, Redis %v", i, got, want)
		}
	}
	if v := viaProxy.do("PING"); v != "PONG" {
		t.Fatalf("PING after: %v", v)
	}
}

// A relay that cannot count its replies refuses writes past the 1024 it
// can keep marked. With replies muted (CLIENT REPLY OFF before the relay,
// or on it) the refusal never reached the client, and the writes were
// lost without a word (found by review: 1024 of 1100 SETs ran). The
// client is closed instead, behind what it sent before, and the close is
// counted.
func TestMutedRelayClosesRatherThanDropWrites(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) { c.LocalCache.Enabled = true })
	for _, start := range [][][]string{
		{{"CLIENT", "REPLY", "OFF"}, {"CLIENT", "TRACKING", "ON"}},
		{{"CLIENT", "TRACKING", "ON"}, {"CLIENT", "REPLY", "OFF"}},
		{{"CLIENT", "TRACKING", "ON"}, {"CLIENT", "REPLY", "SKIP"}, {"PING"}, {"CLIENT", "REPLY", "OFF"}},
		{{"CLIENT", "TRACKING", "ON"}, {"CLIENT", "REPLY", "OFF"}, {"CLIENT", "REPLY", "ON"}, {"CLIENT", "REPLY", "OFF"}},
	} {
		p.Redis.Client(t).FlushAll(ctx)
		c := dialRaw(t, p.Addr)
		c.do("HELLO", "3")
		c.send(start...)
		muted, skip := false, false
		for _, cmd := range start { // read the replies Redis would send
			if len(cmd) < 3 {
				cmd = append(cmd, "", "")
			}
			switch {
			case cmd[1] == "REPLY" && cmd[2] == "OFF":
				muted = true
			case cmd[1] == "REPLY" && cmd[2] == "SKIP":
				skip = true
			case cmd[1] == "REPLY" && cmd[2] == "ON":
				muted = false
				c.readReply()
			case !muted && !skip:
				c.readReply()
			default:
				skip = false
			}
		}
		var w [][]string
		for i := range 1100 {
			w = append(w, []string{"SET", fmt.Sprintf("muted:%d", i), "v"})
		}
		c.send(w...)
		c.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.rd.ReadByte(); err == nil {
			t.Fatalf("%v: the client got a reply with replies off", start)
		} else if ne, isNet := err.(net.Error); isNet && ne.Timeout() {
			t.Fatalf("%v: the client was not closed after its writes could not be tracked", start)
		}
		if n := p.Redis.Client(t).DBSize(ctx).Val(); n != 1024 {
			t.Fatalf("%v: %d keys written, want the 1024 before the one refused", start, n)
		}
	}
	waitCloses(t, p, map[string]float64{metrics.CloseHeldWrites: 4})
	// Replies on again (on the relay, after OFF or SKIP): the client reads
	// the refusals, and is not closed (found by review: any CLIENT REPLY
	// made the relay close it, with its replies cut off).
	for _, start := range [][][]string{
		{{"CLIENT", "TRACKING", "ON"}, {"CLIENT", "REPLY", "ON"}},
		{{"CLIENT", "TRACKING", "ON"}, {"CLIENT", "REPLY", "OFF"}, {"CLIENT", "REPLY", "ON"}},
	} {
		p.Redis.Client(t).FlushAll(ctx)
		c := dialRaw(t, p.Addr)
		c.do("HELLO", "3")
		c.send(start...)
		c.readReply() // TRACKING ON's
		c.readReply() // the last REPLY ON's
		var w [][]string
		for i := range 1100 {
			w = append(w, []string{"SET", fmt.Sprintf("muted:%d", i), "v"})
		}
		c.send(w...)
		oks, refused := 0, 0
		for range 1100 {
			switch v, _ := c.readReply(); {
			case v == "OK":
				oks++
			case strings.Contains(fmt.Sprint(v), "too many writes"):
				refused++
			default:
				t.Fatalf("%v: reply %v", start, v)
			}
		}
		if oks != 1024 || refused != 76 {
			t.Fatalf("%v: %d OK and %d refused, want 1024 and 76", start, oks, refused)
		}
		if v := c.do("PING"); v != "PONG" {
			t.Fatalf("%v: PING after the refusals: %v", start, v)
		}
	}
}

// In cluster mode MONITOR is the proxy's own merge of every primary's
// feed; it answered a muted client's commands anyway (found by review).
// With CLIENT REPLY OFF set before it, as on Redis, the client gets
// nothing but the feed: no +OK, no refusal, and QUIT closes silently.
func TestClusterMonitorKeepsRepliesOff(t *testing.T) {
	_, p := startClusterProxy(t)
	c := dialRaw(t, p.Addr)
	c.send([]string{"CLIENT", "REPLY", "OFF"}, []string{"MONITOR"}, []string{"PING"})
	c.send([]string{"GET", "k"}, []string{"QUIT"})
	c.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	rest, err := io.ReadAll(c.rd)
	if err != nil {
		t.Fatalf("the connection did not close at QUIT: %v (read %q)", err, rest)
	}
	for _, line := range strings.Split(string(rest), "\r\n") {
		if line == "+OK" || strings.HasPrefix(line, "-") {
			t.Fatalf("a muted MONITOR client got %q; all it got: %q", line, rest)
		}
	}
}
