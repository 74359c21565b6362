package proxy_test

// Transaction and connection-state safety (issue 9, items 1-4, 15, 16, 20,
// 21): a command the proxy answered is never also forwarded, nothing of a
// transaction runs outside it, and connection state a client sets lands
// only on connections that are its own.

import (
	"bytes"
	"io"
	"net"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/upstream"
)

func onePinned(c *config.Config) { c.Upstream.MaxPinned = 1 }

// holdPinned takes the proxy's only dedicated connection (max_pinned = 1)
// with a WATCH from a client of its own.
func holdPinned(t *testing.T, p *proxytest.Proxy) *rawConn {
	t.Helper()
	holder := dialRaw(t, p.Addr)
	wantReplies(t, holder, []string{"WATCH", "held"}, "OK")
	return holder
}

// wantReplies sends cmds in one write and checks their replies in order.
// Errors are compared by prefix (respError), everything else exactly.
func wantReplies(t *testing.T, c *rawConn, cmds ...any) {
	t.Helper()
	var send [][]string
	var want []any
	for _, x := range cmds {
		if cmd, ok := x.([]string); ok {
			send = append(send, cmd)
		} else {
			want = append(want, x)
		}
	}
	c.send(send...)
	for i, w := range want {
		got, _ := c.readReply()
		if we, ok := w.(respError); ok {
			if ge, ok := got.(respError); ok && strings.HasPrefix(string(ge), string(we)) {
				continue
			}
		} else if reflect.DeepEqual(got, w) {
			continue
		}
		t.Fatalf("after %v: reply %d is %#v, want %#v", send, i, got, w)
	}
}

const errMaxPinned = respError("ERR redproxy: too many dedicated upstream connections in use (upstream.max_pinned)")

func pubsubSubscribers(t *testing.T, p *proxytest.Proxy, ch string) int64 {
	t.Helper()
	m, err := p.Redis.Client(t).PubSubNumSub(ctx, ch).Result()
	if err != nil {
		t.Fatal(err)
	}
	return m[ch]
}

// A relay that cannot start (max_pinned reached) answers the error and
// sends nothing: the command must not reach a shared connection, where a
// RESP2 subscription turns the connection into a subscriber and a RESP3
// push is dropped, shifting every later reply on it by one client.
func TestRelayThatCannotStartIsNotForwarded(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) { onePinned(c); c.Upstream.Connections = 1 })
	holdPinned(t, p)
	if err := p.Redis.Client(t).Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	for _, start := range [][]string{{"SUBSCRIBE", "ch"}, {"PSUBSCRIBE", "ch*"}, {"MONITOR"}, {"CLIENT", "TRACKING", "ON"}} {
		t.Run(strings.Join(start, " "), func(t *testing.T) {
			for _, proto := range []string{"2", "3"} {
				c := dialRaw(t, p.Addr)
				c.do("HELLO", proto)
				wantReplies(t, c, start, []string{"GET", "k"}, errMaxPinned, "v")
				wantReplies(t, c, []string{"GET", "k"}, "v")
			}
			// Others on the same shared connections get their own replies.
			for _, proto := range []int{2, 3} {
				other := p.Client(t, func(o *redis.Options) { o.Protocol = proto })
				for i := 0; i < 3; i++ {
					if v, err := other.Get(ctx, "k").Result(); err != nil || v != "v" {
						t.Fatalf("RESP%d GET k after a refused %v: %q %v", proto, start, v, err)
					}
				}
			}
		})
	}
	if n := pubsubSubscribers(t, p, "ch"); n != 0 {
		t.Fatalf("a refused SUBSCRIBE left %d subscriptions in Redis", n)
	}
}

// The same when Redis refuses the relay's connection (maxclients reached).
// The refusal is an outage, as Redis down is: the error, then the client's
// connection closes as Redis closes a connection it refuses for its client
// limit, without answering (or forwarding) what was pipelined after it
// (upstreamlost.go); the library reconnects and subscribes again.
func TestRelayWhoseDialFailsIsNotForwarded(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Upstream.Connections = 1 })
	direct := dialRaw(t, p.Redis.Addr())
	wantReplies(t, direct, []string{"SET", "k", "v"}, "OK")
	c := dialRaw(t, p.Addr)
	wantReplies(t, c, []string{"GET", "k"}, "v") // the shared connection is up
	info := direct.do("INFO", "clients").(string)
	connected := strings.TrimSpace(strings.Split(strings.Split(info, "connected_clients:")[1], "\n")[0])
	wantReplies(t, direct, []string{"CONFIG", "SET", "maxclients", connected}, "OK")
	for _, start := range [][]string{{"SUBSCRIBE", "ch"}, {"CLIENT", "TRACKING", "ON"}} {
		c := dialRaw(t, p.Addr)
		wantReplies(t, c, start, []string{"GET", "k"}, respError("ERR redproxy: upstream unavailable"))
		if !connClosed(c.nc) {
			t.Fatalf("%v refused for maxclients: the connection stays open", start)
		}
		// The shared connection is in order: nothing of the refused
		// command reached it.
		wantReplies(t, dialRaw(t, p.Addr), []string{"GET", "k"}, "v")
	}
	wantReplies(t, direct, []string{"CONFIG", "SET", "maxclients", "10000"}, "OK")
	if n := pubsubSubscribers(t, p, "ch"); n != 0 {
		t.Fatalf("a refused SUBSCRIBE left %d subscriptions in Redis", n)
	}
}

