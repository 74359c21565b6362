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

// The same transaction typed command by command: the write's fix-up waits
// for the transaction's end (it is queued before EXEC, apart from the
// write) and the mirror gets it too.
func TestMirrorTypedTransactionKeepsFixups(t *testing.T) {
	ms := redistest.Start(t)
	p := startMirrored(t, ms, func(c *config.Config) {
		c.Policy.TTL = []policy.TTLRule{{Pattern: "h:*", Required: true, Default: policy.Duration{Duration: time.Hour}}}
	})
	conn := p.Client(t).Conn()
	defer conn.Close()
	for _, cmd := range [][]any{{"MULTI"}, {"HSET", "h:typed", "f", "v"}, {"EXEC"}} {
		if err := conn.Do(ctx, cmd...).Err(); err != nil {
			t.Fatalf("%v: %v", cmd, err)
		}
	}
	waitMirrored(t, p)
	if ttl, _ := p.Redis.Client(t).TTL(ctx, "h:typed").Result(); ttl <= 0 {
		t.Fatalf("primary h:typed TTL = %v", ttl)
	}
	mc := ms.Client(t)
	if got, _ := mc.HGet(ctx, "h:typed", "f").Result(); got != "v" {
		t.Fatalf("mirror h:typed f = %q", got)
	}
	if ttl, _ := mc.TTL(ctx, "h:typed").Result(); ttl <= 0 {
		t.Errorf("mirror h:typed TTL = %v: the transaction's fix-up was not mirrored", ttl)
	}
}
