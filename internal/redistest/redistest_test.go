package redistest

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestStartSetGet(t *testing.T) {
	s := Start(t)
	if s.Port() == 6379 || s.Port() <= 0 {
		t.Fatalf("bad port %d", s.Port())
	}
	if want := fmt.Sprintf("127.0.0.1:%d", s.Port()); s.Addr() != want {
		t.Fatalf("Addr() = %q, want %q", s.Addr(), want)
	}
	ctx := context.Background()
	c := s.Client(t)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	got, err := c.Get(ctx, "k").Result()
	if err != nil || got != "v" {
		t.Fatalf("GET = %q, %v; want \"v\"", got, err)
	}
}

func TestExtraArgsApplied(t *testing.T) {
	s := Start(t, "--maxmemory", "12345678")
	got, err := s.Client(t).ConfigGet(context.Background(), "maxmemory").Result()
	if err != nil {
		t.Fatalf("CONFIG GET: %v", err)
	}
	if got["maxmemory"] != "12345678" {
		t.Fatalf("maxmemory = %q, want 12345678", got["maxmemory"])
	}
}

func TestKillRestart(t *testing.T) {
	s := Start(t)
	ctx := context.Background()
	c := s.Client(t)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	port := s.Port()

	// A client without retries fails at once instead of after go-redis's
	// default dial backoff, keeping the test fast. Its pooled connection is
	// open before Kill, so both a broken connection and a refused dial are hit.
	noRetry := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, DialerRetries: 1, PoolSize: 1})
	defer noRetry.Close()
	if err := noRetry.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING before Kill: %v", err)
	}

	s.Kill(t)
	for i := range 2 {
		if err := noRetry.Get(ctx, "k").Err(); err == nil || errors.Is(err, redis.Nil) {
			t.Fatalf("GET #%d after Kill = %v, want a connection error", i, err)
		}
	}
	s.Kill(t) // idempotent

	s.Restart(t)
	if s.Port() != port {
		t.Fatalf("port changed across Restart: %d -> %d", port, s.Port())
	}
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after Restart: %v", err)
	}
	// Persistence is off, so the restarted server must be empty.
	if err := c.Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET after Restart = %v, want redis.Nil", err)
	}
}

func TestFreePortNeverDefault(t *testing.T) {
	for range 20 {
		if p := FreePort(t); p == 6379 || p <= 0 {
			t.Fatalf("FreePort returned %d", p)
		}
	}
}

// fatalRecorder lets us observe Fatalf without ending the real test.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Helper() {}
func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
}

func TestStartFailureShowsOutput(t *testing.T) {
	rec := &fatalRecorder{TB: t}
	if s := Start(rec, "--no-such-option", "x"); s != nil {
		t.Fatal("Start returned a server despite a bad option")
	}
	if !strings.Contains(rec.msg, "Bad directive") {
		t.Fatalf("failure message lacks redis output: %q", rec.msg)
	}
}

func TestEventually(t *testing.T) {
	var n atomic.Int32
	Eventually(t, 5*time.Second, func() bool { return n.Add(1) >= 3 }, "never reached 3")
	if n.Load() != 3 {
		t.Fatalf("cond called %d times, want 3", n.Load())
	}

	rec := &fatalRecorder{TB: t}
	Eventually(rec, 20*time.Millisecond, func() bool { return false }, "waiting for %s", "godot")
	if !strings.Contains(rec.msg, "waiting for godot") {
		t.Fatalf("timeout message = %q", rec.msg)
	}
}

func TestCleanupKillsServer(t *testing.T) {
	var addrs []string
	t.Run("owner", func(t *testing.T) {
		for range 3 {
			s := Start(t)
			if !ping(s.Addr()) {
				t.Fatalf("%s not answering while the test runs", s.Addr())
			}
			addrs = append(addrs, s.Addr())
		}
	})
	if addrs[0] == addrs[1] || addrs[1] == addrs[2] || addrs[0] == addrs[2] {
		t.Fatalf("servers share an address: %v", addrs)
	}
	for _, a := range addrs {
		if ping(a) {
			t.Fatalf("%s still answers after its test finished", a)
		}
	}
}

func TestSentinelGroupFailover(t *testing.T) {
	start := time.Now()
	g := StartSentinelGroup(t, SentinelOptions{})
	t.Logf("group up in %v", time.Since(start))
	if p := g.Primary(t); p != g.Nodes[0] {
		t.Fatalf("primary at start = %v, want %s", p, g.Nodes[0].Addr())
	}
	start = time.Now()
	g.Failover(t)
	p := g.WaitNewPrimary(t, g.Nodes[0], 20*time.Second)
	t.Logf("SENTINEL FAILOVER: %s is primary after %v", p.Addr(), time.Since(start))

	start = time.Now()
	p.Kill(t)
	q := g.WaitNewPrimary(t, p, 30*time.Second)
	t.Logf("killed primary: %s is primary after %v", q.Addr(), time.Since(start))
}

// TestLaunchOnAPortAnotherServerHolds: a redis-server started on a port
// another one already serves cannot bind it; launch must not take the
// other, which answers PING, for it (two tests whose FreePort drew the
// same port shared one node of a cluster in CI).
func TestLaunchOnAPortAnotherServerHolds(t *testing.T) {
	other := Start(t)
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{bin: bin, dir: t.TempDir(), port: other.Port()}
	t.Cleanup(s.stop)
	if err := s.launch(); err == nil {
		t.Fatalf("launch on %s, which another redis-server serves, reported success", other.Addr())
	}
	if !ping(other.Addr()) {
		t.Fatal("the other server stopped answering")
	}
}