// SUBSCRIBE, MONITOR and CLIENT TRACKING ON under WATCH would move the
// client to a relay connection of its own and silently drop the WATCH, so
// a later EXEC would run unchecked. They are refused; the WATCH stays.
func TestRelayUnderWatchIsRefusedAndWatchKept(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	direct := p.Redis.Client(t)
	for _, start := range [][]string{{"SUBSCRIBE", "ch"}, {"SSUBSCRIBE", "ch"}, {"MONITOR"}, {"CLIENT", "TRACKING", "ON"}, {"CLIENT", "TRACKING", "ON", "BCAST"}} {
		for _, proto := range []string{"2", "3"} {
			c := dialRaw(t, p.Addr)
			c.do("HELLO", proto)
			wantReplies(t, c, []string{"SET", "w", "mine"}, []string{"WATCH", "w"}, start, "OK", "OK",
				respError("ERR redproxy: "+relayName(start)+" while WATCH is active is not supported"))
			if err := direct.Set(ctx, "w", "changed", 0).Err(); err != nil {
				t.Fatal(err)
			}
			wantReplies(t, c, []string{"MULTI"}, []string{"SET", "w", "mine"}, []string{"EXEC"}, "OK", "QUEUED", nil)
			if v := direct.Get(ctx, "w").Val(); v != "changed" {
				t.Fatalf("RESP%s %v under WATCH: EXEC ran unchecked, w=%q", proto, start, v)
			}
		}
	}
	if n := pubsubSubscribers(t, p, "ch"); n != 0 {
		t.Fatalf("a refused SUBSCRIBE left %d subscriptions in Redis", n)
	}
}

func relayName(cmd []string) string {
	if cmd[0] == "CLIENT" {
		return "CLIENT " + cmd[1]
	}
	return cmd[0]
}

