package proxy_test

import (
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
)

// TestRingReviewPipelineOrder: a pipeline mixing keys of every shard,
// split commands and single-key ones, answered in order.
func TestRingReviewPipelineOrder(t *testing.T) {
	for _, tier := range []bool{false, true} {
		t.Run("tier="+strconv.FormatBool(tier), func(t *testing.T) {
			r := startRingRig(t, func(c *config.Config) { c.LocalCache.Enabled = tier })
			c := r.c
			const n = 400
			for round := range 3 {
				cmds, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
					for i := range n {
						k := "p:" + ringKey(i)
						p.Set(ctx, k, strconv.Itoa(i+round), 0)
						p.Get(ctx, k)
						if i%10 == 9 {
							p.MGet(ctx, "p:"+ringKey(i), "p:"+ringKey(i-1), "p:"+ringKey(i-5), "nokey")
						}
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
				j := 0
				for i := range n {
					if v := cmds[j+1].(*redis.StringCmd).Val(); v != strconv.Itoa(i+round) {
						t.Fatalf("round %d: GET %d in the pipeline = %q", round, i, v)
					}
					j += 2
					if i%10 == 9 {
						vals := cmds[j].(*redis.SliceCmd).Val()
						if vals[0] != strconv.Itoa(i+round) || vals[1] != strconv.Itoa(i-1+round) || vals[2] != strconv.Itoa(i-5+round) || vals[3] != nil {
							t.Fatalf("round %d: MGET %d = %v", round, i, vals)
						}
						j++
					}
				}
			}
			big := make([]string, 1000)
			for i := range big {
				big[i] = "p:" + ringKey(i%n)
			}
			vals, err := c.MGet(ctx, big...).Result()
			if err != nil {
				t.Fatal(err)
			}
			for i, v := range vals {
				if v != strconv.Itoa(i%n+2) {
					t.Fatalf("MGET of 1000: value %d = %v", i, v)
				}
			}
		})
	}
}
