package localcache_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/localcache"
	"github.com/redproxy/redproxy/internal/redistest"
)

// A stale_if_error value is an old value that beats an error, never one
// older than a write the proxy acknowledged. A write that names its key
// drops the value kept aside; a script's write names none, and the fence
// after it did not drop it: with the tier's connection lost (values moved
// aside) and then the shared connections too, a read answered the value
// from before the script's acknowledged SET.
//
// Redis's maxclients keeps the lost connections from coming back, so the
// windows are as long as the test needs. The same steps without the
// script come first and must serve the stale value: the test reaches the
// state it claims to.
func TestStaleValueNeverPredatesAFencedWrite(t *testing.T) {
	p := startTier(t, nil, func(c *config.Config) {
		c.Upstream.Connections = 1
		c.LocalCache.StaleIfError = []localcache.StaleRule{{Pattern: "*", MaxAge: units.Duration{Duration: time.Minute}}}
	})
	c := p.Client(t, func(o *redis.Options) { o.MaxRetries = -1 })
	direct := redis.NewClient(&redis.Options{Addr: p.Redis.Addr(), PoolSize: 1})
	defer direct.Close()
	defer direct.ConfigSet(ctx, "maxclients", "10000")
	if err := direct.Set(ctx, "k", "before", 0).Err(); err != nil {
		t.Fatal(err)
	}
	losses := 0.0
	run := func(script bool) (string, error) {
		if err := direct.ConfigSet(ctx, "maxclients", "10000").Err(); err != nil {
			t.Fatal(err)
		}
		waitLive(t, p, 0)
		// The shared connections too, which the first run's CLIENT KILL
		// cut while maxclients refused them: one still backing off when
		// maxclients drops again below could not carry the script
		// (seen failing on a quiet machine).
		redistest.Eventually(t, 10*time.Second, func() bool {
			return p.Backend().Pool(0, true).Up() && p.Backend().Pool(0, false).Up()
		}, "the shared connections never came back")
		if v := cacheIt(t, p, c, "k"); v != "before" {
			t.Fatalf("GET k = %q", v)
		}
		if err := direct.ConfigSet(ctx, "maxclients", "1").Err(); err != nil {
			t.Fatal(err)
		}
		if n := killTierConns(t, direct); n == 0 {
			t.Fatal("no tracking connection found in CLIENT LIST")
		}
		losses++
		redistest.Eventually(t, 5*time.Second, func() bool {
			return metric(t, p.Metrics.Registry, "redproxy_localcache_flushes_total", "reason="+localcache.FlushDisconnect) >= losses
		}, "the lost tier connection was never noticed")
		if script {
			// The write the proxy cannot name the key of, acknowledged;
			// it writes the value k already has, which changes nothing
			// for the first run's next step.
			if err := c.Eval(ctx, "return redis.call('SET', 'k', 'before')", nil).Err(); err != nil {
				t.Fatal(err)
			}
		}
		if err := direct.Do(ctx, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes").Err(); err != nil {
			t.Fatal(err)
		}
		redistest.Eventually(t, 5*time.Second, func() bool {
			return c.Ping(ctx).Err() != nil
		}, "the proxy still reaches Redis")
		return c.Get(ctx, "k").Result()
	}
	if v, err := run(false); err != nil || v != "before" {
		t.Fatalf("without a script: GET k = %q, %v; want the value kept aside", v, err)
	}
	if v, err := run(true); err == nil {
		t.Fatalf("after an acknowledged script: GET k = %q; want an error, not a value kept aside before the script", v)
	}
}
