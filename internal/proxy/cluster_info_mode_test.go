package proxy_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// TestClusterInfoSaysStandalone: in cluster mode the proxy presents one
// ordinary Redis (docs/COMPATIBILITY.md "Cluster mode": clients "need no
// cluster support"; CLUSTER ... answers "This instance has cluster support
// disabled", HELLO answers mode "standalone"). But INFO is forwarded to the
// keyless node unchanged and says redis_mode:cluster and cluster_enabled:1
// (and CONFIG GET cluster-enabled says yes). Tools that detect a cluster
// from INFO (redis_exporter, RedisInsight, some client libraries' auto
// detection) then switch to cluster commands, which the proxy refuses.
// Found by review (modes, 2026-12-06).
func TestClusterInfoSaysStandalone(t *testing.T) {
	_, p := startClusterProxy(t)
	rc := p.Client(t)
	ctx := context.Background()
	if mode := rc.Do(ctx, "HELLO", "2").String(); !strings.Contains(mode, "standalone") {
		t.Fatalf("HELLO = %s; want mode standalone", mode)
	}
	server, err := rc.Info(ctx, "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(server, "redis_mode:standalone") {
		t.Errorf("INFO server says %q; HELLO and CLUSTER say standalone", line(server, "redis_mode:"))
	}
	cl, err := rc.Info(ctx, "cluster").Result()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(cl, "cluster_enabled:0") {
		t.Errorf("INFO cluster says %q; CLUSTER INFO answers \"cluster support disabled\"", line(cl, "cluster_enabled:"))
	}
}

// TestClusterInfoProxyListsNodes: INFO proxy in cluster mode showed one
// line, upstream_0, for the backend the proxy keeps for admin round trips:
// one node's pool, which carries no client's command, so a node down showed
// nowhere and the connections of the others were not counted (found by
// review, 2026-12-06). Each node the proxy has connections for has a line.
func TestClusterInfoProxyListsNodes(t *testing.T) {
	c, p := startClusterProxy(t)
	rc := p.Client(t)
	ctx := context.Background()
	for i := range 30 { // a key on every primary: each gets its connections
		if err := rc.Set(ctx, fmt.Sprintf("infonodes:%d", i), i, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	info, err := rc.Info(ctx, "proxy").Result()
	if err != nil {
		t.Fatal(err)
	}
	primaries := c.Primaries(t)
	for _, n := range primaries {
		if !strings.Contains(info, ":addr="+n.Addr()+",state=up,role=primary,") {
			t.Errorf("INFO proxy has no line for primary %s:\n%s", n.Addr(), info)
		}
	}
	if got := strings.Count(info, "role=primary"); got != len(primaries) {
		t.Errorf("%d lines say role=primary, want %d:\n%s", got, len(primaries), info)
	}
	if !strings.Contains(info, fmt.Sprintf("upstream_%d:", len(primaries)-1)) {
		t.Errorf("the lines are not numbered upstream_0..%d:\n%s", len(primaries)-1, info)
	}
}

func line(text, prefix string) string {
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, prefix) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

// TestClusterOverTLS: a cluster whose nodes talk TLS (tls-cluster yes)
// behind [upstream.tls], seeded at their TLS ports. CLUSTER SHARDS names a
// node's TLS port "tls-port" and its plaintext one "port"; the map read
// "port" and dialled it with TLS, so no command was ever served (found by
// review).
func TestClusterOverTLS(t *testing.T) {
	certs := redistest.NewCerts(t)
	c := redistest.StartTLSCluster(t, certs, 3)
	var seeds []string
	for _, n := range c.Nodes {
		seeds = append(seeds, n.TLSAddr())
	}
	p := proxytest.Start(t, c.Nodes[0], func(cfg *config.Config) {
		cfg.Upstream.Mode = config.ModeCluster
		cfg.Upstream.Seeds = seeds
		cfg.Upstream.TLS = &config.UpstreamTLS{CAFile: certs.CAFile}
	})
	rc := p.Client(t)
	ctx := context.Background()
	for i := range 100 {
		k := fmt.Sprintf("tls:%d", i)
		if err := rc.Set(ctx, k, i, 0).Err(); err != nil {
			t.Fatalf("SET %s through the proxy: %v", k, err)
		}
	}
	if v, err := rc.MGet(ctx, "tls:1", "tls:2", "tls:3").Result(); err != nil || fmt.Sprint(v) != "[1 2 3]" {
		t.Fatalf("MGET across slots: %v, %v", v, err)
	}
	// Every node got some of the keys (read on its plaintext port).
	for _, n := range c.Nodes {
		if size := n.Client(t).DBSize(ctx).Val(); size == 0 {
			t.Errorf("node %s holds no key of 100", n.Addr())
		}
	}
}

// TestClusterInfoProxyBeforeAnyNodeAnswers: with no slot map (every seed
// down since the start) the proxy has no node's connections to list, and
// INFO proxy had no upstream line at all (found by review): each seed has
// one, down.
func TestClusterInfoProxyBeforeAnyNodeAnswers(t *testing.T) {
	seeds := []string{fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t)), fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))}
	p := proxytest.StartUnready(t, nil, func(c *config.Config) {
		c.Upstream.Mode = config.ModeCluster
		c.Upstream.Seeds = seeds
	})
	info, err := p.Client(t).Info(context.Background(), "proxy").Result()
	if err != nil {
		t.Fatal(err)
	}
	for i, seed := range seeds {
		if want := fmt.Sprintf("upstream_%d:addr=%s,state=down,role=seed", i, seed); !strings.Contains(info, want) {
			t.Errorf("INFO proxy lacks %q:\n%s", want, info)
		}
	}
}

// TestClusterInfoProxyBeforeAnyCommand: a node's connections are made when
// the first command (or a readiness probe) goes to it, so a proxy that had
// loaded its slot map but served nothing yet listed no node, and showed
// its seeds as down (found by review). Every primary of the map is listed.
func TestClusterInfoProxyBeforeAnyCommand(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	p := proxytest.StartUnready(t, c.Nodes[0], func(cfg *config.Config) {
		cfg.Upstream.Mode = config.ModeCluster
		cfg.Upstream.Seeds = c.Seeds()
	})
	redistest.Eventually(t, 10*time.Second, func() bool { m := p.Router().Map(); return m != nil && len(m.Primaries()) == 3 },
		"the proxy never loaded the slot map")
	info, err := p.Client(t).Info(context.Background(), "proxy").Result()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(info, "role=seed") || strings.Count(info, "role=primary") != 3 {
		t.Errorf("INFO proxy with the slot map loaded does not list its 3 primaries:\n%s", info)
	}
}

// TestClusterInfoProxyListsReplicas: with read_from in cluster mode each
// primary's line is followed by its replicas', as the poll found them.
func TestClusterInfoProxyListsReplicas(t *testing.T) {
	c, p := startClusterReplicaProxy(t, config.ReadReplicaPreferred, nil)
	info, err := p.Client(t).Info(context.Background(), "proxy").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range c.Replicas(t) {
		if !strings.Contains(info, ":addr="+r.Addr()+",state=up,role=replica,") {
			t.Errorf("INFO proxy has no line for replica %s:\n%s", r.Addr(), info)
		}
	}
	if n := strings.Count(info, "role=primary"); n != 3 {
		t.Errorf("%d primaries listed, want 3:\n%s", n, info)
	}
}
