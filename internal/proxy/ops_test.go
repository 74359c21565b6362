package proxy_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// readString reads one bulk ($) or verbatim (=) string reply and checks
// that its declared length is exactly the bytes that follow, up to CRLF.
func readString(t *testing.T, r *bufio.Reader) (kind byte, body string) {
	t.Helper()
	head, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("reading reply header: %v", err)
	}
	if len(head) < 4 || head[0] != '$' && head[0] != '=' {
		t.Fatalf("not a string reply: %q", head)
	}
	n, err := strconv.Atoi(strings.TrimSuffix(head[1:], "\r\n"))
	if err != nil {
		t.Fatalf("bad length in %q", head)
	}
	buf := make([]byte, n+2)
	if _, err := io.ReadFull(r, buf); err != nil {
		t.Fatalf("reply shorter than its declared %d bytes: %v", n, err)
	}
	if string(buf[n:]) != "\r\n" {
		t.Fatalf("declared length %d does not end at CRLF: %q", n, buf[max(0, n-10):])
	}
	return head[0], string(buf[:n])
}

// skipTo reads lines up to and including want.
func skipTo(t *testing.T, r *bufio.Reader, want string) {
	t.Helper()
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("waiting for %q: %v", want, err)
		}
		if line == want {
			return
		}
	}
}

func opsConn(t *testing.T, p *proxytest.Proxy) (net.Conn, *bufio.Reader) {
	nc := p.Dial(t)
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	return nc, bufio.NewReader(nc)
}

