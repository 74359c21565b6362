package proxy_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/resp"
)

// loopLibrary is redistest.LoopScript as a function, for FUNCTION KILL.
const loopLibrary = "#!lua name=busylib\n" + `redis.register_function('busyloop', function(keys, args)
  local t = redis.call('TIME')
  local stop = tonumber(t[1]) * 1000000 + tonumber(t[2]) + tonumber(args[1]) * 1000
  while true do
    local n = redis.call('TIME')
    if tonumber(n[1]) * 1000000 + tonumber(n[2]) >= stop then break end
  end
  return 'done'
end)`

// busyRedis starts a Redis that turns -BUSY 50 ms into a script, and a
// proxy in front of it with short upstream timeouts.
func busyRedis(t *testing.T, connections int, dead time.Duration) (*proxytest.Proxy, *redistest.Server) {
	t.Helper()
	rs := redistest.Start(t, "--busy-reply-threshold", "50", "--enable-debug-command", "local")
	p := proxytest.Start(t, rs, func(c *config.Config) {
		c.Upstream.Connections = connections
		c.Upstream.ReplyTimeout = units.Duration{Duration: 150 * time.Millisecond}
		c.Upstream.DeadTimeout = units.Duration{Duration: dead}
		// SHUTDOWN NOSAVE is Redis's way out of a busy script; the
		// guard refuses it unless allowed.
		c.Policy.Commands.Allow = append(c.Policy.Commands.Allow, "shutdown")
	})
	return p, rs
}

// rawDo sends one command on nc and returns the raw bytes of its reply.
func rawDo(t *testing.T, nc net.Conn, args ...string) string {
	t.Helper()
	rawSend(t, nc, args...)
	return rawRead(t, nc)
}

func rawSend(t *testing.T, nc net.Conn, args ...string) {
	t.Helper()
	if _, err := nc.Write(resp.AppendCommandStrings(nil, args...)); err != nil {
		t.Fatal(err)
	}
}

// rawRead reads exactly one reply, byte for byte, within 10 seconds. It
// counts owed elements itself rather than use the framer under test.
func rawRead(t *testing.T, nc net.Conn) string {
	t.Helper()
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	var out []byte
	one := make([]byte, 1)
	readLine := func() string {
		t.Helper() // a failure names the test's line, not this one
		start := len(out)
		for !bytes.HasSuffix(out[start:], []byte("\r\n")) {
			if _, err := nc.Read(one); err != nil {
				t.Fatalf("read reply (have %d bytes): %v", len(out), err)
			}
			out = append(out, one[0])
		}
		return string(out[start : len(out)-2])
	}
	for owed := 1; owed > 0; {
		line := readLine()
		n, _ := strconv.Atoi(line[1:])
		owed--
		switch line[0] {
		case '*', '~', '>', '%':
			if line[0] == '%' {
				n *= 2
			}
			owed += max(n, 0)
		case '$', '=', '!':
			if n >= 0 {
				body := make([]byte, n+2)
				if _, err := io.ReadFull(nc, body); err != nil {
					t.Fatal(err)
				}
				out = append(out, body...)
			}
		}
	}
	return string(out)
}

func dialAddr(t *testing.T, addr string) net.Conn {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return nc
}

// redisBusy reports whether Redis itself answers -BUSY right now.
func redisBusy(t *testing.T, rs *redistest.Server) bool {
	nc := dialAddr(t, rs.Addr())
	defer nc.Close()
	return strings.HasPrefix(rawDo(t, nc, "PING"), "-BUSY")
}

// startLoop runs the loop script (or function) for ms milliseconds through
// its own proxy connection; the returned channel gets its reply.
func startLoop(t *testing.T, addr string, function bool, ms int) <-chan string {
	t.Helper()
	return startLoopOn(t, addr, "", function, false, ms)
}

