package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/redistest"
)

// A proxy started before its Redis (containers started together) listens
// at once, answers errors meanwhile, and serves once Redis is up. It used
// to wait out the dial timeout twice (once per protocol's connections)
// before it listened, and a Redis that did not answer COMMAND was then
// asked its version too: with the timeout set to 20 s here, 40 s and more.
func TestStartsBeforeRedis(t *testing.T) {
	rs := redistest.Start(t)
	rs.Kill(t) // its port is now free and refuses connections
	e := startEarly(t, upstreamAt(rs.Addr()), "it waited for dials Redis refused")
	listen, ready, logs := e.listen, e.ready, e.logs
	t.Logf("listening %v after start, Redis down", e.listeningAfter.Round(time.Millisecond))

	c := redis.NewClient(&redis.Options{Addr: listen, MaxRetries: -1})
	defer c.Close()
	if err := c.Set(ctx, "startup:k", "v", time.Minute).Err(); err == nil {
		t.Fatal("SET with Redis down succeeded")
	}
	redistest.Eventually(t, 10*time.Second, func() bool { return ready() != 0 }, "the admin listener never answered")
	if code := ready(); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz with Redis down: %d, want 503", code)
	}
	rs.Restart(t)
	redistest.Eventually(t, 15*time.Second, func() bool { return ready() == http.StatusOK },
		"/readyz never 200 after Redis came up")
	redistest.Eventually(t, 15*time.Second, func() bool {
		return c.Set(ctx, "startup:k", "v", time.Minute).Err() == nil
	}, "SET through the proxy never succeeded after Redis came up; log:\n%s", logs.String())
	if v, err := c.Get(ctx, "startup:k").Result(); err != nil || v != "v" {
		t.Fatalf("GET after Redis came up: %q, %v", v, err)
	}
	if v, err := rs.Client(t).Get(ctx, "startup:k").Result(); err != nil || v != "v" {
		t.Fatalf("the SET did not reach Redis: %q, %v", v, err)
	}
	// The version INFO and HELLO report is Redis's once it is up, not the
	// stand-in the proxy started with.
	info, err := rs.Client(t).Info(ctx, "server").Result()
	check(t, err)
	want := ""
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "redis_version:"); ok {
			want = v
		}
	}
	redistest.Eventually(t, 15*time.Second, func() bool {
		got, _ := c.Info(ctx, "proxy").Result()
		return strings.Contains(got, "upstream_redis_version:"+want+"\r")
	}, "INFO proxy never reported Redis's version %s", want)
	// And the command table is Redis's too, not the built-in one that
	// stood in for it (internal/proxy's TestStandInTableReplaced... shows
	// what that changes for clients).
	redistest.Eventually(t, 15*time.Second, func() bool {
		return strings.Contains(logs.String(), "command table read from the upstream")
	}, "the command table was never read from Redis once it was up; log:\n%s", logs)
}

// A Redis that accepts connections and never answers (stopped, or a
// blackholed path behind a load balancer) holds the listener back only by
// the probes' reply timeouts (COMMAND 3 s, PING 2 s): the pools do not
// wait their dial timeout for it again (before: about 7 s with the
// defaults, 23 s with this dial_timeout). The proxy is not ready until
// Redis answers, then serves.
func TestStartsBeforeASilentRedis(t *testing.T) {
	rs := redistest.Start(t)
	rs.Freeze(t)
	thawed := false
	t.Cleanup(func() {
		if !thawed {
			rs.Thaw(t)
		}
	})
	e := startEarly(t, upstreamAt(rs.Addr()), "the pools waited for dials that could not finish")
	listen, ready, logs := e.listen, e.ready, e.logs
	t.Logf("listening %v after start, Redis silent", e.listeningAfter.Round(time.Millisecond))
	redistest.Eventually(t, 10*time.Second, func() bool { return ready() != 0 }, "the admin listener never answered")
	if code := ready(); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz with Redis silent: %d, want 503", code)
	}
	rs.Thaw(t)
	thawed = true
	redistest.Eventually(t, 30*time.Second, func() bool { return ready() == http.StatusOK },
		"/readyz never 200 after Redis answered; log:\n%s", logs.String())
	c := redis.NewClient(&redis.Options{Addr: listen, MaxRetries: -1})
	defer c.Close()
	redistest.Eventually(t, 15*time.Second, func() bool {
		return c.Set(ctx, "startup:silent", "v", time.Minute).Err() == nil
	}, "SET through the proxy never succeeded after Redis answered; log:\n%s", logs.String())
	if v, err := rs.Client(t).Get(ctx, "startup:silent").Result(); err != nil || v != "v" {
		t.Fatalf("the SET did not reach Redis: %q, %v", v, err)
	}
}

