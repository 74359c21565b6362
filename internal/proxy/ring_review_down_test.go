package proxy_test

import (
	"testing"

	"github.com/redproxy/redproxy/internal/config"
)

func TestRingReviewShardDown(t *testing.T) {
	r := startRingRig(t, nil)
	c := r.c
	k0, k1, k2 := r.keyOn("d:", 0), r.keyOn("d:", 1), r.keyOn("d:", 2)
	c.MSet(ctx, k0, "0", k1, "1", k2, "2")
	r.shards[2].Kill(t)
	if v, err := c.MGet(ctx, k0, k1).Result(); err != nil || v[0] != "0" || v[1] != "1" {
		t.Errorf("MGET on live shards with shard 2 down: %v %v", v, err)
	}
	v, err := c.MGet(ctx, k0, k2).Result()
	t.Logf("MGET k0 k2 with shard 2 down: %v %v", v, err)
	err = c.MSet(ctx, k0, "new", k2, "new").Err()
	t.Logf("MSET k0 k2 with shard 2 down: %v; k0 now %q on its shard", err, r.direct[0].Get(ctx, k0).Val())
	if err := c.Set(ctx, k2, "x", 0).Err(); err == nil {
		t.Errorf("SET of shard 2's key with shard 2 down succeeded (ejected?)")
	}
	if on := r.on(k2); len(on) != 0 {
		t.Errorf("shard 2's key written on %v", on)
	}
	n, err := c.DBSize(ctx).Result()
	t.Logf("DBSIZE with shard 2 down: %v %v", n, err)
}

func TestRingReviewMirrorCheck(t *testing.T) {
	c := config.Default()
	c.Upstream.Address = "127.0.0.1:1"
	c.Upstreams = map[string]config.Upstream{"s1": namedUpstream("127.0.0.1:2"), "s2": namedUpstream("127.0.0.1:3")}
	c.Routes = []config.Route{{Pattern: "*", Upstreams: []string{"default", "s1", "s2"}}}
	c.Mirror.Upstream = "s2"
	err := c.Validate()
	t.Logf("mirror to a ring member: %v", err)
	if err == nil {
		t.Error("mirror to a ring member accepted")
	}
}