// startLoopOn is startLoop for a loop whose one key is key ("" for none),
// so that a cluster or the routes send it where key lives; ro runs it as
// EVAL_RO.
func startLoopOn(t *testing.T, addr, key string, function, ro bool, ms int) <-chan string {
	t.Helper()
	nc := dialAddr(t, addr)
	name, body := "EVAL", redistest.LoopScript
	switch {
	case function:
		name, body = "FCALL", "busyloop"
	case ro:
		name = "EVAL_RO"
	}
	args := []string{name, body, "0"}
	if key != "" {
		args = []string{name, body, "1", key}
	}
	rawSend(t, nc, append(args, fmt.Sprint(ms))...)
	done := make(chan string, 1)
	go func() {
		nc.SetReadDeadline(time.Now().Add(30 * time.Second))
		var buf []byte
		tmp := make([]byte, 512)
		for {
			n, err := nc.Read(tmp)
			buf = append(buf, tmp[:n]...)
			if k, _ := resp.ScanReply(buf); k > 0 || err != nil {
				done <- string(buf)
				return
			}
		}
	}()
	return done
}

// While a script runs past busy-reply-threshold, PING through the proxy
// answers what Redis answers (-BUSY), and the proxy is not ready; once the
// script is killed both recover.
func TestPingAndReadinessReflectBusyRedis(t *testing.T) {
	p, rs := busyRedis(t, 2, 30*time.Second)
	loop := startLoop(t, p.Addr, false, 20000)
	redistest.Eventually(t, 5*time.Second, func() bool { return redisBusy(t, rs) }, "Redis never became busy")
	// The script's connection is now overdue, so new commands go to the
	// other one (Pool.Send passes over a lagging pipe).
	pool := p.Backend().Pool(0, false)
	redistest.Eventually(t, 5*time.Second, func() bool { s, _ := pool.Stats(); return s.Overdue > 0 }, "script's connection never seen overdue")

	direct := rawDo(t, dialAddr(t, rs.Addr()), "PING")
	c := dialAddr(t, p.Addr)
	if got := rawDo(t, c, "PING"); got != direct {
		t.Fatalf("PING while Redis is busy: proxy %q, Redis %q", got, direct)
	}
	if p.Ready() {
		t.Fatal("proxy ready while Redis answers -BUSY")
	}
	if got := rawDo(t, c, "SCRIPT", "KILL"); got != "+OK\r\n" {
		t.Fatalf("SCRIPT KILL: %q", got)
	}
	if r := <-loop; !strings.HasPrefix(r, "-ERR Script killed by user") {
		t.Fatalf("killed script's caller got %q", r)
	}
	redistest.Eventually(t, 5*time.Second, p.Ready, "proxy not ready after the script was killed")
	if got := rawDo(t, c, "PING"); got != "+PONG\r\n" {
		t.Fatalf("PING after the kill: %q", got)
	}
}

