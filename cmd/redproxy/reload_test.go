package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/proxy"
	"github.com/redproxy/redproxy/internal/redistest"
)

func postReload(t *testing.T, adminAddr, path string) (int, string) {
	t.Helper()
	res, err := http.Post("http://"+adminAddr+path, "text/plain", nil)
	check(t, err)
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(body)
}

// TestReloadEndpointAndSIGHUP runs the binary with the example config (its
// local tier on) in front of Redis A, then edits the file: POST /reload
// switches to Redis B, and a key the tier was serving from A reads B's value
// from then on; a change to server.listen is refused with its reason and
// keeps everything; a broken file keeps everything, through POST /reload
// and SIGHUP; POST /policy/reload still works.
func TestReloadEndpointAndSIGHUP(t *testing.T) {
	a, b := redistest.Start(t), redistest.Start(t)
	bin := binary(t)
	listen := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	adminAddr := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	base := exampleConfig(t, listen, adminAddr, "")
	if !strings.Contains(base, "\n[localcache]") || !strings.Contains(base, "\nenabled = true") {
		t.Fatal("the example config no longer turns the local tier on; this test means to reload with it on")
	}
	withUpstream := func(addr string) string {
		return strings.Replace(base, `address = "127.0.0.1:6379"`, `address = "`+addr+`"`, 1)
	}
	path := filepath.Join(t.TempDir(), "redproxy.toml")
	check(t, os.WriteFile(path, []byte(withUpstream(a.Addr())), 0o600))

	cmd, c, logs := startProxy(t, bin, listen, nil, "--config", path)
	directA, directB := a.Client(t), b.Client(t)
	writeLandsOn := func(key string, want, other *redis.Client) {
		t.Helper()
		check(t, c.Set(ctx, key, "1", time.Minute).Err())
		if want.Get(ctx, key).Val() != "1" || other.Exists(ctx, key).Val() != 0 {
			t.Fatalf("%s did not land on the expected upstream only; log:\n%s", key, logs.String())
		}
	}
	writeLandsOn("product:before", directA, directB)

	// A hot key, read until the local tier answers it from A.
	check(t, directA.Set(ctx, "product:hot", "from-A", 0).Err())
	check(t, directB.Set(ctx, "product:hot", "from-B", 0).Err())
	tierHits := func() string {
		_, text, _ := get(t, "GET", "http://"+adminAddr+"/metrics")
		for _, line := range strings.Split(text, "\n") {
			if strings.HasPrefix(line, "redproxy_localcache_hits_total") {
				return line
			}
		}
		return ""
	}
	redistest.Eventually(t, 10*time.Second, func() bool {
		before := tierHits()
		if v := c.Get(ctx, "product:hot").Val(); v != "from-A" {
			t.Fatalf("GET product:hot before the switch = %q", v)
		}
		return tierHits() != before
	}, "product:hot never became a local tier hit; log:\n%s", logs)

	// Switch upstreams, and change a stampede setting and the log level.
	next := strings.Replace(withUpstream(b.Addr()), "max_waiters = 1000", "max_waiters = 500", 1)
	next = strings.Replace(next, `log_level = "info"`, `log_level = "debug"`, 1)
	check(t, os.WriteFile(path, []byte(next), 0o600))
	code, body := postReload(t, adminAddr, "/reload")
	if code != http.StatusOK || !strings.Contains(body, "upstream.address") || !strings.Contains(body, "stampede.max_waiters") || !strings.Contains(body, "server.log_level") {
		t.Fatalf("POST /reload = %d %q", code, body)
	}
	writeLandsOn("product:after", directB, directA)
	for range 50 {
		if v := c.Get(ctx, "product:hot").Val(); v != "from-B" {
			t.Fatalf("GET product:hot after the switch = %q; log:\n%s", v, logs.String())
		}
	}

	// A restart-only change is refused, and so is the rest of that file.
	refused := strings.Replace(withUpstream(a.Addr()), `listen = "`+listen+`"`, `listen = "127.0.0.1:1"`, 1)
	check(t, os.WriteFile(path, []byte(refused), 0o600))
	code, body = postReload(t, adminAddr, "/reload")
	if code != http.StatusUnprocessableEntity || !strings.Contains(body, "server.listen: the client listener is bound once at start") {
		t.Fatalf("POST /reload with a new listen address = %d %q", code, body)
	}
	// Said once, and what to do (a user's trial read "the configuration
	// in force stays" twice in one reply).
	if strings.Count(body, "in force stays") != 1 || !strings.Contains(body, "restart redproxy to apply them") {
		t.Errorf("POST /reload with a restart-only change: %q", body)
	}
	writeLandsOn("product:refused", directB, directA)

	// A broken file: POST /reload and SIGHUP both keep the configuration.
	check(t, os.WriteFile(path, []byte(strings.Replace(withUpstream(a.Addr()), "connections = 4", "connections = 99", 1)), 0o600))
	code, body = postReload(t, adminAddr, "/reload")
	if code != http.StatusUnprocessableEntity || !strings.Contains(body, path+":") {
		t.Fatalf("POST /reload with a broken file = %d %q", code, body)
	}
	check(t, os.WriteFile(path, []byte(strings.Replace(withUpstream(a.Addr()), "max_clients = 10000", "max_clients = 0", 1)), 0o600))
	check(t, cmd.Process.Signal(syscall.SIGHUP))
	redistest.Eventually(t, 5*time.Second, func() bool { return strings.Contains(logs.String(), "server.max_clients: must be > 0") },
		"SIGHUP with a broken file not reported; log:\n%s", logs)
	writeLandsOn("product:broken", directB, directA)

	// Counted for alerting: one applied (the switch), three refused (the
	// listen change, the broken file by POST and by SIGHUP), the last one
	// refused.
	for _, want := range []string{`redproxy_config_reloads_total{result="applied"} 1`, `redproxy_config_reloads_total{result="refused"} 3`,
		"redproxy_config_last_reload_successful 0"} {
		if _, text, _ := get(t, "GET", "http://"+adminAddr+"/metrics"); !strings.Contains(text, want+"\n") {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	// POST /policy/reload still re-reads [policy] alone.
	check(t, os.WriteFile(path, []byte(strings.Replace(next, "allow = []", `allow = ["keys"]`, 1)), 0o600))
	if code, body := postReload(t, adminAddr, "/policy/reload"); code != http.StatusOK {
		t.Fatalf("POST /policy/reload = %d %q", code, body)
	}
	if err := c.Keys(ctx, "product:*").Err(); err != nil {
		t.Fatalf("KEYS after allowing it: %v", err)
	}

	check(t, cmd.Process.Signal(syscall.SIGTERM))
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit: %v\n%s", err, logs.String())
	}
}

// A refused reload is logged a line per problem; a heading above them
// (the restart-only settings') goes with each as its reason, not as a
// problem of its own (a user's trial).
func TestReloadRefusedLogsEachProblemWithItsHeading(t *testing.T) {
	var logs redistest.LogBuffer
	r := &reloader{path: "redproxy.toml", log: slog.New(slog.NewTextHandler(&logs, nil))}
	r.logRefused(fmt.Errorf("%w (restart redproxy to apply them):\n%w", proxy.ErrRestartRequired,
		errors.Join(errors.New("server.listen: changed"), errors.New("upstream.mode: changed"))))
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines, want one per problem:\n%s", len(lines), logs.String())
	}
	for i, want := range []string{"problem=\"server.listen: changed\" problem_no=1 problems=2", "problem=\"upstream.mode: changed\" problem_no=2 problems=2"} {
		if !strings.Contains(lines[i], want) || !strings.Contains(lines[i], `reason="settings that need a restart changed (restart redproxy to apply them)"`) {
			t.Errorf("line %d: %s\nwant %s and the heading as reason", i, lines[i], want)
		}
	}
}

