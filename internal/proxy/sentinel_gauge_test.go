package proxy_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// gauge is the value of the gauge name whose labels are exactly labels,
// and whether there is such a series.
func gauge(t *testing.T, p *proxytest.Proxy, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	fams, err := p.Metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; !ok || v != l.GetValue() {
					continue series
				}
			}
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// TestSentinelsAnsweringPerUpstream: a named upstream in Sentinel mode has
// its own redproxy_sentinels_answering, labelled with its name, as
// [upstream]'s is with "default" when routes are configured. It had none:
// its Sentinels all down was only logged (found by review). Killing the
// named upstream's Sentinel takes its gauge to 0 and leaves [upstream]'s.
func TestSentinelsAnsweringPerUpstream(t *testing.T) {
	defGroup := redistest.StartSentinelGroup(t, redistest.SentinelOptions{Replicas: 1, Sentinels: 1})
	namedGroup := redistest.StartSentinelGroup(t, redistest.SentinelOptions{Name: "other", Replicas: 1, Sentinels: 1})
	p := proxytest.Start(t, defGroup.Nodes[0], func(c *config.Config) {
		sentinelConfig(defGroup, defGroup.SentinelAddrs())(c)
		u := namedUpstream("")
		u.Mode, u.Address = config.ModeSentinel, ""
		u.Sentinels, u.MasterName = namedGroup.SentinelAddrs(), namedGroup.Name
		c.Upstreams = map[string]config.Upstream{"s": u}
		c.Routes = []config.Route{{Pattern: "s:*", Upstream: "s"}}
	})
	const name = "redproxy_sentinels_answering"
	def := map[string]string{"upstream": config.DefaultUpstream}
	s := map[string]string{"upstream": "s"}
	both := func() string {
		d, dok := gauge(t, p, name, def)
		v, sok := gauge(t, p, name, s)
		return fmt.Sprintf("default: %v (present %v), s: %v (present %v)", d, dok, v, sok)
	}
	redistest.Eventually(t, 10*time.Second, func() bool {
		d, _ := gauge(t, p, name, def)
		v, _ := gauge(t, p, name, s)
		return d == 1 && v == 1
	}, "each upstream's gauge never said its Sentinel answers: %s", lazy(both))

	namedGroup.Sentinels[0].Kill(t)
	redistest.Eventually(t, 10*time.Second, func() bool {
		v, ok := gauge(t, p, name, s)
		return ok && v == 0
	}, "the named upstream's gauge never went to 0: %s", lazy(both))
	if d, ok := gauge(t, p, name, def); !ok || d != 1 {
		t.Errorf("[upstream]'s gauge changed with the named upstream's Sentinel: %s", both())
	}
}

// TestSentinelsAnsweringUnlabelledWithoutRoutes: without routes,
// [upstream]'s gauge keeps the series it always had, with no label.
func TestSentinelsAnsweringUnlabelledWithoutRoutes(t *testing.T) {
	nowhere := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	p := proxytest.StartUnready(t, nil, func(c *config.Config) {
		c.Upstream.Mode, c.Upstream.Sentinels, c.Upstream.MasterName = config.ModeSentinel, []string{nowhere}, "mymaster"
	})
	if v, ok := gauge(t, p, "redproxy_sentinels_answering", map[string]string{}); !ok || v != 0 {
		t.Errorf("redproxy_sentinels_answering with no label = %v (present %v), want 0: the Sentinel at start did not answer", v, ok)
	}
}

// lazy formats as f's result, computed when a failure message is printed.
type lazy func() string

func (f lazy) String() string { return f() }
