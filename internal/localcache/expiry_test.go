package localcache_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/redistest"
)

// With active expiry off, Redis deletes an expired key only when something
// reads it, and only then invalidates it. Reads served by the tier do not
// reach Redis, so the tier must expire entries on its own, from the PTTL
// it read with the value.
func TestExpiryWithoutInvalidation(t *testing.T) {
	rs := redistest.Start(t, "--enable-debug-command", "local")
	direct := rs.Client(t)
	if err := direct.Do(ctx, "DEBUG", "SET-ACTIVE-EXPIRE", "0").Err(); err != nil {
		t.Fatal(err)
	}
	p := startTier(t, rs)
	c := p.Client(t)

	t.Run("PX", func(t *testing.T) {
		const px = 300 * time.Millisecond
		if err := direct.Set(ctx, "px", "v", px).Err(); err != nil {
			t.Fatal(err)
		}
		acked := time.Now()
		if v := cacheIt(t, p, c, "px"); v != "v" {
			t.Fatalf("GET px = %q", v)
		}
		// Redis ran the SET before we got its reply, so the key is expired
		// by acked+px (plus Redis's millisecond clock granularity): every
		// read from then on must miss.
		readsAfter(t, c, "px", "", acked.Add(px+msSlack), acked.Add(px+2*testS))
	})

	t.Run("PEXPIRE shortens", func(t *testing.T) {
		direct.Set(ctx, "pe", "v", 0)
		cacheIt(t, p, c, "pe")
		const px = 300 * time.Millisecond
		if err := direct.PExpire(ctx, "pe", px).Err(); err != nil {
			t.Fatal(err)
		}
		acked := time.Now()
		readsAfter(t, c, "pe", "", acked.Add(px+msSlack), acked.Add(px+2*testS))
	})

	t.Run("PERSIST", func(t *testing.T) {
		const px = 300 * time.Millisecond
		direct.Set(ctx, "pp", "v", px)
		cacheIt(t, p, c, "pp")
		if err := direct.Persist(ctx, "pp").Err(); err != nil {
			t.Fatal(err)
		}
		acked := time.Now()
		// Past the old expiry, the value is still there.
		readsAfter(t, c, "pp", "v", acked.Add(testS), acked.Add(px+2*testS))
		if v := cacheIt(t, p, c, "pp"); v != "v" {
			t.Fatalf("GET pp = %q", v)
		}
	})
}

// msSlack covers Redis's expiry clock, which counts whole milliseconds.
const msSlack = 2 * time.Millisecond

// Keys evicted by Redis under maxmemory are invalidated like any change.
func TestEvictionUnderMaxmemory(t *testing.T) {
	rs := redistest.Start(t, "--maxmemory", "4mb", "--maxmemory-policy", "allkeys-random")
	direct := rs.Client(t)
	p := startTier(t, rs)
	c := p.Client(t)
	direct.Set(ctx, "victim", "v", 0)
	cacheIt(t, p, c, "victim")

	// Fill Redis until the victim is gone. EXISTS through the direct client
	// only looks; it does not count as a read through the proxy.
	blob := strings.Repeat("x", 16<<10)
	var gone time.Time
	for i := 0; gone.IsZero(); i++ {
		if i > 100000 {
			t.Fatal("the victim was never evicted")
		}
		if err := direct.Set(ctx, "fill:"+strconv.Itoa(i), blob, 0).Err(); err != nil {
			t.Fatal(err)
		}
		if i%32 == 0 {
			if n, _ := direct.Exists(ctx, "victim").Result(); n == 0 {
				gone = time.Now()
			}
		}
	}
	readsAfter(t, c, "victim", "", gone.Add(testS), gone.Add(3*testS))
	if n := metric(t, p.Metrics.Registry, "redproxy_localcache_invalidations_total"); n == 0 {
		t.Fatal("the eviction was not invalidated")
	}
}
