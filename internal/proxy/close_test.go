package proxy_test

import (
	"bufio"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// closeCounts reads redproxy_clients_closed_total for every reason.
func closeCounts(p *proxytest.Proxy) map[string]float64 {
	out := map[string]float64{}
	for _, r := range metrics.CloseReasons {
		v, _, _ := metrics.CounterSum(p.Metrics.Registry, "redproxy_clients_closed_total", "reason", r)
		if v != 0 {
			out[r] = v
		}
	}
	return out
}

// waitCloses waits until the counter holds exactly want (reasons not in
// want at 0): every connection closed once, under its own reason.
func waitCloses(t *testing.T, p *proxytest.Proxy, want map[string]float64) {
	t.Helper()
	same := func() bool {
		got := closeCounts(p)
		if len(got) != len(want) {
			return false
		}
		for r, n := range want {
			if got[r] != n {
				return false
			}
		}
		return true
	}
	redistest.Eventually(t, 10*time.Second, same, "redproxy_clients_closed_total = %v, want %v", closeCounts(p), want)
}

// send writes an inline command and returns the first line of the reply.
func send(t *testing.T, nc net.Conn, r *bufio.Reader, cmd string) string {
	t.Helper()
	if _, err := nc.Write([]byte(cmd + "\r\n")); err != nil {
		t.Fatal(err)
	}
	line, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("%s: %v", cmd, err)
	}
	return strings.TrimRight(line, "\r\n")
}

// waitEOF waits for the proxy to close nc.
func waitEOF(t *testing.T, nc net.Conn, r *bufio.Reader) {
	t.Helper()
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		if _, err := r.ReadByte(); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatal("the proxy did not close the connection")
			}
			return
		}
	}
}

// Every way a session ends records exactly one reason, including those the
// counter used to lump under client_closed: a relay whose Redis connection
// is closed (upstream_lost), a tracking client that stays idle
// (idle_timeout), SHUTDOWN (upstream_lost). The paths are driven one at a
// time and the whole counter is compared after each, so a path that
// counted twice, or under another reason, fails.
func TestEveryCloseRecordsOneReason(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Server.ClientOutputLimit = 256 * units.KB })
	direct := p.Redis.Client(t)
	want := map[string]float64{}
	dial := func() (net.Conn, *bufio.Reader) {
		nc := p.Dial(t)
		nc.SetDeadline(time.Now().Add(20 * time.Second))
		return nc, bufio.NewReader(nc)
	}

	t.Run("quit", func(t *testing.T) {
		nc, r := dial()
		if got := send(t, nc, r, "QUIT"); got != "+OK" {
			t.Fatalf("QUIT: %q", got)
		}
		waitEOF(t, nc, r)
		want[metrics.CloseQuit]++
		waitCloses(t, p, want)
	})

	t.Run("protocol error", func(t *testing.T) {
		nc, r := dial()
		nc.Write([]byte("*1\r\n$x\r\n"))
		waitEOF(t, nc, r)
		want[metrics.CloseProtocolError]++
		waitCloses(t, p, want)
	})

	t.Run("output limit", func(t *testing.T) {
		if err := direct.Set(ctx, "big", strings.Repeat("v", 512<<10), 0).Err(); err != nil {
			t.Fatal(err)
		}
		nc, r := dial()
		// Two in one batch: a lone GET would be a coalesced read, which
		// the output limit does not cut (it holds one reply).
		nc.Write([]byte("GET big\r\nGET big\r\n"))
		waitEOF(t, nc, r)
		want[metrics.CloseOutputLimit]++
		waitCloses(t, p, want)
	})

	t.Run("subscriber closes", func(t *testing.T) {
		nc, r := dial()
		if got := send(t, nc, r, "SUBSCRIBE ch"); got != "*3" {
			t.Fatalf("SUBSCRIBE: %q", got)
		}
		nc.Close()
		want[metrics.CloseClient]++
		waitCloses(t, p, want)
	})

	t.Run("subscriber's Redis connection closed", func(t *testing.T) {
		nc, r := dial()
		if got := send(t, nc, r, "SUBSCRIBE ch"); got != "*3" {
			t.Fatalf("SUBSCRIBE: %q", got)
		}
		// Redis closes the relay's connection: the client is cut off with
		// it, because its subscriptions are gone.
		if n, err := direct.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Int(); err != nil || n != 1 {
			t.Fatalf("CLIENT KILL TYPE pubsub on Redis: %v, %v", n, err)
		}
		waitEOF(t, nc, r)
		want[metrics.CloseUpstreamLost]++
		waitCloses(t, p, want)
	})

	t.Run("subscriber killed", func(t *testing.T) {
		nc, r := dial()
		id := send(t, nc, r, "CLIENT ID")
		if got := send(t, nc, r, "SUBSCRIBE ch"); got != "*3" {
			t.Fatalf("SUBSCRIBE: %q", got)
		}
		killer, kr := dial()
		if got := send(t, killer, kr, "CLIENT KILL ID "+strings.TrimPrefix(id, ":")); got != ":1" {
			t.Fatalf("CLIENT KILL: %q", got)
		}
		waitEOF(t, nc, r)
		killer.Close()
		want[metrics.CloseKilled]++
		want[metrics.CloseClient]++ // the killer
		waitCloses(t, p, want)
	})

	t.Run("blocked client closes", func(t *testing.T) {
		nc, _ := dial()
		nc.Write([]byte("BLPOP nothing 0\r\n"))
		redistest.Eventually(t, 5*time.Second, func() bool {
			n, _ := direct.Do(ctx, "CLIENT", "LIST", "TYPE", "normal").Text()
			return strings.Contains(n, "cmd=blpop")
		}, "BLPOP never reached Redis")
		nc.Close()
		want[metrics.CloseClient]++
		waitCloses(t, p, want)
	})

	if got := closeCounts(p); got[metrics.ClosePanic] != 0 || got[metrics.CloseReadError] != 0 {
		t.Fatalf("closes counted under reasons that did not happen: %v", got)
	}

	t.Run("idle tracking client", func(t *testing.T) {
		idle := proxytest.Start(t, nil, func(c *config.Config) { c.Server.IdleTimeout.Duration = 200 * time.Millisecond })
		nc := idle.Dial(t)
		nc.SetDeadline(time.Now().Add(20 * time.Second))
		r := bufio.NewReader(nc)
		trackingOn(t, nc, r)
		waitEOF(t, nc, r)
		waitCloses(t, idle, map[string]float64{metrics.CloseIdleTimeout: 1})
	})

	t.Run("shutdown of Redis", func(t *testing.T) {
		own := proxytest.Start(t, redistest.Start(t), func(c *config.Config) {
			c.Policy.Commands.Allow = append(c.Policy.Commands.Allow, "shutdown") // refused by default
		})
		nc := own.Dial(t)
		nc.SetDeadline(time.Now().Add(20 * time.Second))
		r := bufio.NewReader(nc)
		nc.Write([]byte("SHUTDOWN NOSAVE\r\n"))
		waitEOF(t, nc, r)
		waitCloses(t, own, map[string]float64{metrics.CloseUpstreamLost: 1})
	})
}
