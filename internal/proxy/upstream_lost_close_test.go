package proxy_test

import (
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// A client on a dedicated upstream connection sees a Redis restart as it
// would on Redis: its connection closes (upstreamlost.go). From the client
// review (branch clientreview, internal/proxy/review_clients_test.go and
// review/clients/): ioredis resends a BLPOP that was never answered when
// its connection closes, but not one answered with an error; redis-py
// resubscribes when it reconnects, but not after a SUBSCRIBE was refused
// on a connection that stays open.

// readToClose reads what nc sends within d and reports whether the peer
// closed it (EOF or a reset) rather than leaving it open.
func readToClose(t *testing.T, nc net.Conn, d time.Duration) (got string, closed bool) {
	t.Helper()
	nc.SetReadDeadline(time.Now().Add(d))
	var out []byte
	buf := make([]byte, 4096)
	for {
		n, err := nc.Read(buf)
		out = append(out, buf[:n]...)
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || strings.Contains(err.Error(), "connection reset") {
				return string(out), true
			}
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return string(out), false
			}
			t.Fatalf("read: %v", err)
		}
	}
}

// blockedOn waits until Redis counts n blocked clients.
func blockedOn(t *testing.T, rs *redistest.Server, n int) {
	t.Helper()
	rc := rs.Client(t)
	want := "blocked_clients:" + strconv.Itoa(n) + "\r\n"
	redistest.Eventually(t, 5*time.Second, func() bool {
		info, _ := rc.Info(ctx, "clients").Result()
		return strings.Contains(info, want)
	}, "Redis never counted %d blocked clients", n)
}

// upstreamLostClosed waits until the proxy has counted n clients closed
// for upstream_lost.
func upstreamLostClosed(t *testing.T, p *proxytest.Proxy, n float64) {
	t.Helper()
	redistest.Eventually(t, 5*time.Second, func() bool { return closedFor(p, metrics.CloseUpstreamLost) == n },
		"redproxy_clients_closed_total{reason=upstream_lost} = %v, want %v", closedFor(p, metrics.CloseUpstreamLost), n)
}

// A client blocked in BLPOP q 0 when Redis is killed: on Redis its
// connection closes with no reply, and ioredis resends the BLPOP after
// reconnecting. Through the proxy it was answered
// "-ERR redproxy: upstream connection lost" on an open connection, a pop
// the worker took as failed. The reply to what came before the BLPOP
// still arrives first.
func TestBlockedClientClosedWhenItsConnectionIsLost(t *testing.T) {
	rs := redistest.Start(t)
	p := proxytest.Start(t, rs, nil)
	c := dialAddr(t, p.Addr)
	rawSend(t, c, "ECHO", "before")
	rawSend(t, c, "BLPOP", "lost:queue", "0")
	if got := rawRead(t, c); got != "$6\r\nbefore\r\n" {
		t.Fatalf("ECHO before the BLPOP: %q", got)
	}
	blockedOn(t, rs, 1)
	rs.Kill(t)
	got, closed := readToClose(t, c, 5*time.Second)
	if !closed || got != "" {
		t.Fatalf("BLPOP 0 when Redis was killed: got %q, closed=%v; want the connection closed with no reply, as Redis's restart closes it (ioredis then resends the BLPOP)", got, closed)
	}
	upstreamLostClosed(t, p, 1)
}

// WAIT on its dedicated connection is a blocking command like BLPOP: WAIT
// 1 0 with no replica waits forever, and the connection lost under it
// closes the client.
func TestBlockedWaitClosedWhenItsConnectionIsLost(t *testing.T) {
	rs := redistest.Start(t)
	p := proxytest.Start(t, rs, nil)
	c := dialAddr(t, p.Addr)
	if got := rawDo(t, c, "SET", "lost:k", "v"); got != "+OK\r\n" {
		t.Fatalf("SET: %q", got)
	}
	rawSend(t, c, "WAIT", "1", "0")
	blockedOn(t, rs, 1)
	rs.Kill(t)
	if got, closed := readToClose(t, c, 5*time.Second); !closed || got != "" {
		t.Fatalf("WAIT 1 0 when Redis was killed: got %q, closed=%v; want the connection closed with no reply", got, closed)
	}
	upstreamLostClosed(t, p, 1)
}

