package proxy_test

import (
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
)

// "HOST:" (or "POST") is Redis's securityWarningCommand: Redis closes the
// connection it arrives on. The proxy forwards it, as an unknown command,
// on a shared upstream connection, so any client (any user allowed
// unknown commands, or anyone without [[users]]) makes Redis close the
// connection other clients' requests are pipelined on, and those fail
// with "upstream connection lost": one misbehaving client costs others
// their service, as often as it likes.
func TestReviewHostCommandKillsSharedConnection(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Upstream.Connections = 1 })
	victim := dialRaw(t, p.Addr)

	var stop atomic.Bool
	var lost atomic.Int64
	var victimErr atomic.Value
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		const burst = 20
		cmds := make([][]string, burst)
		for i := range cmds {
			cmds[i] = []string{"GET", "victim:k"}
		}
		for !stop.Load() {
			if err := victim.write(cmds...); err != nil {
				victimErr.Store(err.Error())
				return
			}
			for range burst {
				v, err := victim.next(nil)
				if err != nil {
					victimErr.Store(err.Error())
					return
				}
				if e, ok := v.(respError); ok && strings.Contains(string(e), "redproxy: upstream") {
					lost.Add(1)
				}
			}
		}
	}()
	// Each attempt needs a new connection: the proxy closes the one that
	// sent HOST:, as Redis does. Before the fix the first few attempts
	// failed victim GETs (36-60 of them in 3 s in the reviewer's runs).
	attempts := 0
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline) && lost.Load() == 0; attempts++ {
		attacker := dialRaw(t, p.Addr)
		attacker.send([]string{"HOST:"})
		if v, err := attacker.next(nil); err == nil {
			t.Fatalf("HOST: answered %v; want the connection closed", v)
		}
		attacker.nc.Close()
	}
	t.Logf("%d HOST: attempts", attempts)
	stop.Store(true)
	wg.Wait()
	if e := victimErr.Load(); e != nil {
		t.Fatalf("victim: %v", e)
	}
	if n := lost.Load(); n > 0 {
		t.Errorf("another client's HOST: made Redis close the shared connection: %d of the victim's GETs failed ('redproxy: upstream connection lost' / 'unavailable')", n)
	}
}
