package stampede_test

import (
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/stampede"
)

// TestReviewHoldEndedBeforeNilHandledMakesSecondFiller: the README's miss
// hold promise is that of the clients missing a cold key one recomputes it
// and the others wait for its write. Here L and Z miss the key at the same
// time: L's GET leads fetch 1, Z's arrives while it is in flight and leads
// fetch 2 (coalescing never joins a fetch already sent). Both return nil.
// L becomes the filler and writes the key; the hold ends. Z's nil, read by
// Redis before that write but handled after the hold ended, finds no hold
// and makes Z a second filler: Z is told "miss" and recomputes too, after
// the first filler's write was acknowledged. In a 100-client stampede this
// happens on its own (2 or 3 database queries instead of 1; see
// proxy's TestReviewMissHoldCacheAside100ClientsWithTier, tier=false); the
// test hooks only make the timing deterministic.
func TestReviewHoldEndedBeforeNilHandledMakesSecondFiller(t *testing.T) {
	const key = "cache:race:v1"
	gate1, gate2 := make(chan struct{}), make(chan struct{})
	f1, f2 := make(chan struct{}), make(chan struct{})
	var fetches atomic.Int32
	stampede.SetTestHooks(t, false, func(k string) {
		if !strings.Contains(k, key) {
			return
		}
		switch fetches.Add(1) {
		case 1:
			close(f1)
			<-gate1
		case 2:
			close(f2)
			<-gate2
		}
	})
	p := proxytest.Start(t, nil, func(c *config.Config) {
		c.Stampede.Hold = []stampede.HoldRule{{Pattern: "cache:*", Timeout: units.Duration{Duration: 30 * time.Second}}}
	})
	open1, open2 := sync.OnceFunc(func() { close(gate1) }), sync.OnceFunc(func() { close(gate2) })
	t.Cleanup(open1)
	t.Cleanup(open2)
	cs := conns(t, p, 2)
	l, z := cs[0], cs[1]

	coalesced := metric(t, p, mCoalesced)
	lRes := make(chan error, 1)
	go func() { lRes <- l.Get(ctx, key).Err() }()
	<-f1 // fetch 1 (L's) has run in Redis: nil
	zRes := make(chan string, 1)
	go func() {
		v, err := z.Get(ctx, key).Result()
		if err != nil {
			v = "error: " + err.Error()
		}
		zRes <- v
	}()
	redistest.Eventually(t, 5*time.Second, func() bool { return metric(t, p, mCoalesced)-coalesced == 2 }, "Z never reached the group")
	open1()
	if err := <-lRes; err != redis.Nil {
		t.Fatalf("L's GET: %v, want a miss", err)
	}
	<-f2 // fetch 2 (Z's) has run in Redis: nil, before L's write
	// L, the filler, recomputes and writes; the write is acknowledged.
	if err := l.SetEx(ctx, key, "computed", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	open2()
	if v := <-zRes; v != "computed" {
		t.Fatalf("Z's GET, which missed together with L's, answered %q after L had filled the key: "+
			"Z is told to recompute as a second filler (held reads %v)", v, metric(t, p, mHeld))
	}
}
