package sentinel

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/resp"
	"github.com/redproxy/redproxy/internal/upstream"
)

// hungTimeout is the per-server timeout of the tests with a hung server:
// long enough that waiting for it once cannot go unnoticed next to the
// milliseconds a live server takes, even on a loaded machine.
const hungTimeout = 3 * time.Second

// hungServer listens on a loopback port, accepts every connection and
// never answers: a host that went away without closing its sockets, or a
// stopped (SIGSTOP) process, as seen from a client. Its connections are
// closed on cleanup.
func hungServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() { _, _ = io.Copy(io.Discard, c) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// roleFunc asks ROLE as the proxy does (a connection of its own, named,
// so a server that never answers holds it for the dial timeout).
func roleFunc(timeout time.Duration) func(string) ([]byte, error) {
	return func(addr string) ([]byte, error) {
		return upstream.RoundTrip(upstream.Options{
			Addr: addr, DialTimeout: timeout, ReplyTimeout: timeout, DeadTimeout: timeout,
			Name: "redproxy-sentinel-check",
		}, resp.AppendCommandStrings(nil, "ROLE"))
	}
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// watcherGoroutines counts the goroutines running the Watcher's code
// (its calls' helpers: asking a Sentinel, a ROLE check).
func watcherGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		if bytes.Contains(g, []byte("internal/sentinel.(*Watcher)")) {
			count++
		}
	}
	return count
}

// waitGoroutines waits until the goroutines a closed watcher's calls
// started have ended: each within the timeout it waits on a server.
func waitGoroutines(t *testing.T) {
	t.Helper()
	redistest.Eventually(t, 2*hungTimeout, func() bool { return watcherGoroutines() == 0 },
		"%d goroutines of the watcher still run after Close", watcherGoroutines())
}

// TestReplicasHungSentinel: Replicas asked the Sentinels one after
// another, so a hung first Sentinel held every replica-list refresh for
// its read timeout (3s here) before the next one was asked; in the proxy,
// whose refresh gets a shorter deadline (the replica poll's check
// timeout), no list came at all. The live Sentinels answer in
// milliseconds: the list must come well within the hung one's timeout.
func TestReplicasHungSentinel(t *testing.T) {
	g := redistest.StartSentinelGroup(t, redistest.SentinelOptions{Replicas: 2})
	var want []string
	for _, n := range g.Nodes[1:] {
		want = append(want, n.Addr())
	}
	slices.Sort(want)
	// The Sentinels list a replica as usable once they have its INFO.
	live := New(Options{Sentinels: g.SentinelAddrs(), MasterName: g.Name, Role: roleFunc(hungTimeout), Logger: quietLogger()})
	redistest.Eventually(t, 20*time.Second, func() bool {
		list, err := live.Replicas(context.Background())
		slices.Sort(list)
		return err == nil && slices.Equal(list, want)
	}, "the Sentinels never listed the replicas %v as usable", want)
	live.Close()

	hung := hungServer(t)
	w := New(Options{
		Sentinels:  append([]string{hung}, g.SentinelAddrs()...),
		MasterName: g.Name, DialTimeout: hungTimeout, Role: roleFunc(hungTimeout), Logger: quietLogger(),
	})
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		start := time.Now()
		list, err := w.Replicas(ctx)
		took := time.Since(start)
		cancel()
		slices.Sort(list)
		t.Logf("Replicas #%d with the first Sentinel hung: %v in %v", i, list, took)
		if err != nil || !slices.Equal(list, want) {
			t.Fatalf("Replicas with the first Sentinel hung = %v, %v; want %v", list, err, want)
		}
		if took > hungTimeout/2 {
			t.Fatalf("Replicas took %v with the first Sentinel hung (its timeout is %v): it waited for it", took, hungTimeout)
		}
	}
	w.Close()
	waitGoroutines(t)
}
