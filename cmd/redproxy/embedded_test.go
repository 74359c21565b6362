package main

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/redistest"
)

// TestEmbeddedFallbackQuickStart is the README's quick start as a new user
// runs it: the real binary with no config and no --upstream, with nothing
// answering on the default upstream address, falls back to the embedded
// store and answers PING, SET/GET and INFO server.
//
// The default address is 127.0.0.1:6379, which a test cannot reserve; if a
// Redis answers there the binary would rightly use it, so the test skips.
func TestEmbeddedFallbackQuickStart(t *testing.T) {
	def := config.Default().Upstream.Address
	if redisAnswers(def) {
		t.Skipf("something answers on %s (the default upstream the quick start probes); "+
			"the embedded fallback only runs when nothing does", def)
	}
	bin := binary(t)
	listen := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	adminAddr := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	// Only addresses are given: the default ones may be taken on a CI host.
	_, c, logs := startProxy(t, bin, listen, nil, "--listen", listen, "--admin", adminAddr)
	if !strings.Contains(logs.String(), "using the embedded store") {
		if strings.Contains(logs.String(), "upstream="+def) {
			t.Skipf("a Redis came up on %s while the test started; log:\n%s", def, logs.String())
		}
		t.Fatalf("no embedded-store warning in the log:\n%s", logs.String())
	}

	if v, err := c.Ping(ctx).Result(); err != nil || v != "PONG" {
		t.Fatalf("PING = %q, %v", v, err)
	}
	check(t, c.Set(ctx, "quickstart:greeting", "hello", time.Minute).Err())
	if v, err := c.Get(ctx, "quickstart:greeting").Result(); err != nil || v != "hello" {
		t.Fatalf("GET = %q, %v", v, err)
	}
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		t.Fatalf("INFO server: %v", err)
	}
	if !strings.Contains(info, "# Server") {
		t.Fatalf("INFO server has no Server section:\n%s", info)
	}
	// redis-cli reading commands from stdin (as in its interactive mode)
	// asks COMMAND DOCS first: the store's answer made it abort.
	host, port, _ := strings.Cut(listen, ":")
	cli := exec.Command("redis-cli", "-h", host, "-p", port)
	cli.Stdin = strings.NewReader("GET quickstart:greeting\n")
	if out, err := cli.CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "hello" {
		t.Fatalf("redis-cli with commands on stdin: %q, %v", out, err)
	}
	// A command the store lacks gets Redis's unknown-command error and
	// the reason (it answered in its own words, without one).
	err = c.Do(ctx, "FUNCTION", "LIST").Err()
	if err == nil || !strings.HasPrefix(err.Error(), "ERR unknown command 'function', with args beginning with: 'LIST' ") ||
		!strings.Contains(err.Error(), "embedded demo store lacks this command") {
		t.Fatalf("FUNCTION LIST on the embedded store: %v", err)
	}
}