// The same in cluster mode, every seed silent: the router's first slot
// map is loaded in the background, where it waited for each seed's reply
// up to reply_timeout (here as long as the dial timeout, so that the test
// fails without the change: about 25 s before listening). Once the nodes
// answer, the map loads and a SET reaches the cluster.
func TestStartsBeforeASilentCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	nodes := cl.Primaries(t)
	for _, n := range nodes {
		n.Freeze(t)
	}
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			for _, n := range nodes {
				n.Thaw(t)
			}
		}
	}
	t.Cleanup(thaw)
	seeds := make([]string, len(nodes))
	for i, n := range nodes {
		seeds[i] = strconv.Quote(n.Addr())
	}
	e := startEarly(t, fmt.Sprintf("mode = \"cluster\"\nseeds = [%s]\ndial_timeout = %q\nreply_timeout = %q\n",
		strings.Join(seeds, ", "), earlyDialTimeout.String(), earlyDialTimeout.String()),
		"the router waited for the seeds' slot maps")
	t.Logf("listening %v after start, every seed silent", e.listeningAfter.Round(time.Millisecond))
	redistest.Eventually(t, 10*time.Second, func() bool { return e.ready() != 0 }, "the admin listener never answered")
	if code := e.ready(); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz with the cluster silent: %d, want 503", code)
	}
	thaw()
	redistest.Eventually(t, 3*earlyDialTimeout, func() bool { return e.ready() == http.StatusOK },
		"/readyz never 200 after the cluster answered; log:\n%s", e.logs.String())
	c := redis.NewClient(&redis.Options{Addr: e.listen, MaxRetries: -1})
	defer c.Close()
	if err := c.Set(ctx, "startup:silent-cluster", "v", time.Minute).Err(); err != nil {
		t.Fatalf("SET once ready: %v; log:\n%s", err, e.logs.String())
	}
	if v, err := cl.ClusterClient(t).Get(ctx, "startup:silent-cluster").Result(); err != nil || v != "v" {
		t.Fatalf("the SET did not reach the cluster: %q, %v", v, err)
	}
}

// In cluster mode the command table comes from the first seed that
// answers: with the first seed down or hung, the proxy used to fall back
// to its built-in table (and, hung, waited COMMAND's 3 s for it), though
// the next seed could answer.
func TestClusterCommandTableFromAnAnsweringSeed(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	hung := redistest.Start(t)
	hung.Freeze(t)
	t.Cleanup(func() { hung.Thaw(t) })
	down := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	for _, first := range []string{down, hung.Addr()} {
		// dial_timeout as by default: the slot map's first load waits
		// that long for the hung seed's handshake.
		e := startEarly(t, fmt.Sprintf("mode = \"cluster\"\nseeds = [%q, %q]\ndial_timeout = \"2s\"\n", first, cl.Seeds()[0]), "it waited for the first seed")
		redistest.Eventually(t, 30*time.Second, func() bool { return e.ready() == http.StatusOK },
			"first seed %s: /readyz never 200; log:\n%s", first, e.logs.String())
		if strings.Contains(e.logs.String(), "using the built-in command table") {
			t.Errorf("first seed %s: the built-in command table, though the second seed answers; log:\n%s", first, e.logs.String())
		}
	}
}

// A Redis that answers slowly is not a silent one: COMMAND's 200 KB
// taking longer than the probe's timeout (a slow link, a fork) makes the
// proxy use its built-in table, but the pools are still waited for, so the
// proxy is ready and serves as soon as it listens. Found by review: taken
// for silent, its pools were not waited for, and the first clients were
// told the upstream was unavailable. The link here delays every 4 KB from
// Redis by 250 ms: PING and the pools' handshakes take 250 ms, COMMAND
// about 12 s.
func TestStartsBeforeASlowRedis(t *testing.T) {
	rs := redistest.Start(t)
	link := slowLink(t, rs.Addr(), 4096, 250*time.Millisecond)
	e := startEarly(t, upstreamAt(link), "it waited for COMMAND")
	redistest.Eventually(t, 10*time.Second, func() bool { return e.ready() != 0 }, "the admin listener never answered")
	if code := e.ready(); code != http.StatusOK {
		t.Fatalf("/readyz once listening: %d, want 200 (the pools were not waited for); log:\n%s", code, e.logs.String())
	}
	c := redis.NewClient(&redis.Options{Addr: e.listen, MaxRetries: -1})
	defer c.Close()
	if err := c.Set(ctx, "startup:slow", "v", time.Minute).Err(); err != nil {
		t.Fatalf("first SET: %v", err)
	}
	if !strings.Contains(e.logs.String(), "using the built-in command table") {
		t.Errorf("COMMAND was answered within the probe's timeout: the link is not slow enough to test this; log:\n%s", e.logs.String())
	}
}

