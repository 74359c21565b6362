package proxy_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/stampede"
)

// stampedeCounts reads the redproxy_stampede_NAME series of p's registry:
// by upstream label value ("" for a series with no upstream label).
func stampedeCounts(t *testing.T, p *proxytest.Proxy, name string) map[string]float64 {
	t.Helper()
	return metricBy(t, p, "redproxy_stampede_"+name, "upstream")
}

// TestRoutesStampedeMetricsPerUpstream: with routes, stampede protection's
// counters carry the upstream of the read's key, one series per configured
// upstream; a miss hold counts its held read and its timeout under its
// key's upstream.
func TestRoutesStampedeMetricsPerUpstream(t *testing.T) {
	r := startRouted(t, func(c *config.Config) {
		// Long enough for the second client's GET to come within it on a
		// loaded machine (CI beside other work: 100 ms had passed, the
		// hold was over, and that GET filled instead of being held).
		c.Stampede.Hold = []stampede.HoldRule{{Pattern: "queue:h*", Timeout: units.Duration{Duration: 2 * time.Second}}}
	})
	for _, key := range []string{"queue:m", "queue:m", "plain:m"} {
		if err := r.c.Get(ctx, key).Err(); err != redis.Nil {
			t.Fatalf("GET %s: %v", key, err)
		}
	}
	got := stampedeCounts(t, r.p, "coalesced_reads_total")
	if got["queue"] != 2 || got["default"] != 1 || got["cache"] != 0 {
		t.Errorf("coalesced reads by upstream = %v, want queue 2, default 1, cache 0", got)
	}
	if _, ok := got["cache"]; !ok || len(got) != 3 {
		t.Errorf("want one series per configured upstream (default, queue, cache), have %v", got)
	}
	// The first miss makes its client the filler; a second client's GET
	// is held until the hold times out (nobody writes the key).
	if err := r.c.Get(ctx, "queue:h1").Err(); err != redis.Nil {
		t.Fatalf("filler's GET: %v", err)
	}
	if err := r.p.Client(t).Get(ctx, "queue:h1").Err(); err != redis.Nil {
		t.Fatalf("held GET: %v", err)
	}
	if got := stampedeCounts(t, r.p, "held_reads_total"); got["queue"] != 1 || got["default"] != 0 {
		t.Errorf("held reads by upstream = %v, want queue 1", got)
	}
	if got := stampedeCounts(t, r.p, "hold_timeouts_total"); got["queue"] != 1 || got["default"] != 0 {
		t.Errorf("hold timeouts by upstream = %v, want queue 1", got)
	}
	// The labelled exposition passes promtool as the unlabelled one does
	// (cmd/redproxy TestMetricsPassPromtool).
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Log("promtool not installed: exposition not checked")
		return
	}
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(r.p.Metrics.Registry, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(rec.Body.String())
	if out, err := cmd.CombinedOutput(); err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("promtool check metrics with routes: %v\n%s", err, out)
	}
}

// TestStampedeMetricsUnlabelledWithoutRoutes: without routes the stampede
// counters keep the names and the absence of labels they had before
// routes, so existing dashboards keep working.
func TestStampedeMetricsUnlabelledWithoutRoutes(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	if err := p.Client(t).Get(ctx, "plain:m").Err(); err != redis.Nil {
		t.Fatal(err)
	}
	got := stampedeCounts(t, p, "coalesced_reads_total")
	if len(got) != 1 || got[""] != 1 {
		t.Fatalf("coalesced reads = %v, want one unlabelled series counting 1", got)
	}
}

