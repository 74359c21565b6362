package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/redistest"
)

// startShutdownProxy starts the binary with an admin endpoint and
// shutdown_timeout = "4s" in front of rs; it returns the process, a
// channel closed at its exit, the client and admin addresses and the log.
func startShutdownProxy(t *testing.T, rs *redistest.Server) (proc *os.Process, exited <-chan struct{}, listen, adminAddr string, logs *redistest.LogBuffer) {
	t.Helper()
	listen = fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	adminAddr = fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	path := filepath.Join(t.TempDir(), "redproxy.toml")
	check(t, os.WriteFile(path, []byte(fmt.Sprintf(`
[server]
listen = %q
admin = %q
shutdown_timeout = "4s"
[upstream]
address = %q
`, listen, adminAddr, rs.Addr())), 0o600))
	c, _, logs := startProxy(t, binary(t), listen, nil, "--config", path)
	done := make(chan struct{})
	go func() { c.Wait(); close(done) }()
	// Before startProxy's clean-up, whose Wait must not run alongside
	// this one (a second Wait on a running process never returns).
	t.Cleanup(func() {
		c.Process.Kill()
		<-done
	})
	return c.Process, done, listen, adminAddr, logs
}

// status is the HTTP status of GET url, 0 if it got no answer.
func status(url string) int {
	res, err := http.Get(url)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode
}

// main shut the admin endpoint down gracefully before the Redis side: a
// request in flight there (a 30s CPU profile) kept the client listener
// accepting, and applying, new clients' commands after SIGTERM until
// shutdown_timeout ran out, which then left the busy clients no time
// (found by review). Now the Redis side stops first and the admin endpoint
// is closed hard: a client connecting after SIGTERM is refused at once,
// and with no client busy the process exits at once.
func TestShutdownNotDelayedByAdminRequest(t *testing.T) {
	proc, exited, listen, adminAddr, logs := startShutdownProxy(t, redistest.Start(t))

	// An operator takes a 30s CPU profile; wait until its handler runs.
	go func() {
		if res, err := http.Get("http://" + adminAddr + "/debug/pprof/profile?seconds=30"); err == nil {
			res.Body.Close()
		}
	}()
	redistest.Eventually(t, 5*time.Second, func() bool {
		res, err := http.Get("http://" + adminAddr + "/debug/pprof/goroutine?debug=1")
		if err != nil {
			return false
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return strings.Contains(string(b), "pprof.Profile")
	}, "the profile request never reached its handler")

	start := time.Now()
	check(t, proc.Signal(syscall.SIGTERM))

	// Within a second of SIGTERM a new client must not be served.
	late := redis.NewClient(&redis.Options{Addr: listen, MaxRetries: -1, DialTimeout: time.Second})
	defer late.Close()
	redistest.Eventually(t, time.Second, func() bool {
		return late.Set(ctx, "accepted-after-sigterm", "1", 0).Err() != nil
	}, "a client connecting after SIGTERM was still served 1s later")
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("no exit within 10s of SIGTERM")
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("exit took %v after SIGTERM with no client busy (shutdown_timeout 4s)\n%s", took, logs.String())
	}
}

// While busy clients drain, /readyz answers 503 (the listeners are
// closed: a load balancer must send new clients elsewhere) and /healthz
// still 200; the admin endpoint goes once they are done. (Before, the
// admin endpoint was shut first, so neither answered during the drain.)
func TestShutdownReadyzWhileDraining(t *testing.T) {
	rs := redistest.Start(t)
	proc, exited, listen, adminAddr, _ := startShutdownProxy(t, rs)
	base := "http://" + adminAddr
	if code := status(base + "/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz before SIGTERM: %d", code)
	}
	busy := redis.NewClient(&redis.Options{Addr: listen, MaxRetries: -1, ReadTimeout: 10 * time.Second})
	defer busy.Close()
	check(t, busy.Ping(ctx).Err())
	// A batch in flight for 3s (within the 4s shutdown_timeout, and long
	// enough for the checks below on a loaded machine): Redis holds writes
	// back (CLIENT PAUSE WRITE; PING, the readiness check, still answers).
	check(t, rs.Client(t).Do(ctx, "CLIENT", "PAUSE", "3000", "WRITE").Err())
	blocked := make(chan error, 1)
	go func() { blocked <- busy.Set(ctx, "k", "v", 0).Err() }()
	redistest.Eventually(t, 5*time.Second, func() bool {
		return strings.Contains(rs.Client(t).Info(ctx, "clients").Val(), "blocked_clients:1")
	}, "the SET never reached Redis")

	check(t, proc.Signal(syscall.SIGTERM))
	redistest.Eventually(t, 2*time.Second, func() bool { return status(base+"/readyz") == http.StatusServiceUnavailable },
		"/readyz not 503 while clients drain")
	if code := status(base + "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz while clients drain: %d, want 200", code)
	}
	select {
	case err := <-blocked:
		if err != nil {
			t.Errorf("the SET in flight at SIGTERM got %v, want OK within shutdown_timeout", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the SET never returned")
	}
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatal("no exit after the busy client was done")
	}
	if code := status(base + "/healthz"); code != 0 {
		t.Errorf("/healthz after exit: %d", code)
	}
}
