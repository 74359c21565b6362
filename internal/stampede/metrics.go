package stampede

import "github.com/prometheus/client_golang/prometheus"

// Metrics count what stampede protection did. A nil *Metrics counts nothing.
type Metrics struct {
	Coalesced      prometheus.Counter // reads that went through a Group (leaders and joiners)
	FetchesSaved   prometheus.Counter // reads answered by a fetch another read sent
	Held           prometheus.Counter // reads held by a miss hold
	HoldTimeouts   prometheus.Counter // holds ended by their timeout rather than a write
	EarlyRefreshes prometheus.Counter // readers handed an early miss (XFetch)
	Overflows      prometheus.Counter // reads sent alone because a fetch had too many waiters
	HoldsSkipped   prometheus.Counter // misses that started no hold: maxHolds were open

	// byKey, when set (NewMetricsPerUpstream), gives the counters of a
	// key's upstream; these fields are then the first upstream's.
	byKey func(key []byte) *Metrics
}

// NewMetrics creates the counters and registers them on reg (if not nil).
// Call it once per registry.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: "redproxy_stampede_" + name, Help: help})
	}
	m := newMetrics(c)
	if reg != nil {
		reg.MustRegister(m.Coalesced, m.FetchesSaved, m.Held, m.HoldTimeouts, m.EarlyRefreshes, m.Overflows, m.HoldsSkipped)
	}
	return m
}

// NewMetricsPerUpstream creates the counters with an "upstream" label, one
// series per name of upstreams (a bounded set: the configured upstreams),
// and registers them on reg (if not nil). upstreamOf gives the index in
// upstreams of a key's upstream; reads of a key are counted under it.
// Counts that concern no one key (local-tier fills) go to upstreams[0].
// Call it once per registry, instead of NewMetrics.
func NewMetricsPerUpstream(reg prometheus.Registerer, upstreams []string, upstreamOf func(key []byte) int) *Metrics {
	var vecs []*prometheus.CounterVec
	byName := map[string]*prometheus.CounterVec{}
	c := func(name, help string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "redproxy_stampede_" + name, Help: help}, []string{"upstream"})
		vecs = append(vecs, v)
		byName[name] = v
		return v
	}
	// The vectors, created once with the same names and helps as NewMetrics's.
	newMetrics(func(name, help string) prometheus.Counter { return c(name, help).WithLabelValues(upstreams[0]) })
	per := make([]*Metrics, len(upstreams))
	for i, up := range upstreams {
		per[i] = newMetrics(func(name, _ string) prometheus.Counter { return byName[name].WithLabelValues(up) })
	}
	if reg != nil {
		for _, v := range vecs {
			reg.MustRegister(v)
		}
	}
	m := *per[0]
	m.byKey = func(key []byte) *Metrics {
		if i := upstreamOf(key); i >= 0 && i < len(per) {
			return per[i]
		}
		return per[0]
	}
	return &m
}

func newMetrics(c func(name, help string) prometheus.Counter) *Metrics {
	return &Metrics{
		Coalesced:      c("coalesced_reads_total", "Reads that went through coalescing, as leader or joiner of a shared fetch."),
		FetchesSaved:   c("fetches_saved_total", "Reads answered by an upstream fetch another read sent: upstream requests saved."),
		Held:           c("held_reads_total", "GETs held by a miss hold until the filler wrote the key (or the hold ended)."),
		HoldTimeouts:   c("hold_timeouts_total", "Miss holds that ended because their timeout ran out before a write."),
		EarlyRefreshes: c("early_refreshes_total", "Readers handed a miss before the key expired, to refresh it early (XFetch)."),
		Overflows:      c("waiter_overflows_total", "Reads sent upstream alone because the fetch they would join had max_waiters waiters."),
		HoldsSkipped:   c("holds_skipped_total", "Misses under a hold rule that started no hold because 100,000 holds were open."),
	}
}

// forKey is the counters a read of key counts in: its upstream's with
// NewMetricsPerUpstream, m otherwise.
func (m *Metrics) forKey(key []byte) *Metrics {
	if m == nil || m.byKey == nil {
		return m
	}
	return m.byKey(key)
}

func (m *Metrics) read() {
	if m != nil {
		m.Coalesced.Inc()
	}
}

func (m *Metrics) saved() {
	if m != nil {
		m.FetchesSaved.Inc()
	}
}

func (m *Metrics) overflow() {
	if m != nil {
		m.Overflows.Inc()
	}
}

func (m *Metrics) holdSkipped() {
	if m != nil {
		m.HoldsSkipped.Inc()
	}
}

func (m *Metrics) held() {
	if m != nil {
		m.Held.Inc()
	}
}

func (m *Metrics) holdTimeout() {
	if m != nil {
		m.HoldTimeouts.Inc()
	}
}

func (m *Metrics) earlyRefresh() {
	if m != nil {
		m.EarlyRefreshes.Inc()
	}
}
