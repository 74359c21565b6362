package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestCounterSum(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x_total", Help: "x"}, []string{"rule", "action"})
	reg.MustRegister(c)
	c.WithLabelValues("ttl", "enforce").Add(2)
	c.WithLabelValues("ttl", "report").Add(3)
	c.WithLabelValues("command", "enforce").Add(5)
	for _, tc := range []struct {
		labels []string
		want   float64
		found  bool
	}{
		{nil, 10, true},
		{[]string{"rule", "ttl"}, 5, true},
		{[]string{"rule", "ttl", "action", "report"}, 3, true},
		{[]string{"rule", "names"}, 0, false},
	} {
		got, found, err := CounterSum(reg, "x_total", tc.labels...)
		if err != nil || got != tc.want || found != tc.found {
			t.Errorf("%v: got %v %v %v, want %v %v", tc.labels, got, found, err, tc.want, tc.found)
		}
	}
	if _, found, _ := CounterSum(reg, "missing_total"); found {
		t.Error("a metric that is not registered was found")
	}
}
