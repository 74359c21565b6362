package proxy_test

// SCRIPT DEBUG YES|SYNC changes the connection it is sent on: Redis runs
// that connection's next EVAL in the Lua debugger (YES forks a child that
// then owns the socket; SYNC blocks the whole server). The proxy forwarded
// it (it was not among the commands the proxy knows change connection
// state), on a shared connection, or on a pinned one that UNWATCH gave back
// to the pool as clean: another client's plain EVAL, which happened to
// travel on that connection, ran in the debugger and was answered with the
// debugger's output instead of its result (found by review). The proxy now
// refuses SCRIPT DEBUG YES/SYNC everywhere (shared, under WATCH, inside
// MULTI, on a relay) and answers SCRIPT DEBUG NO itself.

import (
	"net"
	"strings"
	"testing"

	"github.com/redproxy/redproxy/internal/resp"
)

// wantScriptDebugRefused checks the proxy's refusal of SCRIPT DEBUG: an
// error that says to debug against Redis directly.
func wantScriptDebugRefused(t *testing.T, got string) {
	t.Helper()
	if !strings.HasPrefix(got, "-ERR redproxy: SCRIPT DEBUG") || !strings.Contains(got, "redis-cli --ldb") {
		t.Fatalf("SCRIPT DEBUG YES through the proxy answered %q, want a refusal that points to redis-cli --ldb", got)
	}
}

func TestScriptDebugReachesOtherClients(t *testing.T) {
	c, p, _ := newDirectPair(t)
	d, pr := c.do(t, "SCRIPT", "DEBUG", "YES")
	if d != "+OK\r\n" {
		t.Fatalf("SCRIPT DEBUG YES: Redis %q", d)
	}
	wantScriptDebugRefused(t, pr)
	if got := rawDo(t, c.proxied, "SCRIPT", "DEBUG", "SYNC"); !strings.HasPrefix(got, "-ERR redproxy: SCRIPT DEBUG") {
		t.Errorf("SCRIPT DEBUG SYNC through the proxy answered %q, want the refusal", got)
	}
	// Another client, which never asked for a debugger.
	for _, side := range []struct {
		name, addr string
	}{{"Redis", c.direct.RemoteAddr().String()}, {"proxy", p.Addr}} {
		other := dialAddr(t, side.addr)
		for i := range 4 { // round-robin over the shared connections
			if got := rawDo(t, other, "EVAL", "return 1", "0"); got != ":1\r\n" {
				t.Errorf("%s: another client's EVAL #%d answered %q, want :1", side.name, i, replyHead(got))
				break
			}
		}
	}
}

// The same through the pool of pinned connections: SCRIPT DEBUG under
// WATCH went to the pinned connection, which UNWATCH gave back to the pool
// as clean; the next client to WATCH got it, and its EVAL ran in the
// debugger.
func TestScriptDebugReachesNextPinnedClient(t *testing.T) {
	c, p, direct := newDirectPair(t)
	c.do(t, "WATCH", "k")
	if d, pr := c.do(t, "SCRIPT", "DEBUG", "YES"); d != "+OK\r\n" {
		t.Fatalf("SCRIPT DEBUG YES under WATCH: Redis %q", d)
	} else {
		wantScriptDebugRefused(t, pr)
	}
	if d, pr := c.do(t, "UNWATCH"); d != pr {
		t.Fatalf("UNWATCH: Redis %q, proxy %q", d, pr)
	}
	for _, side := range []struct{ name, addr string }{{"Redis", direct.Addr()}, {"proxy", p.Addr}} {
		other := dialAddr(t, side.addr)
		rawDo(t, other, "WATCH", "k")
		if got := rawDo(t, other, "EVAL", "return 1", "0"); got != ":1\r\n" {
			t.Errorf("%s: another client's EVAL under WATCH answered %q, want :1", side.name, replyHead(got))
		}
	}
}

// Inside MULTI and on a relay (tracking, RESP3 subscribed) SCRIPT DEBUG
// YES is refused too: queued, EXEC would set the flag on the pinned
// connection (Redis refuses it there only while EXEC has replies pending,
// which CLIENT REPLY OFF avoids); on a relay it would reach Redis and
// SYNC would block the server. SCRIPT DEBUG NO, the state of every
// connection the proxy has, is answered +OK as Redis does, and a bad
// mode gets Redis's error.
func TestScriptDebugNeverReachesRedis(t *testing.T) {
	c, _, _ := newDirectPair(t)
	for _, cmd := range [][]string{{"SCRIPT", "DEBUG", "NO"}, {"SCRIPT", "DEBUG", "no"}, {"SCRIPT", "DEBUG", "maybe"}, {"SCRIPT", "DEBUG"}} {
		if d, p := c.do(t, cmd...); d != p {
			t.Errorf("%q: Redis %q, proxy %q", cmd, d, p)
		}
	}

	tx := c.proxied
	rawDo(t, tx, "MULTI")
	// Refused as every connection-state command is inside MULTI.
	if got := rawDo(t, tx, "SCRIPT", "DEBUG", "YES"); got != "-ERR redproxy: 'SCRIPT DEBUG' inside MULTI is not supported\r\n" {
		t.Errorf("SCRIPT DEBUG YES inside MULTI answered %q, want the refusal", got)
	}
	if got := rawDo(t, tx, "EXEC"); !strings.HasPrefix(got, "-EXECABORT") {
		t.Errorf("EXEC after a refused SCRIPT DEBUG answered %q, want EXECABORT", got)
	}

	for _, start := range [][]string{{"CLIENT", "TRACKING", "ON"}, {"SUBSCRIBE", "ch"}} {
		t.Run(strings.Join(start, "_"), func(t *testing.T) {
			c, _, _ := newDirectPair(t)
			c.do(t, "HELLO", "3")
			c.do(t, start...)
			if _, p := c.do(t, "SCRIPT", "DEBUG", "YES"); !strings.Contains(p, "redproxy: SCRIPT DEBUG") {
				t.Errorf("SCRIPT DEBUG YES on a relay (%s) answered %q, want the refusal", strings.Join(start, " "), p)
			}
			if _, p := c.do(t, "EVAL", "return 1", "0"); p != ":1\r\n" {
				t.Errorf("EVAL on the relay after SCRIPT DEBUG YES answered %q, want :1", replyHead(p))
			}
		})
	}
}