// TestRoutesClusterUpstreamErrorsAreCounted: a command to a named cluster
// upstream that no node answers counts in redproxy_route_errors_total
// under that upstream, as for any other upstream, and its nodes'
// connections are in redproxy_upstream_connections_up. The cluster's router
// answers such a command with an error reply of its own, which the routed
// batch took for Redis's: a cluster upstream whose every node was down
// counted 0 while its clients got "upstream unavailable" (found by a
// probe).
func TestRoutesClusterUpstreamErrorsAreCounted(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	p := proxytest.Start(t, nil, func(c *config.Config) {
		routeBigToCluster(c, cl)
	})
	c := p.Client(t)
	if err := c.Set(ctx, "big:k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n := counterSum(t, p, "redproxy_route_errors_total", "upstream", "big"); n != 0 {
		t.Fatalf("%v route errors with every node up", n)
	}
	// The cluster's nodes have connection series of their own, labelled
	// with the node, and the default upstream's carry an empty node label
	// (one name's series carry the same labels); it had none.
	up := metricBy(t, p, "redproxy_upstream_connections_up", "upstream", "node")
	var nodes int
	for key, n := range up {
		if strings.HasPrefix(key, "big/") && key != "big/" && n > 0 {
			nodes++
		}
	}
	if nodes == 0 || up["default/"] == 0 {
		t.Fatalf("redproxy_upstream_connections_up by upstream and node: %v; want the default upstream's and the node of big:k's", up)
	}
	for _, n := range cl.Nodes {
		n.Kill(t)
	}
	if err := c.Get(ctx, "big:k").Err(); err == nil || !strings.Contains(err.Error(), "redproxy") {
		t.Fatalf("GET big:k with every node down: %v, want the proxy's error", err)
	}
	redistest.Eventually(t, 10*time.Second, func() bool {
		for key, n := range metricBy(t, p, "redproxy_upstream_connections_up", "upstream", "node") {
			if strings.HasPrefix(key, "big/") && n > 0 {
				return false
			}
		}
		return true
	}, "connections to a cluster whose every node is down still counted up")
	if n := counterSum(t, p, "redproxy_route_errors_total", "upstream", "big"); n != 1 {
		t.Fatalf("redproxy_route_errors_total{upstream=\"big\"} = %v after a GET no node answered, want 1", n)
	}
	// Once per command, as redproxy_route_commands_total counts, however
	// many slots it was split over (it counted one per slot: review).
	keys := make([]string, 20)
	for i := range keys {
		keys[i] = fmt.Sprintf("big:%d", i)
	}
	if err := c.MGet(ctx, keys...).Err(); err == nil {
		t.Fatal("MGET over 20 slots of a cluster whose every node is down answered")
	}
	if n := counterSum(t, p, "redproxy_route_errors_total", "upstream", "big"); n != 2 {
		t.Fatalf("redproxy_route_errors_total{upstream=\"big\"} = %v after a GET and an MGET over 20 slots no node answered, want 2", n)
	}
	if n := counterSum(t, p, "redproxy_route_errors_total", "upstream", "default"); n != 0 {
		t.Fatalf("%v route errors counted for the default upstream", n)
	}
}

// TestRoutesFetchErrorsAreCounted: a read that takes stampede protection's
// fetch path to a named upstream that does not answer counts in
// redproxy_route_errors_total, as one sent with the client's batch does
// (found by review: only a cluster upstream's fetches were counted).
func TestRoutesFetchErrorsAreCounted(t *testing.T) {
	down := redistest.Start(t)
	p := proxytest.Start(t, nil, func(c *config.Config) {
		c.Upstreams = map[string]config.Upstream{"down": namedUpstream(down.Addr())}
		c.Routes = []config.Route{{Pattern: "down:*", Upstream: "down"}}
	})
	down.Kill(t)
	c := p.Client(t)
	for i := range 3 {
		if err := c.Get(ctx, "down:k").Err(); err == nil || err == redis.Nil {
			t.Fatalf("GET %d of an upstream that is down: %v", i, err)
		}
	}
	if n := counterSum(t, p, "redproxy_route_errors_total", "upstream", "down"); n != 3 {
		t.Fatalf("redproxy_route_errors_total{upstream=\"down\"} = %v after 3 GETs it did not answer, want 3", n)
	}
}
