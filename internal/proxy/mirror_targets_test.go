package proxy_test

// Mirror targets other than a standalone server: a Sentinel group, whose
// primary the mirror follows, and a Redis Cluster, where each mirrored
// command goes to the node of its slot.

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/cluster"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/mirror"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// TestMirrorSentinelTarget: with a Sentinel upstream as the mirror, writes
// land on the group's primary, and after a failover on the new one.
func TestMirrorSentinelTarget(t *testing.T) {
	g := redistest.StartSentinelGroup(t, redistest.SentinelOptions{Replicas: 1, Sentinels: 1})
	p := proxytest.Start(t, nil, func(c *config.Config) {
		u := namedUpstream("")
		u.Mode, u.Sentinels, u.MasterName = config.ModeSentinel, g.SentinelAddrs(), g.Name
		c.Upstreams = map[string]config.Upstream{"new": u}
		c.Mirror = mirror.DefaultConfig()
		c.Mirror.Upstream = "new"
		c.Mirror.ReadsSample, c.Mirror.Compare = 1, true
	})
	c := p.Client(t)
	old := g.Nodes[0]
	if err := c.Set(ctx, "sm:1", "a", 0).Err(); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 10*time.Second, func() bool {
		v, _ := old.Client(t).Get(ctx, "sm:1").Result()
		return v == "a"
	}, "sm:1 never reached the Sentinel group's primary %s", old.Addr())

	g.Failover(t)
	next := g.WaitNewPrimary(t, old, 30*time.Second)
	i := 0
	redistest.Eventually(t, 20*time.Second, func() bool {
		i++
		key := fmt.Sprintf("sm:after:%d", i)
		if c.Set(ctx, key, "b", 0).Err() != nil {
			return false
		}
		waitMirrored(t, p)
		v, _ := next.Client(t).Get(ctx, key).Result()
		return v == "b"
	}, "mirrored writes never reached the new primary %s", next.Addr())
	// Once switched, every write lands, and sampled reads match.
	for j := range 20 {
		if err := c.Incr(ctx, "sm:counter").Err(); err != nil {
			t.Fatal(j, err)
		}
	}
	waitMirrored(t, p)
	if v, _ := next.Client(t).Get(ctx, "sm:counter").Result(); v != "20" {
		t.Errorf("new primary sm:counter = %q, want 20", v)
	}
	compareThrough(t, p, c, func() { c.Get(ctx, "sm:counter") })
}

// TestMirrorClusterTarget: with a cluster as the mirror, each write goes to
// the node of its key's slot (keys on all three primaries), MSET and DEL
// across slots are split, a transaction within one slot runs there
// atomically; a transaction across slots, a command Redis Cluster cannot
// split and a write in database 1 are dropped, counted by reason.
func TestMirrorClusterTarget(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	p := proxytest.Start(t, nil, func(c *config.Config) {
		u := namedUpstream("")
		u.Mode, u.Seeds = config.ModeCluster, cl.Seeds()
		c.Upstreams = map[string]config.Upstream{"new": u}
		c.Mirror = mirror.DefaultConfig()
		c.Mirror.Upstream = "new"
		c.Mirror.ReadsSample, c.Mirror.Compare = 1, true
	})
	c := p.Client(t)
	cc := cl.ClusterClient(t)
	check := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	var keys []string
	for i := range 60 {
		key := fmt.Sprintf("cm:%d", i)
		keys = append(keys, key)
		check(c.Set(ctx, key, i, 0).Err())
	}
	check(c.MSet(ctx, "cm:m:a", "1", "cm:m:b", "2", "cm:m:c", "3").Err())
	check(c.Del(ctx, "cm:0", "cm:1", "cm:2").Err())
	_, err := c.TxPipelined(ctx, func(tx redis.Pipeliner) error {
		tx.Set(ctx, "{cm:t}a", "1", 0)
		tx.Incr(ctx, "{cm:t}n")
		return nil
	})
	check(err)
	check(c.RPush(ctx, "cm:l", "x").Err())
	if got, err := c.BLPop(ctx, time.Second, "cm:l").Result(); err != nil || len(got) != 2 {
		t.Fatalf("BLPOP = %v, %v", got, err)
	}
	// Dropped: a transaction across slots, SUNIONSTORE across slots, and a
	// write in database 1.
	if cluster.Slot([]byte("cm:x:1")) == cluster.Slot([]byte("cm:x:2")) {
		t.Fatal("the test's keys share a slot")
	}
	_, err = c.TxPipelined(ctx, func(tx redis.Pipeliner) error {
		tx.Set(ctx, "cm:x:1", "1", 0)
		tx.Set(ctx, "cm:x:2", "2", 0)
		return nil
	})
	check(err)
	check(c.SAdd(ctx, "cm:s1", "a").Err())
	check(c.SUnionStore(ctx, "cm:s3", "cm:s1", "cm:s2").Err())
	c1 := p.Client(t, func(o *redis.Options) { o.DB = 1; o.PoolSize = 1 })
	check(c1.Set(ctx, "cm:db1", "1", 0).Err())
	waitMirrored(t, p)

	for i, key := range keys {
		got, err := cc.Get(ctx, key).Result()
		if i < 3 {
			if err != redis.Nil {
				t.Errorf("mirror %s = %q, %v; want deleted", key, got, err)
			}
			continue
		}
		if err != nil || got != fmt.Sprint(i) {
			t.Errorf("mirror %s = %q, %v; want %d", key, got, err, i)
		}
	}
	for key, want := range map[string]string{"cm:m:a": "1", "cm:m:c": "3", "{cm:t}a": "1", "{cm:t}n": "1"} {
		if got, err := cc.Get(ctx, key).Result(); err != nil || got != want {
			t.Errorf("mirror %s = %q, %v; want %q", key, got, err, want)
		}
	}
	for _, key := range []string{"cm:l", "cm:x:1", "cm:x:2", "cm:s3", "cm:db1"} {
		if n, _ := cc.Exists(ctx, key).Result(); n != 0 {
			t.Errorf("mirror has %s", key)
		}
	}
	primaries := cl.Primaries(t)
	if len(primaries) != 3 {
		t.Fatalf("%d primaries", len(primaries))
	}
	execs := 0
	for _, n := range primaries {
		if size, _ := n.Client(t).DBSize(ctx).Result(); size == 0 {
			t.Errorf("primary %s holds no mirrored key", n.Addr())
		}
		execs += calls(t, n, "exec")
	}
	if execs != 1 {
		t.Errorf("the cluster ran EXEC %d times, want 1 (the transaction within one slot)", execs)
	}
	rep := p.Mirror().Report(0)
	if rep.Dropped[mirror.DropCrossSlot] != 2 || rep.Dropped[mirror.DropDBRange] != 1 || rep.Errors[mirror.ErrReply] != 0 || rep.Errors[mirror.ErrConnection] != 0 {
		t.Errorf("dropped = %v, errors = %v; want 2 cross_slot, 1 db_range, no errors", rep.Dropped, rep.Errors)
	}
	compareThrough(t, p, c, func() {
		for _, key := range keys[3:] {
			c.Get(ctx, key)
		}
		c.Get(ctx, "{cm:t}n")
	})
}