// WAIT on several upstreams (routes): a connection lost on any of them
// closes the client at once, although the WAIT on the other one would go
// on forever.
func TestRoutesWaitClosedWhenOneConnectionIsLost(t *testing.T) {
	r := startRouted(t, nil)
	c := dialAddr(t, r.p.Addr)
	for _, k := range []string{"plain", "queue:1"} {
		if got := rawDo(t, c, "SET", k, "v"); got != "+OK\r\n" {
			t.Fatalf("SET %s: %q", k, got)
		}
	}
	rawSend(t, c, "WAIT", "1", "0")
	blockedOn(t, r.def, 1)
	blockedOn(t, r.queue, 1)
	r.queue.Kill(t)
	if got, closed := readToClose(t, c, 5*time.Second); !closed || got != "" {
		t.Fatalf("WAIT 1 0 on two upstreams when one was killed: got %q, closed=%v; want the connection closed with no reply", got, closed)
	}
	// The other upstream's WAIT ended with it.
	blockedOn(t, r.def, 0)
	upstreamLostClosed(t, r.p, 1)
}

// What stays an error reply on an open connection: a blocking command that
// could not get a connection (nothing ran), and the client's own UNBLOCK.
func TestBlockedClientErrorsThatKeepTheConnection(t *testing.T) {
	rs := redistest.Start(t)
	p := proxytest.Start(t, rs, nil)

	c := dialAddr(t, p.Addr)
	rawSend(t, c, "BLPOP", "kept:queue", "0")
	blockedOn(t, rs, 1)
	id := rawDo(t, dialAddr(t, p.Addr), "CLIENT", "UNBLOCK", blockedProxyID(t, p), "ERROR")
	if id != ":1\r\n" {
		t.Fatalf("CLIENT UNBLOCK ... ERROR: %q", id)
	}
	if got := rawRead(t, c); !strings.HasPrefix(got, "-UNBLOCKED") {
		t.Fatalf("BLPOP unblocked with ERROR: %q", got)
	}
	if got := rawDo(t, c, "ECHO", "after"); got != "$5\r\nafter\r\n" {
		t.Fatalf("ECHO after the UNBLOCK: %q", got)
	}

	// The first BLPOP's connection went back to the pool for DB 0. Were
	// the next BLPOP to take it before its reader has seen Redis's end
	// (seen in CI under load), it would be sent and lost, which closes
	// the client as a lost connection must (outcome unknown). In DB 1 it
	// has no pooled connection to take: the dial is refused, nothing ran.
	if got := rawDo(t, c, "SELECT", "1"); got != "+OK\r\n" {
		t.Fatalf("SELECT 1: %q", got)
	}
	rs.Kill(t)
	if got := rawDo(t, c, "BLPOP", "kept:queue", "0"); !strings.HasPrefix(got, "-ERR redproxy: upstream unavailable") {
		t.Fatalf("BLPOP while Redis is down: %q, want the error (nothing ran)", got)
	}
	if got := rawDo(t, c, "ECHO", "open"); got != "$4\r\nopen\r\n" {
		t.Fatalf("ECHO after the refused BLPOP: %q", got)
	}
	if n := closedFor(p, metrics.CloseUpstreamLost); n != 0 {
		t.Fatalf("upstream_lost closes: %v, want 0", n)
	}
}

