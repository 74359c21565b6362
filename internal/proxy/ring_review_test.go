package proxy_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/route"
)

type ringRig struct {
	p      *proxytest.Proxy
	shards []*redistest.Server
	direct []*redis.Client
	ring   *route.Ring
	c      *redis.Client
}

func startRingRig(t *testing.T, mutate func(*config.Config)) *ringRig {
	t.Helper()
	shards := []*redistest.Server{redistest.Start(t), redistest.Start(t), redistest.Start(t)}
	p := proxytest.Start(t, shards[0], func(c *config.Config) {
		c.Upstreams = map[string]config.Upstream{
			"s1": namedUpstream(shards[1].Addr()),
			"s2": namedUpstream(shards[2].Addr()),
		}
		c.Routes = []config.Route{{Pattern: "*", Upstreams: []string{config.DefaultUpstream, "s1", "s2"}, HashTag: "{}"}}
		if mutate != nil {
			mutate(c)
		}
	})
	var names []string
	var direct []*redis.Client
	for _, s := range shards {
		names = append(names, s.Addr())
		direct = append(direct, s.Client(t))
	}
	ring, err := route.NewRing([]int{0, 1, 2}, route.RingConfig{HashTag: "{}", Names: names})
	if err != nil {
		t.Fatal(err)
	}
	return &ringRig{p: p, shards: shards, direct: direct, ring: ring, c: p.Client(t, func(o *redis.Options) { o.MaxRetries = -1 })}
}

// keyOn is a key with prefix on shard i.
func (r *ringRig) keyOn(prefix string, i int) string {
	for n := 0; ; n++ {
		k := prefix + strconv.Itoa(n)
		if r.ring.Pick([]byte(k)) == i {
			return k
		}
	}
}

func (r *ringRig) on(k string) []int {
	var out []int
	for i, d := range r.direct {
		if d.Exists(ctx, k).Val() == 1 {
			out = append(out, i)
		}
	}
	return out
}

func wantErr(t *testing.T, what string, err error, sub string) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), sub) {
		t.Errorf("%s: %v, want an error with %q", what, err, sub)
	}
}

