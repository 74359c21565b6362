package localcache_test

import (
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/redistest"
)

// A read is filled through the tier and then served from it; a write
// through the proxy is seen by the writer's next read (C3); a write that
// bypasses the proxy is seen within S (C2).
func TestHitsAndInvalidation(t *testing.T) {
	p := startTier(t, nil)
	c := p.Client(t)
	direct := p.Redis.Client(t)

	if err := direct.Set(ctx, "k", "v1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if v := cacheIt(t, p, c, "k"); v != "v1" {
		t.Fatalf("GET k = %q", v)
	}
	if err := c.Set(ctx, "k", "v2", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if v := mustGet(t, c, "k"); v != "v2" {
		t.Fatalf("after SET through the proxy, GET k = %q, want v2", v)
	}
	if v := cacheIt(t, p, c, "k"); v != "v2" {
		t.Fatalf("GET k = %q", v)
	}
	if err := direct.Set(ctx, "k", "v3", 0).Err(); err != nil {
		t.Fatal(err)
	}
	acked := time.Now()
	for {
		start := time.Now()
		v := mustGet(t, c, "k")
		if v == "v3" {
			break
		}
		if start.After(acked.Add(testS)) {
			t.Fatalf("read started %v after a direct write was acknowledged returned %q", start.Sub(acked), v)
		}
	}
	if n := metric(t, p.Metrics.Registry, "redproxy_localcache_invalidations_total"); n == 0 {
		t.Fatal("no invalidation counted")
	}

	// Other commands of the same key are cached alongside and dropped with
	// it; RESP3 clients get their own entries.
	if err := direct.HSet(ctx, "h", "f", "1").Err(); err != nil {
		t.Fatal(err)
	}
	c3 := p.Client(t, func(o *redis.Options) { o.Protocol = 3 })
	for _, cl := range []*redis.Client{c, c3} {
		redistest.Eventually(t, 5*time.Second, func() bool {
			before := hits(t, p)
			m, err := cl.HGetAll(ctx, "h").Result()
			if err != nil || m["f"] != "1" {
				t.Fatalf("HGETALL = %v, %v", m, err)
			}
			return hits(t, p) > before
		}, "HGETALL never hit")
	}
	if err := c.HSet(ctx, "h", "f", "2").Err(); err != nil {
		t.Fatal(err)
	}
	for _, cl := range []*redis.Client{c, c3} {
		if v, _ := cl.HGet(ctx, "h", "f").Result(); v != "2" {
			t.Fatalf("HGET after HSET = %q", v)
		}
		if m, _ := cl.HGetAll(ctx, "h").Result(); m["f"] != "2" {
			t.Fatalf("HGETALL after HSET = %v", m)
		}
	}
}

// Only admitted keys are filled through the tier: with admit_min_reads 3 a
// key read once is not cached, and a key read often is.
func TestAdmission(t *testing.T) {
	p := startTier(t, nil, func(c *config.Config) { c.LocalCache.AdmitMinReads = 3 })
	c := p.Client(t)
	for i := range 50 {
		c.Set(ctx, "cold:"+strconv.Itoa(i), "x", 0)
	}
	for i := range 50 {
		mustGet(t, c, "cold:"+strconv.Itoa(i))
		mustGet(t, c, "cold:"+strconv.Itoa(i))
	}
	if n := metric(t, p.Metrics.Registry, "redproxy_localcache_entries"); n != 0 {
		t.Fatalf("%v entries after reading 50 keys twice, want 0", n)
	}
	c.Set(ctx, "hot", "x", 0)
	cacheIt(t, p, c, "hot")
	if n := metric(t, p.Metrics.Registry, "redproxy_localcache_entries"); n != 1 {
		t.Fatalf("%v entries, want 1", n)
	}
}

// Under traffic spread over many keys, the sketch is aged by volume as well
// as by time, so keys read twice among 40,000 reads are not admitted while a
// key read throughout is.
func TestAdmissionUnderColdTraffic(t *testing.T) {
	p := startTier(t, nil, func(c *config.Config) {
		c.LocalCache.AdmitMinReads = 8
		c.LocalCache.MaxBytes = 64 * units.KB // the smallest sketch: 4096 counters a row
		c.LocalCache.AdmitWindow = units.Duration{Duration: time.Hour}
	})
	p.Redis.Client(t).Set(ctx, "hot", "x", 0)
	var wg sync.WaitGroup
	for w := range 8 {
		c := p.Client(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2500 {
				key := "cold:" + strconv.Itoa(w*2500+i)
				for range 2 {
					if err := c.Get(ctx, key).Err(); err != redis.Nil {
						t.Errorf("GET %s: %v", key, err)
						return
					}
				}
				if i%50 == 0 {
					c.Get(ctx, "hot")
				}
			}
		}()
	}
	wg.Wait()
	n := metric(t, p.Metrics.Registry, "redproxy_localcache_fills_total")
	t.Logf("%v fills", n)
	if n > 100 {
		t.Fatalf("%v fills for 20,000 keys read twice each: the sketch saturated", n)
	}
	cacheIt(t, p, p.Client(t), "hot")
}

// write_ratio keeps out a key written about as often as it is read, while
// a key only read is admitted.
func TestWriteHeavyKeyNotAdmitted(t *testing.T) {
	p := startTier(t, nil, func(c *config.Config) { c.LocalCache.WriteRatio = 0.1 })
	c := p.Client(t)
	for i := range 30 {
		mustGet(t, c, "written")
		if err := c.Set(ctx, "written", strconv.Itoa(i), 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	mustGet(t, c, "written")
	if n := metric(t, p.Metrics.Registry, "redproxy_localcache_rejections_total", "reason=write_heavy"); n == 0 {
		t.Fatal("no read was kept out as write-heavy")
	}
	if n := metric(t, p.Metrics.Registry, "redproxy_localcache_entries"); n != 0 {
		t.Fatalf("%v entries after reading a key as often as it was written, want 0", n)
	}
	c.Set(ctx, "read", "x", 0)
	cacheIt(t, p, c, "read")
}
