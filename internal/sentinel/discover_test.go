package sentinel

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/resp"
	"github.com/redproxy/redproxy/internal/upstream"
)

// TestDiscoverHungSentinel: Discover asked the Sentinels one after
// another, so a hung one (SIGSTOP: a host gone without closing its
// sockets) held every check for its read timeout, and with it the switch
// to a promoted replica (found by review). With a read timeout of 10s and
// 5s to answer, Discover found no primary before (it waited 10s on the
// first, hung Sentinel, then had no time left to ask the others); the two
// live Sentinels are a majority and their answer is enough now.
func TestDiscoverHungSentinel(t *testing.T) {
	g := redistest.StartSentinelGroup(t, redistest.SentinelOptions{Replicas: 1})
	g.Sentinels[0].Freeze(t)
	t.Cleanup(func() { g.Sentinels[0].Thaw(t) })
	w := New(Options{
		Sentinels: g.SentinelAddrs(), MasterName: g.Name, DialTimeout: 10 * time.Second,
		Role: func(addr string) ([]byte, error) {
			return upstream.RoundTrip(upstream.Options{Addr: addr}, resp.AppendCommandStrings(nil, "ROLE"))
		},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	addr, _, err := w.Discover(ctx, "", -1)
	if err != nil || addr != g.Nodes[0].Addr() {
		t.Fatalf("Discover with the first of three Sentinels hung = %q, %v; want the primary %s", addr, err, g.Nodes[0].Addr())
	}
}