// CLIENT TRACKING ... REDIRECT <id> names a proxy client id, which on Redis
// names some other connection: the invalidations (key names) would go to
// it. It is refused, also on a connection that is already a relay.
func TestTrackingRedirectIsRefused(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	direct := p.Redis.Client(t)
	// A connection straight to Redis listening for invalidations: the one a
	// forwarded REDIRECT would most likely name is some such connection.
	listener := dialRaw(t, p.Redis.Addr())
	rid := listener.do("CLIENT", "ID").(int64)
	wantReplies(t, listener, []string{"SUBSCRIBE", "__redis__:invalidate"}, []any{"subscribe", "__redis__:invalidate", int64(1)})
	redirect := strconv.FormatInt(rid, 10)
	const refused = respError("ERR redproxy: CLIENT TRACKING REDIRECT is not supported")

	c := dialRaw(t, p.Addr)
	wantReplies(t, c, []string{"CLIENT", "TRACKING", "ON", "REDIRECT", redirect}, []string{"GET", "tk"}, refused, nil)
	wantReplies(t, c, []string{"CLIENT", "TRACKING", "ON", "BCAST", "redirect", redirect}, refused)
	// Already a relay (RESP3 tracking): REDIRECT must not reach Redis either.
	r3 := dialRaw(t, p.Addr)
	r3.do("HELLO", "3")
	wantReplies(t, r3, []string{"CLIENT", "TRACKING", "ON"}, "OK")
	wantReplies(t, r3, []string{"CLIENT", "TRACKING", "OFF"}, []string{"CLIENT", "TRACKING", "ON", "REDIRECT", redirect}, []string{"GET", "tk"}, "OK", refused, nil)

	if err := direct.Set(ctx, "tk", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// Invalidation is sent while SET runs, so had one been meant for the
	// listener it would arrive before this marker.
	if err := direct.Publish(ctx, "__redis__:invalidate", "marker").Err(); err != nil {
		t.Fatal(err)
	}
	if got, _ := listener.readReply(); !reflect.DeepEqual(got, []any{"message", "__redis__:invalidate", "marker"}) {
		t.Fatalf("another connection received an invalidation meant for a proxy client: %#v", got)
	}
}

// killPinned closes, from Redis's side, the proxy's dedicated connections
// that carry name, as a Redis timeout, CLIENT KILL or failover would.
func killPinned(t *testing.T, p *proxytest.Proxy, name string) {
	t.Helper()
	direct := p.Redis.Client(t)
	list, err := direct.ClientList(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	killed := 0
	for _, line := range strings.Split(strings.TrimSpace(list), "\n") {
		if !strings.Contains(line, " name="+name+" ") {
			continue
		}
		id := strings.TrimPrefix(strings.Fields(line)[0], "id=")
		if err := direct.Do(ctx, "CLIENT", "KILL", "ID", id).Err(); err != nil {
			t.Fatal(err)
		}
		killed++
	}
	if killed == 0 {
		t.Fatalf("no upstream connection named %s in\n%s", name, list)
	}
}

// After the pinned connection of a WATCH is lost, nothing up to EXEC may
// run: not unguarded by the WATCH, and not outside MULTI on a shared
// connection, where a client that retries on EXEC's failure would apply it
// twice. EXEC answers EXECABORT as Redis does for a transaction with
// errors; then the client is an ordinary one again.
func TestLostPinnedConnectionAbortsTheTransaction(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	direct := p.Redis.Client(t)
	c := dialRaw(t, p.Addr)
	wantReplies(t, c, []string{"WATCH", "w"}, "OK")
	killPinned(t, p, "redproxy-pinned")
	// Whether or not the proxy has noticed the loss yet, this fails, and
	// afterwards it has.
	wantReplies(t, c, []string{"GET", "w"}, respError("ERR redproxy: "))
	wantReplies(t, c, []string{"MULTI"}, []string{"INCR", "a"}, []string{"EXEC"},
		"OK", respError("ERR redproxy: "), respError("EXECABORT"))
	if n := direct.Exists(ctx, "a").Val(); n != 0 {
		t.Fatalf("INCR a ran outside the aborted transaction")
	}
	wantReplies(t, c, []string{"INCR", "a"}, int64(1))

	// Lost inside MULTI: the same.
	wantReplies(t, c, []string{"WATCH", "w"}, []string{"MULTI"}, []string{"INCR", "b"}, "OK", "OK", "QUEUED")
	killPinned(t, p, "redproxy-pinned")
	wantReplies(t, c, []string{"INCR", "b"}, respError("ERR redproxy: "))
	wantReplies(t, c, []string{"INCR", "b"}, []string{"EXEC"}, []string{"INCR", "b"}, respError("ERR redproxy: "), respError("EXECABORT"), int64(1))

	// Lost under WATCH alone: UNWATCH ends it too, DISCARD does not (there
	// is no MULTI to discard).
	wantReplies(t, c, []string{"WATCH", "w"}, "OK")
	killPinned(t, p, "redproxy-pinned")
	wantReplies(t, c, []string{"GET", "w"}, respError("ERR redproxy: "))
	wantReplies(t, c, []string{"DISCARD"}, []string{"UNWATCH"}, []string{"INCR", "b"}, respError("ERR "), "OK", int64(2))
}

// A MULTI that gets no connection because max_pinned is reached aborts
// the transaction: the commands queued after it fail, naming why, instead
// of running one by one on a shared connection, and EXEC answers
// EXECABORT. MULTI itself answers +OK, as Redis does, so a client that
// stops reading at an error from MULTI is not left one reply behind.
func TestRefusedMultiAbortsTheTransaction(t *testing.T) {
	p := proxytest.Start(t, nil, onePinned)
	holder := holdPinned(t, p)
	c := dialRaw(t, p.Addr)
	aborted := respError("ERR redproxy: transaction aborted: too many dedicated upstream connections in use (upstream.max_pinned); EXEC or DISCARD ends it")
	wantReplies(t, c, []string{"MULTI"}, []string{"INCR", "a"}, []string{"SET", "b", "1"}, []string{"EXEC"}, []string{"GET", "a"},
		"OK", aborted, aborted, respError("EXECABORT"), nil)
	wantReplies(t, c, []string{"MULTI"}, []string{"INCR", "a"}, []string{"MULTI"}, []string{"DISCARD"}, []string{"GET", "a"},
		"OK", aborted, respError("ERR MULTI calls can not be nested"), "OK", nil)
	if n := p.Redis.Client(t).Exists(ctx, "a", "b").Val(); n != 0 {
		t.Fatalf("commands of a refused MULTI ran: %d keys exist", n)
	}
	// With the connection free again, transactions work.
	wantReplies(t, holder, []string{"UNWATCH"}, "OK")
	wantReplies(t, c, []string{"MULTI"}, []string{"INCR", "a"}, []string{"EXEC"}, "OK", "QUEUED", []any{int64(1)})
}

// As on Redis, UNWATCH inside MULTI is queued; it does not abort the
// transaction.
func TestUnwatchInsideMultiIsQueued(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	c := dialRaw(t, p.Addr)
	wantReplies(t, c, []string{"MULTI"}, []string{"SET", "a", "1"}, []string{"UNWATCH"}, []string{"EXEC"},
		"OK", "QUEUED", "QUEUED", []any{"OK", "OK"})
	wantReplies(t, c, []string{"WATCH", "a"}, []string{"MULTI"}, []string{"UNWATCH"}, []string{"INCR", "a"}, []string{"EXEC"},
		"OK", "OK", "QUEUED", "QUEUED", []any{"OK", int64(2)})
}

// CLIENT REPLY OFF mutes transactions too, as on Redis: no +OK for MULTI,
// no +QUEUED, no EXEC array; the commands still run.
func TestClientReplyOffMutesTransactions(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	expect := lineExpecter(t, p, exact)
	expect("CLIENT REPLY OFF\r\nMULTI\r\nSET a 1\r\nINCR a\r\nEXEC\r\nWATCH a\r\nMULTI\r\nINCR a\r\nEXEC\r\nCLIENT REPLY ON\r\nGET a\r\n",
		"+OK\r\n", "$1\r\n", "3\r\n")
	expect("CLIENT REPLY SKIP\r\nMULTI\r\nINCR a\r\nEXEC\r\n", "+QUEUED\r\n", "*1\r\n", ":4\r\n")
}

func exact(line, want string) bool { return line == want }

// CLIENT UNBLOCK names a proxy client; its blocking command runs on a
// dedicated connection, whose Redis id the proxy substitutes, so the
// TIMEOUT and ERROR variants work as on Redis, also under WATCH. Ids of no
// blocked client answer 0, and a Redis connection whose id happens to
// equal the proxy id is never touched.
func TestClientUnblockReachesTheBlockedClient(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	direct := p.Redis.Client(t)
	admin := dialRaw(t, p.Addr)
	unblock := func(id int64, mode ...string) []string {
		return append([]string{"CLIENT", "UNBLOCK", strconv.FormatInt(id, 10)}, mode...)
	}
	for _, tc := range []struct {
		watch bool
		mode  []string
		want  any
	}{
		{false, nil, nil},
		{false, []string{"timeout"}, nil},
		{false, []string{"ERROR"}, respError("UNBLOCKED client unblocked via CLIENT UNBLOCK")},
		{true, nil, nil},
		{true, []string{"ERROR"}, respError("UNBLOCKED client unblocked via CLIENT UNBLOCK")},
	} {
		blocked := dialRaw(t, p.Addr)
		id := blocked.do("CLIENT", "ID").(int64)
		if tc.watch {
			wantReplies(t, blocked, []string{"WATCH", "ub:w"}, "OK")
		}
		blocked.send([]string{"BLPOP", "ub:q", "0"})
		redistest.Eventually(t, 5*time.Second, func() bool { return blockedClients(direct) == 1 }, "BLPOP never blocked")
		wantReplies(t, admin, unblock(id, tc.mode...), int64(1))
		if got, _ := blocked.readReply(); !reflect.DeepEqual(got, tc.want) {
			t.Fatalf("unblocked %v: BLPOP answered %#v, want %#v", tc, got, tc.want)
		}
		wantReplies(t, admin, unblock(id, tc.mode...), int64(0))
		if tc.watch {
			wantReplies(t, blocked, []string{"MULTI"}, []string{"SET", "ub:w", "1"}, []string{"EXEC"}, "OK", "QUEUED", []any{"OK"})
		}
		wantReplies(t, blocked, []string{"LPUSH", "ub:q", "x"}, []string{"BLPOP", "ub:q", "0"}, int64(1), []any{"ub:q", "x"})
	}

	// Not blocked, unknown, or itself: 0. Bad arguments: Redis's errors.
	self := admin.do("CLIENT", "ID").(int64)
	wantReplies(t, admin, unblock(self), unblock(self+1000), unblock(1, "FOO"), []string{"CLIENT", "UNBLOCK", "x"},
		int64(0), int64(0), respError("ERR CLIENT UNBLOCK reason should be TIMEOUT or ERROR"), respError("ERR value is not an integer or out of range"))

	// A connection straight to Redis, blocked: its Redis id means nothing
	// to the proxy, and must not be forwarded as is.
	other := dialRaw(t, p.Redis.Addr())
	rid := other.do("CLIENT", "ID").(int64)
	other.send([]string{"BLPOP", "ub:d", "0"})
	redistest.Eventually(t, 5*time.Second, func() bool { return blockedClients(direct) == 1 }, "direct BLPOP never blocked")
	for id := int64(1); id <= rid; id++ {
		wantReplies(t, admin, unblock(id), int64(0))
	}
	// A relayed client's commands go to Redis raw; UNBLOCK is refused there.
	relayed := dialRaw(t, p.Addr)
	relayed.do("HELLO", "3")
	wantReplies(t, relayed, []string{"CLIENT", "TRACKING", "ON"}, unblock(rid), "OK",
		respError("ERR redproxy: CLIENT UNBLOCK is not supported on a connection in subscribed, tracking or MONITOR mode"))
	direct.RPush(ctx, "ub:d", "x")
	if got, _ := other.readReply(); !reflect.DeepEqual(got, []any{"ub:d", "x"}) {
		t.Fatalf("a Redis connection blocked directly was unblocked through the proxy: %#v", got)
	}

	// Inside MULTI it would run at EXEC with the proxy id: refused.
	wantReplies(t, admin, []string{"MULTI"}, unblock(1), []string{"EXEC"}, "OK",
		respError("ERR redproxy: 'CLIENT UNBLOCK' inside MULTI is not supported"), respError("EXECABORT"))
}

// infoFields returns the field names of a CLIENT INFO/LIST line, in order.
func infoFields(line string) []string {
	var names []string
	for _, f := range strings.Fields(line) {
		k, _, _ := strings.Cut(f, "=")
		names = append(names, k)
	}
	return names
}

func infoValue(line, key string) string {
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, key+"="); ok {
			return v
		}
	}
	return "<missing " + key + ">"
}