// INFO through the proxy is Redis's INFO followed by a "# Proxy" section;
// INFO proxy is that section alone; other sections are Redis's unchanged.
func TestInfoProxySection(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) { c.LocalCache.Enabled = true })
	c := p.Client(t)

	all, err := c.Info(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(all, "# Server\r\n") || !strings.Contains(all, "# Keyspace") {
		t.Fatalf("Redis's sections missing:\n%s", all)
	}
	i := strings.Index(all, "\r\n\r\n# Proxy\r\n")
	if i < 0 || strings.Contains(all[i+4:], "\r\n# ") {
		t.Fatalf("# Proxy is not the last section, after an empty line:\n%s", all)
	}
	for _, want := range []string{
		"proxy_version:", "proxy_uptime_in_seconds:", "proxy_connected_clients:1\r\n",
		"upstream_0:addr=" + p.Redis.Addr() + ",state=up,", ",pinned=0,",
		"pinned_connections:0\r\n", "localtier_enabled:1\r\n", "localtier_hit_ratio:", "policy_mode:enforce\r\n",
		"slowlog_entries:0\r\n", "slowlog_total:0\r\n",
	} {
		if !strings.Contains(all[i:], want) {
			t.Errorf("# Proxy lacks %q:\n%s", want, all[i:])
		}
	}
	m, err := c.InfoMap(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if m["Proxy"]["proxy_connected_clients"] != "1" || m["Server"]["redis_version"] == "" {
		t.Fatalf("go-redis's InfoMap does not see both: %v", m["Proxy"])
	}

	only, err := c.Info(ctx, "proxy").Result()
	if err != nil || !strings.HasPrefix(only, "# Proxy\r\n") || strings.Count(only, "# ") != 1 {
		t.Fatalf("INFO proxy: %v\n%s", err, only)
	}
	server, err := c.Info(ctx, "server").Result()
	if err != nil || strings.Contains(server, "Proxy") || !strings.Contains(server, "redis_version:") {
		t.Fatalf("INFO server changed: %v\n%s", err, server)
	}
	for _, arg := range []string{"all", "everything", "default", "DEFAULT"} {
		s, err := c.Info(ctx, arg).Result()
		if err != nil || !strings.Contains(s, "# Server\r\n") || !strings.Contains(s, "# Proxy\r\n") {
			t.Errorf("INFO %s: %v, proxy section %v", arg, err, strings.Contains(s, "# Proxy"))
		}
	}
	both, err := c.Info(ctx, "server", "proxy").Result()
	if err != nil || !strings.Contains(both, "# Server\r\n") || !strings.Contains(both, "# Proxy\r\n") || strings.Contains(both, "# Clients") {
		t.Fatalf("INFO server proxy: %v\n%s", err, both)
	}

	// The lengths on the wire, RESP2 then RESP3 (a verbatim string).
	nc, r := opsConn(t, p)
	nc.Write([]byte("INFO\r\nINFO proxy\r\n"))
	if kind, body := readString(t, r); kind != '$' || !strings.HasSuffix(body, "\r\n") || !strings.Contains(body, "# Proxy\r\n") {
		t.Fatalf("RESP2 INFO: %c\n%s", kind, body)
	}
	if kind, body := readString(t, r); kind != '$' || !strings.HasPrefix(body, "# Proxy\r\n") {
		t.Fatalf("RESP2 INFO proxy: %c\n%s", kind, body)
	}
	nc.Write([]byte("HELLO 3\r\nPING\r\n"))
	skipTo(t, r, "+PONG\r\n")
	nc.Write([]byte("INFO\r\nINFO proxy\r\nPING\r\n"))
	if kind, body := readString(t, r); kind != '=' || !strings.HasPrefix(body, "txt:# Server") || !strings.Contains(body, "# Proxy\r\n") {
		t.Fatalf("RESP3 INFO: %c\n%.200s", kind, body)
	}
	if kind, body := readString(t, r); kind != '=' || !strings.HasPrefix(body, "txt:# Proxy\r\n") {
		t.Fatalf("RESP3 INFO proxy: %c\n%s", kind, body)
	}
	if line, _ := r.ReadString('\n'); line != "+PONG\r\n" {
		t.Fatalf("the reply after INFO: %q", line)
	}

	// Inside MULTI Redis answers INFO at EXEC: that reply is Redis's own,
	// without the proxy's section (docs/COMPATIBILITY.md).
	nc.Write([]byte("HELLO 2\r\nPING\r\n"))
	skipTo(t, r, "+PONG\r\n")
	nc.Write([]byte("MULTI\r\nINFO server\r\nINFO\r\nEXEC\r\n"))
	for _, want := range []string{"+OK\r\n", "+QUEUED\r\n", "+QUEUED\r\n", "*2\r\n"} {
		if line, _ := r.ReadString('\n'); line != want {
			t.Fatalf("MULTI: got %q want %q", line, want)
		}
	}
	readString(t, r)
	if _, body := readString(t, r); strings.Contains(body, "# Proxy") || !strings.Contains(body, "# Server") {
		t.Fatalf("INFO in MULTI: %.200s", body)
	}

	// With Redis gone, INFO proxy still answers and says so.
	p.Redis.Kill(t)
	redistest.Eventually(t, 5*time.Second, func() bool {
		s, err := c.Info(ctx, "proxy").Result()
		return err == nil && strings.Contains(s, ",state=down,")
	}, "INFO proxy never reported the upstream down")
	// failures counts connections lost once up, so it stays put while the
	// proxy cannot reach Redis; dials climb (found by review: INFO said
	// failures=0 through an outage that began at start).
	dials := func() int {
		s, err := c.Info(ctx, "proxy").Result()
		if err != nil {
			t.Fatal(err)
		}
		v := line(s, "upstream_0:")
		i := strings.Index(v, ",dials=")
		if i < 0 {
			t.Fatalf("upstream_0 has no dials: %s", v)
		}
		n, _ := strconv.Atoi(strings.SplitN(v[i+len(",dials="):], ",", 2)[0])
		return n
	}
	before := dials()
	redistest.Eventually(t, 20*time.Second, func() bool { return dials() > before },
		"INFO proxy's dials did not climb while Redis was down")
}

// A batch slower than the threshold is in the slow log with the time it
// waited for Redis, its first command and key pattern, never its values;
// a blocking command's wait is not.
func TestSlowlogRecordsSlowBatches(t *testing.T) {
	rs := redistest.Start(t, "--enable-debug-command", "local")
	p := proxytest.Start(t, rs, func(c *config.Config) {
		// Far above what the connection's own HELLO and CLIENT SETINFO
		// take on a loaded machine (with 30 ms one was logged as a third
		// entry), and the sleeps further above it.
		c.Server.SlowlogThreshold.Duration = 200 * time.Millisecond
		c.Server.SlowlogMaxLen = 4
	})
	c := p.Client(t)
	if err := c.Do(ctx, "DEBUG", "SLEEP", "0.3").Err(); err != nil {
		t.Fatal(err)
	}
	pipe := c.Pipeline()
	pipe.Set(ctx, "user:4242:email", "secret@example.com", 0)
	pipe.Do(ctx, "DEBUG", "SLEEP", "0.3")
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	// Blocking for longer than the threshold is the client's choice.
	if err := c.Do(ctx, "BLPOP", "nothing", "0.4").Err(); err != redis.Nil {
		t.Fatalf("BLPOP: %v", err)
	}

	entries := p.Slowlog().Entries()
	if len(entries) != 2 {
		t.Fatalf("want 2 entries, got %+v", entries)
	}
	byCmd := map[string]int{}
	for i, e := range entries {
		byCmd[e.Command] = i
		if e.UpstreamMicros < 300000 || e.TotalMicros != e.UpstreamMicros+e.ProxyMicros || e.User != "default" ||
			!strings.HasPrefix(e.Client, "127.0.0.1:") || e.Time.IsZero() {
			t.Errorf("entry %+v", e)
		}
	}
	debug, set := entries[byCmd["debug"]], entries[byCmd["set"]]
	if debug.Command != "debug" || debug.Batch != 1 || debug.KeyPattern != "" {
		t.Errorf("DEBUG SLEEP entry %+v", debug)
	}
	if set.Command != "set" || set.Batch != 2 || set.KeyPattern != "user:*:*" {
		t.Errorf("pipeline entry %+v", set)
	}
	js, _ := json.Marshal(entries)
	if strings.Contains(string(js), "secret") || strings.Contains(string(js), "4242") {
		t.Errorf("a value or key identifier leaked into the slow log: %s", js)
	}
	for cmd, want := range map[string]float64{"debug": 1, "set": 1, "blpop": 0} {
		got, _, _ := metrics.CounterSum(p.Metrics.Registry, "redproxy_slow_commands_total", "command", cmd)
		if got != want {
			t.Errorf("redproxy_slow_commands_total{command=%q} = %v, want %v", cmd, got, want)
		}
	}
}

// Every way a client connection ends is counted under its reason.
func TestClientsClosedByReason(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	closed := func(reason string) float64 {
		v, _, _ := metrics.CounterSum(p.Metrics.Registry, "redproxy_clients_closed_total", "reason", reason)
		return v
	}
	waitFor := func(reason string, want float64) {
		t.Helper()
		redistest.Eventually(t, 5*time.Second, func() bool { return closed(reason) == want },
			"redproxy_clients_closed_total{reason=%q} = %v, want %v", reason, closed(reason), want)
	}

	nc, r := opsConn(t, p)
	nc.Write([]byte("QUIT\r\n"))
	r.ReadString('\n')
	waitFor(metrics.CloseQuit, 1)

	nc, r = opsConn(t, p)
	nc.Write([]byte("*1\r\n$x\r\n"))
	r.ReadString('\n')
	waitFor(metrics.CloseProtocolError, 1)

	nc, _ = opsConn(t, p)
	nc.Write([]byte("PING\r\n"))
	nc.Close()
	waitFor(metrics.CloseClient, 1)

	victim, vr := opsConn(t, p)
	victim.Write([]byte("CLIENT ID\r\n"))
	id, _ := vr.ReadString('\n')
	killer := p.Client(t)
	if err := killer.Do(ctx, "CLIENT", "KILL", "ID", strings.Trim(id, ":\r\n")).Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(metrics.CloseKilled, 1)

	if got := closed(metrics.CloseShutdown); got != 0 {
		t.Fatalf("shutdown counted before one: %v", got)
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	p.Shutdown(sctx)
	// The go-redis client's pooled connection is closed by the shutdown.
	if closed(metrics.CloseShutdown) < 1 {
		t.Fatalf("shutdown closed no client: %v", closed(metrics.CloseShutdown))
	}
	if closed(metrics.CloseIdleTimeout) != 0 || closed(metrics.CloseReadError) != 0 || closed(metrics.ClosePanic) != 0 {
		t.Fatal("a close was counted under a reason that did not happen")
	}

	idle := proxytest.Start(t, nil, func(c *config.Config) { c.Server.IdleTimeout.Duration = 100 * time.Millisecond })
	nc = idle.Dial(t)
	if _, err := bufio.NewReader(nc).ReadString('\n'); err == nil {
		t.Fatal("an idle client got a reply")
	}
	redistest.Eventually(t, 5*time.Second, func() bool {
		v, _, _ := metrics.CounterSum(idle.Metrics.Registry, "redproxy_clients_closed_total", "reason", metrics.CloseIdleTimeout)
		return v == 1
	}, "idle timeout not counted")
}