// A Redis busy at start (a long command, a fork) for longer than the
// COMMAND probe's 3 s is not a silent one: the PING that follows waits up
// to 2 s, Redis answers it, and the pools are waited for, so the proxy is
// ready and serves once it listens. Found by review: with a 500 ms PING,
// DEBUG SLEEP 4 was taken for silence and the first clients were told the
// upstream was unavailable. (DEBUG SLEEP 4.5: past COMMAND's 3 s and a
// 500 ms PING, within a 2 s one.)
func TestStartsBeforeABusyRedis(t *testing.T) {
	binary(t) // built before the sleep: the proxy must start while Redis sleeps
	rs := redistest.Start(t, "--enable-debug-command", "yes")
	sleeping := make(chan error, 1)
	go func() { sleeping <- rs.Client(t).Do(ctx, "DEBUG", "SLEEP", "4.5").Err() }()
	redistest.Eventually(t, 5*time.Second, func() bool {
		nc, err := net.Dial("tcp", rs.Addr())
		if err != nil {
			return false
		}
		defer nc.Close()
		nc.SetDeadline(time.Now().Add(100 * time.Millisecond))
		nc.Write([]byte("PING\r\n"))
		_, err = nc.Read(make([]byte, 8))
		return err != nil // no answer: the sleep has begun
	}, "DEBUG SLEEP never began")
	e := startEarly(t, upstreamAt(rs.Addr()), "it waited for COMMAND")
	redistest.Eventually(t, 10*time.Second, func() bool { return e.ready() != 0 }, "the admin listener never answered")
	if code := e.ready(); code != http.StatusOK {
		t.Fatalf("/readyz once listening (%v after start): %d, want 200 (taken for silent); log:\n%s", e.listeningAfter, code, e.logs.String())
	}
	c := redis.NewClient(&redis.Options{Addr: e.listen, MaxRetries: -1})
	defer c.Close()
	if err := c.Set(ctx, "startup:busy", "v", time.Minute).Err(); err != nil {
		t.Fatalf("first SET: %v", err)
	}
	if err := <-sleeping; err != nil {
		t.Fatalf("DEBUG SLEEP: %v", err)
	}
}

