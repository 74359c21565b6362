package proxy_test

// Transaction and connection-state safety (issue 9, items 1-4, 15, 16, 20,
// 21): a command the proxy answered is never also forwarded, nothing of a
// transaction runs outside it, and connection state a client sets lands
// only on connections that are its own.

import (
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
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
		respError("ERR redproxy: "), respError("ERR redproxy: "), respError("EXECABORT"))
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

// A MULTI refused because max_pinned is reached aborts the transaction:
// the commands queued after it fail instead of running one by one on a
// shared connection, and EXEC answers EXECABORT.
func TestRefusedMultiAbortsTheTransaction(t *testing.T) {
	p := proxytest.Start(t, nil, onePinned)
	holder := holdPinned(t, p)
	c := dialRaw(t, p.Addr)
	wantReplies(t, c, []string{"MULTI"}, []string{"INCR", "a"}, []string{"SET", "b", "1"}, []string{"EXEC"}, []string{"GET", "a"},
		errMaxPinned, respError("ERR redproxy: "), respError("ERR redproxy: "), respError("EXECABORT"), nil)
	wantReplies(t, c, []string{"MULTI"}, []string{"INCR", "a"}, []string{"DISCARD"}, []string{"GET", "a"},
		errMaxPinned, respError("ERR redproxy: "), "OK", nil)
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
