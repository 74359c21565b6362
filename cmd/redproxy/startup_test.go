package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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
	bin := binary(t)
	rs := redistest.Start(t)
	rs.Kill(t) // its port is now free and refuses connections
	listen := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	adminAddr := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	conf := filepath.Join(t.TempDir(), "redproxy.toml")
	const dialTimeout = 20 * time.Second
	check(t, os.WriteFile(conf, []byte(fmt.Sprintf(
		"[server]\nlisten = %q\nadmin = %q\n\n[upstream]\naddress = %q\ndial_timeout = %q\n",
		listen, adminAddr, rs.Addr(), dialTimeout.String())), 0o644))
	logs := &redistest.LogBuffer{}
	cmd := exec.Command(bin, "--config", conf)
	cmd.Env = childEnv()
	cmd.Stderr = logs
	started := time.Now()
	check(t, cmd.Start())
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	for {
		nc, err := net.DialTimeout("tcp", listen, time.Second)
		if err == nil {
			nc.Close()
			break
		}
		if time.Since(started) > dialTimeout {
			t.Fatalf("not listening %v after start with Redis down (the dial timeout: it waited for dials Redis refused); log:\n%s", time.Since(started), logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("listening %v after start, Redis down", time.Since(started).Round(time.Millisecond))

	c := redis.NewClient(&redis.Options{Addr: listen, MaxRetries: -1})
	defer c.Close()
	if err := c.Set(ctx, "startup:k", "v", time.Minute).Err(); err == nil {
		t.Fatal("SET with Redis down succeeded")
	}
	// 0 until the admin listener answers (it may bind after the
	// client listener).
	ready := func() int {
		res, err := http.Get("http://" + adminAddr + "/readyz")
		if err != nil {
			return 0
		}
		res.Body.Close()
		return res.StatusCode
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
}

// A Redis that accepts connections and never answers (stopped, or a
// blackholed path behind a load balancer) holds the listener back only by
// the probe's reply timeout: the pools do not wait their dial timeout for
// it again (before: about 7 s with the defaults, 23 s with this
// dial_timeout). The proxy is not ready until Redis answers, then serves.
func TestStartsBeforeASilentRedis(t *testing.T) {
	bin := binary(t)
	rs := redistest.Start(t)
	rs.Freeze(t)
	thawed := false
	t.Cleanup(func() {
		if !thawed {
			rs.Thaw(t)
		}
	})
	listen := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	adminAddr := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	conf := filepath.Join(t.TempDir(), "redproxy.toml")
	const dialTimeout = 20 * time.Second
	check(t, os.WriteFile(conf, []byte(fmt.Sprintf(
		"[server]\nlisten = %q\nadmin = %q\n\n[upstream]\naddress = %q\ndial_timeout = %q\n",
		listen, adminAddr, rs.Addr(), dialTimeout.String())), 0o644))
	logs := &redistest.LogBuffer{}
	cmd := exec.Command(bin, "--config", conf)
	cmd.Env = childEnv()
	cmd.Stderr = logs
	started := time.Now()
	check(t, cmd.Start())
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	for {
		nc, err := net.DialTimeout("tcp", listen, time.Second)
		if err == nil {
			nc.Close()
			break
		}
		if time.Since(started) > dialTimeout {
			t.Fatalf("not listening %v after start with Redis silent (the dial timeout: the pools waited for dials that could not finish); log:\n%s",
				time.Since(started), logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("listening %v after start, Redis silent", time.Since(started).Round(time.Millisecond))
	ready := func() int {
		res, err := http.Get("http://" + adminAddr + "/readyz")
		if err != nil {
			return 0
		}
		res.Body.Close()
		return res.StatusCode
	}
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
