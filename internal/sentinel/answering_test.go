package sentinel

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/redistest"
)

// With every Sentinel gone and the primary healthy, the proxy keeps its
// primary but could not follow a failover: it says so once, at warning
// level, counts no Sentinel answering, and says when one answers again
// (found by review: only debug lines, nothing an operator would see).
func TestNoSentinelAnsweringIsReported(t *testing.T) {
	g := redistest.StartSentinelGroup(t, redistest.SentinelOptions{Replicas: 0})
	var logs redistest.LogBuffer
	w := New(Options{Sentinels: g.SentinelAddrs(), MasterName: g.Name, DialTimeout: 500 * time.Millisecond,
		Role: roleFunc(time.Second), Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	defer w.Close()
	if n := w.Answering(); n != -1 {
		t.Fatalf("Answering before any check = %d, want -1", n)
	}
	check := func() (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		addr, _, err := w.Discover(ctx, g.Nodes[0].Addr(), 0)
		return addr, err
	}
	if addr, err := check(); err != nil || addr != g.Nodes[0].Addr() {
		t.Fatalf("Discover = %q, %v", addr, err)
	}
	if n := w.Answering(); n < 1 {
		t.Fatalf("Answering with every Sentinel up = %d", n)
	}
	for _, s := range g.Sentinels {
		s.Kill(t)
	}
	for range 3 {
		if addr, err := check(); err != nil || addr != g.Nodes[0].Addr() {
			t.Fatalf("Discover with no Sentinel: %q, %v; want the primary in use kept", addr, err)
		}
	}
	if n := w.Answering(); n != 0 {
		t.Fatalf("Answering with every Sentinel down = %d, want 0", n)
	}
	const warn = "no Sentinel answered"
	if n := strings.Count(logs.String(), warn); n != 1 {
		t.Fatalf("%d warnings %q over three checks, want one:\n%s", n, warn, logs.String())
	}
	if !strings.Contains(logs.String(), "level=WARN") {
		t.Fatalf("not logged as a warning:\n%s", logs.String())
	}
	g.Sentinels[0].Restart(t)
	redistest.Eventually(t, 10*time.Second, func() bool {
		_, err := check()
		return err == nil && w.Answering() >= 1
	}, "the restarted Sentinel never counted")
	if !strings.Contains(logs.String(), "Sentinels answer again") {
		t.Fatalf("no line says the Sentinels answer again:\n%s", logs.String())
	}
}
