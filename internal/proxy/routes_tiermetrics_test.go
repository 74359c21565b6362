package proxy_test

import (
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// familySeries reads every series of p's registry whose family name starts
// with prefix: by family, the series' labels (name=value, sorted as
// gathered).
func familySeries(t *testing.T, p *proxytest.Proxy, prefix string) map[string][]*dto.Metric {
	t.Helper()
	families, err := p.Metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]*dto.Metric{}
	for _, f := range families {
		if strings.HasPrefix(f.GetName(), prefix) {
			out[f.GetName()] = f.GetMetric()
		}
	}
	return out
}

func labelOf(m *dto.Metric, name string) (string, bool) {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue(), true
		}
	}
	return "", false
}

// countBy sums family name's counters by the value of label upstream,
// over the series that also have every want label (name=value).
func countBy(t *testing.T, p *proxytest.Proxy, name string, want ...string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, m := range familySeries(t, p, name)[name] {
		ok := true
		for _, w := range want {
			k, v, _ := strings.Cut(w, "=")
			if got, has := labelOf(m, k); !has || got != v {
				ok = false
			}
		}
		if ok {
			up, _ := labelOf(m, "upstream")
			out[up] += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return out
}

// tierWide are the local tier's families that describe the one shared
// tier, not an upstream: never labelled with one.
var tierWide = map[string]bool{
	"redproxy_localcache_bytes": true, "redproxy_localcache_max_bytes": true, "redproxy_localcache_entries": true,
	"redproxy_localcache_fences_total": true, "redproxy_localcache_hot_key_reads": true,
}

// checkPromtool runs promtool check metrics on p's exposition, when
// promtool is installed.
func checkPromtool(t *testing.T, p *proxytest.Proxy) {
	t.Helper()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Log("promtool not installed: exposition not checked")
		return
	}
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(p.Metrics.Registry, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(rec.Body.String())
	if out, err := cmd.CombinedOutput(); err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}

// tierHit reads key through c until the tier answers it.
func tierHit(t *testing.T, p *proxytest.Proxy, c *redis.Client, key string) {
	t.Helper()
	redistest.Eventually(t, 5*time.Second, func() bool {
		before := p.LocalTier().Hits()
		if err := c.Get(ctx, key).Err(); err != nil && err != redis.Nil {
			t.Fatalf("GET %s: %v", key, err)
		}
		return p.LocalTier().Hits() > before
	}, "%s never became a hit", key)
}

func withTier(c *config.Config) {
	c.LocalCache.Enabled = true
	c.LocalCache.AdmitMinReads = 0
	c.LocalCache.WriteRatio = 1000
	c.LocalCache.Staleness = units.Duration{Duration: 200 * time.Millisecond}
}

// TestRoutesTierMetricsPerUpstream: with routes, the local tier's counters
// of what happens to keys carry the upstream of the key's route, one hits
// series per configured upstream; the live gauge one per upstream and
// database; what describes the shared tier (budget, entries, fences, hot
// keys) none. The exposition passes promtool.
func TestRoutesTierMetricsPerUpstream(t *testing.T) {
	r := startRouted(t, withTier)
	tier := r.p.LocalTier()
	redistest.Eventually(t, 10*time.Second, func() bool {
		return tier.LiveOwner("default", 0) && tier.LiveOwner("queue", 0) && tier.LiveOwner("cache", 0)
	}, "the tier never became live for every upstream")
	for _, k := range []string{"queue:t1", "queue:t2", "plain:t1"} {
		if err := r.c.Set(ctx, k, "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
		tierHit(t, r.p, r.c, k)
	}
	hits := countBy(t, r.p, "redproxy_localcache_hits_total")
	if hits["queue"] < 2 || hits["default"] < 1 || hits["cache"] != 0 || len(hits) != 3 {
		t.Errorf("hits by upstream = %v, want queue >= 2, default >= 1, cache 0 (one series each)", hits)
	}
	if got := countBy(t, r.p, "redproxy_localcache_fills_total", "result=stored"); got["queue"] < 2 || got["default"] < 1 || got["cache"] != 0 {
		t.Errorf("stored fills by upstream = %v", got)
	}
	if got := countBy(t, r.p, "redproxy_localcache_admissions_total"); got["queue"] < 2 || got["default"] < 1 {
		t.Errorf("admissions by upstream = %v", got)
	}
	// A write straight to queue's server is invalidated on queue's
	// tracking connection, and counted there.
	if err := r.queue.Client(t).Set(ctx, "queue:t1", "w", 0).Err(); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 5*time.Second, func() bool {
		return countBy(t, r.p, "redproxy_localcache_invalidations_total")["queue"] >= 1
	}, "no invalidation counted under queue")
	// Live needs a heartbeat answered within S, which a loaded machine
	// may miss now and then: polled.
	redistest.Eventually(t, 5*time.Second, func() bool {
		live := countBy(t, r.p, "redproxy_localcache_live")
		return live["queue"] == 1 && live["default"] == 1 && live["cache"] == 1 && len(live) == 3
	}, "redproxy_localcache_live never 1 for each of the 3 upstreams")
	for name, series := range familySeries(t, r.p, "redproxy_localcache_") {
		for _, m := range series {
			_, has := labelOf(m, "upstream")
			if has == tierWide[name] {
				t.Errorf("%s: upstream label present %v, want %v (%v)", name, has, !tierWide[name], m.GetLabel())
			}
		}
	}
	checkPromtool(t, r.p)
}

// TestTierMetricsUnlabelledWithoutRoutes: without routes the local tier's
// series keep the labels they had before routes, none of them an upstream.
func TestTierMetricsUnlabelledWithoutRoutes(t *testing.T) {
	p := proxytest.Start(t, nil, withTier)
	c := p.Client(t)
	if err := c.Set(ctx, "plain:t", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	tierHit(t, p, c, "plain:t")
	fams := familySeries(t, p, "redproxy_localcache_")
	if len(fams["redproxy_localcache_hits_total"]) != 1 {
		t.Fatalf("hits: %d series, want one", len(fams["redproxy_localcache_hits_total"]))
	}
	for name, series := range fams {
		for _, m := range series {
			if _, has := labelOf(m, "upstream"); has {
				t.Errorf("%s has an upstream label without routes: %v", name, m.GetLabel())
			}
		}
	}
}

// TestRoutesPolicyViolationsPerUpstream: with routes, a policy violation
// counts under its key's upstream, one that names no key (a denied
// command) under the default upstream, like stampede protection's and the
// local tier's counters; without routes the counter has no upstream label
// (TestTierMetricsUnlabelledWithoutRoutes's convention, checked here too).
func TestRoutesPolicyViolationsPerUpstream(t *testing.T) {
	ttl := func(c *config.Config) {
		c.Policy.TTL = []policy.TTLRule{{Pattern: "*lock*", Required: true}}
	}
	r := startRouted(t, ttl)
	for _, k := range []string{"queue:lock1", "queue:lock2", "plain:lock"} {
		if err := r.c.Set(ctx, k, "v", 0).Err(); err == nil {
			t.Fatalf("SET %s without a TTL was not refused", k)
		}
	}
	if err := r.c.Do(ctx, "FLUSHALL").Err(); err == nil {
		t.Fatal("FLUSHALL was not refused")
	}
	if got := countBy(t, r.p, "redproxy_policy_violations_total", "rule=ttl", "action=enforce"); got["queue"] != 2 || got["default"] != 1 || got["cache"] != 0 || len(got) != 3 {
		t.Errorf("ttl violations by upstream = %v, want queue 2, default 1, cache 0", got)
	}
	if got := countBy(t, r.p, "redproxy_policy_violations_total", "rule=command", "action=enforce"); got["default"] != 1 || got["queue"] != 0 {
		t.Errorf("command violations by upstream = %v, want default 1", got)
	}
	checkPromtool(t, r.p)

	p := proxytest.Start(t, nil, ttl)
	if err := p.Client(t).Set(ctx, "plain:lock", "v", 0).Err(); err == nil {
		t.Fatal("SET without a TTL was not refused")
	}
	got := countBy(t, p, "redproxy_policy_violations_total", "rule=ttl", "action=enforce")
	if len(got) != 1 || got[""] != 1 {
		t.Errorf("without routes, ttl violations = %v, want one unlabelled series counting 1", got)
	}
}