// CLIENT INFO and CLIENT LIST answered by the proxy carry every field
// Redis prints, in Redis's order, with values that follow the client's
// state: tools that parse the lines work.
func TestClientInfoHasEveryRedisField(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	redisLine := dialRaw(t, p.Redis.Addr()).do("CLIENT", "INFO").(string)
	// Redis 7.2's fields; older servers print a prefix of them.
	want := strings.Fields("id addr laddr fd name age idle flags db sub psub ssub multi qbuf qbuf-free argv-mem multi-mem rbs rbp obl oll omem tot-mem events cmd user redir resp lib-name lib-ver")
	if got := infoFields(redisLine); !reflect.DeepEqual(got, want[:len(got)]) {
		t.Fatalf("Redis prints fields %v; the test expects a prefix of %v", got, want)
	}

	c := dialRaw(t, p.Addr)
	wantReplies(t, c, []string{"CLIENT", "SETNAME", "app"}, []string{"SELECT", "3"}, "OK", "OK")
	line := c.do("CLIENT", "INFO").(string)
	if got := infoFields(line); !reflect.DeepEqual(got, want) {
		t.Fatalf("CLIENT INFO fields\n got %v\nwant %v", got, want)
	}
	for k, v := range map[string]string{"id": strconv.FormatInt(c.do("CLIENT", "ID").(int64), 10), "name": "app", "db": "3", "flags": "N",
		"multi": "-1", "cmd": "client|info", "user": "default", "redir": "-1", "resp": "2", "addr": c.nc.LocalAddr().String()} {
		if got := infoValue(line, k); got != v {
			t.Errorf("CLIENT INFO %s=%s, want %s in %q", k, got, v, line)
		}
	}

	// Flags and multi follow the client's state, in CLIENT LIST as seen by
	// another client.
	inMulti := dialRaw(t, p.Addr)
	wantReplies(t, inMulti, []string{"MULTI"}, []string{"INCR", "m"}, []string{"INCR", "m"}, "OK", "QUEUED", "QUEUED")
	blocked := dialRaw(t, p.Addr)
	blocked.send([]string{"BLPOP", "info:q", "0"})
	sub := dialRaw(t, p.Addr)
	wantReplies(t, sub, []string{"SUBSCRIBE", "info:ch"}, []any{"subscribe", "info:ch", int64(1)})
	redistest.Eventually(t, 5*time.Second, func() bool { return blockedClients(p.Redis.Client(t)) == 1 }, "BLPOP never blocked")
	byID := map[int64]string{}
	for _, l := range strings.Split(strings.TrimSpace(c.do("CLIENT", "LIST").(string)), "\n") {
		if got := infoFields(l); !reflect.DeepEqual(got, want) {
			t.Fatalf("CLIENT LIST line fields\n got %v\nwant %v", got, want)
		}
		n, _ := strconv.ParseInt(infoValue(l, "id"), 10, 64)
		byID[n] = l
	}
	if len(byID) != 4 {
		t.Fatalf("CLIENT LIST has %d clients, want 4:\n%v", len(byID), byID)
	}
	for _, tc := range []struct {
		who          *rawConn
		flags, multi string
	}{{inMulti, "x", "2"}, {blocked, "b", "-1"}, {sub, "P", "-1"}} {
		l := byID[idOf(t, p, tc.who)]
		if infoValue(l, "flags") != tc.flags || infoValue(l, "multi") != tc.multi {
			t.Errorf("want flags=%s multi=%s in %q", tc.flags, tc.multi, l)
		}
	}
}