// TestScriptDebugModeRefusesItsScripts: after a refused SCRIPT DEBUG YES,
// the proxy keeps the mode Redis would be in. EVALSHA, EVALSHA_RO and an
// EVAL of the wrong arity answer as on Redis in that mode (compared with a
// Redis connection in it), RESET keeps the mode as Redis does, and SCRIPT
// DEBUG NO ends it; the next EVAL, which Redis would run in the debugger,
// is refused and ends the mode, inside MULTI at queue time.
func TestScriptDebugModeRefusesItsScripts(t *testing.T) {
	c, _, _ := newDirectPair(t)
	d, p := c.do(t, "SCRIPT", "LOAD", "return 1")
	if d != p || !strings.HasPrefix(d, "$40\r\n") {
		t.Fatalf("SCRIPT LOAD: Redis %q, proxy %q", d, p)
	}
	sha := strings.TrimSpace(d[len("$40\r\n"):])
	same := func(args ...string) string {
		t.Helper()
		d, p := c.do(t, args...)
		if d != p {
			t.Errorf("%q: Redis %q, proxy %q", args, d, replyHead(p))
		}
		return d
	}
	c.do(t, "SCRIPT", "DEBUG", "YES")
	if got := same("EVALSHA", sha, "0"); !strings.Contains(got, "Please use EVAL instead of EVALSHA for debugging") {
		t.Fatalf("EVALSHA in debugger mode on Redis answered %q: is this Redis's debugger different?", got)
	}
	same("EVALSHA_RO", sha, "0")
	same("EVAL", "return 1")
	same("RESET")
	same("EVALSHA", sha, "0") // RESET leaves the mode on

	proxied := c.proxied
	refused := func(args ...string) {
		t.Helper()
		if got := rawDo(t, proxied, args...); !strings.Contains(got, "redproxy: the script was not run") {
			t.Errorf("%q in debugger mode answered %q, want the refusal", args, replyHead(got))
		}
	}
	refused("EVAL", "redis.call('set', KEYS[1], 'ran') return 1", "1", "dbg:key")
	if got := rawDo(t, proxied, "EVAL", "return 1", "0"); got != ":1\r\n" {
		t.Errorf("the EVAL after the refused one answered %q, want :1 (the mode ends with the refusal)", got)
	}
	rawDo(t, proxied, "SCRIPT", "DEBUG", "SYNC")
	refused("EVAL_RO", "return 1", "0")

	rawDo(t, proxied, "SCRIPT", "DEBUG", "YES")
	same("SCRIPT", "DEBUG", "NO")
	if got := same("EVALSHA", sha, "0"); got != ":1\r\n" {
		t.Errorf("EVALSHA after SCRIPT DEBUG NO answered %q, want :1", got)
	}

	rawDo(t, proxied, "SCRIPT", "DEBUG", "YES")
	rawDo(t, proxied, "MULTI")
	refused("EVAL", "redis.call('set', KEYS[1], 'ran') return 1", "1", "dbg:key")
	if got := rawDo(t, proxied, "EXEC"); !strings.HasPrefix(got, "-EXECABORT") {
		t.Errorf("EXEC after the refused EVAL answered %q, want EXECABORT", got)
	}
	if got := rawDo(t, proxied, "EXISTS", "dbg:key"); got != ":0\r\n" {
		t.Errorf("a refused script's write reached Redis: EXISTS dbg:key = %q", got)
	}
}

// SCRIPT DEBUG behind another command in one write is refused by Redis
// ("must be called outside a pipeline"), whatever its mode, and the
// connection stays out of the debugger: the EVAL after it runs. The proxy
// refused YES as one it does not support and then the EVAL as one the
// debugger would have run, so the script and its write silently did not
// happen (found by review).
func TestScriptDebugInAPipelineAnswersAsRedis(t *testing.T) {
	for _, mode := range []string{"YES", "SYNC", "NO", "maybe"} {
		t.Run(mode, func(t *testing.T) {
			c, _, _ := newDirectPair(t)
			key := "dbgpipe:" + mode
			cmds := [][]string{
				{"PING"},
				{"SCRIPT", "DEBUG", mode},
				{"EVAL", "return redis.call('SET', KEYS[1], 'ran')", "1", key},
				{"GET", key},
			}
			var raw []byte
			for _, cmd := range cmds {
				raw = resp.AppendCommandStrings(raw, cmd...)
			}
			for _, nc := range []net.Conn{c.direct, c.proxied} {
				if _, err := nc.Write(raw); err != nil {
					t.Fatal(err)
				}
			}
			for _, cmd := range cmds {
				if d, p := rawRead(t, c.direct), rawRead(t, c.proxied); d != p {
					t.Errorf("%q: Redis %q, proxy %q", cmd, d, replyHead(p))
				}
			}
		})
	}
}