// SCRIPT KILL, FUNCTION KILL and SHUTDOWN NOSAVE reach Redis at once on a
// connection of their own, even when the proxy's only shared connection is
// the one running the script; CLIENT KILL (of a proxy client) is answered
// by the proxy without waiting for Redis.
func TestKillCommandsReachBusyRedisAtOnce(t *testing.T) {
	for _, function := range []bool{false, true} {
		kill := []string{"SCRIPT", "KILL"}
		if function {
			kill[0] = "FUNCTION"
		}
		t.Run(strings.Join(kill, " "), func(t *testing.T) {
			p, rs := busyRedis(t, 1, 30*time.Second)
			if function {
				if err := rs.Client(t).FunctionLoad(ctx, loopLibrary).Err(); err != nil {
					t.Fatal(err)
				}
			}
			loop := startLoop(t, p.Addr, function, 20000)
			redistest.Eventually(t, 5*time.Second, func() bool { return redisBusy(t, rs) }, "Redis never became busy")
			if got := rawDo(t, dialAddr(t, p.Addr), kill...); got != "+OK\r\n" {
				t.Fatalf("%v: %q", kill, got)
			}
			if r := <-loop; !strings.HasPrefix(r, "-ERR Script killed by user") {
				t.Fatalf("the killed loop's caller got %q", r)
			}
		})
	}
	t.Run("SHUTDOWN NOSAVE", func(t *testing.T) {
		p, rs := busyRedis(t, 1, 30*time.Second)
		loop := startLoop(t, p.Addr, false, 20000)
		redistest.Eventually(t, 5*time.Second, func() bool { return redisBusy(t, rs) }, "Redis never became busy")
		c := dialAddr(t, p.Addr)
		rawSend(t, c, "SHUTDOWN", "NOSAVE")
		// Like Redis, the proxy closes the connection instead of answering.
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if b, err := io.ReadAll(c); err != nil || len(b) != 0 {
			t.Fatalf("SHUTDOWN NOSAVE: got %q, %v; want the connection closed", b, err)
		}
		redistest.Eventually(t, 5*time.Second, func() bool {
			nc, err := net.DialTimeout("tcp", rs.Addr(), time.Second)
			if err == nil {
				nc.Close()
			}
			return err != nil
		}, "Redis still running after SHUTDOWN NOSAVE")
		if r := <-loop; !strings.HasPrefix(r, "-ERR") && r != "" {
			t.Fatalf("script's caller got %q after the shutdown", r)
		}
	})
	t.Run("CLIENT KILL", func(t *testing.T) {
		p, rs := busyRedis(t, 1, 30*time.Second)
		loop := startLoop(t, p.Addr, false, 20000)
		redistest.Eventually(t, 5*time.Second, func() bool { return redisBusy(t, rs) }, "Redis never became busy")
		victim := dialAddr(t, p.Addr)
		id := rawDo(t, victim, "CLIENT", "ID")
		c := dialAddr(t, p.Addr)
		if got := rawDo(t, c, "CLIENT", "KILL", "ID", strings.TrimSpace(id[1:])); got != ":1\r\n" {
			t.Fatalf("CLIENT KILL: %q", got)
		}
		if !redisBusy(t, rs) {
			t.Fatal("the script ended before CLIENT KILL was answered; the test proves nothing")
		}
		victim.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := victim.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Fatalf("killed client's connection: %v", err)
		}
		rawDo(t, dialAddr(t, p.Addr), "SCRIPT", "KILL")
		<-loop
	})
}

// PING with too many arguments, in RESP3, inside MULTI and while subscribed
// (RESP2 and RESP3) answers byte for byte what Redis answers.
func TestPingMatchesRedisBytes(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	scripts := [][][]string{
		{{"PING"}, {"PING", "hi"}, {"PING", "x", "y", "z"}, {"PING", ""}},
		{{"HELLO", "3"}, {"PING"}, {"PING", "x", "y"}, {"PING", "hi"}},
		{{"MULTI"}, {"PING"}, {"PING", "a", "b"}, {"EXEC"}},
		{{"MULTI"}, {"PING"}, {"PING", "hi"}, {"EXEC"}},
		{{"SUBSCRIBE", "pch"}, {"PING"}, {"PING", "hi"}, {"PING", "x", "y"}},
		{{"HELLO", "3"}, {"SUBSCRIBE", "pch"}, {"PING"}, {"PING", "hi"}, {"PING", "x", "y"}},
	}
	run := func(addr string, script [][]string) []string {
		nc := dialAddr(t, addr)
		var out []string
		for _, cmd := range script {
			r := rawDo(t, nc, cmd...)
			if cmd[0] == "HELLO" {
				r = "(hello)" // server version and client id differ
			}
			out = append(out, r)
		}
		return out
	}
	for _, script := range scripts {
		want := run(p.Redis.Addr(), script)
		got := run(p.Addr, script)
		if strings.Join(got, "") != strings.Join(want, "") {
			t.Errorf("%v:\nproxy %q\nRedis %q", script, got, want)
		}
	}
}