func TestRingReviewCommands(t *testing.T) {
	r := startRingRig(t, nil)
	c := r.c
	k0, k1, k2 := r.keyOn("m:", 0), r.keyOn("m:", 1), r.keyOn("m:", 2)

	t.Run("Split", func(t *testing.T) {
		if err := c.MSet(ctx, k2, "v2", k0, "v0", k1, "v1").Err(); err != nil {
			t.Fatal(err)
		}
		for i, k := range []string{k0, k1, k2} {
			if on := r.on(k); len(on) != 1 || on[0] != i {
				t.Errorf("%s on %v, want [%d]", k, on, i)
			}
		}
		vals, err := c.MGet(ctx, k1, "nokey", k2, k0, k1).Result()
		if err != nil || len(vals) != 5 || vals[0] != "v1" || vals[1] != nil || vals[2] != "v2" || vals[3] != "v0" || vals[4] != "v1" {
			t.Errorf("MGET = %v, %v", vals, err)
		}
		if n := c.Exists(ctx, k0, k1, k2, k1, "nokey").Val(); n != 4 {
			t.Errorf("EXISTS = %d, want 4", n)
		}
		if n := c.Touch(ctx, k0, k1, k2, "nokey").Val(); n != 3 {
			t.Errorf("TOUCH = %d, want 3", n)
		}
		if n := c.Unlink(ctx, k0, k2).Val(); n != 2 {
			t.Errorf("UNLINK = %d", n)
		}
		if n := c.Del(ctx, k1, k0).Val(); n != 1 {
			t.Errorf("DEL = %d", n)
		}
	})

	t.Run("CrossRoute", func(t *testing.T) {
		wantErr(t, "MSETNX across shards", c.MSetNX(ctx, k0, "a", k1, "b").Err(), "CROSSROUTE")
		if on := r.on(k0); len(on) != 0 {
			t.Errorf("MSETNX refused but %s written on %v", k0, on)
		}
		c.Set(ctx, k0, "x", 0)
		wantErr(t, "RENAME across shards", c.Rename(ctx, k0, k1).Err(), "CROSSROUTE")
		wantErr(t, "SUNIONSTORE across shards", c.SUnionStore(ctx, k2, k0, k1).Err(), "CROSSROUTE")
		wantErr(t, "EVAL across shards", c.Eval(ctx, "return redis.call('get', KEYS[1])", []string{k0, k1}).Err(), "CROSSROUTE")
		wantErr(t, "BLPOP across shards", c.BLPop(ctx, 100*time.Millisecond, k1, k2).Err(), "CROSSROUTE")
		// Same tag: one shard.
		if err := c.MSetNX(ctx, "{t}a", "1", "{t}b", "2").Err(); err != nil {
			t.Errorf("MSETNX with one tag: %v", err)
		}
		if err := c.Rename(ctx, "{t}a", "{t}c").Err(); err != nil {
			t.Errorf("RENAME with one tag: %v", err)
		}
		if v, err := c.Eval(ctx, "return redis.call('get', KEYS[1])", []string{"{t}c", "{t}b"}).Result(); err != nil || v != "1" {
			t.Errorf("EVAL with one tag: %v %v", v, err)
		}
		tagShard := r.ring.Pick([]byte("t"))
		if on := r.on("{t}c"); len(on) != 1 || on[0] != tagShard {
			t.Errorf("{t}c on %v, want [%d]", on, tagShard)
		}
		// EVAL with no keys
		if v, err := c.Eval(ctx, "return 1", nil).Result(); err != nil || v != int64(1) {
			t.Errorf("EVAL with no keys: %v %v", v, err)
		}
	})

	t.Run("Blocking", func(t *testing.T) {
		l2 := r.keyOn("list:", 2)
		go func() {
			time.Sleep(200 * time.Millisecond)
			r.direct[2].RPush(ctx, l2, "x")
		}()
		v, err := c.BLPop(ctx, 3*time.Second, l2).Result()
		if err != nil || len(v) != 2 || v[1] != "x" {
			t.Errorf("BLPOP on shard 2's key: %v %v", v, err)
		}
	})

	t.Run("Tx", func(t *testing.T) {
		_, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, "{u}x", "1", 0)
			p.Incr(ctx, "{u}y")
			return nil
		})
		if err != nil {
			t.Errorf("MULTI one tag: %v", err)
		}
		_, err = c.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, k0, "1", 0)
			p.Set(ctx, k1, "1", 0)
			return nil
		})
		wantErr(t, "MULTI on two shards", err, "EXECABORT")
		// WATCH on shard 1's key, changed behind: EXEC fails.
		w1 := r.keyOn("w:", 1)
		err = c.Watch(ctx, func(tx *redis.Tx) error {
			r.direct[1].Set(ctx, w1, "changed", 0)
			_, err := tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.Set(ctx, w1, "mine", 0)
				return nil
			})
			return err
		}, w1)
		if err != redis.TxFailedErr {
			t.Errorf("WATCH %s changed on its shard: EXEC %v, want TxFailedErr", w1, err)
		}
	})

	t.Run("ScanDBSize", func(t *testing.T) {
		for _, d := range r.direct {
			d.FlushAll(ctx)
		}
		want := map[string]bool{}
		for i := range 90 {
			k := "s:" + ringKey(i)
			want[k] = true
			c.Set(ctx, k, "v", 0)
			c.Set(ctx, "other:"+ringKey(i), "v", 0)
		}
		for i, d := range r.direct {
			if d.DBSize(ctx).Val() == 0 {
				t.Fatalf("shard %d empty", i)
			}
		}
		if n := c.DBSize(ctx).Val(); n != 180 {
			t.Errorf("DBSIZE = %d, want 180", n)
		}
		got := map[string]bool{}
		var cur uint64
		for rounds := 0; ; rounds++ {
			keys, next, err := c.Scan(ctx, cur, "s:*", 7).Result()
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range keys {
				if got[k] {
					t.Errorf("SCAN returned %s twice", k)
				}
				got[k] = true
				if !want[k] {
					t.Errorf("SCAN MATCH s:* returned %s", k)
				}
			}
			if next == 0 || rounds > 1000 {
				break
			}
			cur = next
		}
		if len(got) != len(want) {
			t.Errorf("SCAN found %d of %d", len(got), len(want))
		}
	})

	t.Run("Wait", func(t *testing.T) {
		c.Set(ctx, k2, "w", 0)
		if n, err := c.Wait(ctx, 0, 100*time.Millisecond).Result(); err != nil {
			t.Errorf("WAIT after a write on shard 2: %d %v", n, err)
		}
	})
}