// blockedProxyID returns the proxy's id of its one blocked client.
func blockedProxyID(t *testing.T, p *proxytest.Proxy) string {
	t.Helper()
	list, err := p.Client(t).ClientList(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(list, "\n") {
		if strings.Contains(line, "flags=b") {
			for _, f := range strings.Fields(line) {
				if id, ok := strings.CutPrefix(f, "id="); ok {
					return id
				}
			}
		}
	}
	t.Fatalf("no blocked client in the proxy's CLIENT LIST:\n%s", list)
	return ""
}

// A subscriber closed by Redis's restart reconnects at once (redis-py) and
// resubscribes while Redis is still down. The proxy answered the SUBSCRIBE
// with an error and kept the connection, and redis-py, having raised that
// error once, sat on an open connection subscribed to nothing for good:
// PUBLISH after the restart reached nobody. Now the error is followed by
// the connection closing, so the library reconnects and subscribes again,
// as when Redis refuses its connection.
func TestSubscribeWhileRedisDownClosesClient(t *testing.T) {
	rs := redistest.Start(t)
	p := proxytest.Start(t, rs, nil)
	sub := dialAddr(t, p.Addr)
	if got := rawDo(t, sub, "SUBSCRIBE", "lost:ch"); !strings.Contains(got, "subscribe") {
		t.Fatalf("SUBSCRIBE: %q", got)
	}
	rs.Kill(t)
	if got, closed := readToClose(t, sub, 5*time.Second); !closed {
		t.Fatalf("subscriber not closed when Redis went away: %q", got)
	}
	upstreamLostClosed(t, p, 1)

	// Every command that starts a relay on a connection of its own.
	starts := [][]string{
		{"SUBSCRIBE", "lost:ch"},
		{"PSUBSCRIBE", "lost:*"},
		{"SSUBSCRIBE", "lost:ch"},
		{"MONITOR"},
		{"CLIENT", "TRACKING", "ON"},
	}
	for i, cmd := range starts {
		c := dialAddr(t, p.Addr)
		rawSend(t, c, cmd...)
		got, closed := readToClose(t, c, 5*time.Second)
		if !strings.HasPrefix(got, "-ERR redproxy: upstream unavailable") || !closed {
			t.Fatalf("%s while Redis is down: got %q, closed=%v; want the error, then the connection closed so that the library reconnects and subscribes again", strings.Join(cmd, " "), got, closed)
		}
		upstreamLostClosed(t, p, float64(i+2))
	}

	rs.Restart(t)
	// The library's reconnect and resubscribe, once Redis is back.
	sub = dialAddr(t, p.Addr)
	redistest.Eventually(t, 5*time.Second, func() bool {
		got := rawDo(t, sub, "SUBSCRIBE", "lost:ch")
		return strings.Contains(got, "subscribe")
	}, "SUBSCRIBE never worked again")
	pub := dialAddr(t, p.Addr)
	var n string
	redistest.Eventually(t, 5*time.Second, func() bool {
		n = rawDo(t, pub, "PUBLISH", "lost:ch", "after")
		return !strings.HasPrefix(n, "-") // the shared connections redialling
	}, "PUBLISH never worked again")
	if n != ":1\r\n" {
		t.Fatalf("PUBLISH after the restart: %q, want :1", n)
	}
	if got := rawRead(t, sub); !strings.Contains(got, "after") {
		t.Fatalf("message after the restart: %q", got)
	}
}

// A definitive refusal of a relay (here upstream.max_pinned) keeps the
// connection: reconnecting would not change the answer.
func TestSubscribeRefusedAtMaxPinnedKeepsClient(t *testing.T) {
	rs := redistest.Start(t)
	p := proxytest.Start(t, rs, func(c *config.Config) { c.Upstream.MaxPinned = 1 })
	holder := dialAddr(t, p.Addr)
	rawSend(t, holder, "BLPOP", "pinned:queue", "0")
	blockedOn(t, rs, 1)
	c := dialAddr(t, p.Addr)
	if got := rawDo(t, c, "SUBSCRIBE", "pinned:ch"); got != "-"+string(errMaxPinned)+"\r\n" {
		t.Fatalf("SUBSCRIBE at max_pinned: %q", got)
	}
	if got := rawDo(t, c, "ECHO", "open"); got != "$4\r\nopen\r\n" {
		t.Fatalf("ECHO after the refused SUBSCRIBE: %q", got)
	}
}

// The user-level outcome with go-redis (default options: 3 retries, and a
// network error such as the connection closing is retried, BLPOP
// included): a BLPOP 0 whose connection to Redis is lost while Redis stays
// up (CLIENT KILL, a network cut, an idle killer) is resent by go-redis on
// a new connection and gets the item pushed afterwards, with no error
// returned to the caller. Before, the call returned
// "ERR redproxy: upstream connection lost", which go-redis does not retry.
func TestGoRedisBlockedPopResentAfterItsConnectionIsLost(t *testing.T) {
	rs := redistest.Start(t)
	p := proxytest.Start(t, rs, nil)
	c := p.Client(t, func(o *redis.Options) { o.MaxRetries = 0 }) // go-redis's default: 3
	type popped struct {
		v   []string
		err error
	}
	done := make(chan popped, 1)
	go func() {
		v, err := c.BLPop(ctx, 0, "lost:gq").Result()
		done <- popped{v, err}
	}()
	blockedOn(t, rs, 1)
	rc := rs.Client(t)
	first := blockedRedisID(t, rc, "")
	if err := rc.Do(ctx, "CLIENT", "KILL", "ID", first).Err(); err != nil {
		t.Fatal(err)
	}
	// go-redis resends the BLPOP, which blocks on another connection.
	redistest.Eventually(t, 5*time.Second, func() bool {
		select {
		case r := <-done:
			t.Fatalf("go-redis BLPOP 0 returned %v, %v when its connection was lost; want it resent", r.v, r.err)
		default:
		}
		return blockedRedisID(t, rc, first) != ""
	}, "the BLPOP was not resent")
	if err := rc.RPush(ctx, "lost:gq", "item").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.err != nil || len(r.v) != 2 || r.v[1] != "item" {
			t.Fatalf("go-redis BLPOP 0 across the lost connection: %v, %v; want [lost:gq item] and no error", r.v, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("BLPOP did not return the item")
	}
	upstreamLostClosed(t, p, 1)
}

// blockedRedisID returns the Redis id of a client blocked in BLPOP other
// than the one with id not, or "" when there is none.
func blockedRedisID(t *testing.T, rc *redis.Client, not string) string {
	t.Helper()
	list, err := rc.ClientList(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(list, "\n") {
		if !strings.Contains(line, "cmd=blpop") || !strings.Contains(line, "flags=b") {
			continue
		}
		for _, f := range strings.Fields(line) {
			if id, ok := strings.CutPrefix(f, "id="); ok && id != not {
				return id
			}
		}
	}
	return ""
}

// go-redis across a Redis restart (default options). go-redis resends the
// BLPOP once its connection closes, after 8 to 24 ms (its first retry's
// backoff); a restart that is not over by then makes the resent BLPOP get
// "ERR redproxy: upstream unavailable" (a blocking command that cannot get
// a connection is answered, nothing ran), an error reply go-redis does not
// retry, and the call returns it. On Redis directly the call fails as
// well, with the refused dial, once its 3 retries (about 150 ms) are
// spent; no default go-redis BLPOP outlives a restart longer than that
// either way. What changed: the loss is a closed connection go-redis
// retries (the retry is visible here: the error is "unavailable", the
// resent BLPOP's, not "connection lost"), and the application's next
// BLPOP, once Redis is back, gets the item pushed after the restart.
func TestGoRedisBlockedPopAcrossRedisRestart(t *testing.T) {
	rs := redistest.Start(t)
	p := proxytest.Start(t, rs, nil)
	c := p.Client(t, func(o *redis.Options) { o.MaxRetries = 0 })
	done := make(chan error, 1)
	go func() { done <- c.BLPop(ctx, 0, "lost:rq").Err() }()
	blockedOn(t, rs, 1)
	rs.Kill(t)
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "upstream unavailable") {
			t.Fatalf("go-redis BLPOP 0 with Redis down: %v; want the resent BLPOP's upstream unavailable", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("BLPOP did not return while Redis was down")
	}
	upstreamLostClosed(t, p, 1)
	rs.Restart(t)
	got := make(chan []string, 1)
	go func() {
		for {
			v, err := c.BLPop(ctx, 0, "lost:rq").Result()
			if err == nil {
				got <- v
				return
			}
			time.Sleep(20 * time.Millisecond) // the proxy reconnecting
		}
	}()
	blockedOn(t, rs, 1)
	if err := rs.Client(t).RPush(ctx, "lost:rq", "after").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case v := <-got:
		if len(v) != 2 || v[1] != "after" {
			t.Fatalf("BLPOP after the restart: %v", v)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("BLPOP after the restart got nothing")
	}
}
