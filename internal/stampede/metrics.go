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
}

// NewMetrics creates the counters and registers them on reg (if not nil).
// Call it once per registry.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: "redproxy_stampede_" + name, Help: help})
	}
	m := &Metrics{
		Coalesced:      c("coalesced_reads_total", "Reads that went through coalescing, as leader or joiner of a shared fetch."),
		FetchesSaved:   c("fetches_saved_total", "Reads answered by an upstream fetch another read sent: upstream requests saved."),
		Held:           c("held_reads_total", "GETs held by a miss hold until the filler wrote the key (or the hold ended)."),
		HoldTimeouts:   c("hold_timeouts_total", "Miss holds that ended because their timeout ran out before a write."),
		EarlyRefreshes: c("early_refreshes_total", "Readers handed a miss before the key expired, to refresh it early (XFetch)."),
		Overflows:      c("waiter_overflows_total", "Reads sent upstream alone because the fetch they would join had max_waiters waiters."),
	}
	if reg != nil {
		reg.MustRegister(m.Coalesced, m.FetchesSaved, m.Held, m.HoldTimeouts, m.EarlyRefreshes, m.Overflows)
	}
	return m
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
