package metrics

import (
	"math"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestLatencyMatchesPrometheusHistogram feeds the same durations, some as
// n equal observations at once, to a command's Latency and to a Prometheus
// histogram with the same buckets, and checks that /metrics would show the
// same count, buckets (bounds are inclusive, as Prometheus's) and sum.
func TestLatencyMatchesPrometheusHistogram(t *testing.T) {
	m := New()
	ref := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ref", Buckets: latencyBuckets[:]})
	get := m.Command("get")
	obs := []struct {
		v float64
		n uint64
	}{
		{0, 1}, {.00005, 3}, {.00005001, 1}, {.0003, 16}, {.001, 2}, {.7, 1}, {5, 1}, {6.5, 4}, {.0003, 0},
	}
	for _, o := range obs {
		get.Latency.ObserveN(o.v, o.n)
		for range o.n {
			ref.Observe(o.v)
		}
	}
	m.Command("set") // a second series, never observed

	var want dto.Metric
	if err := ref.Write(&want); err != nil {
		t.Fatal(err)
	}
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got, set *dto.Histogram
	for _, f := range fams {
		if f.GetName() != "redproxy_command_duration_seconds" {
			continue
		}
		if f.GetType() != dto.MetricType_HISTOGRAM {
			t.Fatalf("type %v, want a histogram", f.GetType())
		}
		for _, mt := range f.Metric {
			switch mt.Label[0].GetValue() {
			case "get":
				got = mt.Histogram
			case "set":
				set = mt.Histogram
			}
		}
	}
	if got == nil || set == nil {
		t.Fatal("redproxy_command_duration_seconds lacks the get or set series")
	}
	w := want.Histogram
	if got.GetSampleCount() != w.GetSampleCount() {
		t.Fatalf("count %d, want %d", got.GetSampleCount(), w.GetSampleCount())
	}
	if math.Abs(got.GetSampleSum()-w.GetSampleSum()) > 1e-9*float64(w.GetSampleCount()) {
		t.Fatalf("sum %v, want %v", got.GetSampleSum(), w.GetSampleSum())
	}
	if len(got.Bucket) != len(w.Bucket) {
		t.Fatalf("%d buckets, want %d", len(got.Bucket), len(w.Bucket))
	}
	for i := range w.Bucket {
		if got.Bucket[i].GetUpperBound() != w.Bucket[i].GetUpperBound() || got.Bucket[i].GetCumulativeCount() != w.Bucket[i].GetCumulativeCount() {
			t.Fatalf("bucket %d: le=%v count %d, want le=%v count %d", i, got.Bucket[i].GetUpperBound(),
				got.Bucket[i].GetCumulativeCount(), w.Bucket[i].GetUpperBound(), w.Bucket[i].GetCumulativeCount())
		}
	}
	if set.GetSampleCount() != 0 {
		t.Fatalf("set was never observed, count %d", set.GetSampleCount())
	}
}
