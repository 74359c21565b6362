package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// CounterSum adds up the counter series called name whose labels include
// every given (name, value) pair, as read from g. found is false when no
// series matched. Tests and operators' tools read counters this way without
// parsing the text exposition.
func CounterSum(g prometheus.Gatherer, name string, labels ...string) (sum float64, found bool, err error) {
	err = eachSeries(g, name, labels, func(m *dto.Metric) { sum += m.GetCounter().GetValue(); found = true })
	return sum, found, err
}

// GaugeSum adds up the gauge series called name whose labels include
// every given (name, value) pair, as CounterSum.
func GaugeSum(g prometheus.Gatherer, name string, labels ...string) (sum float64, found bool, err error) {
	err = eachSeries(g, name, labels, func(m *dto.Metric) { sum += m.GetGauge().GetValue(); found = true })
	return sum, found, err
}

// HistogramCount adds up the sample counts of the histogram series called
// name whose labels include every given (name, value) pair, as CounterSum.
func HistogramCount(g prometheus.Gatherer, name string, labels ...string) (count uint64, found bool, err error) {
	err = eachSeries(g, name, labels, func(m *dto.Metric) { count += m.GetHistogram().GetSampleCount(); found = true })
	return count, found, err
}

// eachSeries calls f for every series called name whose labels include
// every (name, value) pair of labels.
func eachSeries(g prometheus.Gatherer, name string, labels []string, f func(*dto.Metric)) error {
	mfs, err := g.Gather()
	if err != nil {
		return err
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				has := false
				for _, lp := range m.GetLabel() {
					has = has || lp.GetName() == labels[i] && lp.GetValue() == labels[i+1]
				}
				if !has {
					continue series
				}
			}
			f(m)
		}
	}
	return nil
}
