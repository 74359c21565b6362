package sentinel

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"runtime"
	"slices"
	"strconv"
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
	return redistest.ServeLoopback(t, func(wg *sync.WaitGroup, c net.Conn) {
		wg.Go(func() { _, _ = io.Copy(io.Discard, c) })
	})
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

// TestDiscoverStalledCandidates: Discover checked the candidate primaries
// (ROLE) one after another, so each one that never answers added its
// timeout. Here the primary in use (current) and the address a Sentinel
// monitoring another server names both hang, and both rank above the real
// primary: before, Discover took both timeouts (6s) before choosing it;
// checked at once, they cost one (3s). The order of preference is kept:
// a lower-ranked candidate is not chosen while a higher one may still
// answer, so one timeout remains.
func TestDiscoverStalledCandidates(t *testing.T) {
	g := redistest.StartSentinelGroup(t, redistest.SentinelOptions{Replicas: 1, Sentinels: 1})
	current := hungServer(t) // the primary in use hangs
	other := hungServer(t)
	_, port, _ := net.SplitHostPort(other)
	p, _ := strconv.Atoi(port)
	// A Sentinel that names the hung server for the same name, at the same
	// epoch (0: no failover), listed first so its answer ranks first.
	stray := redistest.StartSentinel(t, redistest.SentinelOptions{Name: g.Name, Replicas: 1, Sentinels: 1, DownAfter: time.Minute}, p, 1)

	w := New(Options{
		Sentinels:  []string{stray.Addr(), g.Sentinels[0].Addr()},
		MasterName: g.Name, DialTimeout: hungTimeout, Role: roleFunc(hungTimeout), Logger: quietLogger(),
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	addr, epoch, err := w.Discover(ctx, current, 0)
	took := time.Since(start)
	t.Logf("Discover with two hung candidates ranked first: %q at epoch %d, %v, in %v", addr, epoch, err, took)
	if err != nil || addr != g.Nodes[0].Addr() {
		t.Fatalf("Discover = %q, %v; want the primary %s", addr, err, g.Nodes[0].Addr())
	}
	if took > hungTimeout*3/2 {
		t.Fatalf("Discover took %v with two hung candidates (timeout %v each): it waited for them one after the other", took, hungTimeout)
	}
	w.Close()
	waitGoroutines(t)
}

// TestFirstPrimaryOrder: checked at once, the candidates are still chosen
// in order: a slow primary ranked first wins over a fast one after it, a
// candidate that is not a primary gives way to the next, and an address
// named twice is asked once.
func TestFirstPrimaryOrder(t *testing.T) {
	const primary, replica = "*3\r\n$6\r\nmaster\r\n:0\r\n*0\r\n", "*5\r\n$5\r\nslave\r\n"
	var mu sync.Mutex
	asked := map[string]int{}
	w := New(Options{Logger: quietLogger(), Role: func(addr string) ([]byte, error) {
		mu.Lock()
		asked[addr]++
		mu.Unlock()
		switch addr {
		case "slow-primary:1":
			time.Sleep(200 * time.Millisecond)
			return []byte(primary), nil
		case "fast-primary:1", "other-primary:1":
			return []byte(primary), nil
		case "replica:1":
			return []byte(replica), nil
		}
		time.Sleep(100 * time.Millisecond)
		return nil, io.EOF
	}})
	defer w.Close()
	for _, c := range []struct {
		cands []string
		want  int
	}{
		{[]string{"slow-primary:1", "fast-primary:1"}, 0},
		{[]string{"replica:1", "down:1", "fast-primary:1", "other-primary:1"}, 2},
		{[]string{"down:1", "replica:1", "down:1", "slow-primary:1", "fast-primary:1"}, 3},
		{[]string{"down:1", "replica:1", "down:1"}, -1},
	} {
		clear(asked)
		i, errs := w.firstPrimary(c.cands)
		if i != c.want {
			t.Errorf("firstPrimary(%q) = %d, want %d", c.cands, i, c.want)
		}
		for j, err := range errs {
			if (err == nil) != (i >= 0 && j >= i) {
				t.Errorf("firstPrimary(%q): errs[%d] = %v", c.cands, j, err)
			}
		}
		// Let the checks not waited for end before reading the count.
		time.Sleep(300 * time.Millisecond)
		mu.Lock()
		if asked["down:1"] > 1 {
			t.Errorf("firstPrimary(%q) asked down:1 %d times, want once", c.cands, asked["down:1"])
		}
		mu.Unlock()
	}
}
