package proxy_test

import (
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/route"
)

// TestRingReviewWatchAcrossReload: WATCH a key, reload a ring that moves
// it to another shard, then MULTI/SET/EXEC: the transaction must not run
// unwatched on the key's new shard.
func TestRingReviewWatchAcrossReload(t *testing.T) {
	r := startRingRig(t, nil)
	var names []string
	for _, s := range r.shards {
		names = append(names, s.Addr())
	}
	md5Ring, _ := route.NewRing([]int{0, 1, 2}, route.RingConfig{Hash: "md5", HashTag: "{}", Names: names})
	var k string
	for n := 0; ; n++ {
		k = "wr:" + strconv.Itoa(n)
		if r.ring.Pick([]byte(k)) != md5Ring.Pick([]byte(k)) {
			break
		}
	}
	err := r.c.Watch(ctx, func(tx *redis.Tx) error {
		next := *r.p.Config()
		next.Routes = []config.Route{{Pattern: "*", Upstreams: []string{config.DefaultUpstream, "s1", "s2"}, HashTag: "{}", Hash: "md5"}}
		if _, err := r.p.Reload(&next); err != nil {
			t.Fatal(err)
		}
		_, err := tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, k, "tx", 0)
			return nil
		})
		return err
	}, k)
	t.Logf("EXEC after the WATCHed key moved shards: %v; key on %v (old shard %d, new %d)", err, r.on(k), r.ring.Pick([]byte(k)), md5Ring.Pick([]byte(k)))
	if err == nil {
		if on := r.on(k); len(on) != 1 || on[0] != md5Ring.Pick([]byte(k)) {
			t.Errorf("EXEC succeeded but wrote %s on %v, not its new shard %d", k, on, md5Ring.Pick([]byte(k)))
		}
	}
}
