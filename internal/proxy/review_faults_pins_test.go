package proxy_test

import (
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// Clients using dedicated connections (WATCH/MULTI, BLPOP, SUBSCRIBE)
// that disconnect at random points while the proxy's upstream
// connections are killed and Redis frozen: once every client is gone,
// every dedicated connection must have been given back (no pin leaks),
// else upstream.max_pinned is eventually exhausted for everyone.
func TestReviewFaultsPinsGivenBack(t *testing.T) {
	rs := redistest.Start(t)
	p := proxytest.Start(t, rs, func(c *config.Config) {
		c.Upstream.MaxPinned = 64
		c.Upstream.ReplyTimeout = units.Duration{Duration: 100 * time.Millisecond}
		c.Upstream.DeadTimeout = units.Duration{Duration: 300 * time.Millisecond}
	})
	stop := make(chan struct{})
	var wg, fw sync.WaitGroup
	scripts := [][][]string{
		{{"WATCH", "a"}, {"MULTI"}, {"SET", "a", "1"}, {"EXEC"}},
		{{"MULTI"}, {"INCR", "a"}, {"EXEC"}},
		{{"BLPOP", "q", "0.2"}},
		{{"BLPOP", "q", "0"}},
		{{"SUBSCRIBE", "ch"}, {"UNSUBSCRIBE", "ch"}, {"GET", "a"}},
		{{"WATCH", "a"}, {"GET", "a"}, {"UNWATCH"}},
		{{"MULTI"}, {"SET", "a", "2"}, {"DISCARD"}},
		{{"CLIENT", "TRACKING", "ON"}, {"GET", "a"}},
		{{"WAIT", "0", "50"}},
	}
	for id := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(id), 5))
			for {
				select {
				case <-stop:
					return
				default:
				}
				nc, err := p.DialErr()
				if err != nil {
					continue
				}
				s := scripts[r.IntN(len(scripts))]
				cut := r.IntN(len(s) + 1)
				for i, cmd := range s {
					if i == cut {
						break
					}
					args := make([]string, len(cmd))
					copy(args, cmd)
					if !rfTrySend(nc, args...) {
						break // closed by the proxy (its relay was killed): as Redis would
					}
					if r.IntN(2) == 0 {
						rfReadAll(nc, time.Duration(r.IntN(30))*time.Millisecond)
					}
				}
				rfReadAll(nc, time.Duration(r.IntN(30))*time.Millisecond)
				nc.Close()
			}
		}()
	}
	fw.Add(1)
	go rfFaults(t, rs, []rfFault{rfKillAll, rfFreeze, rfPauseAll}, stop, &fw)
	time.Sleep(6 * time.Second)
	close(stop)
	wg.Wait()
	fw.Wait()
	b := p.Backend()
	deadline := time.Now().Add(5 * time.Second)
	for b.PinnedTotal() != 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := b.PinnedTotal(); n != 0 {
		t.Fatalf("%d dedicated connections still counted in use 5s after every client left (max_pinned %d)", n, b.MaxPinned())
	}
}

func rfTrySend(nc net.Conn, args ...string) bool {
	s := fmt.Sprintf("*%d\r\n", len(args))
	for _, a := range args {
		s += fmt.Sprintf("$%d\r\n%s\r\n", len(a), a)
	}
	_, err := nc.Write([]byte(s))
	return err == nil
}
