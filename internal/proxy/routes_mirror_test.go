package proxy_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/redistest"
)

// With routes, the upstream [mirror] sends to is not one of them: the
// commands about every upstream (DBSIZE, SCAN, KEYS, ...) and readiness
// leave it out. It was one (found by review): DBSIZE counted the mirror's
// copies, SCAN listed a key only the mirror had, and a frozen mirror
// failed DBSIZE and SCAN after dead_timeout and made the proxy unready,
// where the docs say a mirror stopped changes nothing for clients.
func TestRoutesLeaveTheMirrorOut(t *testing.T) {
	mir := redistest.Start(t)
	r := startRouted(t, func(c *config.Config) {
		m := namedUpstream(mir.Addr())
		m.ReplyTimeout.Duration = 300 * time.Millisecond
		m.DeadTimeout.Duration = time.Second
		c.Upstreams["mir"] = m
		c.Mirror.Upstream = "mir"
	})
	if err := r.c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := mir.Client(t).Set(ctx, "only-on-mirror", "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 5*time.Second, func() bool { return mir.Client(t).Exists(ctx, "k").Val() == 1 }, "k was never mirrored")
	direct := r.def.Client(t).DBSize(ctx).Val() + r.queue.Client(t).DBSize(ctx).Val() + r.cach.Client(t).DBSize(ctx).Val()
	if n, err := r.c.DBSize(ctx).Result(); err != nil || n != direct {
		t.Fatalf("DBSIZE through the proxy: %d, %v; the routed servers hold %d keys", n, err, direct)
	}
	keys := scanAll(t, r.c)
	if slices.Contains(keys, "only-on-mirror") || len(keys) != int(direct) {
		t.Fatalf("SCAN through the proxy: %v; want the routed servers' %d keys", keys, direct)
	}
	mir.Freeze(t)
	defer mir.Thaw(t)
	if _, err := r.c.DBSize(ctx).Result(); err != nil {
		t.Errorf("a frozen mirror failed DBSIZE: %v", err)
	}
	scanAll(t, r.c)
	if !r.p.Ready() {
		t.Errorf("not ready while only the mirror is frozen")
	}
}

// scanAll walks SCAN through c to the end and returns the keys.
func scanAll(t *testing.T, c *redis.Client) []string {
	t.Helper()
	var all []string
	var cur uint64
	for i := 0; ; i++ {
		keys, next, err := c.Scan(ctx, cur, "*", 10).Result()
		if err != nil {
			t.Fatalf("SCAN %d: %v", cur, err)
		}
		all = append(all, keys...)
		if cur = next; cur == 0 {
			return all
		}
		if i == 10000 {
			t.Fatal("SCAN never ended")
		}
	}
}

// TestRoutesMirrorsEveryPartOfASplitMSET: an MSET split over two routes
// with a TTL rule runs as one MULTI per part; the mirror gets every part
// that ran, with its fix-ups, not only the last (found in the read-back
// of the change that split it).
func TestRoutesMirrorsEveryPartOfASplitMSET(t *testing.T) {
	mir := redistest.Start(t)
	r := startRouted(t, func(c *config.Config) {
		c.Upstreams["mir"] = namedUpstream(mir.Addr())
		c.Mirror.Upstream = "mir"
		c.Policy.TTL = []policy.TTLRule{{Pattern: "queue:ttl*", Required: true, Default: policy.Duration{Duration: time.Hour}}}
	})
	if err := r.c.MSet(ctx, "queue:ttl1", "a", "plain", "b", "cache:x", "c").Err(); err != nil {
		t.Fatal(err)
	}
	mc := mir.Client(t)
	redistest.Eventually(t, 5*time.Second, func() bool { return mc.Exists(ctx, "queue:ttl1", "plain", "cache:x").Val() == 3 },
		"the mirror holds %s of the MSET's 3 keys", lazy(func() string { return fmt.Sprint(mc.Exists(ctx, "queue:ttl1", "plain", "cache:x").Val()) }))
	if ttl := mc.TTL(ctx, "queue:ttl1").Val(); ttl <= 0 {
		t.Errorf("queue:ttl1 on the mirror has TTL %v, want the rule's", ttl)
	}
}
