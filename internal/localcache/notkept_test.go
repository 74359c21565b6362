package localcache_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/localcache"
)

// A fill whose reply the tier does not keep (here nil, negative_caching
// off) is not repeated on every read: the reads that follow pass to Redis
// (reason not_kept) as one command each. Found by review
// (TestReviewTierTriplesUpstreamCommandsForHotMissingKey in proxy). The
// note never outlives the key's absence: when the key appears, written
// around the proxy, the invalidation drops it and the key is filled and
// served well before the note would have ended on its own.
func TestNotKeptFillIsNotRepeatedAndEndsWithTheKey(t *testing.T) {
	// Notes that would last 30 s, so that the key served from the tier
	// within the 5 s allowed below can only be the invalidation's doing,
	// however slow the machine.
	localcache.SetNotKeptFor(t, 30*time.Second)
	p := startTier(t, nil)
	c := p.Client(t)
	direct := p.Redis.Client(t)
	notKept := func() float64 {
		return metric(t, p.Metrics.Registry, "redproxy_localcache_misses_total", "reason=not_kept")
	}
	for range 20 {
		if err := c.Get(ctx, "gone").Err(); err != redis.Nil {
			t.Fatalf("GET gone: %v", err)
		}
	}
	if n := notKept(); n < 15 {
		t.Fatalf("%v of 20 reads of a missing key passed as not_kept, want the reads after the first fill", n)
	}
	if err := direct.Set(ctx, "gone", "here", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// Redis answers the reads passed meanwhile: never a stale nil after
	// the write was acknowledged.
	if v := mustGet(t, c, "gone"); v != "here" {
		t.Fatalf("GET after the key was written = %q", v)
	}
	deadline := time.Now().Add(5 * time.Second)
	for before := hits(t, p); ; {
		if v := mustGet(t, c, "gone"); v != "here" {
			t.Fatalf("GET = %q", v)
		}
		if hits(t, p) > before {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the key, written around the proxy, was not served from the tier within 5s: its not_kept note outlived the invalidation")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
