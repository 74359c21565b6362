package proxy_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// The tests of this file run a cluster of three primaries and no replica
// with cluster-require-full-coverage no: a primary that fails keeps its
// slots (no replica takes over), the cluster flags it as failed
// (CLUSTER SHARDS health "fail", Map.Failed), and the other slots keep
// being served. Whatever the proxy had chosen that node for must move.

// failedPrimaryCluster is such a cluster behind a proxy, with a client of
// the proxy that has sent a PING, so that the keyless node is chosen.
type failedPrimaryCluster struct {
	cl      *redistest.Cluster
	p       *proxytest.Proxy
	c       *redis.Client
	keyless string // where PING went
}

func startClusterWithoutReplicas(t *testing.T) failedPrimaryCluster {
	t.Helper()
	cl := redistest.StartCluster(t, 3, 0, "--cluster-require-full-coverage", "no")
	p := proxytest.Start(t, nil, func(c *config.Config) {
		c.Upstream.Mode = config.ModeCluster
		c.Upstream.Seeds = cl.Seeds()
		c.Upstream.ReplyTimeout = units.Duration{Duration: 500 * time.Millisecond}
		c.Upstream.DialTimeout = units.Duration{Duration: 500 * time.Millisecond}
	})
	c := p.Client(t)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	return failedPrimaryCluster{cl: cl, p: p, c: c, keyless: p.Router().AnyNode()}
}

// TestClusterAdminLeavesAFailedPrimary: the proxy's own connections leave a
// primary the cluster flagged as failed although it keeps its slots (no
// replica to take over; cluster-require-full-coverage no keeps the other
// slots served). They stayed on it, dialling a dead address, as long as it
// was in the map: the command table and version were then never read
// again, and SCRIPT KILL had nowhere to go. Keyless commands (PING,
// PUBLISH) stayed on it too.
func TestClusterAdminLeavesAFailedPrimary(t *testing.T) {
	f := startClusterWithoutReplicas(t)
	p, c := f.p, f.c
	admin := p.Backend().Addr()
	victim := nodeAt(t, f.cl, admin)
	if f.keyless != admin {
		t.Fatalf("keyless commands go to %s, not to the admin backend's %s: the test kills the node of both", f.keyless, admin)
	}
	victim.Kill(t)
	redistest.Eventually(t, 60*time.Second, func() bool {
		// Commands keep asking for the map (a lost node does) until the
		// cluster's failure flag is in it.
		c.Ping(ctx)
		return p.Backend().Addr() != admin
	}, "the proxy's own connections stayed on %s, a primary the cluster flagged as failed", admin)
	to := p.Backend().Addr()
	m := p.Router().Map()
	if !m.Failed(admin) || m.Failed(to) || !slices.Contains(m.Primaries(), to) {
		t.Fatalf("moved from %s (failed: %v) to %s (failed: %v, primaries %v)",
			admin, m.Failed(admin), to, m.Failed(to), m.Primaries())
	}
	// Keyless commands stuck to the failed node too: PING failed for as
	// long as it was in the map.
	var err error
	redistest.Eventually(t, 30*time.Second, func() bool {
		err = c.Ping(ctx).Err()
		return err == nil
	}, "PING kept failing once the cluster flagged %s as failed: %v", admin, lazyErr{&err})
	if keyless := p.Router().AnyNode(); keyless == admin {
		t.Fatalf("keyless commands still go to the failed %s", admin)
	}
	if err := c.Do(ctx, "SCRIPT", "KILL").Err(); err == nil || !strings.Contains(err.Error(), "NOTBUSY") {
		t.Fatalf("SCRIPT KILL after the move: %v, want the live primary's NOTBUSY", err)
	}
}

