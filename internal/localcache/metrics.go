package localcache

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Reasons, used as metric labels and in logs.
const (
	// Misses: why a cacheable read was not answered from the tier.
	missFill     = "fill"            // admitted: filled through the tier
	missCold     = "cold"            // not (yet) read often enough
	missPattern  = "pattern"         // excluded by include/exclude
	missWrites   = "write_heavy"     // written too often relative to reads
	missNotLive  = "not_live"        // no fresh heartbeat, a fence, or no connection
	missInFlight = "write_in_flight" // a write to the key is in flight through this proxy
	missOther    = "other"

	// Flushes: why entries were dropped in bulk.
	FlushDisconnect = "disconnect"      // the fill connection was lost
	FlushReconnect  = "reconnect"       // a fill connection (re)connected
	FlushRedis      = "redis_flush"     // Redis sent a null invalidation (FLUSHALL/FLUSHDB)
	FlushForwarded  = "forwarded"       // FLUSHALL/FLUSHDB/SWAPDB passed through the proxy
	FlushRedirBroke = "redir_broken"    // Redis said the invalidation stream broke
	FlushSwitch     = "upstream_switch" // a reload moved the tier to another Redis

	// Fill results.
	fillStored    = "stored"
	fillDiscarded = "discarded" // invalidated while in flight: handed to waiters only
	fillSkipped   = "not_kept"  // error reply, nil without negative caching, over budget
	fillError     = "error"
)

type cacheMetrics struct {
	misses       *prometheus.CounterVec
	fills        *prometheus.CounterVec
	invalidated  prometheus.Counter
	flushes      *prometheus.CounterVec
	admissions   prometheus.Counter
	rejections   *prometheus.CounterVec
	evictions    prometheus.Counter
	staleServes  prometheus.Counter
	fences       prometheus.Counter
	missByReason map[string]prometheus.Counter
	fillByResult map[string]prometheus.Counter
	rejByReason  map[string]prometheus.Counter
}

func newMetrics() *cacheMetrics {
	m := &cacheMetrics{
		misses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "redproxy_localcache_misses_total", Help: "Cacheable reads not answered from the local tier, by reason.",
		}, []string{"reason"}),
		fills: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "redproxy_localcache_fills_total", Help: "Reads sent on a tracking connection to fill the tier, by result.",
		}, []string{"result"}),
		invalidated: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "redproxy_localcache_invalidations_total", Help: "Keys invalidated by Redis (CLIENT TRACKING pushes).",
		}),
		flushes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "redproxy_localcache_flushes_total", Help: "Times a whole database or the whole tier was dropped, by reason.",
		}, []string{"reason"}),
		admissions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "redproxy_localcache_admissions_total", Help: "Keys admitted into the tier (stored after a fill).",
		}),
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "redproxy_localcache_rejections_total", Help: "Reads of keys kept out of the tier, by reason.",
		}, []string{"reason"}),
		evictions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "redproxy_localcache_evictions_total", Help: "Keys evicted to stay within max_bytes.",
		}),
		staleServes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "redproxy_localcache_stale_serves_total", Help: "Reads answered with a stale value because Redis was unreachable (stale_if_error).",
		}),
		fences: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "redproxy_localcache_fences_total", Help: "Fences: writes with keys the proxy cannot know, after which no hit is served until every fill connection answered a PING.",
		}),
		missByReason: map[string]prometheus.Counter{},
		fillByResult: map[string]prometheus.Counter{},
		rejByReason:  map[string]prometheus.Counter{},
	}
	// Resolve label values once so the data path does no label hashing.
	for _, r := range []string{missFill, missCold, missPattern, missWrites, missNotLive, missInFlight, missOther} {
		m.missByReason[r] = m.misses.WithLabelValues(r)
	}
	for _, r := range []string{fillStored, fillDiscarded, fillSkipped, fillError} {
		m.fillByResult[r] = m.fills.WithLabelValues(r)
	}
	for _, r := range []string{missCold, missPattern, missWrites, "victim_hotter", "too_big"} {
		m.rejByReason[r] = m.rejections.WithLabelValues(r)
	}
	return m
}

func (m *cacheMetrics) miss(reason string) { m.missByReason[reason].Inc() }
func (m *cacheMetrics) fill(result string) { m.fillByResult[result].Inc() }
func (m *cacheMetrics) reject(reason string) {
	m.rejByReason[reason].Inc()
}

// register adds the metrics and the collectors that read the cache's state
// at scrape time.
func (c *Cache) register(reg prometheus.Registerer) {
	m := c.m
	reg.MustRegister(m.misses, m.fills, m.invalidated, m.flushes, m.admissions,
		m.rejections, m.evictions, m.staleServes, m.fences,
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "redproxy_localcache_hits_total", Help: "Reads answered from the local tier.",
		}, func() float64 { return float64(c.Hits()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "redproxy_localcache_bytes", Help: "Bytes charged against localcache.max_bytes.",
		}, func() float64 { return float64(c.used.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "redproxy_localcache_max_bytes", Help: "The configured byte budget (localcache.max_bytes).",
		}, func() float64 { return float64(c.cfg.MaxBytes) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "redproxy_localcache_entries", Help: "Cached replies (one key may have several, one per command).",
		}, func() float64 { return float64(c.nentries.Load()) }),
		&tierCollector{c: c},
	)
}

var (
	descLive = prometheus.NewDesc("redproxy_localcache_live",
		"1 when the database's fill connection is up and its heartbeat fresh, so hits may be served.", []string{"db"}, nil)
	descHot = prometheus.NewDesc("redproxy_localcache_hot_key_reads",
		"Estimated recent reads of the hottest keys (decaying count per admit_window; saturates at 256), by rank. Names are on /debug/hotkeys.", []string{"rank"}, nil)
)

// tierCollector reports per-connection liveness and the hot-key ranking,
// computed when Prometheus scrapes.
type tierCollector struct{ c *Cache }

func (t *tierCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descLive
	ch <- descHot
}

func (t *tierCollector) Collect(ch chan<- prometheus.Metric) {
	now := nanotime()
	if t.c.opt.Owner != nil {
		// Cluster mode: database 0, live when every primary's is.
		v := 0.0
		if t.c.Live(0) {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(descLive, prometheus.GaugeValue, v, "0")
	}
	for db := range t.c.conns {
		fc := t.c.conns[db].Load()
		if fc == nil {
			continue
		}
		v := 0.0
		if fc.live(now, t.c.fenceAt.Load()) {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(descLive, prometheus.GaugeValue, v, strconv.Itoa(db))
	}
	for i, hk := range t.c.HotKeys(10) {
		ch <- prometheus.MustNewConstMetric(descHot, prometheus.GaugeValue, float64(hk.Reads), strconv.Itoa(i+1))
	}
}

// Hits is the number of reads answered from the tier.
func (c *Cache) Hits() uint64 {
	var n uint64
	for i := range c.shards {
		n += c.shards[i].hits.Load()
	}
	return n
}
