package stampede_test

import (
	"bufio"
	"sync"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// TestHeldReadsRespectMaxWaiters shows that reads held by a miss hold obey
// max_waiters when the hold ends: "at most max_waiters reads wait for one
// request; the rest go to Redis directly" (README, config.example.toml).
// With max_waiters = 2, 30 held reads need at least 10 GETs upstream. What
// went wrong (found by review): held reads all shared one fetch after the
// hold (Hold.Fetch, a sync.Once per protocol) with no cap, outside the
// coalescing group, so 30 clients waited on a single GET.
func TestHeldReadsRespectMaxWaiters(t *testing.T) {
	const held = 30
	p := proxytest.Start(t, nil, func(c *config.Config) {
		holdRule("cache:*", 10*time.Second)(c)
		c.Stampede.MaxWaiters = 2
	})
	direct := p.Redis.Client(t)
	filler := p.Dial(t)
	fr := bufio.NewReader(filler)
	if got := rawGet(t, filler, fr, "cache:k"); got != "$-1\r\n" {
		t.Fatalf("filler got %q, want a miss", got)
	}
	cs := conns(t, p, held)
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if v, err := c.Get(ctx, "cache:k").Result(); err != nil || v != "v" {
				t.Errorf("held read: %q, %v", v, err)
			}
		}()
	}
	redistest.Eventually(t, 5*time.Second, func() bool { return metric(t, p, mHeld) == held }, "the reads were not all held")
	before := cmdCalls(t, direct, "get")
	// The filler writes through the proxy, which ends the hold.
	if _, err := filler.Write([]byte("*3\r\n$3\r\nSET\r\n$7\r\ncache:k\r\n$1\r\nv\r\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := fr.ReadString('\n'); err != nil || line != "+OK\r\n" {
		t.Fatalf("filler SET: %q, %v", line, err)
	}
	wg.Wait()
	gets := cmdCalls(t, direct, "get") - before
	t.Logf("%d held clients, max_waiters 2: %d GETs reached Redis after the hold", held, gets)
	// Each fetch may be shared by its leader and at most 2 waiters.
	if want := (held + 2) / 3; gets < want {
		t.Fatalf("%d held reads shared %d upstream GET(s) with max_waiters = 2: at least %d reads waited for one request, want at most 3 per request (>= %d GETs)",
			held, gets, held/gets, want)
	}
}

// TestHeldReadsCountAsCoalesced shows that a held read that shares a fetch
// after its hold counts in coalesced_reads_total as well as in
// fetches_saved_total, so saved reads stay a subset of coalesced ones and
// the dashboard's "fetches saved / coalesced reads" share (deploy/grafana)
// stays at most 100%. What went wrong (found by review): held reads counted
// as saved (Hold.Fetch) but never as coalesced (heldRead did not go through
// Group.do), and one held wave of 10 reads showed the share at 900%.
func TestHeldReadsCountAsCoalesced(t *testing.T) {
	const held = 10
	p := proxytest.Start(t, nil, holdRule("cache:*", 10*time.Second))
	filler := p.Dial(t)
	fr := bufio.NewReader(filler)
	if got := rawGet(t, filler, fr, "cache:k"); got != "$-1\r\n" {
		t.Fatalf("filler got %q, want a miss", got)
	}
	cs := conns(t, p, held)
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if v, err := c.Get(ctx, "cache:k").Result(); err != nil || v != "v" {
				t.Errorf("held read: %q, %v", v, err)
			}
		}()
	}
	redistest.Eventually(t, 5*time.Second, func() bool { return metric(t, p, mHeld) == held }, "the reads were not all held")
	if _, err := filler.Write([]byte("*3\r\n$3\r\nSET\r\n$7\r\ncache:k\r\n$1\r\nv\r\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := fr.ReadString('\n'); err != nil || line != "+OK\r\n" {
		t.Fatalf("filler SET: %q, %v", line, err)
	}
	wg.Wait()
	saved, coalesced := metric(t, p, mSaved), metric(t, p, mCoalesced)
	if saved > coalesced {
		t.Fatalf("fetches_saved_total = %v > coalesced_reads_total = %v: the dashboard's \"fetches saved / coalesced reads\" is %.0f%%",
			saved, coalesced, 100*saved/coalesced)
	}
}
