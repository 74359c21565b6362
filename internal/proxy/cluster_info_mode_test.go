package proxy_test

import (
	"context"
	"strings"
	"testing"
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

func line(text, prefix string) string {
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, prefix) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}
