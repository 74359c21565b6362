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
