package proxy_test

import (
	"regexp"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// INFO's upstream line counts the connections of every pool: with RESP2
// and RESP3 clients, upstream.connections 2 is 4 connections up, as Redis
// sees them (found by a probe: db 0's RESP2 pool alone, 2).
func TestInfoCountsEveryPoolsConnections(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Upstream.Connections = 2 })
	for _, proto := range []int{2, 3} {
		c := p.Client(t, func(o *redis.Options) { o.Protocol = proto })
		must(t, c.Ping(ctx).Err())
	}
	up := regexp.MustCompile(`upstream_0:[^\r\n]*connections_up=(\d+)`)
	var got string
	redistest.Eventually(t, 5*time.Second, func() bool {
		info, err := p.Client(t).Info(ctx, "proxy").Result()
		if err != nil {
			t.Fatal(err)
		}
		if m := up.FindStringSubmatch(info); m != nil {
			got = m[1]
		}
		return got == "4"
	}, "INFO upstream_0 connections_up=%v; want 4 (two pools of 2)", lazyString{&got})
}

// lazyString prints *p when formatted: a failure message shows the last
// value an Eventually condition saw.
type lazyString struct{ p *string }

func (s lazyString) String() string { return *s.p }