// A legal reply as deep as Redis can build (a self-referencing Lua table)
// reaches the client exactly, and the shared connection it came on keeps
// serving the other clients queued on it.
func TestDeeplyNestedReplyKeepsSharedConnection(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Upstream.Connections = 1 })
	const deep = "local a = {}; local b = {a}; a[1] = b; return a"
	want := rawDo(t, dialAddr(t, p.Redis.Addr()), "EVAL", deep, "0")
	if strings.Count(want, "*1\r\n") < 1025 {
		t.Fatalf("Redis's reply is not deep enough to test anything: %d levels", strings.Count(want, "*1\r\n"))
	}
	other := p.Client(t)
	stop := make(chan struct{})
	errs := make(chan error, 1)
	go func() {
		defer close(errs)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			v := fmt.Sprint("v", i)
			if got, err := other.Echo(ctx, v).Result(); err != nil || got != v {
				errs <- fmt.Errorf("other client: %q, %v", got, err)
				return
			}
			if err := other.Set(ctx, "deep:other", v, 0).Err(); err != nil {
				errs <- fmt.Errorf("other client SET: %v", err)
				return
			}
		}
	}()
	c := dialAddr(t, p.Addr)
	for range 5 {
		if got := rawDo(t, c, "EVAL", deep, "0"); got != want {
			t.Fatalf("deep reply through the proxy differs from Redis's (%d vs %d bytes)", len(got), len(want))
		}
	}
	close(stop)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	if s, _ := p.Backend().Pool(0, false).Stats(); s.Failures != 0 {
		t.Fatalf("shared connection lost %d times", s.Failures)
	}
}

func waitBusy(t *testing.T, rs *redistest.Server) {
	t.Helper()
	redistest.Eventually(t, 5*time.Second, func() bool { return redisBusy(t, rs) }, "Redis never became busy")
}

// waitOverdue waits until a shared DB 0 connection has had
// a reply overdue (and so has probed Redis).
func waitOverdue(t *testing.T, p *proxytest.Proxy) {
	t.Helper()
	pool := p.Backend().Pool(0, false)
	redistest.Eventually(t, 5*time.Second, func() bool { s, _ := pool.Stats(); return s.Overdue > 0 }, "no reply seen overdue")
}

