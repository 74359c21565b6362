package localcache_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/localcache"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

var ctx = context.Background()

// testS is the staleness bound the behaviour tests run with: short, so
// waiting it out is cheap, and long enough for a loaded 2-core machine to
// answer a heartbeat.
const testS = 200 * time.Millisecond

// startTier starts a proxy with the local tier on, admitting every key on
// its first read, in front of rs (a new redis-server if nil), and waits
// until DB 0's tier is live.
func startTier(t testing.TB, rs *redistest.Server, mutate ...func(*config.Config)) *proxytest.Proxy {
	t.Helper()
	p := proxytest.Start(t, rs, func(c *config.Config) {
		c.LocalCache.Enabled = true
		c.LocalCache.AdmitMinReads = 0
		c.LocalCache.WriteRatio = 1000
		c.LocalCache.Staleness = units.Duration{Duration: testS}
		c.LocalCache.MaxTTL = units.Duration{Duration: time.Minute}
		// Tests flush through the proxy; the guard refuses that by default.
		c.Policy.Commands.Allow = append(c.Policy.Commands.Allow, "flushall", "flushdb")
		for _, m := range mutate {
			m(c)
		}
	})
	waitLive(t, p, 0)
	return p
}

func waitLive(t testing.TB, p *proxytest.Proxy, db int) {
	t.Helper()
	p.LocalTier().Connect(db)
	redistest.Eventually(t, 10*time.Second, func() bool { return p.LocalTier().Live(db) }, "local tier for db %d never became live", db)
}

// withHooks installs test hooks for the rest of the test.
func withHooks(t testing.TB, h *localcache.TestHooks) {
	t.Helper()
	prev := localcache.SetTestHooks(h)
	t.Cleanup(func() { localcache.SetTestHooks(prev) })
}

// metric sums the values of a counter or gauge family, over the series
// whose labels include all of want ("reason=disconnect").
func metric(t testing.TB, reg prometheus.Gatherer, name string, want ...string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if !hasLabels(m, want) {
				continue
			}
			switch {
			case m.Counter != nil:
				total += m.Counter.GetValue()
			case m.Gauge != nil:
				total += m.Gauge.GetValue()
			}
		}
	}
	return total
}

func hasLabels(m *dto.Metric, want []string) bool {
	for _, w := range want {
		k, v, _ := strings.Cut(w, "=")
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == k && l.GetValue() == v {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func hits(t testing.TB, p *proxytest.Proxy) float64 {
	return metric(t, p.Metrics.Registry, "redproxy_localcache_hits_total")
}

// mustGet reads key, "" for nil.
func mustGet(t testing.TB, c *redis.Client, key string) string {
	t.Helper()
	v, err := c.Get(ctx, key).Result()
	if err == redis.Nil {
		return ""
	}
	if err != nil {
		t.Fatalf("GET %s: %v", key, err)
	}
	return v
}

// cacheIt reads key through p until a read is a hit, so the test knows the
// value is in the tier.
func cacheIt(t testing.TB, p *proxytest.Proxy, c *redis.Client, key string) string {
	t.Helper()
	var v string
	redistest.Eventually(t, 5*time.Second, func() bool {
		before := hits(t, p)
		v = mustGet(t, c, key)
		return hits(t, p) > before
	}, "%s never became a hit", key)
	return v
}

// killTierConns kills the proxy's tracking connections on Redis (CLIENT
// KILL has no name filter, so by ID from CLIENT LIST).
func killTierConns(t testing.TB, direct *redis.Client) int {
	t.Helper()
	list, err := direct.ClientList(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(list, "\n") {
		if !strings.Contains(line, " name="+localcache.ConnName+" ") {
			continue
		}
		for _, f := range strings.Fields(line) {
			if id, ok := strings.CutPrefix(f, "id="); ok {
				if err := direct.Do(ctx, "CLIENT", "KILL", "ID", id).Err(); err != nil {
					t.Fatal(err)
				}
				n++
			}
		}
	}
	return n
}

// staleWatch runs reads of key through c in a loop and records, for every
// read that started at or after deadline, whether it returned bad.
type staleWatch struct {
	mu      sync.Mutex
	bad     []string
	checked int
}

func (w *staleWatch) record(start, deadline time.Time, got string, isBad func(string) bool) {
	if start.Before(deadline) {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.checked++
	if isBad(got) {
		w.bad = append(w.bad, got)
	}
}

// redistestClient is a direct client to rs that survives its restarts.
func redistestClient(t testing.TB, rs *redistest.Server) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	t.Cleanup(func() { c.Close() })
	return c
}
