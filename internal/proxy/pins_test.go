package proxy_test

import (
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// upstream.max_pinned bounds the dedicated connections to Redis of every
// upstream credential together, not each credential's pools on their own:
// two users with credentials of their own and one on the proxy's share
// max_pinned = 2.
func TestMaxPinnedIsTotalAcrossCredentials(t *testing.T) {
	rs := redistest.Start(t)
	rc := rs.Client(t)
	for _, name := range []string{"redis-a", "redis-b"} {
		if err := rc.Do(ctx, "acl", "setuser", name, "on", ">"+name+"-pw", "~*", "+@all").Err(); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	for _, name := range []string{"redis-a", "redis-b"} {
		if err := writeFileT(dir+"/"+name, name+"-pw\n"); err != nil {
			t.Fatal(err)
		}
	}
	p := proxytest.Start(t, rs, func(c *config.Config) {
		a := user("a", "a-pw", "+@all ~*")
		a.UpstreamUser, a.UpstreamPasswordFile = "redis-a", dir+"/redis-a"
		b := user("b", "b-pw", "+@all ~*")
		b.UpstreamUser, b.UpstreamPasswordFile = "redis-b", dir+"/redis-b"
		c.Users = []auth.UserConfig{a, b, user("c", "c-pw", "+@all ~*")}
		c.Upstream.MaxPinned = 2
	})
	// watch logs in as name and sends WATCH, which takes a dedicated
	// connection; it returns WATCH's reply and the connection.
	watch := func(name string) (string, *replyReader) {
		nc := p.Dial(t)
		rd := newReplyReader(nc)
		nc.Write([]byte("AUTH " + name + " " + name + "-pw\r\nWATCH k\r\n"))
		if got := rd.line(t); got != "+OK" {
			t.Fatalf("AUTH %s: %q", name, got)
		}
		return rd.line(t), rd
	}
	const refused = "-ERR redproxy: too many dedicated upstream connections in use (upstream.max_pinned)"
	gotA, rdA := watch("a")
	gotB, _ := watch("b")
	if gotA != "+OK" || gotB != "+OK" {
		t.Fatalf("first two WATCHes: %q %q", gotA, gotB)
	}
	for _, name := range []string{"a", "b", "c"} {
		if got, _ := watch(name); got != refused {
			t.Errorf("WATCH as %s with max_pinned taken by a and b: %q, want %q", name, got, refused)
		}
	}
	if n := p.Backend().PinnedTotal(); n != 2 {
		t.Errorf("PinnedTotal = %d, want 2", n)
	}
	// The refusals are counted (a user's trial found neither a metric nor
	// a log line for them).
	if got, found, err := metrics.CounterSum(p.Metrics.Registry, "redproxy_upstream_dedicated_refused_total"); err != nil || !found || got != 3 {
		t.Errorf("redproxy_upstream_dedicated_refused_total = %v (found %v, %v), want 3", got, found, err)
	}
	// Redis itself sees no more dedicated connections than the limit.
	list, err := rc.ClientList(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(list, "name=redproxy-pinned"); n > 2 {
		t.Errorf("%d dedicated connections on Redis, max_pinned is 2:\n%s", n, list)
	}
	// One given back (UNWATCH) lets another credential take it.
	rdA.nc.Write([]byte("UNWATCH\r\n"))
	if got := rdA.line(t); got != "+OK" {
		t.Fatalf("UNWATCH: %q", got)
	}
	redistest.Eventually(t, 5*time.Second, func() bool { return p.Backend().PinnedTotal() == 1 }, "a's dedicated connection never given back")
	if got, _ := watch("c"); got != "+OK" {
		t.Errorf("WATCH as c after a's UNWATCH: %q", got)
	}
}