// idOf finds a client's proxy id by its address.
func idOf(t *testing.T, p *proxytest.Proxy, c *rawConn) int64 {
	t.Helper()
	list, err := p.Client(t).ClientList(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(list, "\n") {
		if infoValue(l, "addr") == c.nc.LocalAddr().String() {
			n, _ := strconv.ParseInt(infoValue(l, "id"), 10, 64)
			return n
		}
	}
	t.Fatalf("no client with addr %s", c.nc.LocalAddr())
	return 0
}

// upstreamNamed returns Redis's CLIENT LIST lines of connections named name.
func upstreamNamed(t *testing.T, p *proxytest.Proxy, name string) []string {
	t.Helper()
	list, err := p.Redis.Client(t).ClientList(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(list), "\n") {
		if infoValue(l, "name") == name {
			out = append(out, l)
		}
	}
	return out
}

// A client's CLIENT SETNAME reaches the upstream connections that are its
// own (pinned, borrowed, relayed), so Redis's CLIENT LIST and SLOWLOG show
// whose they are; a pinned or borrowed connection gets its own name back
// before another client uses it. Shared connections keep the proxy's name.
func TestClientNameReachesItsOwnConnections(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	c := dialRaw(t, p.Addr)
	wantReplies(t, c, []string{"CLIENT", "SETNAME", "app"}, []string{"GET", "k"}, "OK", nil)
	if l := upstreamNamed(t, p, "app"); len(l) != 0 {
		t.Fatalf("a shared connection took a client's name: %v", l)
	}

	wantReplies(t, c, []string{"WATCH", "k"}, "OK")
	if l := upstreamNamed(t, p, "app"); len(l) != 1 {
		t.Fatalf("pinned connection named app: %v, want one", l)
	}
	wantReplies(t, c, []string{"CLIENT", "SETNAME", "app2"}, "OK")
	if l := upstreamNamed(t, p, "app2"); len(l) != 1 {
		t.Fatalf("pinned connection renamed app2: %v, want one", l)
	}
	wantReplies(t, c, []string{"UNWATCH"}, "OK")
	if l := upstreamNamed(t, p, "app2"); len(l) != 0 {
		t.Fatalf("an idle pinned connection kept the client's name: %v", l)
	}
	if l := upstreamNamed(t, p, "redproxy-pinned"); len(l) != 1 {
		t.Fatalf("the pinned connection did not go back to the pool under its own name: %v", l)
	}

	c.send([]string{"BLPOP", "nq", "0"})
	redistest.Eventually(t, 5*time.Second, func() bool {
		l := upstreamNamed(t, p, "app2")
		return len(l) == 1 && infoValue(l[0], "cmd") == "blpop"
	}, "the borrowed connection of a BLPOP does not carry the client's name")
	p.Redis.Client(t).RPush(ctx, "nq", "x")
	if got, _ := c.readReply(); !reflect.DeepEqual(got, []any{"nq", "x"}) {
		t.Fatalf("BLPOP: %#v", got)
	}
	wantReplies(t, c, []string{"PING"}, "PONG")
	if l := upstreamNamed(t, p, "app2"); len(l) != 0 {
		t.Fatalf("an idle borrowed connection kept the client's name: %v", l)
	}

	wantReplies(t, c, []string{"SUBSCRIBE", "nch"}, []any{"subscribe", "nch", int64(1)})
	if l := upstreamNamed(t, p, "app2"); len(l) != 1 || infoValue(l[0], "flags") != "P" {
		t.Fatalf("the relay connection of a subscriber named app2: %v, want one with flags=P", l)
	}
}

// SLOWLOG, recorded by Redis per connection, names the connection a
// command ran on: for shared connections the proxy's own name and address
// (many clients' commands share them), for a client's own connections the
// client's name. Documented in docs/COMPATIBILITY.md.
func TestSlowlogNamesTheConnection(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	direct := p.Redis.Client(t)
	if err := direct.ConfigSet(ctx, "slowlog-log-slower-than", "0").Err(); err != nil {
		t.Fatal(err)
	}
	direct.RPush(ctx, "sl:borrowed", "x")
	direct.SlowLogReset(ctx)
	c := dialRaw(t, p.Addr)
	wantReplies(t, c, []string{"CLIENT", "SETNAME", "app"}, []string{"SET", "sl:shared", "1"}, []string{"BLPOP", "sl:borrowed", "0"},
		"OK", "OK", []any{"sl:borrowed", "x"})
	logs, err := direct.SlowLogGet(ctx, 100).Result()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	for _, l := range logs {
		if len(l.Args) > 0 {
			names[strings.ToUpper(l.Args[0])] = l.ClientName
		}
	}
	if names["SET"] != "redproxy" || names["BLPOP"] != "app" {
		t.Fatalf("SLOWLOG client names: SET %q (want redproxy), BLPOP %q (want app)", names["SET"], names["BLPOP"])
	}
}

// CLIENT KILL names proxy clients (ids, addresses). Queued in MULTI it
// would run at EXEC on Redis, and sent raw from a relayed client it would
// reach Redis as is: either way an id or address of the proxy's numbering
// could kill an unrelated Redis connection (the proxy's own shared ones
// included). In MULTI it is refused; on a relay the proxy answers it for
// its own clients (TestRelayedClientKill); the Redis connection lives on.
func TestClientKillNeverReachesRedisWithProxyIDs(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	victim := dialRaw(t, p.Redis.Addr())
	rid := victim.do("CLIENT", "ID").(int64)
	kill := []string{"CLIENT", "KILL", "ID", strconv.FormatInt(rid, 10)}

	tx := dialRaw(t, p.Addr)
	wantReplies(t, tx, []string{"MULTI"}, kill, []string{"EXEC"}, "OK",
		respError("ERR redproxy: 'CLIENT KILL' inside MULTI is not supported"), respError("EXECABORT"))

	for _, proto := range []string{"2", "3"} {
		relayed := dialRaw(t, p.Addr)
		relayed.do("HELLO", proto)
		wantReplies(t, relayed, []string{"CLIENT", "TRACKING", "ON", "BCAST"}, "OK")
		if n, isInt := relayed.do(kill...).(int64); !isInt || n > 1 {
			t.Fatalf("RESP%s relayed CLIENT KILL answered %v, want the proxy's count (0 or 1)", proto, n)
		}
	}
	wantReplies(t, victim, []string{"PING"}, "PONG")
}

// A WATCH whose connection is lost before it is answered (a kept pinned
// connection Redis had closed, CLIENT KILL or a restart, taken before the
// proxy noticed) is answered with the error and leaves nothing behind:
// the client was told before it had anything to guard, and what it sent
// behind the WATCH went on that connection and failed too. The pin was
// kept, and the client's next command put it in the aborted state, which
// only UNWATCH, EXEC or DISCARD ends; go-redis sends UNWATCH only after a
// WATCH that succeeded, so one CLIENT KILL left a go-redis connection
// failing every command (found by review). Under MULTI the abort stays
// (TestLostPinnedConnectionAbortsTheTransaction).
func TestWatchLostBeforeItsReplyLeavesNoTransaction(t *testing.T) {
	rs := redistest.Start(t)
	var armed atomic.Bool
	fwd := cutOnWatch(t, rs.Addr(), &armed)
	p := proxytest.Start(t, rs, func(c *config.Config) { c.Upstream.Address = fwd })
	lost := respError("ERR redproxy: upstream connection lost")

	c := dialRaw(t, p.Addr)
	armed.Store(true)
	wantReplies(t, c, []string{"WATCH", "wl"}, lost)
	wantReplies(t, c, []string{"SET", "wl", "1"}, []string{"PING"}, "OK", "PONG")
	// With what followed it in the same write: that failed too.
	wantReplies(t, c, []string{"WATCH", "wl"}, []string{"GET", "wl"}, lost, lost)
	wantReplies(t, c, []string{"GET", "wl"}, "1")
	// SELECT behind it: it failed too, and the client stays in its
	// database.
	wantReplies(t, c, []string{"WATCH", "wl"}, []string{"SELECT", "3"}, lost, lost)
	wantReplies(t, c, []string{"SET", "wl:db", "0"}, "OK")
	if n := rs.Client(t).Exists(ctx, "wl:db").Val(); n != 1 {
		t.Fatalf("the SET after a failed SELECT 3 went to another database")
	}
	// MULTI behind it in the same write: answered +OK, as Redis answers
	// MULTI (TestTxPipelinedWhileRedisIsDownKeepsConnInStep), and the
	// transaction stays aborted.
	wantReplies(t, c, []string{"WATCH", "wl"}, []string{"MULTI"}, lost, "OK")
	wantReplies(t, c, []string{"INCR", "wl"}, []string{"EXEC"}, []string{"GET", "wl"},
		respError("ERR redproxy: transaction aborted"), respError("EXECABORT"), "1")

	// go-redis: Watch fails, and the connection it goes back to the pool
	// with serves what comes next.
	rc := p.Client(t, func(o *redis.Options) { o.PoolSize = 1 })
	err := rc.Watch(ctx, func(tx *redis.Tx) error { return nil }, "wl")
	if err == nil || !strings.Contains(err.Error(), "upstream connection lost") {
		t.Fatalf("Watch on a lost connection: %v", err)
	}
	armed.Store(false)
	if v, err := rc.Get(ctx, "wl").Result(); err != nil || v != "1" {
		t.Fatalf("GET after the failed Watch: %q, %v", v, err)
	}
	err = rc.Watch(ctx, func(tx *redis.Tx) error {
		_, err := tx.TxPipelined(ctx, func(pipe redis.Pipeliner) error { return pipe.Incr(ctx, "wl").Err() })
		return err
	}, "wl")
	if err != nil {
		t.Fatalf("Watch once the connection is good: %v", err)
	}
	if v := rs.Client(t).Get(ctx, "wl").Val(); v != "2" {
		t.Fatalf("wl = %q after the transaction, want 2", v)
	}
}

// cutOnWatch forwards connections to addr and, while armed, closes any
// that carries a WATCH instead of forwarding it.
func cutOnWatch(t *testing.T, addr string, armed *atomic.Bool) string {
	return cutOnCommand(t, addr, armed, "WATCH")
}

// cutOnCommand is cutOnWatch for the command name (upper case).
func cutOnCommand(t *testing.T, addr string, armed *atomic.Bool, name string) string {
	marker := []byte("\r\n" + name + "\r\n")
	return redistest.Forward(t, addr, func(wg *sync.WaitGroup, down, up net.Conn) {
		wg.Go(func() {
			io.Copy(down, up)
			down.Close()
		})
		wg.Go(func() {
			defer up.Close()
			defer down.Close()
			buf := make([]byte, 64<<10)
			for {
				n, err := down.Read(buf)
				if n > 0 {
					if armed.Load() && bytes.Contains(bytes.ToUpper(buf[:n]), marker) {
						return
					}
					if _, err := up.Write(buf[:n]); err != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		})
	})
}

// go-redis's TxPipelined stops reading at an error from MULTI, leaving the
// replies to the rest of its write unread; on a connection it keeps
// (Client.Conn) every later reply then came one behind: with Redis down,
// MULTI answered the dial error, and after Redis came back SET answered
// EXECABORT and GET "OK" (found by a probe). MULTI answers +OK now and
// the failure comes with the queued command and EXEC, which go-redis reads.
func TestTxPipelinedWhileRedisIsDownKeepsConnInStep(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Upstream.ReconnectMin.Duration = 10 * time.Millisecond })
	c := redis.NewClient(&redis.Options{Addr: p.Addr, PoolSize: 1, MaxRetries: -1}).Conn()
	t.Cleanup(func() { c.Close() })
	if err := c.Set(ctx, "txk", "before", 0).Err(); err != nil {
		t.Fatal(err)
	}
	p.Redis.Kill(t)
	_, err := c.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.Set(ctx, "txk", "v1", 0)
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "EXECABORT") {
		t.Errorf("TxPipelined with Redis down: %v, want EXECABORT", err)
	}
	p.Redis.Restart(t)
	var setErr error
	redistest.Eventually(t, 10*time.Second, func() bool {
		setErr = c.Set(ctx, "txk", "after", 0).Err()
		return setErr == nil || !strings.Contains(setErr.Error(), "upstream unavailable")
	}, "SET through the kept connection after Redis came back: %v", setErr)
	if setErr != nil {
		t.Fatalf("SET after Redis came back: %v", setErr)
	}
	if v, err := c.Get(ctx, "txk").Result(); err != nil || v != "after" {
		t.Fatalf("GET after SET on the kept connection: %q %v, want \"after\"", v, err)
	}
}

