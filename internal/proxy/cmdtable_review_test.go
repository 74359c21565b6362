package proxy_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/proxy"
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

// TestReviewFailedNewServerReadsNoTable: a NewServer that fails (here
// initUsers, on a listener open to all) leaves nothing running. Its main
// pools had dialled the primary already, and a dial of a server other
// than the one the table describes starts the table's read in the
// background (upstreamSeen); the failure path closed the backend and the
// watcher but not the read (stopTables): it went on after NewServer had
// returned its error, and swapped a table into a server nobody holds.
// Whether the read is still running when NewServer returns is a race (it
// often ends first), so NewServer is tried ten times.
func TestReviewFailedNewServerReadsNoTable(t *testing.T) {
	primary := redistest.Start(t)
	sen := redistest.StartSentinel(t, redistest.SentinelOptions{Sentinels: 1}, primary.Port(), 1)
	cfg := config.Default()
	cfg.Server.Listen, cfg.Server.Admin = "0.0.0.0:0", "" // refused by initUsers: no [[users]], no password
	cfg.Upstream.Mode, cfg.Upstream.Sentinels, cfg.Upstream.MasterName = config.ModeSentinel, []string{sen.Addr()}, "mymaster"
	cfg.Upstream.Address = ""
	cfg.Upstream.Connections = 1 // NewServer goes on as soon as the first dials are in
	const tries = 10
	logs := make([]redistest.LogBuffer, tries)
	atReturn := make([]string, tries)
	for i := range tries {
		_, err := proxy.NewServer(proxy.Options{Config: cfg, Table: commands.Builtin(), Logger: slog.New(slog.NewTextHandler(&logs[i], nil)), Metrics: metrics.New()})
		atReturn[i] = logs[i].String()
		if err == nil {
			t.Fatal("NewServer did not fail")
		}
	}
	time.Sleep(time.Second)
	leaked := 0
	var last string
	for i := range tries {
		if after := strings.TrimPrefix(logs[i].String(), atReturn[i]); strings.Contains(after, "command table") {
			leaked++
			last = after
		}
	}
	if leaked > 0 {
		t.Fatalf("in %d of %d failed NewServers a table read ran on after it returned; logged after one returned:\n%s", leaked, tries, last)
	}
}
