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
	missNotKept  = "not_kept" // a fill of it just read a reply the tier did not keep (notKept)
	// missPipelined: behind commands of its batch still to be sent, it was
	// not asked (CountRead); counted by sampling, countReadSample at a time.
	missPipelined = "pipelined"

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

// cacheMetrics are the tier's counters. Without routes they carry no
// upstream label, as before routes existed; with routes the counters of
// what happens to keys (hits, misses, fills, invalidations, admissions,
// rejections, evictions, stale serves) carry the upstream of the key's
// route, and flushes the upstream whose connection or event caused them,
// or the default upstream for one no upstream caused (a route change):
// the same convention as stampede protection's counters. What describes
// the one shared tier (its budget, entries, fences, hot keys) is never
// labelled.
type cacheMetrics struct {
	misses      *prometheus.CounterVec
	fills       *prometheus.CounterVec
	invalidated *prometheus.CounterVec
	flushes     *prometheus.CounterVec
	admissions  *prometheus.CounterVec
	rejections  *prometheus.CounterVec
	evictions   *prometheus.CounterVec
	staleServes *prometheus.CounterVec
	touches     *prometheus.CounterVec
	fences      prometheus.Counter
}

// upstreamMetrics are the counters of one upstream (of the only one
// without routes), resolved once so the data path does no label hashing.
type upstreamMetrics struct {
	vecs        *cacheMetrics
	label       []string // the upstream label's value, none without routes
	invalidated prometheus.Counter
	admissions  prometheus.Counter
	evictions   prometheus.Counter
	staleServes prometheus.Counter
	// touches counts keys sent back to Redis as TOUCH, touchesDropped
	// those a full queue left for their next hit (touch.go).
	touches        prometheus.Counter
	touchesDropped prometheus.Counter
	missByReason   map[string]prometheus.Counter
	fillByResult   map[string]prometheus.Counter
	rejByReason    map[string]prometheus.Counter
}

// newMetrics makes the vectors, with an upstream label when labelled.
func newMetrics(labelled bool) *cacheMetrics {
	labels := func(l ...string) []string {
		if labelled {
			return append([]string{"upstream"}, l...)
		}
		return l
	}
	return &cacheMetrics{
		misses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "redproxy_localcache_misses_total", Help: "Cacheable reads not answered from the local tier, by reason (pipelined: behind commands of their batch still to be sent, counted by sampling).",
		}, labels("reason")),
		fills: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "redproxy_localcache_fills_total", Help: "Reads sent on a tracking connection to fill the tier, by result.",
		}, labels("result")),
		invalidated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "redproxy_localcache_invalidations_total", Help: "Keys invalidated by Redis (CLIENT TRACKING pushes).",
		}, labels()),
		flushes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "redproxy_localcache_flushes_total", Help: "Times a whole database or the whole tier was dropped, by reason.",
		}, labels("reason")),
		admissions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "redproxy_localcache_admissions_total", Help: "Keys admitted into the tier (stored after a fill).",
		}, labels()),
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "redproxy_localcache_rejections_total", Help: "Reads of keys kept out of the tier, by reason.",
		}, labels("reason")),
		evictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "redproxy_localcache_evictions_total", Help: "Keys evicted to stay within max_bytes.",
		}, labels()),
		staleServes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "redproxy_localcache_stale_serves_total", Help: "Reads answered with a stale value because Redis was unreachable (stale_if_error).",
		}, labels()),
		touches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "redproxy_localcache_touches_total", Help: "Keys served from the tier and sent back to Redis as TOUCH (sent), or left for their next hit by a full queue (dropped), so Redis's LRU/LFU sees them used.",
		}, labels("result")),
		fences: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "redproxy_localcache_fences_total", Help: "Fences: writes with keys the proxy cannot know, after which no hit is served until every fill connection answered a PING.",
		}),
	}
}

// forUpstream resolves the counters of one upstream; name is "" without
// routes (no label).
func (m *cacheMetrics) forUpstream(name string) *upstreamMetrics {
	var label []string
	if name != "" {
		label = []string{name}
	}
	with := func(l ...string) []string { return append(append([]string(nil), label...), l...) }
	u := &upstreamMetrics{
		vecs:           m,
		label:          label,
		invalidated:    m.invalidated.WithLabelValues(label...),
		admissions:     m.admissions.WithLabelValues(label...),
		evictions:      m.evictions.WithLabelValues(label...),
		staleServes:    m.staleServes.WithLabelValues(label...),
		touches:        m.touches.WithLabelValues(with("sent")...),
		touchesDropped: m.touches.WithLabelValues(with("dropped")...),
		missByReason:   map[string]prometheus.Counter{},
		fillByResult:   map[string]prometheus.Counter{},
		rejByReason:    map[string]prometheus.Counter{},
	}
	for _, r := range []string{missFill, missCold, missPattern, missWrites, missNotLive, missInFlight, missOther, missNotKept, missPipelined} {
		u.missByReason[r] = m.misses.WithLabelValues(with(r)...)
	}
	for _, r := range []string{fillStored, fillDiscarded, fillSkipped, fillError} {
		u.fillByResult[r] = m.fills.WithLabelValues(with(r)...)
	}
	for _, r := range []string{missCold, missPattern, missWrites, "victim_hotter", "too_big"} {
		u.rejByReason[r] = m.rejections.WithLabelValues(with(r)...)
	}
	return u
}