// slowLink forwards connections to addr, and Redis's replies back in
// pieces of at most chunk bytes, each delay late.
func slowLink(t *testing.T, addr string, chunk int, delay time.Duration) string {
	return redistest.Forward(t, addr, func(wg *sync.WaitGroup, down, up net.Conn) {
		wg.Go(func() {
			io.Copy(up, down)
			up.Close()
		})
		wg.Go(func() {
			defer down.Close()
			buf := make([]byte, chunk)
			for {
				n, err := up.Read(buf)
				if n > 0 {
					time.Sleep(delay)
					if _, werr := down.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		})
	})
}

// earlyStart is a proxy process started on upstream with dial_timeout
// 20 s, and what its start-up tests look at.
type earlyStart struct {
	listen, admin string
	logs          *redistest.LogBuffer
	// listeningAfter is how long after the start the client listener took
	// connections.
	listeningAfter time.Duration
}

const earlyDialTimeout = 20 * time.Second

// startEarly starts the proxy with upstream as its [upstream] section
// (upstreamAt; dial_timeout earlyDialTimeout unless it says otherwise) and
// waits for its client listener; listening only after earlyDialTimeout
// fails the test, saying why (what the process waited for). A port that
// another test package's process took between FreePort and the proxy's
// bind (seen in CI: "address already in use" for the admin port) is no
// finding: the proxy is started again on fresh ports.
func startEarly(t *testing.T, upstream, why string) *earlyStart {
	for attempt := 1; ; attempt++ {
		e, taken := startEarlyOnce(t, upstream, why)
		if !taken {
			return e
		}
		if attempt == 3 {
			t.Fatalf("three starts found a port taken; log:\n%s", e.logs.String())
		}
	}
}

func startEarlyOnce(t *testing.T, upstream, why string) (e *earlyStart, portTaken bool) {
	bin := binary(t)
	e = &earlyStart{
		listen: fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t)),
		admin:  fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t)),
		logs:   &redistest.LogBuffer{},
	}
	conf := filepath.Join(t.TempDir(), "redproxy.toml")
	check(t, os.WriteFile(conf, []byte(fmt.Sprintf(
		"[server]\nlisten = %q\nadmin = %q\n\n[upstream]\n%s",
		e.listen, e.admin, upstream)), 0o644))
	cmd := exec.Command(bin, "--config", conf)
	cmd.Env = childEnv()
	cmd.Stderr = e.logs
	started := time.Now()
	check(t, cmd.Start())
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	// waitFor dials addr until it answers; taken: the proxy exited because
	// a port it was given was taken meanwhile.
	waitFor := func(addr, exitedMsg, lateMsg string) (taken bool) {
		for {
			nc, err := net.DialTimeout("tcp", addr, time.Second)
			if err == nil {
				nc.Close()
				return false
			}
			select {
			case <-exited:
				if strings.Contains(e.logs.String(), "address already in use") {
					return true
				}
				t.Fatalf("%s; log:\n%s", exitedMsg, e.logs.String())
			default:
			}
			if time.Since(started) > earlyDialTimeout {
				t.Fatalf("%s %v after start; log:\n%s", lateMsg, time.Since(started), e.logs.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if waitFor(e.listen, "the proxy exited before listening", "not listening (the dial timeout: "+why+")") {
		return e, true
	}
	e.listeningAfter = time.Since(started)
	// The admin listener is bound right after the client listeners; its
	// port may be the one taken by another package's process, and the
	// proxy then exits (CI: "the admin listener never answered").
	return e, waitFor(e.admin, "the proxy exited after listening", "the admin listener not up")
}

// upstreamAt is startEarly's [upstream] section for one Redis at addr.
func upstreamAt(addr string) string {
	return fmt.Sprintf("address = %q\ndial_timeout = %q\n", addr, earlyDialTimeout.String())
}

// ready is /readyz's status code, 0 until the admin listener answers (it
// may bind after the client listener).
func (e *earlyStart) ready() int {
	res, err := http.Get("http://" + e.admin + "/readyz")
	if err != nil {
		return 0
	}
	res.Body.Close()
	return res.StatusCode
}

// Review of 5be1636: a Redis that answers COMMAND with an error at start
// is taken to answer the same for good ("an ACL without COMMAND"), and the
// built-in table for that server's own. But -BUSY (a script running past
// busy-reply-threshold, as a proxy restarted beside a busy Redis meets)
// passes: once the script ends, COMMAND is answered, yet the built-in
// table stays for good, the case the commit set out to fix.
func TestStartsBeforeAScriptBusyRedis(t *testing.T) {
	binary(t)
	rs := redistest.Start(t, "--busy-reply-threshold", "50")
	busy := make(chan error, 1)
	go func() {
		busy <- rs.Client(t).Eval(ctx, `local function ms() local t = redis.call('TIME') return t[1]*1000 + t[2]/1000 end
local t0 = ms() while ms() - t0 < 3000 do end return 1`, nil).Err()
	}()
	redistest.Eventually(t, 5*time.Second, func() bool {
		pc := redis.NewClient(&redis.Options{Addr: rs.Addr(), MaxRetries: -1})
		defer pc.Close()
		err := pc.Ping(ctx).Err()
		return err != nil && strings.HasPrefix(err.Error(), "BUSY")
	}, "the script never made Redis answer BUSY")
	e := startEarly(t, upstreamAt(rs.Addr()), "it waited for the script")
	if !strings.Contains(e.logs.String(), "BUSY") {
		t.Logf("start-up did not meet BUSY (the script ended first?); log:\n%s", e.logs.String())
	}
	if err := <-busy; err != nil {
		t.Fatalf("the script: %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: e.listen, MaxRetries: -1})
	defer c.Close()
	redistest.Eventually(t, 15*time.Second, func() bool { return c.Set(ctx, "startup:busy", "v", time.Minute).Err() == nil },
		"SET through the proxy never succeeded after the script ended")
	redistest.Eventually(t, 15*time.Second, func() bool {
		return strings.Contains(e.logs.String(), "command table read from the upstream")
	}, "the command table was never read from Redis once its script ended; log:\n%s", e.logs)
}
