package proxy_test

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// A client's dedicated connection dialled while Redis is paused waits out
// the pause, as the client's command would on Redis: WATCH, MULTI, BLPOP
// and SUBSCRIBE each need one, and its handshake failed "upstream
// unavailable" at the dial timeout (found by a probe: 2 s into a 5 s
// CLIENT PAUSE ALL, DEBUG SLEEP or SIGSTOP, where Redis directly answers
// once it resumes). A pause of several dial timeouts here; no pinned
// connection is idle, so each is dialled during it.
func TestDedicatedConnectionsDialledDuringAPauseWaitForIt(t *testing.T) {
	const pause = 1500 * time.Millisecond
	rs := redistest.Start(t)
	p := proxytest.Start(t, rs, func(c *config.Config) {
		c.Upstream.DialTimeout = units.Duration{Duration: 200 * time.Millisecond}
		c.Upstream.DeadTimeout = units.Duration{Duration: 30 * time.Second}
	})
	cases := []struct {
		cmd  []string
		want string
	}{
		{[]string{"WATCH", "k"}, "OK"},
		{[]string{"MULTI"}, "OK"},
		{[]string{"BLPOP", "nolist", "0.1"}, "<nil>"},
		{[]string{"SUBSCRIBE", "ch"}, "[subscribe ch 1]"},
	}
	conns := make([]*rawConn, len(cases))
	for i := range conns {
		conns[i] = dialRaw(t, p.Addr)
		conns[i].wait = 20 * time.Second
	}
	if err := rs.Client(t).Do(ctx, "CLIENT", "PAUSE", strconv.FormatInt(pause.Milliseconds(), 10), "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	for i, c := range cases {
		conns[i].send(c.cmd)
	}
	for i, c := range cases {
		v, _ := conns[i].readReply()
		if got := fmt.Sprint(v); got != c.want {
			t.Errorf("%q sent during a pause: %s, want %s", c.cmd, got, c.want)
		}
	}
}

// A dedicated connection waiting in its handshake on a paused Redis stops
// waiting when the upstream switches, and is dialled on the new one: a
// client's WATCH is served by the new Redis, where it waited for the old
// one's pause and then failed "upstream unavailable" at dead_timeout
// (found by review of the patient handshake; a failover from a frozen
// primary is the same case).
func TestDedicatedDialWaitingOnAPauseMovesWithASwitch(t *testing.T) {
	old, next := redistest.Start(t), redistest.Start(t)
	p := proxytest.Start(t, old, func(c *config.Config) {
		c.Upstream.DialTimeout = units.Duration{Duration: 200 * time.Millisecond}
		c.Upstream.DeadTimeout = units.Duration{Duration: 2 * time.Second}
	})
	if err := old.Client(t).Do(ctx, "CLIENT", "PAUSE", "60000", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	c := dialRaw(t, p.Addr)
	c.wait = 20 * time.Second
	base := establishedTowards(t, old.Port())
	c.send([]string{"WATCH", "k"})
	// The WATCH's connection is in its handshake with the paused Redis.
	redistest.Eventually(t, 5*time.Second, func() bool {
		return establishedTowards(t, old.Port()) > base
	}, "no dedicated dial to the paused Redis")
	cfg := *p.Config()
	cfg.Upstream.Address = next.Addr()
	if _, err := p.Reload(&cfg); err != nil {
		t.Fatal(err)
	}
	if v, _ := c.readReply(); v != "OK" {
		t.Fatalf("WATCH dialled during a pause, then the upstream switched: %v, want OK from the new Redis", v)
	}
}

// A client that leaves while its dedicated connection waits out a pause
// ends that wait: its max_pinned slot is free again, and the transaction
// it had sent does not run when the pause ends, as Redis frees a departed
// client's commands (found by a probe: MULTI INCR EXEC of a client gone
// during a 4 s pause ran after it). The wait goes on past the dial
// timeout only while the client is there.
func TestDedicatedDialEndsWhenItsClientLeaves(t *testing.T) {
	rs := redistest.Start(t)
	p := proxytest.Start(t, rs, func(c *config.Config) {
		c.Upstream.DialTimeout = units.Duration{Duration: 200 * time.Millisecond}
		c.Upstream.DeadTimeout = units.Duration{Duration: 30 * time.Second}
	})
	direct := rs.Client(t)
	// Far longer than the dial's end takes once the client has left.
	if err := direct.Do(ctx, "CLIENT", "PAUSE", "8000", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	c := dialRaw(t, p.Addr)
	c.send([]string{"MULTI"}, []string{"INCR", "left:tx"}, []string{"EXEC"})
	redistest.Eventually(t, 5*time.Second, func() bool { return p.Backend().Pinned() == 1 }, "the MULTI took no dedicated connection")
	c.nc.Close()
	redistest.Eventually(t, 4*time.Second, func() bool { return p.Backend().Pinned() == 0 },
		"the departed client's dial kept its max_pinned slot during the pause")
	// Past the pause: nothing of the client's ran.
	redistest.Eventually(t, 15*time.Second, func() bool { return direct.Ping(ctx).Err() == nil }, "Redis never resumed")
	if n, err := direct.Exists(ctx, "left:tx").Result(); err != nil || n != 0 {
		t.Fatalf("the departed client's transaction ran after the pause (EXISTS %d, %v)", n, err)
	}
}

// A dedicated connection's handshake that a paused Redis never answers
// fails as a reply past dead_timeout does, not with Go's "read tcp ...:
// i/o timeout" (found by a probe). A subscriber is then closed too, as
// when Redis cannot be reached, so that its library reconnects and
// subscribes again (found by review: told "upstream reply timeout", it
// kept its connection, subscribed to nothing).
func TestDedicatedDialPastDeadTimeoutSaysReplyTimeout(t *testing.T) {
	for _, c := range []struct {
		cmd    string
		closed bool
	}{{"WATCH", false}, {"SUBSCRIBE", true}} {
		t.Run(c.cmd, func(t *testing.T) {
			rs := redistest.Start(t)
			p := proxytest.Start(t, rs, func(c *config.Config) {
				c.Upstream.DialTimeout = units.Duration{Duration: 200 * time.Millisecond}
				c.Upstream.ReplyTimeout = units.Duration{Duration: 200 * time.Millisecond}
				c.Upstream.DeadTimeout = units.Duration{Duration: 500 * time.Millisecond}
			})
			if err := rs.Client(t).Do(ctx, "CLIENT", "PAUSE", "3000", "ALL").Err(); err != nil {
				t.Fatal(err)
			}
			conn := dialRaw(t, p.Addr)
			conn.send([]string{c.cmd, "k"})
			if v, _ := conn.readReply(); v != respError("ERR redproxy: upstream reply timeout") {
				t.Fatalf("%s whose connection's handshake passed dead_timeout: %v", c.cmd, v)
			}
			if c.closed && !connClosed(conn.nc) {
				t.Fatal("the subscriber's connection stayed open")
			}
		})
	}
}