// The same when the MULTI's own connection is lost before Redis answers
// it (here cut as the MULTI goes by, so nothing of the transaction
// reaches Redis): MULTI answers +OK and its command and EXEC carry the
// loss, so go-redis's kept connection stays in step.
func TestTxPipelinedOnALostConnectionKeepsConnInStep(t *testing.T) {
	rs := redistest.Start(t)
	var armed atomic.Bool
	fwd := cutOnCommand(t, rs.Addr(), &armed, "MULTI")
	p := proxytest.Start(t, rs, func(c *config.Config) { c.Upstream.Address = fwd })
	c := redis.NewClient(&redis.Options{Addr: p.Addr, PoolSize: 1, MaxRetries: -1}).Conn()
	t.Cleanup(func() { c.Close() })
	armed.Store(true)
	_, err := c.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.Set(ctx, "txlost", "v1", 0)
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "upstream connection lost") {
		t.Errorf("TxPipelined on a connection lost under its MULTI: %v, want the loss", err)
	}
	armed.Store(false)
	for i := range 3 {
		v := strconv.Itoa(i)
		if err := c.Set(ctx, "txlost:canary", v, 0).Err(); err != nil {
			t.Fatalf("SET %d on the kept connection: %v", i, err)
		}
		if got, err := c.Get(ctx, "txlost:canary").Result(); err != nil || got != v {
			t.Fatalf("GET after SET %s on the kept connection: %q %v", v, got, err)
		}
	}
	if n := rs.Client(t).Exists(ctx, "txlost").Val(); n != 0 {
		t.Fatalf("the SET of the cut transaction ran")
	}
}

