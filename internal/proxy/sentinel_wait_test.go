package proxy_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// isolateOldPrimary cuts old off from its replicas and its Sentinels while
// the proxy (which talks to Redis as "app") still reaches it, as a network
// partition would: the "default" user, which replicas and Sentinels use,
// is turned off and its connections killed. The Sentinels then see the
// primary down and promote a replica, while old goes on acknowledging the
// proxy's writes, which no replica receives.
func isolateOldPrimary(t *testing.T, old *redistest.Server) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: old.Addr(), Username: "app", Password: "pw", MaxRetries: -1})
	defer c.Close()
	if err := c.Do(ctx, "ACL", "SETUSER", "default", "off").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Do(ctx, "CLIENT", "KILL", "USER", "default").Err(); err != nil {
		t.Fatal(err)
	}
}

// appUserEverywhere creates the proxy's Redis user on every data node
// (ACLs are not replicated).
func appUserEverywhere(t *testing.T, g *redistest.SentinelGroup) {
	t.Helper()
	for _, n := range g.Nodes {
		if err := n.Client(t).Do(ctx, "ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all").Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSentinelWaitAfterFailoverAnswersZero: a client SETs a key,
// acknowledged by the old primary, which no replica hears any more; the
// primary moves, and the client's WAIT 1 (the remedy COMPATIBILITY.md
// gives for writes lost in a failover) answered 1 although the write was
// on no replica and gone from the new primary (found by review): the WAIT
// ran on the new primary and counted its replicas. Redis, on the client's
// connection to the old primary, answers 0; through the proxy the
// client's connection never broke, so nothing else tells it the write is
// not covered. The proxy now answers such a WAIT 0 itself (the backend
// moved since the client's last write), until the client writes again:
// then WAIT counts the new primary's replicas.
func TestSentinelWaitAfterFailoverAnswersZero(t *testing.T) {
	g := redistest.StartSentinelGroup(t, redistest.SentinelOptions{})
	appUserEverywhere(t, g)
	old := g.Nodes[0]
	p := proxytest.Start(t, old, func(c *config.Config) {
		sentinelConfig(g, g.SentinelAddrs())(c)
		c.Upstream.Username, c.Upstream.Password = "app", "pw"
	})
	c := p.Client(t, func(o *redis.Options) {
		o.Username, o.Password = "app", "pw"
		o.PoolSize = 1 // one client connection, as an application's
		o.ReadTimeout = 20 * time.Second
	})
	if err := c.Set(ctx, "wait:before", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Wait(ctx, 1, 5*time.Second).Result(); err != nil || n < 1 {
		t.Fatalf("WAIT before the failover = %d, %v; want the replicas counted", n, err)
	}

	isolateOldPrimary(t, old)
	if err := c.Set(ctx, "wait:lost", "v", 0).Err(); err != nil {
		t.Fatalf("SET on the isolated primary: %v", err)
	}
	// Redis directly, on the connection that wrote, says 0: old has no
	// replica now.
	dc := redis.NewClient(&redis.Options{Addr: old.Addr(), Username: "app", Password: "pw", MaxRetries: -1, PoolSize: 1})
	defer dc.Close()
	if err := dc.Set(ctx, "wait:direct", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := dc.Wait(ctx, 1, 500*time.Millisecond).Result(); err != nil || n != 0 {
		t.Fatalf("WAIT 1 on the isolated primary directly = %d, %v; want 0", n, err)
	}
	next := g.WaitNewPrimary(t, old, 30*time.Second)
	redistest.Eventually(t, 5*time.Second, func() bool { return p.SentinelPrimary() == next.Addr() },
		"the proxy did not follow to %s", next.Addr())

	start := time.Now()
	n, err := c.Wait(ctx, 1, 10*time.Second).Result()
	lost, gerr := next.Client(t).Exists(ctx, "wait:lost").Result()
	t.Logf("after the failover: WAIT 1 = %d, %v in %s; EXISTS wait:lost on the new primary %s = %d, %v",
		n, err, time.Since(start).Round(time.Millisecond), next.Addr(), lost, gerr)
	if err != nil || n != 0 {
		t.Fatalf("WAIT 1 after a failover = %d, %v, for a SET acknowledged by the old primary %s that no replica received; want 0, as Redis answers on the connection that wrote it",
			n, err, old.Addr())
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("WAIT 1 answered 0 after %s: it waited its timeout upstream instead of being answered at once", d)
	}
	// WAITAOF (Redis 7.2 on) is answered the same way: no local fsync,
	// no replica.
	if info, err := next.Client(t).Do(ctx, "COMMAND", "INFO", "waitaof").Slice(); err == nil && len(info) == 1 && info[0] != nil {
		if r, err := c.Do(ctx, "WAITAOF", 0, 1, 1000).Slice(); err != nil || len(r) != 2 || r[0] != int64(0) || r[1] != int64(0) {
			t.Errorf("WAITAOF 0 1 after the failover = %v, %v; want [0 0]", r, err)
		}
	} else {
		t.Logf("this Redis has no WAITAOF (%v, %v): not checked", info, err)
	}

	// A write to the new primary: WAIT counts its replicas again.
	if err := c.Set(ctx, "wait:after", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Wait(ctx, 1, 10*time.Second).Result(); err != nil || n < 1 {
		t.Fatalf("WAIT 1 after a write on the new primary = %d, %v; want its replica counted", n, err)
	}
}
