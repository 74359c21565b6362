package proxy_test

// Seams between features built in parallel (issue 9 review): the batch
// split of the output limits against the guard's look-ahead, ...

import (
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// The guard lets a write pass without its fix-up when a later command of
// the same batch certainly gives the key its TTL. The output limits answer
// a batch in parts and close a client whose part overflows its limit; if
// the write and that later command land in different parts, the client is
// closed before the EXPIRE is ever sent and the key stays without TTL.
func TestTrustedTTLIsNotSplitFromItsWrite(t *testing.T) {
	const limit = 4 << 20
	p := proxytest.Start(t, nil, func(c *config.Config) {
		c.Server.ClientOutputLimit = limit
		c.Policy = policy.Config{Mode: "enforce", TTL: []policy.TTLRule{
			{Pattern: "s:*", Required: true, Default: policy.Duration{Duration: 24 * time.Hour}},
		}}
	})
	direct := p.Redis.Client(t)
	if err := direct.Set(ctx, "big", strings.Repeat("b", limit+1<<20), 0).Err(); err != nil {
		t.Fatal(err)
	}
	c := dialRaw(t, p.Addr)
	// A new client's replies are assumed large, so its batch is answered
	// in parts of two commands here: HSET and GET big, then EXPIRE.
	c.send([]string{"HSET", "s:k", "f", "v"}, []string{"GET", "big"}, []string{"EXPIRE", "s:k", "100"})
	redistest.Eventually(t, 10*time.Second, func() bool { return closedFor(p, metrics.CloseOutputLimit) == 1 },
		"the client was never closed for its output limit")
	if !connClosed(c.nc) {
		t.Fatal("the output limit was counted but the connection stayed open")
	}
	ttl, err := direct.TTL(ctx, "s:k").Result()
	if err != nil {
		t.Fatal(err)
	}
	if ttl <= 0 {
		t.Fatalf("TTL s:k = %v after the client was closed: the write ran, the EXPIRE trusted for it did not", ttl)
	}
}