// TestClusterSubscriberOfAFailedNodeIsCut: a classic SUBSCRIBE is relayed
// to the keyless node. When that node hangs without closing its sockets (a
// frozen host, a cut network) and the cluster flags it as failed, PUBLISH
// moves to a live primary; the subscriber's relay stayed on the failed
// node, heard nothing more and was never closed, so its client never
// subscribed again (found by review). Now its connection is closed, as
// when a node dies, and a new subscription gets what is published.
func TestClusterSubscriberOfAFailedNodeIsCut(t *testing.T) {
	f := startClusterWithoutReplicas(t)
	p, pub, keyless := f.p, f.c, f.keyless
	victim := nodeAt(t, f.cl, keyless)
	sub := dialRaw(t, p.Addr)
	sub.send([]string{"SUBSCRIBE", "news"})
	if got := readMessage(t, sub); got != "[subscribe news 1]" {
		t.Fatalf("SUBSCRIBE: %s", got)
	}
	victim.Freeze(t)
	t.Cleanup(func() { victim.Thaw(t) })
	redistest.Eventually(t, 60*time.Second, func() bool {
		return pub.Ping(ctx).Err() == nil && p.Router().Map().Failed(keyless)
	}, "PING never worked again, or %s was never flagged failed", keyless)
	sub.nc.SetReadDeadline(time.Now().Add(20 * time.Second))
	_, err := sub.rd.ReadByte()
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the subscriber relayed to %s, flagged failed, got nothing and its connection stayed open", keyless)
	}
	if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !strings.Contains(fmt.Sprint(err), "reset") {
		t.Fatalf("the subscriber's connection: %v, want it closed", err)
	}
	again := dialRaw(t, p.Addr)
	again.send([]string{"SUBSCRIBE", "news"})
	if got := readMessage(t, again); got != "[subscribe news 1]" {
		t.Fatalf("SUBSCRIBE again: %s", got)
	}
	if n, err := pub.Publish(ctx, "news", "after").Result(); err != nil || n != 1 {
		t.Fatalf("PUBLISH news = %d, %v; want the new subscriber", n, err)
	}
	if got := readMessage(t, again); got != "[message news after]" {
		t.Fatalf("the new subscriber got %s", got)
	}
}

// TestClusterReadyAndMonitorWithAFailedPrimary: a primary flagged failed
// made /readyz 503 for as long as it stayed in the map (every instance
// alike, so a load balancer withdrew them all while two thirds of the
// slots were served), and MONITOR, which dialled it, was refused (found by
// review). A monitor started without it is closed once it serves again.
func TestClusterReadyAndMonitorWithAFailedPrimary(t *testing.T) {
	f := startClusterWithoutReplicas(t)
	p, c := f.p, f.c
	var victim string
	for _, a := range p.Router().Map().Primaries() {
		if a != f.keyless {
			victim = a
			break
		}
	}
	victimNode := nodeAt(t, f.cl, victim)
	victimNode.Kill(t)
	redistest.Eventually(t, 60*time.Second, func() bool {
		c.Ping(ctx)
		return p.Router().Map().Failed(victim)
	}, "%s was never flagged failed", victim)
	redistest.Eventually(t, 30*time.Second, p.Ready,
		"not ready with %s flagged failed while the other primaries serve", victim)
	if got, _, err := metrics.GaugeSum(p.Metrics.Registry, "redproxy_cluster_primaries_failed"); err != nil || got != 1 {
		t.Fatalf("redproxy_cluster_primaries_failed = %v, %v; want 1", got, err)
	}
	info, err := c.Info(ctx, "proxy").Result()
	if err != nil || !strings.Contains(info, "addr="+victim+",state=failed,role=primary") {
		t.Fatalf("INFO proxy does not say %s failed: %v\n%s", victim, err, info)
	}
	mon := dialRaw(t, p.Addr)
	if got := mon.do("MONITOR"); got != "OK" {
		t.Fatalf("MONITOR with %s flagged failed: %v", victim, got)
	}
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	// PING goes to the keyless node, watched: its line reaches the
	// monitor (after the lines of the proxy's own commands, if any).
	for i := 0; ; i++ {
		line, err := mon.next(nil)
		if err != nil || i == 100 {
			t.Fatalf("the monitor never showed the PING: %v", err)
		}
		if strings.Contains(strings.ToLower(fmt.Sprint(line)), `"ping"`) {
			break
		}
	}
	// Back, the node serves its slots again: a monitor without it would
	// show a partial picture as a whole one, so it is closed (found by
	// review: it went on without the node for good).
	victimNode.Restart(t)
	redistest.Eventually(t, 60*time.Second, func() bool {
		c.Ping(ctx)
		m := p.Router().Map()
		return slices.Contains(m.Primaries(), victim) && !m.Failed(victim)
	}, "%s never served again unflagged", victim)
	mon.wait = 10 * time.Second
	for {
		_, err := mon.next(nil)
		if err == nil {
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("the monitor stayed open without %s, which serves again", victim)
		}
		break
	}
	again := dialRaw(t, p.Addr)
	if got := again.do("MONITOR"); got != "OK" {
		t.Fatalf("MONITOR with every primary back: %v", got)
	}
}