// A WATCH that gets no connection (here its dial's handshake goes
// unanswered for dead_timeout) fails the rest of its write, as a WATCH
// lost before its reply does: a client that pipelines WATCH, MULTI, SET,
// EXEC reads the WATCH's error only after sending the rest, and the
// transaction behind it committed unguarded (found by a probe, with Redis
// frozen while the WATCH dialled and resumed for the MULTI's).
func TestWatchWithoutAConnectionAbortsItsPipelinedTransaction(t *testing.T) {
	rs := redistest.Start(t)
	var swallowNext atomic.Bool
	fwd := redistest.Forward(t, rs.Addr(), func(wg *sync.WaitGroup, down, up net.Conn) {
		wg.Go(func() {
			io.Copy(down, up)
			down.Close()
		})
		wg.Go(func() {
			defer up.Close()
			buf := make([]byte, 64<<10)
			n, err := down.Read(buf)
			if n > 0 && bytes.Contains(buf[:n], []byte(upstream.PinnedName)) && swallowNext.CompareAndSwap(true, false) {
				// A dedicated connection's handshake, never answered: as
				// a frozen Redis.
				io.Copy(io.Discard, down)
				return
			}
			if n > 0 {
				if _, err := up.Write(buf[:n]); err != nil {
					return
				}
			}
			if err == nil {
				io.Copy(up, down)
			}
		})
	})
	p := proxytest.Start(t, rs, func(c *config.Config) {
		c.Upstream.Address = fwd
		// A dedicated connection's handshake waits dead_timeout, at least
		// reply_timeout and dial_timeout.
		c.Upstream.DialTimeout.Duration = 200 * time.Millisecond
		c.Upstream.ReplyTimeout.Duration = 200 * time.Millisecond
		c.Upstream.DeadTimeout.Duration = 300 * time.Millisecond
	})
	c := dialRaw(t, p.Addr)
	wantReplies(t, c, []string{"SET", "wk", "orig"}, "OK") // the shared connections are up
	swallowNext.Store(true)
	wantReplies(t, c, []string{"WATCH", "wk"}, []string{"MULTI"}, []string{"SET", "wk", "mine"}, []string{"EXEC"},
		respError("ERR redproxy: upstream reply timeout"), "OK", respError("ERR redproxy: transaction aborted"), respError("EXECABORT"))
	if v := rs.Client(t).Get(ctx, "wk").Val(); v != "orig" {
		t.Fatalf("wk = %q: the transaction behind the failed WATCH ran", v)
	}
	// The next write is served as usual.
	wantReplies(t, c, []string{"WATCH", "wk"}, []string{"MULTI"}, []string{"SET", "wk", "mine"}, []string{"EXEC"},
		"OK", "OK", "QUEUED", []any{"OK"})
}