func TestRingReviewKeyspace(t *testing.T) {
	r := startRingRig(t, nil)
	for _, d := range r.direct {
		if err := d.ConfigSet(ctx, "notify-keyspace-events", "KA").Err(); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		k := r.keyOn("ks:", i)
		sub := r.p.Client(t).Subscribe(ctx, "__keyspace@0__:"+k)
		if _, err := sub.Receive(ctx); err != nil {
			t.Fatal(err)
		}
		r.c.Set(ctx, k, "v", 0)
		select {
		case m := <-sub.Channel():
			if m.Payload != "set" {
				t.Errorf("shard %d: %v", i, m)
			}
		case <-time.After(2 * time.Second):
			t.Errorf("SUBSCRIBE __keyspace@0__:%s (shard %d) heard nothing after SET", k, i)
		}
		sub.Close()
	}
	ps := r.p.Client(t).PSubscribe(ctx, "__keyspace@0__:*")
	_, err := ps.Receive(ctx)
	wantErr(t, "PSUBSCRIBE __keyspace@0__:*", err, "ERR")
	ps.Close()
	// A pattern whose literal prefix is inside one tag still spans shards
	// (the tag is not the prefix): refused too?
	ps2 := r.p.Client(t).PSubscribe(ctx, "__keyspace@0__:{t}*")
	_, err = ps2.Receive(ctx)
	t.Logf("PSUBSCRIBE __keyspace@0__:{t}*: %v", err)
	ps2.Close()
}

func TestRingReviewLocalTier(t *testing.T) {
	r := startRingRig(t, func(c *config.Config) { c.LocalCache.Enabled = true })
	c := r.c
	for i := range 3 {
		k := r.keyOn("lt:", i)
		c.Set(ctx, k, "1", 0)
		for range 3 {
			if v := c.Get(ctx, k).Val(); v != "1" {
				t.Fatalf("GET %s = %q", k, v)
			}
		}
		c.Set(ctx, k, "2", 0)
		for range 20 {
			c.Get(ctx, k)
		}
		if v := c.Get(ctx, k).Val(); v != "2" {
			t.Errorf("shard %d: GET after acknowledged SET through proxy = %q, want 2", i, v)
		}
		// Written behind the proxy on its shard: invalidation must come.
		before, _, _ := metrics.CounterSum(r.p.Metrics.Registry, "redproxy_localcache_hits_total")
		r.direct[i].Set(ctx, k, "3", 0)
		redistest.Eventually(t, 3*time.Second, func() bool { return c.Get(ctx, k).Val() == "3" }, "shard %d: tier never invalidated %s", i, k)
		t.Logf("shard %d: tier hits before the write behind %v", i, before)
		// MSET across shards then MGET.
	}
	a, b := r.keyOn("lm:", 0), r.keyOn("lm:", 2)
	c.MSet(ctx, a, "1", b, "1")
	c.MGet(ctx, a, b)
	c.MGet(ctx, a, b)
	c.MSet(ctx, a, "2", b, "2")
	if v := c.MGet(ctx, a, b).Val(); v[0] != "2" || v[1] != "2" {
		t.Errorf("MGET after MSET across shards with the tier: %v", v)
	}
	c.Del(ctx, a, b)
	if v := c.MGet(ctx, a, b).Val(); v[0] != nil || v[1] != nil {
		t.Errorf("MGET after DEL across shards with the tier: %v", v)
	}
}

