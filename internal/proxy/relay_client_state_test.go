package proxy_test

// What a relayed client (CLIENT TRACKING ON, or a RESP3 SUBSCRIBE) learns
// about itself and what other clients learn about it, compared with Redis
// directly: each test sends the same commands to a Redis and, through the
// proxy, to another, identical one.

import (
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// relayStatePair is one connection to Redis directly and one through the
// proxy in front of another, identical Redis.
type relayStatePair struct {
	direct, proxied net.Conn
}

func newRelayStatePair(t *testing.T) (*relayStatePair, *proxytest.Proxy, *redistest.Server) {
	t.Helper()
	direct := redistest.Start(t)
	p := proxytest.Start(t, nil, nil)
	return &relayStatePair{direct: dialAddr(t, direct.Addr()), proxied: dialAddr(t, p.Addr)}, p, direct
}

// do sends args on both connections and returns both raw replies.
func (c *relayStatePair) do(t *testing.T, args ...string) (direct, proxied string) {
	t.Helper()
	return rawDo(t, c.direct, args...), rawDo(t, c.proxied, args...)
}

// A client's id never changes on Redis, and the proxy's CLIENT ID, INFO
// and LIST answer with its own clients and ids (docs/COMPATIBILITY.md).
// What went wrong (found by review): once the client turned tracking on
// (or, on RESP3, subscribed), these were forwarded on its relay, so CLIENT
// ID answered the Redis id of the proxy's upstream connection (":8" where
// it had been ":1"), a number that names nothing the proxy knows (CLIENT
// KILL ID of it from another client answered 0), and CLIENT LIST listed
// the proxy's upstream connections (name=redproxy, redproxy-relay)
// instead of its clients.
func TestClientIDStableAcrossRelay(t *testing.T) {
	for _, start := range [][]string{{"CLIENT", "TRACKING", "ON"}, {"SUBSCRIBE", "ch"}} {
		t.Run(strings.Join(start, "_"), func(t *testing.T) {
			c, p, _ := newRelayStatePair(t)
			c.do(t, "HELLO", "3")
			for _, side := range []struct {
				name string
				nc   net.Conn
			}{{"Redis", c.direct}, {"proxy", c.proxied}} {
				before := rawDo(t, side.nc, "CLIENT", "ID")
				rawDo(t, side.nc, start...)
				after := rawDo(t, side.nc, "CLIENT", "ID")
				if before != after {
					t.Errorf("%s: CLIENT ID before %s %q, after %q", side.name, strings.Join(start, " "), before, after)
				}
				// CLIENT LIST lists the clients, never the proxy's own
				// upstream connections (named redproxy...).
				if list := rawDo(t, side.nc, "CLIENT", "LIST"); strings.Contains(list, "name=redproxy") {
					t.Errorf("%s: CLIENT LIST after %s lists the proxy's upstream connections:\n%s", side.name, strings.Join(start, " "), list)
				}
				if side.name == "proxy" {
					// Another client kills it by the id it reported.
					id := strings.TrimSuffix(strings.TrimPrefix(after, ":"), "\r\n")
					if _, err := strconv.ParseInt(id, 10, 64); err == nil {
						other := dialAddr(t, p.Addr)
						if got := rawDo(t, other, "CLIENT", "KILL", "ID", id); got != ":1\r\n" {
							t.Errorf("proxy: CLIENT KILL ID %s (the id it reported) answered %q, want :1", id, got)
						}
					}
				}
			}
		})
	}
}

// A client that names itself after turning tracking on (rueidis-style
// handshakes pipeline CLIENT TRACKING ON and CLIENT SETNAME) is listed by
// Redis under that name, in the database it selected. What went wrong
// (found by review): both commands went to the relay and the proxy's own
// CLIENT LIST, which answers for its clients, never learnt of them: the
// client's line kept name= (empty) and db=0 for life.
func TestNameSetOnRelayInClientList(t *testing.T) {
	c, p, direct := newRelayStatePair(t)
	c.do(t, "HELLO", "3")
	dID, pID := c.do(t, "CLIENT", "ID")
	c.do(t, "CLIENT", "TRACKING", "ON")
	c.do(t, "CLIENT", "SETNAME", "review-worker")
	c.do(t, "SELECT", "3")
	for _, side := range []struct{ name, addr, id string }{{"Redis", direct.Addr(), dID}, {"proxy", p.Addr, pID}} {
		other := dialAddr(t, side.addr)
		list := rawDo(t, other, "CLIENT", "LIST")
		var line string
		for _, l := range strings.Split(list, "\n") {
			if strings.Contains(l, "id="+strings.Trim(side.id, ":\r\n")+" ") {
				line = l
			}
		}
		if !strings.Contains(line, " name=review-worker ") || !strings.Contains(line, " db=3 ") {
			t.Errorf("%s: CLIENT LIST from another client: the tracking client's line has not name=review-worker and db=3:\n%s", side.name, line)
		}
	}
}

// The proxy's answers on a relay have the shape Redis gives them: CLIENT
// ID an integer, CLIENT INFO a bulk string on RESP2 and a verbatim string
// on RESP3, both queued inside MULTI and answered by EXEC; on a RESP2
// subscribed connection Redis's own "only (P|S)SUBSCRIBE ..." error (as
// on Redis directly); on a MONITOR connection, where Redis would answer
// for the proxy's connection and no script runs, a refusal. Checks the
// fix of TestClientIDStableAcrossRelay beyond its RESP3 cases.
func TestClientAnswersOnRelayKeepTheirShape(t *testing.T) {
	t.Run("RESP2 tracking", func(t *testing.T) {
		c, _, _ := newRelayStatePair(t)
		_, id := c.do(t, "CLIENT", "ID")
		c.do(t, "CLIENT", "TRACKING", "ON")
		if got := rawDo(t, c.proxied, "CLIENT", "ID"); got != id {
			t.Errorf("CLIENT ID %q, want %q", got, id)
		}
		want := "id=" + strings.Trim(id, ":\r\n") + " "
		if got := rawDo(t, c.proxied, "CLIENT", "INFO"); !strings.HasPrefix(got, "$") || !strings.Contains(got, want) || !strings.Contains(got, " flags=t ") {
			t.Errorf("CLIENT INFO %q", got)
		}
		rawDo(t, c.proxied, "MULTI")
		rawDo(t, c.proxied, "CLIENT", "ID")
		if got := rawDo(t, c.proxied, "EXEC"); got != "*1\r\n"+id {
			t.Errorf("MULTI, CLIENT ID, EXEC: %q, want [%q]", got, id)
		}
		// Errors of the proxy's own are its own, in order.
		if got := rawDo(t, c.proxied, "CLIENT", "LIST", "TYPE", "nosuch"); got != "-ERR Unknown client type 'nosuch'\r\n" {
			t.Errorf("CLIENT LIST TYPE nosuch: %q", got)
		}
		if got := rawDo(t, c.proxied, "PING"); got != "+PONG\r\n" {
			t.Errorf("PING after them: %q", got)
		}
	})
	t.Run("RESP3 tracking", func(t *testing.T) {
		c, _, _ := newRelayStatePair(t)
		c.do(t, "HELLO", "3")
		_, id := c.do(t, "CLIENT", "ID")
		c.do(t, "CLIENT", "TRACKING", "ON")
		d, p := c.do(t, "CLIENT", "INFO")
		if d[0] != '=' || p[0] != '=' || !strings.Contains(p, "\r\ntxt:id="+strings.Trim(id, ":\r\n")+" ") {
			t.Errorf("CLIENT INFO on RESP3: Redis %q, proxy %q", d, p)
		}
	})
	t.Run("RESP2 subscribed", func(t *testing.T) {
		c, _, _ := newRelayStatePair(t)
		c.do(t, "SUBSCRIBE", "ch")
		for _, cmd := range [][]string{{"CLIENT", "ID"}, {"CLIENT", "INFO"}, {"CLIENT", "LIST"}} {
			if d, p := c.do(t, cmd...); d != p {
				t.Errorf("%s while subscribed: Redis %q, proxy %q", strings.Join(cmd, " "), d, p)
			}
		}
	})
	t.Run("MONITOR", func(t *testing.T) {
		_, p, _ := newRelayStatePair(t)
		nc := dialAddr(t, p.Addr)
		rawDo(t, nc, "MONITOR")
		for _, cmd := range [][]string{{"CLIENT", "ID"}, {"CLIENT", "LIST"}} {
			if got := rawDo(t, nc, cmd...); !strings.HasPrefix(got, "-") || !strings.Contains(got, "not supported") {
				t.Errorf("%s on MONITOR: %q", strings.Join(cmd, " "), got)
			}
		}
	})
}

// What a relayed client does to its name and database shows in the
// proxy's CLIENT LIST only when Redis accepts it, as Redis's own CLIENT
// LIST shows it: a refused SELECT or SETNAME changes nothing, a RESP2
// subscriber's (refused by Redis) neither, MULTI's count at EXEC and not
// after DISCARD, RESET clears both; CLIENT SETINFO on the relay is the
// proxy's, as elsewhere. Checks the fix of TestNameSetOnRelayInClientList
// beyond its case.
func TestRelayedNameAndDBFollowRedis(t *testing.T) {
	_, p, _ := newRelayStatePair(t)
	line := func(t *testing.T, id string) string {
		t.Helper()
		other := dialAddr(t, p.Addr)
		for _, l := range strings.Split(rawDo(t, other, "CLIENT", "LIST"), "\n") {
			if strings.HasPrefix(l, "id="+strings.Trim(id, ":\r\n")+" ") || strings.HasPrefix(l, "$") && strings.Contains(l, "\r\nid="+strings.Trim(id, ":\r\n")+" ") {
				return l
			}
		}
		t.Fatalf("client %s not listed", id)
		return ""
	}
	want := func(t *testing.T, id, name, db string) {
		t.Helper()
		l := line(t, id)
		if !strings.Contains(l, " name="+name+" ") || !strings.Contains(l, " db="+db+" ") {
			t.Errorf("want name=%s db=%s in:\n%s", name, db, l)
		}
	}
	t.Run("tracking", func(t *testing.T) {
		nc := dialAddr(t, p.Addr)
		id := rawDo(t, nc, "CLIENT", "ID")
		rawDo(t, nc, "CLIENT", "TRACKING", "ON")
		rawDo(t, nc, "CLIENT", "SETNAME", "w1")
		rawDo(t, nc, "SELECT", "2")
		for _, cmd := range [][]string{{"SELECT", "99"}, {"SELECT", "01"}, {"SELECT", "x"}, {"CLIENT", "SETNAME", "has space"}} {
			if got := rawDo(t, nc, cmd...); !strings.HasPrefix(got, "-") {
				t.Fatalf("%v: %q, want Redis's error", cmd, got)
			}
		}
		want(t, id, "w1", "2")
		rawDo(t, nc, "MULTI")
		rawDo(t, nc, "SELECT", "4")
		rawDo(t, nc, "CLIENT", "SETNAME", "w2")
		want(t, id, "w1", "2") // queued, not run
		rawDo(t, nc, "DISCARD")
		want(t, id, "w1", "2")
		rawDo(t, nc, "MULTI")
		rawDo(t, nc, "SELECT", "5")
		rawDo(t, nc, "CLIENT", "SETNAME", "w3")
		rawDo(t, nc, "EXEC")
		want(t, id, "w3", "5")
		// CLIENT SETINFO is in the command table only with Redis 7.2 or
		// later (see TestParkedClientKeepsItsState); before, Redis answers
		// "unknown subcommand" through the proxy everywhere.
		switch got := rawDo(t, nc, "CLIENT", "SETINFO", "lib-name", "mylib"); {
		case got == "+OK\r\n":
			if l := line(t, id); !strings.Contains(l, " lib-name=mylib ") {
				t.Errorf("CLIENT SETINFO lib-name on the relay not listed:\n%s", l)
			}
		case strings.Contains(got, "unknown subcommand"):
			t.Log("upstream Redis has no CLIENT SETINFO (before 7.2): lib-name not checked")
		default:
			t.Errorf("CLIENT SETINFO on the relay: %q", got)
		}
		rawDo(t, nc, "RESET")
		want(t, id, "", "0")
		rawDo(t, nc, "CLIENT", "TRACKING", "ON")

		// "EXEC x" is refused and discards the transaction: what it
		// queued does not count, and what follows runs outside MULTI.
		rawDo(t, nc, "MULTI")
		rawDo(t, nc, "SELECT", "6")
		if got := rawDo(t, nc, "EXEC", "x"); !strings.HasPrefix(got, "-EXECABORT") {
			t.Fatalf("EXEC x: %q, want Redis's EXECABORT", got)
		}
		rawDo(t, nc, "SELECT", "7")
		want(t, id, "", "7")
		// "MULTI x" opens nothing, "DISCARD x" and "RESET x" end nothing.
		rawDo(t, nc, "MULTI", "x")
		rawDo(t, nc, "SELECT", "8")
		want(t, id, "", "8")
		rawDo(t, nc, "MULTI")
		rawDo(t, nc, "DISCARD", "x")
		rawDo(t, nc, "RESET", "x")
		rawDo(t, nc, "SELECT", "9")
		want(t, id, "", "8")
		if got := rawDo(t, nc, "EXEC"); !strings.HasPrefix(got, "-EXECABORT") {
			t.Fatalf("EXEC after refused commands in MULTI: %q, want EXECABORT", got)
		}
		want(t, id, "", "8") // aborted: its SELECT never ran
	})
	t.Run("RESP2 subscribed", func(t *testing.T) {
		nc := dialAddr(t, p.Addr)
		id := rawDo(t, nc, "CLIENT", "ID")
		rawDo(t, nc, "SUBSCRIBE", "ch")
		rawDo(t, nc, "SELECT", "3")             // refused by Redis
		rawDo(t, nc, "CLIENT", "SETNAME", "s1") // refused by Redis
		want(t, id, "", "0")
	})
	t.Run("RESP3 subscribed", func(t *testing.T) {
		nc := dialAddr(t, p.Addr)
		rawDo(t, nc, "HELLO", "3")
		id := rawDo(t, nc, "CLIENT", "ID")
		rawDo(t, nc, "SUBSCRIBE", "ch")
		rawDo(t, nc, "SELECT", "3")
		rawDo(t, nc, "CLIENT", "SETNAME", "s3")
		want(t, id, "s3", "3")
	})
}
