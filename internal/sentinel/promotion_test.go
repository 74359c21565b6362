package sentinel

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/redistest"
)

// TestAdoptedPromotionConfirmed: in a failover that completes, the
// promotion the watcher adopts early (watchPromotion) is confirmed by the
// Sentinels well within provisionalFor, so it is never given up for the
// old primary (which still answers as one for seconds after the
// failover): the watcher switches once, to the promoted replica. The
// failover's leader reports failover_in_progress (SENTINEL MASTER's
// flags) while it runs, which discover reads to hold a promotion its
// leader has not named yet.
func TestAdoptedPromotionConfirmed(t *testing.T) {
	g := redistest.StartSentinelGroup(t, redistest.SentinelOptions{})
	old := g.Nodes[0]
	var mu sync.Mutex
	var switches []string
	var log redistest.LogBuffer
	w := New(Options{
		Sentinels: g.SentinelAddrs(), MasterName: g.Name, DialTimeout: 500 * time.Millisecond,
		Role: roleFunc(2 * time.Second), Logger: slog.New(slog.NewTextHandler(&log, nil)),
		OnSwitch: func(addr string) { mu.Lock(); switches = append(switches, addr); mu.Unlock() },
	})
	w.Start(old.Addr())
	defer w.Close()

	// Watch the Sentinels' flags through the failover.
	var sawFailingOver atomic.Bool
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, addr := range g.SentinelAddrs() {
		wg.Go(func() {
			sc := redis.NewSentinelClient(&redis.Options{Addr: addr, MaxRetries: -1})
			defer sc.Close()
			for {
				select {
				case <-stop:
					return
				case <-time.After(10 * time.Millisecond):
				}
				m, err := sc.Master(context.Background(), g.Name).Result()
				if err == nil && slices.Contains(strings.Split(m["flags"], ","), "failover_in_progress") {
					sawFailingOver.Store(true)
				}
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()

	g.Failover(t)
	next := g.WaitNewPrimary(t, old, 30*time.Second)
	redistest.Eventually(t, 5*time.Second, func() bool { return w.Primary() == next.Addr() }, "the watcher did not follow to %s", next.Addr())
	// Past provisionalFor and a poll or two: the old primary still says it
	// is one for seconds (+convert-to-slave comes later).
	time.Sleep(w.provisionalFor() + 2*time.Second)
	w.mu.Lock()
	adopted := w.adopted
	w.mu.Unlock()
	mu.Lock()
	got := slices.Clone(switches)
	mu.Unlock()
	if !slices.Equal(got, []string{next.Addr()}) {
		t.Errorf("switches = %v, want one, to %s", got, next.Addr())
	}
	if !adopted.IsZero() {
		t.Errorf("the promotion is still provisional (adopted %s ago)", time.Since(adopted).Round(time.Millisecond))
	}
	if l := log.String(); !strings.Contains(l, "confirmed by the Sentinels") {
		t.Errorf("the promotion was not adopted early and then confirmed; log:\n%s", l)
	} else {
		i := strings.Index(l, "confirmed by the Sentinels")
		t.Logf("%s", l[strings.LastIndex(l[:i], "\n")+1:i+strings.Index(l[i:], "\n")])
	}
	if !sawFailingOver.Load() {
		t.Error("no Sentinel ever reported failover_in_progress during the failover")
	}
}