// TestRingReviewNamespace: with a namespace "a:", Redis stores "a:k". A
// twemproxy pool holding the same data hashes "a:k"; the ring must too.
func TestRingReviewNamespace(t *testing.T) {
	r := startRingRig(t, func(c *config.Config) {
		a := user("tenant-a", nsPass, "+@all ~* allchannels")
		a.Namespace = "a:"
		c.Users = []auth.UserConfig{a, user("admin", nsPass, "+@all ~* allchannels")}
	})
	c := nsClient(t, r.p, "tenant-a")
	bad := 0
	for i := range 60 {
		k := "n:" + strconv.Itoa(i)
		if err := c.Set(ctx, k, "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
		on := r.on("a:" + k)
		stored, client := r.ring.Pick([]byte("a:"+k)), r.ring.Pick([]byte(k))
		if len(on) != 1 || on[0] != stored {
			if bad++; bad <= 3 {
				t.Errorf("namespaced %q stored as a:%s on %v; ring of the stored key %d, of the client's key %d", k, k, on, stored, client)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of 60 namespaced keys not where a pool holding the prefixed keys has them", bad)
	}
}

// TestRingReviewReload: changing the ring's hash moves keys; the tier
// must drop what it holds and keys route by the new ring.
func TestRingReviewReload(t *testing.T) {
	r := startRingRig(t, func(c *config.Config) { c.LocalCache.Enabled = true })
	c := r.c
	var names []string
	for _, s := range r.shards {
		names = append(names, s.Addr())
	}
	md5Ring, err := route.NewRing([]int{0, 1, 2}, route.RingConfig{Hash: "md5", HashTag: "{}", Names: names})
	if err != nil {
		t.Fatal(err)
	}
	// A key whose shard changes.
	var k string
	for n := 0; ; n++ {
		k = "rl:" + strconv.Itoa(n)
		if r.ring.Pick([]byte(k)) != md5Ring.Pick([]byte(k)) {
			break
		}
	}
	oldS, newS := r.ring.Pick([]byte(k)), md5Ring.Pick([]byte(k))
	c.Set(ctx, k, "old", 0)
	for range 20 {
		c.Get(ctx, k)
	}
	h0, _, _ := metrics.CounterSum(r.p.Metrics.Registry, "redproxy_localcache_hits_total")
	t.Logf("tier hits before the reload: %v", h0)
	r.direct[newS].Set(ctx, k, "new", 0)
	next := *r.p.Config()
	next.Routes = []config.Route{{Pattern: "*", Upstreams: []string{config.DefaultUpstream, "s1", "s2"}, HashTag: "{}", Hash: "md5"}}
	msgs, err := r.p.Reload(&next)
	t.Logf("reload: %v %v", msgs, err)
	if err != nil {
		t.Fatal(err)
	}
	if v := c.Get(ctx, k).Val(); v != "new" {
		t.Errorf("after reload to md5: GET %s = %q, want new (old shard %d, new %d)", k, v, oldS, newS)
	}
	// Weights change.
	wRing, _ := route.NewRing([]int{0, 1, 2}, route.RingConfig{Hash: "md5", HashTag: "{}", Names: names, Weights: []int{1, 1, 50}})
	var k2 string
	for n := 0; ; n++ {
		k2 = "rw:" + strconv.Itoa(n)
		if wRing.Pick([]byte(k2)) != md5Ring.Pick([]byte(k2)) {
			break
		}
	}
	c.Set(ctx, k2, "old", 0)
	for range 20 {
		c.Get(ctx, k2)
	}
	r.direct[wRing.Pick([]byte(k2))].Set(ctx, k2, "new", 0)
	next2 := *r.p.Config()
	next2.Routes = []config.Route{{Pattern: "*", Upstreams: []string{config.DefaultUpstream, "s1", "s2"}, HashTag: "{}", Hash: "md5", Weights: []int{1, 1, 50}}}
	if _, err := r.p.Reload(&next2); err != nil {
		t.Fatal(err)
	}
	if v := c.Get(ctx, k2).Val(); v != "new" {
		t.Errorf("after reload of weights: GET %s = %q, want new", k2, v)
	}
}
