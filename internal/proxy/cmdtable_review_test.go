package proxy_test

import (
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// TestReviewSentinelTableNotTakenFromUpstreamAddress: in Sentinel mode
// upstream.address is not used, yet NewServer took it for the server the
// start's table describes when Options.UpstreamAddr is empty (main: no
// Sentinel answered at start, so the built-in table stood in). When the
// primary the Sentinels name is at that address (a file that kept the
// address of the Redis it used before Sentinel mode, the example's
// 127.0.0.1:6379), its first dial's version was adopted as the built-in
// table's and the primary's own table was never read; at any other
// address it is. Here the primary lacks GETDEL: a namespaced client's
// GETDEL must be refused by the proxy once the primary's table is in,
// not forwarded with its prefixed key for Redis to call unknown.
func TestReviewSentinelTableNotTakenFromUpstreamAddress(t *testing.T) {
	primary := redistest.Start(t, "--rename-command", "GETDEL", "")
	sen := redistest.StartSentinel(t, redistest.SentinelOptions{Sentinels: 1}, primary.Port(), 1)
	app := user("app", nsPass, "+@all ~* allchannels")
	app.Namespace = "app:"
	// proxytest leaves upstream.address at the primary's address.
	p := proxytest.Start(t, primary, func(c *config.Config) {
		c.Upstream.Mode, c.Upstream.Sentinels, c.Upstream.MasterName = config.ModeSentinel, []string{sen.Addr()}, "mymaster"
		c.Users = []auth.UserConfig{app}
	})
	if got := p.SentinelPrimary(); got != primary.Addr() {
		t.Fatalf("primary %q, want %q", got, primary.Addr())
	}
	c := nsClient(t, p, "app", func(o *redis.Options) { o.PoolSize = 1 })
	const refused = "cannot be confined to a namespace"
	var err error
	redistest.Eventually(t, 5*time.Second, func() bool {
		err = c.GetDel(ctx, "k").Err()
		return err != nil && strings.Contains(err.Error(), refused)
	}, "GETDEL still taken for a command: the primary's table was never read (last answer: %v)", lazyErr{&err})
}