// The commands Redis runs while a script keeps it busy go on a connection
// of their own, which was dialled for each and closed after: one client
// pipelining FUNCTION STATS made the proxy dial Redis about 2,600 times a
// second, each leaving a socket in TIME_WAIT (found by review); across
// hosts, enough to run out of ports towards Redis and fail every other
// dial. One such connection is now kept for the next, and one Redis closed
// meanwhile is replaced without the client seeing it.
func TestCommandsSentAloneReuseTheirConnection(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	direct := p.Redis.Client(t)
	connectionsReceived := func() int64 {
		info, err := direct.Info(ctx, "stats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\n") {
			if rest, ok := strings.CutPrefix(line, "total_connections_received:"); ok {
				n, _ := strconv.ParseInt(strings.TrimSpace(rest), 10, 64)
				return n
			}
		}
		t.Fatal("no total_connections_received in INFO stats")
		return 0
	}
	c := dialRaw(t, p.Addr)
	before := connectionsReceived()
	const n = 1000
	cmds := make([][]string, n)
	for i := range cmds {
		cmds[i] = []string{"FUNCTION", "STATS"}
	}
	c.send(cmds...)
	c.wait = 60 * time.Second // (a deadline set here, readReply sets again)
	for i := 0; i < n; i++ {
		if v, _ := c.readReply(); v == nil {
			t.Fatalf("reply %d: nil", i)
		} else if e, isErr := v.(respError); isErr {
			t.Fatalf("reply %d: %s", i, e)
		}
	}
	if dialled := connectionsReceived() - before; dialled > 10 {
		t.Fatalf("%d pipelined FUNCTION STATS made the proxy dial Redis %d times", n, dialled)
	}

	// Redis closes the kept connection (CLIENT KILL, its timeout, a
	// restart): the next command goes on a new one.
	list, err := direct.ClientList(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	killed := 0
	for _, line := range strings.Split(list, "\n") {
		if strings.Contains(line, " name=redproxy-alone ") {
			id, _, _ := strings.Cut(strings.TrimPrefix(line, "id="), " ")
			if err := direct.Do(ctx, "CLIENT", "KILL", "ID", id).Err(); err != nil {
				t.Fatal(err)
			}
			killed++
		}
	}
	if killed != 1 {
		t.Fatalf("%d connections named redproxy-alone, want the one kept:\n%s", killed, list)
	}
	if v := c.do("FUNCTION", "STATS"); v == nil {
		t.Fatal("FUNCTION STATS: nil")
	} else if e, isErr := v.(respError); isErr {
		t.Fatalf("FUNCTION STATS after its kept connection was killed: %s", e)
	}
}

// TestScriptKillBeforeTheBusyThreshold: Redis reads nothing while a script
// runs until busy-reply-threshold, then answers SCRIPT KILL. Sent through
// the proxy before then, it went on a connection of its own whose
// handshake (CLIENT SETNAME) timed out at the dial timeout: "upstream
// unavailable", and the script ran on (found by a probe). The handshake
// of a command sent alone now waits as long as the command may.
func TestScriptKillBeforeTheBusyThreshold(t *testing.T) {
	rs := redistest.Start(t, "--busy-reply-threshold", "1500")
	p := proxytest.Start(t, rs, func(c *config.Config) {
		c.Upstream.DialTimeout = units.Duration{Duration: 300 * time.Millisecond}
		c.Upstream.ReplyTimeout = units.Duration{Duration: 100 * time.Millisecond}
		c.Upstream.DeadTimeout = units.Duration{Duration: 30 * time.Second}
	})
	overdue := counterSum(t, p, "redproxy_upstream_overdue_replies_total", "", "")
	loop := startLoop(t, p.Addr, false, 20000)
	// Overdue: the script runs (Redis reads nothing more until 1.5 s).
	redistest.Eventually(t, 5*time.Second, func() bool {
		return counterSum(t, p, "redproxy_upstream_overdue_replies_total", "", "") > overdue
	}, "the script's reply never became overdue")
	c := dialAddr(t, p.Addr)
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	if got := rawDo(t, c, "SCRIPT", "KILL"); got != "+OK\r\n" {
		t.Fatalf("SCRIPT KILL before the busy threshold: %q", got)
	}
	if r := <-loop; !strings.HasPrefix(r, "-ERR Script killed by user") {
		t.Fatalf("the killed loop's caller got %q", r)
	}
}

// establishedTowards counts this host's established TCP connections to
// port on 127.0.0.1.
func establishedTowards(t *testing.T, port int) int {
	data, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Skipf("no /proc/net/tcp: %v", err)
	}
	remote := fmt.Sprintf("0100007F:%04X", port)
	n := 0
	for _, line := range strings.Split(string(data), "\n")[1:] {
		if f := strings.Fields(line); len(f) > 3 && f[2] == remote && f[3] == "01" {
			n++
		}
	}
	return n
}

// TestShutdownEndsACommandSentAloneInItsHandshake: the handshake of a
// command sent alone may wait for Redis up to dead_timeout (see
// TestScriptKillBeforeTheBusyThreshold); a shutdown past its deadline
// closes it rather than wait that long (found by review: a SCRIPT KILL to
// a frozen Redis held the shutdown for dead_timeout, past a container's
// grace period).
func TestShutdownEndsACommandSentAloneInItsHandshake(t *testing.T) {
	rs := redistest.Start(t)
	p := proxytest.Start(t, rs, func(c *config.Config) {
		c.Upstream.DialTimeout = units.Duration{Duration: 300 * time.Millisecond}
		c.Upstream.DeadTimeout = units.Duration{Duration: 5 * time.Minute}
	})
	c := dialAddr(t, p.Addr)
	rs.Freeze(t)
	defer rs.Thaw(t)
	before := establishedTowards(t, rs.Port())
	rawSend(t, c, "SCRIPT", "KILL")
	// Connected: the kernel accepts for a frozen Redis, which never
	// answers the handshake.
	redistest.Eventually(t, 5*time.Second, func() bool { return establishedTowards(t, rs.Port()) > before },
		"SCRIPT KILL's connection never reached Redis")
	done := make(chan struct{})
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		p.Shutdown(ctx)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("the shutdown still waits for SCRIPT KILL's handshake (dead_timeout is 5 minutes)")
	}
}
