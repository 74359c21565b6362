package proxy_test

import (
	"net"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// Parking under pressure (park.go, parkPressure): with many clients waiting
// unparked at once, idle ones park after pressureParkAfter (100 ms) rather
// than idle_park_after. These tests set idle_park_after to an hour, so a
// client that parks within the test parked early, and lower the pressure
// to 8 clients.

func pressureProxy(t *testing.T, after time.Duration) *proxytest.Proxy {
	t.Helper()
	p := parkingProxy(t, func(c *config.Config) {
		c.Server.IdleParkAfter = units.Duration{Duration: after}
	})
	p.SetParkPressure(8)
	return p
}

func pingAll(t *testing.T, conns []net.Conn) {
	t.Helper()
	for i, nc := range conns {
		if got := rawDo(t, nc, "PING"); got != "+PONG\r\n" {
			t.Fatalf("client %d: PING = %q", i, got)
		}
	}
}

func dialPing(t *testing.T, p *proxytest.Proxy, n int) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, n)
	for i := range conns {
		conns[i] = p.Dial(t)
	}
	pingAll(t, conns)
	return conns
}

// capParkTick puts the sweeper's next regular look far away (half of
// idle_park_after, an hour here): it returns once a look has armed a
// pause longer than the default cap's second, which a look that read the
// new cap does (the first look is at once, so this waits at most about a
// second). Waiting for a look counted after the cap was set missed the
// look that, counted before, read the new cap and armed the long pause.
func capParkTick(t *testing.T, p *proxytest.Proxy) {
	t.Helper()
	p.SetParkTickCap(time.Hour)
	redistest.Eventually(t, 10*time.Second, func() bool { return p.ParkArmed() > time.Second },
		"the sweeper never armed the long pause")
}

// holdsParked fails unless the parked count stays n for d, polled.
func holdsParked(t *testing.T, p *proxytest.Proxy, n int, d time.Duration) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if got := p.ParkedClients(); got != n {
			t.Fatalf("parked clients = %d, want %d to hold", got, n)
		}
	}
}

func TestPressureParksIdleClientsEarly(t *testing.T) {
	p := pressureProxy(t, time.Hour)
	conns := dialPing(t, p, 16)
	waitParked(t, p, 16)
	if got := metricSum(t, p, "redproxy_client_parks_early_total"); got < 16 {
		t.Fatalf("redproxy_client_parks_early_total = %v, want >= 16", got)
	}
	pingAll(t, conns) // answered from parked
}

// Few clients are no pressure: they park after idle_park_after only. (The
// hold covers a sweep: with no kick the sweeper looks once a second.)
func TestNoPressureBelowThreshold(t *testing.T) {
	p := pressureProxy(t, time.Hour)
	dialPing(t, p, 4)
	holdsParked(t, p, 0, 1500*time.Millisecond)
}

// A client parked early that comes back before idle_park_after is not
// parked early again, however many others wait: a client whose requests
// come 100 ms to idle_park_after apart would otherwise pay a park and a
// resume for each.
func TestPressureParksAClientEarlyOnce(t *testing.T) {
	p := pressureProxy(t, time.Hour)
	first := dialPing(t, p, 16)
	waitParked(t, p, 16)
	back := first[:8]
	pingAll(t, back) // resumed well before idle_park_after
	waitParked(t, p, 8)
	// Idle past pressureParkAfter, then pressure again from new clients,
	// which park early; the eight that came back must stay unparked
	// through the sweeps that park the new ones and after.
	time.Sleep(200 * time.Millisecond)
	dialPing(t, p, 16)
	waitParked(t, p, 8+16)
	holdsParked(t, p, 8+16, 500*time.Millisecond)
	pingAll(t, first)
}

// idle_park_after = 0 turns parking off, under pressure too.
func TestNoPressureParkingWhenParkingIsOff(t *testing.T) {
	p := pressureProxy(t, 0)
	dialPing(t, p, 16)
	holdsParked(t, p, 0, 500*time.Millisecond)
}

// A burst is noticed when it connects (kickParking), not at the sweeper's
// next regular look: here that look is half an hour away, after the first.
func TestPressureNoticedOnConnect(t *testing.T) {
	p := pressureProxy(t, time.Hour)
	capParkTick(t, p)
	dialPing(t, p, 16)
	waitParked(t, p, 16)
}

// Pressure ends pressureLinger (1 s) after the last look that found it: a
// client connecting later, alone, parks only after idle_park_after.
func TestPressureEndsAfterTheBurst(t *testing.T) {
	p := pressureProxy(t, time.Hour)
	dialPing(t, p, 16)
	waitParked(t, p, 16)
	time.Sleep(1500 * time.Millisecond) // past pressureLinger
	dialPing(t, p, 1)
	holdsParked(t, p, 16, 1500*time.Millisecond)
}

// Clients that cannot park early (here: came back from an early park) do
// not count towards pressure when a new client connects: otherwise a
// server with many long-lived clients would look through all of them for
// every new connection.
func TestLongLivedClientsDoNotKickTheSweeper(t *testing.T) {
	p := pressureProxy(t, time.Hour)
	capParkTick(t, p)
	back := dialPing(t, p, 16)
	waitParked(t, p, 16)
	pingAll(t, back) // all came back: unparked, not parked early again
	waitParked(t, p, 0)
	// Wait for the pressure to end (the sweeper stops looking): no look
	// for longer than the pressure lingers (1 s). A shorter quiet spell
	// could be a sweeper starved on a loaded machine, whose later looks
	// would then be counted below.
	var last int64 = -1
	redistest.Eventually(t, 20*time.Second, func() bool {
		n := p.ParkSweeps()
		settled := n == last
		last = n
		time.Sleep(1500 * time.Millisecond)
		return settled
	}, "the sweeper keeps looking")
	before := p.ParkSweeps()
	for range 5 {
		dialPing(t, p, 1)
		time.Sleep(80 * time.Millisecond) // longer than a kick's wait (pressureTick)
	}
	if n := p.ParkSweeps() - before; n != 0 {
		t.Fatalf("the sweeper looked %d times for 5 connections among 16 that cannot park early, want 0", n)
	}
}
