package mirror

import (
	"cmp"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// maxPatterns caps the key patterns whose mismatches are counted apart; the
// rest are counted under OtherPattern. Patterns come from client keys, so
// their number must not grow with the keyspace.
const maxPatterns = 1000

// OtherPattern counts the mismatches of patterns past the first 1000.
const OtherPattern = "(other)"

type patternStat struct {
	count   int64
	command string // the last command that mismatched
}

type patterns struct {
	mu sync.Mutex
	m  map[string]*patternStat
}

func (p *patterns) add(pattern, command string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.m[pattern]
	if st == nil {
		if len(p.m) >= maxPatterns {
			pattern = OtherPattern
			st = p.m[pattern]
		}
		if st == nil {
			st = &patternStat{}
			p.m[pattern] = st
		}
	}
	st.count++
	st.command = command
}

// PatternCount is one line of the mismatches by key pattern.
type PatternCount struct {
	Pattern    string `json:"pattern"`
	Command    string `json:"command"`
	Mismatches int64  `json:"mismatches"`
}

func (p *patterns) top(n int) []PatternCount {
	p.mu.Lock()
	out := make([]PatternCount, 0, len(p.m))
	for k, st := range p.m {
		out = append(out, PatternCount{Pattern: k, Command: st.command, Mismatches: st.count})
	}
	p.mu.Unlock()
	slices.SortFunc(out, func(a, b PatternCount) int {
		if c := cmp.Compare(b.Mismatches, a.Mismatches); c != 0 {
			return c
		}
		return cmp.Compare(a.Pattern, b.Pattern)
	})
	return out[:min(n, len(out))]
}

// Report is what /debug/mirror shows.
type Report struct {
	Upstream    string  `json:"upstream"`
	Address     string  `json:"address"`
	Writes      bool    `json:"writes"`
	ReadsSample float64 `json:"reads_sample"`
	Compare     bool    `json:"compare"`
	// Queued and QueuedBytes are queued or in flight, against the limits
	// MaxQueue and MaxQueueBytes.
	Queued        int   `json:"queued"`
	QueuedBytes   int64 `json:"queued_bytes"`
	MaxQueue      int   `json:"max_queue"`
	MaxQueueBytes int64 `json:"max_queue_bytes"`

	Sent       int64            `json:"sent"`
	Dropped    map[string]int64 `json:"dropped"`
	Skipped    map[string]int64 `json:"skipped"`
	Errors     map[string]int64 `json:"errors"`
	Sampled    int64            `json:"sampled"`
	Compared   int64            `json:"compared"`
	Mismatches int64            `json:"mismatches"`
	// Patterns are the key patterns with the most mismatches, most first.
	Patterns []PatternCount `json:"mismatches_by_pattern"`
}

// DefaultTop is how many patterns Report lists unless asked otherwise.
const DefaultTop = 20

// Report summarises the mirror, with the top patterns by mismatches.
func (m *Mirror) Report(top int) Report {
	r := Report{
		Upstream: m.cfg.Upstream, Address: m.opt.Address,
		Writes: m.cfg.Writes, ReadsSample: m.cfg.ReadsSample, Compare: m.cfg.Compare,
		MaxQueue: m.cfg.Queue, MaxQueueBytes: int64(m.cfg.QueueBytes),
		Sent: m.stats.sent.Load(), Sampled: m.stats.sampled.Load(),
		Compared: m.stats.compared.Load(), Mismatches: m.stats.mismatches.Load(),
		Dropped: map[string]int64{}, Skipped: map[string]int64{}, Errors: map[string]int64{},
		Patterns: m.patterns.top(top),
	}
	r.Queued, r.QueuedBytes = m.Queued()
	for i, k := range dropReasons {
		r.Dropped[k] = m.stats.dropped[i].Load()
	}
	for i, k := range skipReasons {
		r.Skipped[k] = m.stats.skipped[i].Load()
	}
	for i, k := range errorKinds {
		r.Errors[k] = m.stats.errors[i].Load()
	}
	return r
}

// Handler serves /debug/mirror: the Report as JSON; ?top=N lists N
// patterns (default 20).
func (m *Mirror) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		top := DefaultTop
		if s := r.URL.Query().Get("top"); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 0 {
				http.Error(w, "top: want a number of patterns, e.g. ?top=50", http.StatusBadRequest)
				return
			}
			top = n
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(m.Report(top))
	})
}

// RegisterMetrics exposes the mirror's counters on reg.
func (m *Mirror) RegisterMetrics(reg prometheus.Registerer) {
	counter := func(name, help string, labels prometheus.Labels, v func() int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "redproxy_mirror_" + name, Help: help, ConstLabels: labels},
			func() float64 { return float64(v()) })
	}
	cs := []prometheus.Collector{
		counter("sent_total", "Commands sent to the mirror upstream.", nil, m.stats.sent.Load),
		counter("reads_sampled_total", "Reads chosen by mirror.reads_sample to be mirrored.", nil, m.stats.sampled.Load),
		counter("compared_total", "Sampled reads whose mirror reply was compared with the primary's.", nil, m.stats.compared.Load),
		counter("mismatches_total", "Sampled reads whose mirror reply differed from the primary's (by pattern: /debug/mirror).", nil, m.stats.mismatches.Load),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "redproxy_mirror_queued_commands", Help: "Commands queued for, or in flight to, the mirror."},
			func() float64 { n, _ := m.Queued(); return float64(n) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "redproxy_mirror_queued_bytes", Help: "Bytes queued for, or in flight to, the mirror."},
			func() float64 { _, n := m.Queued(); return float64(n) }),
	}
	for i, k := range dropReasons {
		cs = append(cs, counter("dropped_total", "Commands not mirrored: the queue was full, the mirror unreachable, a script unknown to it, keys across a cluster mirror's slots, by reason.", prometheus.Labels{"reason": k}, m.stats.dropped[i].Load))
	}
	for i, k := range skipReasons {
		cs = append(cs, counter("skipped_total", "Writes not mirrored by design (transactions that did not run, blocking XREADGROUP, writes the primary refused, nondeterministic writes not rebuilt, writes of relayed clients), and sampled reads not compared because a replica answered them, by reason.", prometheus.Labels{"reason": k}, m.stats.skipped[i].Load))
	}
	for i, k := range errorKinds {
		cs = append(cs, counter("errors_total", "Mirrored commands that failed on the mirror, by kind.", prometheus.Labels{"kind": k}, m.stats.errors[i].Load))
	}
	reg.MustRegister(cs...)
}
