package proxy_test

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/localcache"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// TestReloadSwitchesUpstreamWithLocalTier: with the local tier on and hot
// keys cached from A, a reload to B (which holds other values for the same
// keys) is applied, and from the moment Reload returns no read through the
// proxy is answered with A's value: not from the tier, not from a fill that
// was on its way from A when the switch happened, not from a coalesced
// fetch sent to A, whatever the client's protocol. Afterwards the tier
// serves hits from B, and a write through the proxy invalidates them (C1).
func TestReloadSwitchesUpstreamWithLocalTier(t *testing.T) {
	const nkeys = 8
	a, b := redistest.Start(t), redistest.Start(t)
	directA, directB := a.Client(t), b.Client(t)
	for i := range nkeys {
		k := "hot:" + strconv.Itoa(i)
		if err := directA.Set(ctx, k, "A"+strconv.Itoa(i), 0).Err(); err != nil {
			t.Fatal(err)
		}
		if err := directB.Set(ctx, k, "B"+strconv.Itoa(i), 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for rs, v := range map[*redistest.Server]string{a: "A", b: "B"} {
		if err := rs.Client(t).Set(ctx, "slow:k", v, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}

	// A fill of slow:k can be held after A's reply arrived and before the
	// tier decides whether to keep it.
	var holdFill atomic.Bool
	fillHeld, releaseFill := make(chan struct{}), make(chan struct{})
	prev := localcache.SetTestHooks(&localcache.TestHooks{AfterFill: func(key []byte) {
		if string(key) == "slow:k" && holdFill.CompareAndSwap(true, false) {
			close(fillHeld)
			<-releaseFill
		}
	}})
	t.Cleanup(func() { localcache.SetTestHooks(prev) })

	p := proxytest.Start(t, a, func(c *config.Config) {
		eagerTier(c, 200*time.Millisecond)
		// Values moved aside on a lost connection must not survive a
		// switch either.
		c.LocalCache.StaleIfError = []localcache.StaleRule{{Pattern: "hot:*", MaxAge: units.Duration{Duration: time.Minute}}}
	})
	redistest.Eventually(t, 10*time.Second, func() bool { return p.LocalTier().Live(0) }, "local tier never became live")
	hits := func() float64 { return metricSum(t, p, "redproxy_localcache_hits_total") }

	resp2 := p.Client(t, func(o *redis.Options) { o.Protocol = 2 })
	resp3 := p.Client(t, func(o *redis.Options) { o.Protocol = 3 })
	for _, c := range []*redis.Client{resp2, resp3} {
		for i := range nkeys {
			k, want := "hot:"+strconv.Itoa(i), "A"+strconv.Itoa(i)
			redistest.Eventually(t, 5*time.Second, func() bool {
				before := hits()
				v, err := c.Get(ctx, k).Result()
				if err != nil || v != want {
					t.Fatalf("GET %s before the switch = %q, %v", k, v, err)
				}
				return hits() > before
			}, "%s (protocol %d) never became a hit from A", k, c.Options().Protocol)
		}
	}

	// A fill of slow:k is in flight against A when the switch happens.
	holdFill.Store(true)
	heldDone := make(chan string, 1)
	go func() {
		v, _ := p.Client(t).Get(ctx, "slow:k").Result()
		heldDone <- v
	}()
	select {
	case <-fillHeld:
	case <-time.After(10 * time.Second):
		t.Fatal("the fill of slow:k never started")
	}

	// Readers run across the switch. A read issued before Reload returned
	// may get either value; one issued after must get B's.
	var switched atomic.Bool
	var reads, afterReads, bad atomic.Int64
	var firstBad atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 4 {
		proto := 2 + g%2
		c := p.Client(t, func(o *redis.Options) { o.Protocol = proto; o.PoolSize = 2 })
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				i := (g + n) % nkeys
				after := switched.Load()
				v, err := c.Get(ctx, "hot:"+strconv.Itoa(i)).Result()
				reads.Add(1)
				ok := err == nil && (v == "B"+strconv.Itoa(i) || !after && v == "A"+strconv.Itoa(i))
				if !ok && bad.Add(1) == 1 {
					firstBad.Store(fmt.Sprintf("client %d (RESP%d), read issued after Reload returned=%v: GET hot:%d = %q, %v", g, proto, after, i, v, err))
				}
				if after {
					afterReads.Add(1)
				}
			}
		}()
	}
	redistest.Eventually(t, 10*time.Second, func() bool { return reads.Load() >= 200 }, "readers stalled")

	changed, err := p.Reload(reloaded(t, p, func(c *config.Config) {
		c.Upstream.Address = b.Addr()
		c.Upstream.Connections = 3
	}))
	switched.Store(true)
	if err != nil {
		close(stop)
		close(releaseFill)
		wg.Wait()
		t.Fatalf("Reload with the local tier on: %v", err)
	}
	if strings.Join(changed, ",") != "upstream.address,upstream.connections" {
		t.Errorf("changed = %v", changed)
	}

	// The fill sent to A completes now; it may answer its own read, which
	// began before the switch, but must not stay in the tier.
	close(releaseFill)
	if v := <-heldDone; v != "A" && v != "B" {
		t.Errorf("the read whose fill was held got %q", v)
	}
	for _, c := range []*redis.Client{resp2, resp3} {
		for range 20 {
			if v, err := c.Get(ctx, "slow:k").Result(); err != nil || v != "B" {
				t.Fatalf("GET slow:k after the switch (protocol %d) = %q, %v: a fill sent to the old upstream was kept", c.Options().Protocol, v, err)
			}
		}
	}

	target := afterReads.Load() + 2000
	redistest.Eventually(t, 30*time.Second, func() bool { return afterReads.Load() >= target || bad.Load() > 0 }, "readers stalled after the switch")
	close(stop)
	wg.Wait()
	if n := bad.Load(); n > 0 {
		t.Fatalf("%d bad reads across the switch; first: %v", n, firstBad.Load())
	}
	t.Logf("%d reads, %d issued after Reload returned", reads.Load(), afterReads.Load())

	// The tier's tracking connections moved: none is left on A, and the
	// tier serves hits again, now from B, for both protocols.
	redistest.Eventually(t, 5*time.Second, func() bool {
		return !strings.Contains(directA.ClientList(ctx).Val(), "name="+localcache.ConnName)
	}, "a tracking connection is still open on the old upstream")
	if !strings.Contains(directB.ClientList(ctx).Val(), "name="+localcache.ConnName) {
		t.Fatal("no tracking connection on the new upstream")
	}
	for _, c := range []*redis.Client{resp2, resp3} {
		redistest.Eventually(t, 10*time.Second, func() bool {
			before := hits()
			v, err := c.Get(ctx, "hot:0").Result()
			if err != nil || v != "B0" {
				t.Fatalf("GET hot:0 after the switch = %q, %v", v, err)
			}
			return hits() > before
		}, "hot:0 (protocol %d) never became a hit from B", c.Options().Protocol)
	}

	// C1 on the new upstream: a write through the proxy is seen by the
	// next read, and written to B only.
	for i := range 5 {
		want := "new" + strconv.Itoa(i)
		if err := resp3.Set(ctx, "hot:0", want, 0).Err(); err != nil {
			t.Fatal(err)
		}
		for _, c := range []*redis.Client{resp2, resp3} {
			if v, err := c.Get(ctx, "hot:0").Result(); err != nil || v != want {
				t.Fatalf("round %d: GET hot:0 after an acknowledged SET of %q = %q, %v", i, want, v, err)
			}
		}
		redistest.Eventually(t, 5*time.Second, func() bool {
			before := hits()
			resp2.Get(ctx, "hot:0")
			return hits() > before
		}, "hot:0 never became a hit again")
	}
	if v := directA.Get(ctx, "hot:0").Val(); v != "A0" {
		t.Errorf("A's hot:0 = %q: a write after the switch reached the old upstream", v)
	}
	// C2 on the new upstream: a write straight to B is invalidated.
	if err := directB.Set(ctx, "hot:0", "direct", 0).Err(); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 5*time.Second, func() bool { return resp2.Get(ctx, "hot:0").Val() == "direct" },
		"a write straight to the new upstream was never seen through the tier")
}