func (m *upstreamMetrics) miss(reason string) { m.missByReason[reason].Inc() }
func (m *upstreamMetrics) fill(result string) { m.fillByResult[result].Inc() }
func (m *upstreamMetrics) reject(reason string) {
	m.rejByReason[reason].Inc()
}

// flushed counts a flush for reason under this upstream.
func (m *upstreamMetrics) flushed(reason string) {
	m.vecs.flushes.WithLabelValues(append(append([]string(nil), m.label...), reason)...).Inc()
}

// register adds the metrics and the collectors that read the cache's state
// at scrape time.
func (c *Cache) register(reg prometheus.Registerer) {
	m := c.m
	reg.MustRegister(m.misses, m.fills, m.invalidated, m.flushes, m.admissions,
		m.rejections, m.evictions, m.staleServes, m.touches, m.fences,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "redproxy_localcache_bytes", Help: "Bytes charged against localcache.max_bytes.",
		}, func() float64 { return float64(c.used.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "redproxy_localcache_max_bytes", Help: "The configured byte budget (localcache.max_bytes).",
		}, func() float64 { return float64(c.cfg.MaxBytes) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "redproxy_localcache_entries", Help: "Cached replies (one key may have several, one per command).",
		}, func() float64 { return float64(c.nentries.Load()) }),
		newTierCollector(c),
	)
}

var descHot = prometheus.NewDesc("redproxy_localcache_hot_key_reads",
	"Estimated recent reads of the hottest keys (decaying count per admit_window; saturates at 256), by rank. Names are on /debug/hotkeys.", []string{"rank"}, nil)

// tierCollector reports hits, per-connection liveness and the hot-key
// ranking, computed when Prometheus scrapes.
type tierCollector struct {
	c              *Cache
	labelled       bool
	descHits, live *prometheus.Desc
}

func newTierCollector(c *Cache) *tierCollector {
	t := &tierCollector{c: c, labelled: c.opt.Routes != nil}
	var hitLabels, liveLabels []string
	if t.labelled {
		hitLabels, liveLabels = []string{"upstream"}, []string{"upstream", "db"}
	} else {
		liveLabels = []string{"db"}
	}
	t.descHits = prometheus.NewDesc("redproxy_localcache_hits_total", "Reads answered from the local tier.", hitLabels, nil)
	t.live = prometheus.NewDesc("redproxy_localcache_live",
		"1 when the database's fill connection is up and its heartbeat fresh, so hits may be served.", liveLabels, nil)
	return t
}

func (t *tierCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- t.descHits
	ch <- t.live
	ch <- descHot
}

func gauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func (t *tierCollector) Collect(ch chan<- prometheus.Metric) {
	c := t.c
	if t.labelled {
		for i, u := range c.ups {
			ch <- prometheus.MustNewConstMetric(t.descHits, prometheus.CounterValue, float64(c.hitsOf(i)), u.name)
		}
		// One series per upstream and database it has a connection of;
		// a cluster upstream's database 0 is live when every primary's
		// connection is.
		seen := map[ownerKey]bool{}
		for _, fc := range c.nodeConns() {
			k := ownerKey{up: fc.up.idx, db: fc.db}
			if seen[k] {
				continue
			}
			seen[k] = true
			ch <- prometheus.MustNewConstMetric(t.live, prometheus.GaugeValue, gauge(c.liveUpstream(fc.up, fc.db)), fc.up.name, strconv.Itoa(fc.db))
		}
	} else {
		ch <- prometheus.MustNewConstMetric(t.descHits, prometheus.CounterValue, float64(c.Hits()))
		if c.opt.Cluster != nil {
			// Cluster mode: database 0, live when every primary's is.
			ch <- prometheus.MustNewConstMetric(t.live, prometheus.GaugeValue, gauge(c.Live(0)), "0")
		}
		now := nanotime()
		for db := range c.conns {
			if fc := c.conns[db].Load(); fc != nil {
				ch <- prometheus.MustNewConstMetric(t.live, prometheus.GaugeValue, gauge(fc.live(now, c.fenceAt.Load())), strconv.Itoa(db))
			}
		}
	}
	for i, hk := range c.HotKeys(10) {
		ch <- prometheus.MustNewConstMetric(descHot, prometheus.GaugeValue, float64(hk.Reads), strconv.Itoa(i+1))
	}
}

// Hits is the number of reads answered from the tier.
func (c *Cache) Hits() uint64 {
	var n uint64
	for i := range c.ups {
		n += c.hitsOf(i)
	}
	return n
}

// hitsOf is the number of reads of upstream up's keys answered from the
// tier.
func (c *Cache) hitsOf(up int) uint64 {
	var n uint64
	for i := range c.shards {
		n += c.shards[i].hits[up].Load()
	}
	return n
}
