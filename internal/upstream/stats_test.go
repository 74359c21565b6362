package upstream

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/redistest"
)

// The shared pools' counters (redproxy_upstream_commands_total, dials,
// failures, ...) count over every generation: a switch (a reload that
// changes an [upstream] setting, a Sentinel failover) left them at 0, the
// commands the old connections still answered and the switch's own dials
// unseen (found by review: dials_total read 4 after 400 switches of 8
// dials each). Prometheus counters must not go back.
func TestPoolCountersSurviveSwitches(t *testing.T) {
	a, b := redistest.Start(t), redistest.Start(t)
	opt := testOptions(a.Addr())
	opt.Connections = 2
	be := NewBackend(opt)
	t.Cleanup(be.Close)
	ping := func(n int) {
		t.Helper()
		for range n {
			c := NewCall()
			c.Add([]byte("*1\r\n$4\r\nPING\r\n"))
			be.Pool(0, false).Do(c)
			if r, err := c.Reply(0); err != nil || string(r) != "+PONG\r\n" {
				t.Fatalf("PING: %q %v", r, err)
			}
		}
	}
	stats := func() PipeStats {
		s, _, ok := be.PoolStats(0, false)
		if !ok {
			t.Fatal("no stats for the pool in use")
		}
		return s
	}
	// A pipe counts a command once its reply is handed over, a moment
	// after the caller has it: wait for the count, never for less.
	reach := func(what string, ok func(PipeStats) bool) PipeStats {
		t.Helper()
		var s PipeStats
		redistest.Eventually(t, 5*time.Second, func() bool { s = stats(); return ok(s) }, "%s: %+v", what, s)
		return s
	}
	ping(5)
	first := reach("after 5 PINGs on 2 connections", func(s PipeStats) bool { return s.Commands >= 5 && s.Dials >= 2 })
	opt.Addr = b.Addr()
	be.Switch(opt) // another server
	ping(5)
	second := reach("after a switch and 5 more PINGs", func(s PipeStats) bool {
		return s.Commands >= first.Commands+5 && s.Dials >= first.Dials+2
	})
	opt.ReplyTimeout = 3 * time.Second
	be.Switch(opt) // the same server, another setting
	// The generations left drain and are closed; their counts stay.
	redistest.Eventually(t, 10*time.Second, func() bool {
		be.statsMu.Lock()
		defer be.statsMu.Unlock()
		return len(be.retiring) == 0
	}, "the old generations never drained")
	if third := stats(); third.Commands < second.Commands || third.Dials < second.Dials+2 {
		t.Fatalf("after the old generations closed: %+v, before %+v", third, second)
	}
}

// A connection Redis drops counts as a failure; one the proxy closes on
// purpose (a reload's drain, shutdown) does not.
func TestFailuresCountLostConnectionsOnly(t *testing.T) {
	srv := redistest.Start(t)
	p := NewPipe(Options{Addr: srv.Addr(), ReconnectMin: 10 * time.Millisecond})
	redistest.Eventually(t, 5*time.Second, p.Up, "pipe not up")
	if err := srv.Client(t).Do(context.Background(), "CLIENT", "KILL", "SKIPME", "yes").Err(); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 5*time.Second, func() bool { return p.Stats().Failures == 1 && p.Up() },
		"a connection Redis closed was not counted, or not redialled: %+v", lazyStats{p})
	p.Close()
	if s := p.Stats(); s.Failures != 1 {
		t.Fatalf("after Close: %d failures, want 1 (the close counted)", s.Failures)
	}
}

type lazyStats struct{ p *Pipe }

func (l lazyStats) String() string { return fmt.Sprintf("%+v", l.p.Stats()) }
