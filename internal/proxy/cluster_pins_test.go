package proxy_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/cluster"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// TestClusterMaxPinnedIsPerNode: in cluster mode each node may hold
// upstream.max_pinned dedicated connections. With one limit for all
// nodes, a node that hangs let its waiting transactions take every one,
// and the other nodes' transactions were refused until it came back
// (found by a fault probe). Here, with max_pinned = 2, two transactions
// wait on a frozen node while one on another node runs to EXEC; a third
// on the frozen node is refused, and counted.
func TestClusterMaxPinnedIsPerNode(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	p := proxytest.Start(t, nil, func(cfg *config.Config) {
		cfg.Upstream.Mode = config.ModeCluster
		cfg.Upstream.Seeds = c.Seeds()
		cfg.Upstream.MaxPinned = 2
		// A dedicated connection to the frozen node waits in its
		// handshake this long, holding its share meanwhile.
		cfg.Upstream.DialTimeout = units.Duration{Duration: time.Minute}
	})
	ctx := context.Background()
	m := p.Router().Map()
	frozenAddr := ""
	for _, a := range m.Primaries() {
		if a != p.Router().AnyNode() { // not where the proxy's own connections are
			frozenAddr = a
			break
		}
	}
	keyOn := func(want bool) string {
		for i := 0; ; i++ {
			k := "k" + strconv.Itoa(i)
			if (m.Owner(cluster.Slot([]byte(k))) == frozenAddr) == want {
				return k
			}
		}
	}
	frozenKey, liveKey := keyOn(true), keyOn(false)

	frozen := nodeAt(t, c, frozenAddr)
	frozen.Freeze(t)
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			frozen.Thaw(t)
		}
	}
	t.Cleanup(thaw)

	// Two transactions on the frozen node: MULTI is answered by the
	// proxy, the first keyed command waits for the node's dedicated
	// connection.
	var waiting []*rawConn
	for range 2 {
		rc := dialRaw(t, p.Addr)
		rc.wait = 2 * time.Minute
		if got := rc.do("MULTI"); got != "OK" {
			t.Fatalf("MULTI = %v", got)
		}
		rc.send([]string{"SET", frozenKey, "v"})
		waiting = append(waiting, rc)
	}
	pinned := func() float64 {
		n, _, err := metrics.GaugeSum(p.Metrics.Registry, "redproxy_upstream_dedicated_connections")
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	redistest.Eventually(t, 10*time.Second, func() bool { return pinned() == 2 },
		"the frozen node's two transactions never held a dedicated connection each (held: %v)", lazyFloat(pinned))

	// Another node's transaction is served.
	cl := p.Client(t, func(o *redis.Options) { o.PoolSize = 1 })
	cmds, err := cl.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.Set(ctx, liveKey, "x", 0)
		pipe.Get(ctx, liveKey)
		return nil
	})
	if err != nil || len(cmds) != 2 || cmds[1].(*redis.StringCmd).Val() != "x" {
		t.Fatalf("a transaction on a live node while the frozen one holds max_pinned: %v, %v", cmds, err)
	}

	// INFO's pinned_connections is the busiest node's, which compares
	// with max_pinned_connections: the sum (3, with a transaction open on
	// the live node too) may pass it.
	open := dialRaw(t, p.Addr)
	if got := open.do("MULTI"); got != "OK" {
		t.Fatalf("MULTI = %v", got)
	}
	if got := open.do("SET", liveKey, "y"); got != "QUEUED" {
		t.Fatalf("SET in a transaction on the live node = %v", got)
	}
	info := fmt.Sprint(dialRaw(t, p.Addr).do("INFO", "proxy"))
	for _, want := range []string{"\r\npinned_connections:2\r\n", "\r\nmax_pinned_connections:2\r\n"} {
		if !strings.Contains(info, want) {
			t.Errorf("INFO proxy has no %q:\n%s", want, info)
		}
	}

	// A third on the frozen node is over its share.
	rc := dialRaw(t, p.Addr)
	if got := rc.do("MULTI"); got != "OK" {
		t.Fatalf("MULTI = %v", got)
	}
	const refused = "ERR redproxy: too many dedicated upstream connections in use (upstream.max_pinned)"
	if got := rc.do("SET", frozenKey, "v"); got != respError(refused) {
		t.Fatalf("a third transaction on the frozen node: SET = %v, want %q", got, refused)
	}
	if n, found, err := metrics.CounterSum(p.Metrics.Registry, "redproxy_upstream_dedicated_refused_total"); err != nil || !found || n != 1 {
		t.Errorf("redproxy_upstream_dedicated_refused_total = %v (found %v, %v), want 1", n, found, err)
	}

	// Thawed, the waiting transactions go on where they were.
	thaw()
	for i, w := range waiting {
		if got, _ := w.readReply(); got != "QUEUED" {
			t.Fatalf("waiting transaction %d: SET = %v, want QUEUED", i, got)
		}
		if got := fmt.Sprint(w.do("EXEC")); got != "[OK]" {
			t.Fatalf("waiting transaction %d: EXEC = %v, want [OK]", i, got)
		}
	}
}
