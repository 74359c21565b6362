package proxy_test

import (
	"context"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// scrape is the proxy's /metrics text, as Prometheus reads it.
func scrape(t *testing.T, p *proxytest.Proxy) string {
	t.Helper()
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(p.Metrics.Registry, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}).
		ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 {
		t.Fatalf("/metrics: %d %s", rec.Code, rec.Body)
	}
	return rec.Body.String()
}

// nodeSeries are the lines of text for metric name with node="addr".
func nodeSeries(text, name, addr string) []string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, name+"{") && strings.Contains(l, `node="`+addr+`"`) {
			out = append(out, l)
		}
	}
	return out
}

// proxyClients counts the proxy's connections on s (named redproxy...).
func proxyClients(t *testing.T, s *redistest.Server) int {
	t.Helper()
	list, err := s.Client(t).ClientList(context.Background()).Result()
	if err != nil {
		return -1
	}
	n := 0
	for _, l := range strings.Split(strings.TrimSpace(list), "\n") {
		if strings.Contains(l, " name=redproxy") {
			n++
		}
	}
	return n
}

// TestClusterNodeLeaves: upstream metrics carry the node in cluster mode;
// a primary emptied of its slots and forgotten by the cluster (as
// redis-cli --cluster del-node does) loses its connections from the
// proxy, and its series leave /metrics.
func TestClusterNodeLeaves(t *testing.T) {
	c, p := startPubSubClusterProxy(t, 0)
	ctx := context.Background()
	m := p.Router().Map()
	ps := m.Primaries()
	victim, dst := nodeAt(t, c, ps[2]), nodeAt(t, c, ps[1])

	text := scrape(t, p)
	for _, a := range ps {
		up := nodeSeries(text, "redproxy_upstream_connections_up", a)
		if len(up) == 0 || strings.HasSuffix(up[0], " 0") {
			t.Fatalf("no connection up to %s in /metrics: %v", a, up)
		}
	}
	if len(nodeSeries(text, "redproxy_upstream_dials_total", victim.Addr())) == 0 {
		t.Fatalf("no dials series for %s", victim.Addr())
	}
	if proxyClients(t, victim) == 0 {
		t.Fatal("the proxy has no connection to the node before it leaves")
	}

	// A sharded subscriber on the node: it hears its slot leave (Redis's
	// sunsubscribe) and, when the node leaves, its connection closes.
	ch := channelOn(t, p, "leaving", victim.Addr(), true)
	sub := dialRaw(t, p.Addr)
	sub.send([]string{"SSUBSCRIBE", ch})
	if got := readMessage(t, sub); got != "[ssubscribe "+ch+" 1]" {
		t.Fatalf("SSUBSCRIBE: %s", got)
	}

	// Its (empty) slots go to dst, then everyone forgets it.
	var slots []int
	for s := range 16384 {
		if m.Owner(s) == victim.Addr() {
			slots = append(slots, s)
		}
	}
	c.RemovePrimary(t, victim, dst, slots)

	redistest.Eventually(t, 15*time.Second, func() bool {
		p.Router().Refresh()
		for _, a := range p.Router().Nodes() {
			if a == victim.Addr() {
				return false
			}
		}
		return proxyClients(t, victim) == 0
	}, "the proxy keeps connections to a node that left the cluster (router nodes %v; the cluster as %s sees it: %v)",
		lazyNodes{p}, dst.Addr(), lazyClusterNodes{t, dst})
	if got := readMessage(t, sub); got != "[sunsubscribe "+ch+" 0]" {
		t.Fatalf("subscriber after its slot moved: %s", got)
	}
	sub.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := sub.rd.ReadByte(); err != io.EOF {
		t.Fatalf("subscriber on a node that left: read = %v, want EOF", err)
	}
	text = scrape(t, p)
	if got := nodeSeries(text, "redproxy_upstream", victim.Addr()); len(got) != 0 {
		t.Fatalf("series of the departed node remain: %v", got)
	}
	if len(nodeSeries(text, "redproxy_upstream_connections_up", dst.Addr())) == 0 {
		t.Fatalf("the remaining node %s has no series", dst.Addr())
	}
	// Its former slots are served by dst through the proxy.
	rc := p.Client(t)
	for i := range 50 {
		k := "after:" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		if err := rc.Set(ctx, k, i, 0).Err(); err != nil {
			t.Fatalf("SET %s after the node left: %v", k, err)
		}
	}
	if n := proxyClients(t, victim); n != 0 {
		t.Fatalf("the proxy dialled the departed node again: %d connections", n)
	}
}

type lazyNodes struct{ p *proxytest.Proxy }

func (l lazyNodes) String() string { return strings.Join(l.p.Router().Nodes(), ",") }

type lazyClusterNodes struct {
	t *testing.T
	s *redistest.Server
}

func (l lazyClusterNodes) String() string {
	list, _ := l.s.Client(l.t).Do(context.Background(), "CLUSTER", "NODES").Text()
	return list
}
