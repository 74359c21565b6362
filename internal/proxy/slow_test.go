package proxy_test

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// What clients see when Redis is slow, paused, frozen or gone, with
// reply_timeout 150ms (busyRedis). One shared connection, so every command
// below queues behind the slow one, the case that used to fail them all.

// A script longer than reply_timeout and dead_timeout: Redis answers a
// fresh connection's PING with -BUSY, so it is alive; the script's caller
// and the commands queued behind it get their replies when it ends.
func TestSlowScriptDelaysQueuedClients(t *testing.T) {
	// dead_timeout a second (about six probes of 150 ms each, any one of
	// which keeps the connection; with 400 ms, two late probes on a loaded
	// machine closed it), the script well past it.
	p, rs := busyRedis(t, 1, time.Second)
	loop := startLoop(t, p.Addr, false, 2500)
	waitBusy(t, rs)
	c := dialAddr(t, p.Addr)
	if got := rawDo(t, c, "SET", "slow:k", "v"); got != "+OK\r\n" {
		t.Fatalf("SET queued behind the script: %q", got)
	}
	if got := <-loop; got != "$4\r\ndone\r\n" {
		t.Fatalf("script: %q", got)
	}
	if got := rawDo(t, c, "GET", "slow:k"); got != "$1\r\nv\r\n" {
		t.Fatalf("GET: %q", got)
	}
}

// DEBUG SLEEP blocks Redis, the probe included: within dead_timeout the
// queued commands only wait.
func TestDebugSleepDelaysQueuedClients(t *testing.T) {
	p, _ := busyRedis(t, 1, 10*time.Second)
	sleeper := dialAddr(t, p.Addr)
	rawSend(t, sleeper, "DEBUG", "SLEEP", "1")
	waitOverdue(t, p)
	c := dialAddr(t, p.Addr)
	if got := rawDo(t, c, "INCR", "sleep:n"); got != ":1\r\n" {
		t.Fatalf("INCR queued behind DEBUG SLEEP: %q", got)
	}
	if got := rawRead(t, sleeper); got != "+OK\r\n" {
		t.Fatalf("DEBUG SLEEP: %q", got)
	}
}

// CLIENT PAUSE WRITE shorter than dead_timeout: a write waits for the
// pause to end, as it would on Redis.
func TestClientPauseDelaysWrites(t *testing.T) {
	p, rs := busyRedis(t, 1, 10*time.Second)
	if got := rawDo(t, dialAddr(t, rs.Addr()), "CLIENT", "PAUSE", "1200", "WRITE"); got != "+OK\r\n" {
		t.Fatal(got)
	}
	c := dialAddr(t, p.Addr)
	if got := rawDo(t, c, "SET", "paused:k", "v"); got != "+OK\r\n" {
		t.Fatalf("SET during CLIENT PAUSE WRITE: %q", got)
	}
	if got := rawDo(t, dialAddr(t, rs.Addr()), "GET", "paused:k"); got != "$1\r\nv\r\n" {
		t.Fatalf("write not applied: %q", got)
	}
}

// A frozen Redis (SIGSTOP) answers nothing, probe included: after
// dead_timeout its clients get an error. Once it resumes, every reply still
// goes to the command that asked for it.
func TestFrozenRedisFailsClientsAfterDeadTimeout(t *testing.T) {
	p, rs := busyRedis(t, 1, 500*time.Millisecond)
	c := dialAddr(t, p.Addr)
	rs.Freeze(t)
	got := rawDo(t, c, "SET", "frozen:k", "before")
	rs.Thaw(t)
	if got != "-ERR redproxy: upstream reply timeout\r\n" {
		t.Fatalf("SET to a frozen Redis: %q", got)
	}
	for i := range 50 {
		v := fmt.Sprint("after-", i)
		var r string
		for try := 0; ; try++ {
			r = rawDo(t, c, "SET", "frozen:k", v)
			if r == "+OK\r\n" || try == 200 {
				break
			}
			time.Sleep(10 * time.Millisecond) // reconnecting
		}
		if r != "+OK\r\n" {
			t.Fatalf("SET after thaw: %q", r)
		}
		if r := rawDo(t, c, "GET", "frozen:k"); r != fmt.Sprintf("$%d\r\n%s\r\n", len(v), v) {
			t.Fatalf("GET after thaw: got %q, want %q", r, v)
		}
	}
}

// A killed Redis fails queued commands at once; nothing waits for
// dead_timeout.
func TestKilledRedisFailsClientsAtOnce(t *testing.T) {
	p, rs := busyRedis(t, 1, time.Minute)
	sleeper := dialAddr(t, p.Addr)
	rawSend(t, sleeper, "DEBUG", "SLEEP", "30")
	waitOverdue(t, p)
	c := dialAddr(t, p.Addr)
	rawSend(t, c, "GET", "killed:k")
	rs.Kill(t)
	// Lost in flight, or refused because no connection is up any more.
	if got := rawRead(t, c); !strings.HasPrefix(got, "-ERR redproxy: upstream connection lost") && !strings.HasPrefix(got, "-ERR redproxy: upstream unavailable") {
		t.Fatalf("GET when Redis was killed: %q", got)
	}
}
