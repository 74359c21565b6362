package proxy_test

// Transaction and connection-state safety (issue 9, items 1-4, 15, 16, 20,
// 21): a command the proxy answered is never also forwarded, nothing of a
// transaction runs outside it, and connection state a client sets lands
// only on connections that are its own.

import (
	"reflect"
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
