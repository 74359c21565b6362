package proxy_test

import (
	"testing"

	"github.com/redproxy/redproxy/internal/proxytest"
)

// histogramSum is the sum of the redproxy_command_duration_seconds series
// of command.
func histogramSum(t *testing.T, p *proxytest.Proxy, command string) float64 {
	t.Helper()
	fams, err := p.Metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "redproxy_command_duration_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "command" && l.GetValue() == command {
					return m.GetHistogram().GetSampleSum()
				}
			}
		}
	}
	return 0
}

// A blocking command's latency includes its block, as the metric's help
// says (from reading the command to having its reply): a BLPOP that Redis
// timed out after 0.3 s was observed as under a microsecond (found by a
// probe). Redis's own timeout bounds the block from below, so the check
// is a floor, not a timing race.
func TestBlockingCommandLatencyIncludesTheBlock(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	c := dialRaw(t, p.Addr)
	before := histogramSum(t, p, "blpop")
	if v := c.do("BLPOP", "never:pushed", "0.3"); v != nil {
		t.Fatalf("BLPOP on an empty list = %#v, want its timeout's null", v)
	}
	if got := histogramSum(t, p, "blpop") - before; got < 0.25 {
		t.Fatalf("BLPOP timed out by Redis after 0.3 s was observed as %.6f s", got)
	}
}
