package proxy_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
)

func TestRingReviewMore(t *testing.T) {
	r := startRingRig(t, func(c *config.Config) {
		c.Policy.Commands.Allow = []string{"keys", "flushdb", "flushall"}
	})
	c := r.c
	k0, k1, k2 := r.keyOn("e:", 0), r.keyOn("e:", 1), r.keyOn("e:", 2)
	sha, err := c.ScriptLoad(ctx, "return redis.call('incr', KEYS[1])").Result()
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range []string{k0, k1, k2} {
		if v, err := c.EvalSha(ctx, sha, []string{k}).Result(); err != nil || v != int64(1) {
			t.Errorf("EVALSHA after SCRIPT LOAD, key on shard %d: %v %v", i, v, err)
		}
	}
	ex, err := c.ScriptExists(ctx, sha).Result()
	t.Logf("SCRIPT EXISTS: %v %v", ex, err)
	_, err = c.FunctionLoad(ctx, "#!lua name=revlib\nredis.register_function('revf', function(keys, args) return redis.call('incr', keys[1]) end)").Result()
	if err != nil {
		t.Logf("FUNCTION LOAD: %v", err)
	} else {
		for i, k := range []string{k0, k1, k2} {
			if v, err := c.FCall(ctx, "revf", []string{k}).Result(); err != nil || v != int64(2) {
				t.Errorf("FCALL after FUNCTION LOAD, key on shard %d: %v %v", i, v, err)
			}
		}
	}
	if keys, err := c.Keys(ctx, "e:*").Result(); err != nil || len(keys) != 3 {
		t.Errorf("KEYS e:* = %v, %v", keys, err)
	}
	rk, err := c.RandomKey(ctx).Result()
	t.Logf("RANDOMKEY: %q %v", rk, err)
	c.XAdd(ctx, &redis.XAddArgs{Stream: k1 + "s", Values: []string{"a", "1"}})
	_, err = c.XRead(ctx, &redis.XReadArgs{Streams: []string{k0, k1, "0", "0"}, Block: -1}).Result()
	wantErr(t, "XREAD over two shards", err, "CROSSROUTE")
	_, _, err = c.LMPop(ctx, "left", 1, k0, k2).Result()
	wantErr(t, "LMPOP over two shards", err, "CROSSROUTE")
	_, err = c.SInterCard(ctx, 0, k0, k2).Result()
	wantErr(t, "SINTERCARD over two shards", err, "CROSSROUTE")
	_, err = c.Copy(ctx, k0, k1, 0, false).Result()
	wantErr(t, "COPY over two shards", err, "CROSSROUTE")
	_, err = c.Do(ctx, "object", "encoding", k2).Result()
	if err != nil {
		t.Errorf("OBJECT ENCODING on shard 2's key: %v", err)
	}
	if err := c.FlushAll(ctx).Err(); err != nil {
		t.Errorf("FLUSHALL: %v", err)
	}
	for i, d := range r.direct {
		if n := d.DBSize(ctx).Val(); n != 0 {
			t.Errorf("shard %d holds %d keys after FLUSHALL", i, n)
		}
	}
	_ = time.Second
}

// Keyspace patterns inside a single-upstream route placed before a ring.
func TestRingReviewPatternBeforeRing(t *testing.T) {
	r := startRingRig(t, func(c *config.Config) {
		c.Routes = append([]config.Route{{Pattern: "q:*", Upstream: "s1"}}, c.Routes...)
	})
	r.direct[1].ConfigSet(ctx, "notify-keyspace-events", "KA")
	ps := r.p.Client(t).PSubscribe(ctx, "__keyspace@0__:q:*")
	_, err := ps.Receive(ctx)
	t.Logf("PSUBSCRIBE __keyspace@0__:q:* with q:* -> s1 before the ring: %v", err)
	ps.Close()
}

// The same without a ring: q:* -> s1, * -> s2.
func TestRingReviewPatternBeforeSingle(t *testing.T) {
	r := startRingRig(t, func(c *config.Config) {
		c.Routes = []config.Route{{Pattern: "q:*", Upstream: "s1"}, {Pattern: "*", Upstream: "s2"}}
	})
	ps := r.p.Client(t).PSubscribe(ctx, "__keyspace@0__:q:*")
	_, err := ps.Receive(ctx)
	t.Logf("PSUBSCRIBE __keyspace@0__:q:* with q:* -> s1, * -> s2: %v", err)
	ps.Close()
}