// TestSIGHUPDuringStartup: a SIGHUP sent while the proxy starts (here
// while it waits for an upstream that accepts and stays silent) does not
// end the process, whose default action for SIGHUP is to exit: it starts,
// serves, and stops on SIGTERM with status 0 (found by a probe: a SIGHUP
// within 20 ms of the start killed it, exit 129). The SIGTERM is sent as
// soon as the port answers, which once killed the proxy outright: SIGTERM
// was taken only after the listeners started (this test, in CI).
func TestSIGHUPDuringStartup(t *testing.T) {
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	check(t, err)
	defer silent.Close()
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			accepted <- c // held open, never answered
		}
	}()
	defer func() {
		for {
			select {
			case c := <-accepted:
				c.Close()
			default:
				return
			}
		}
	}()
	bin := binary(t)
	listen := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	adminAddr := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	path := filepath.Join(t.TempDir(), "redproxy.toml")
	check(t, os.WriteFile(path, []byte(exampleConfig(t, listen, adminAddr, silent.Addr().String())), 0o600))

	logs := &redistest.LogBuffer{}
	cmd := exec.Command(bin, "--config", path)
	cmd.Stderr = logs
	check(t, cmd.Start())
	var exitErr error
	exited := make(chan struct{})
	go func() { exitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	// The proxy dials its upstream only after reading its flags and file:
	// it is starting, not yet serving.
	select {
	case <-accepted:
	case <-exited:
		t.Fatalf("the proxy exited before dialling its upstream: %v\n%s", exitErr, logs)
	case <-time.After(10 * time.Second):
		t.Fatalf("the proxy never dialled its upstream; log:\n%s", logs)
	}
	check(t, cmd.Process.Signal(syscall.SIGHUP))
	// It goes on to listen (after the silent upstream's probe times out).
	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case <-exited:
			t.Fatalf("a SIGHUP during startup ended the proxy: %v\n%s", exitErr, logs)
		default:
		}
		if c, err := net.DialTimeout("tcp", listen, time.Second); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the proxy never listened; log:\n%s", logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	check(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-exited:
		if exitErr != nil {
			t.Fatalf("exit after SIGTERM: %v\n%s", exitErr, logs)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("no exit 30 s after SIGTERM; log:\n%s", logs)
	}
}
