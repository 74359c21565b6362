package proxy_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/redistest"
)

// The mirror copies a write queued in MULTI with the parts queued behind it
// (mirrorQueuedCmd), its fix-ups included: the mirror's copy of a key
// written in a transaction gets the TTL the primary's gets.
func TestMirrorTransactionKeepsFixups(t *testing.T) {
	ms := redistest.Start(t)
	p := startMirrored(t, ms, func(c *config.Config) {
		c.Policy.TTL = []policy.TTLRule{{Pattern: "h:*", Required: true, Default: policy.Duration{Duration: time.Hour}}}
	})
	c := p.Client(t)
	direct := p.Redis.Client(t)
	mc := ms.Client(t)
	if _, err := c.TxPipelined(ctx, func(tx redis.Pipeliner) error {
		tx.HSet(ctx, "h:tx", "f", "v")
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	waitMirrored(t, p)
	if ttl, _ := direct.TTL(ctx, "h:tx").Result(); ttl <= 0 {
		t.Fatalf("primary h:tx TTL = %v", ttl)
	}
	if got, _ := mc.HGet(ctx, "h:tx", "f").Result(); got != "v" {
		t.Fatalf("mirror h:tx f = %q", got)
	}
	if ttl, _ := mc.TTL(ctx, "h:tx").Result(); ttl <= 0 {
		t.Errorf("mirror h:tx TTL = %v: the transaction's fix-up was not mirrored", ttl)
	}
}
