package main

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/commands"
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

// The embedded store ages its keys' TTLs: miniredis does only when told
// time passed, so a key set with EX 1 was there ten minutes later, and the
// seed patterns' locks, rate limits and cache entries never expired (found
// by a probe).
func TestEmbeddedStoreExpiresKeys(t *testing.T) {
	c := embeddedClient(t)
	check(t, c.Set(ctx, "lock:order", "token", 300*time.Millisecond).Err())
	check(t, c.Set(ctx, "kept", "v", time.Hour).Err())
	redistest.Eventually(t, 10*time.Second, func() bool {
		return c.Exists(ctx, "lock:order").Val() == 0
	}, "a key set with PX 300 still exists")
	if ttl := c.TTL(ctx, "kept").Val(); ttl <= 0 || ttl > time.Hour {
		t.Fatalf("TTL of a key set for an hour: %v", ttl)
	}
}

// INFO on the embedded store answers every section Redis has that it can
// fill, as Redis does: with no argument (the server section, which says
// this is not Redis), "all", and several sections at once. It refused all
// but "clients" and "stats" (found by a probe).
func TestEmbeddedStoreInfo(t *testing.T) {
	c := embeddedClient(t)
	check(t, c.Set(ctx, "k", "v", 0).Err())
	for _, args := range [][]string{nil, {"all"}, {"everything"}, {"server", "keyspace"}} {
		info, err := c.Info(ctx, args...).Result()
		if err != nil {
			t.Fatalf("INFO %v: %v", args, err)
		}
		for _, want := range []string{"# Server\r\n", "redproxy_embedded_store:yes", "# Keyspace\r\ndb0:keys=1\r\n"} {
			if !strings.Contains(info, want) {
				t.Fatalf("INFO %v lacks %q:\n%s", args, want, info)
			}
		}
	}
	if info := c.Info(ctx, "clients").Val(); strings.Contains(info, "# Server") || !strings.Contains(info, "connected_clients:") {
		t.Fatalf("INFO clients:\n%s", info)
	}
}

// Through the proxy, the embedded store's version is the built-in table's
// everywhere: the store's own HELLO names 8.4.0, which the proxy learned
// from its first RESP3 dial, so HELLO said 8.4.0 where INFO server said
// the built-in version (found by a probe).
func TestEmbeddedVersionStaysTheBuiltIn(t *testing.T) {
	bin := binary(t)
	listen := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	adminAddr := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	startProxy(t, bin, listen, nil, "--upstream", "embedded", "--listen", listen, "--admin", adminAddr)
	c3 := redis.NewClient(&redis.Options{Addr: listen, Protocol: 3, MaxRetries: -1})
	defer c3.Close()
	// RESP3 commands dial the proxy's RESP3 pool (HELLO 3 to the store).
	check(t, c3.Set(ctx, "k", "v", 0).Err())
	if err := c3.BLPop(ctx, 100*time.Millisecond, "nolist").Err(); err != redis.Nil {
		t.Fatalf("BLPOP of an empty list: %v", err)
	}
	hello, err := c3.Do(ctx, "HELLO", "3").Result()
	check(t, err)
	m, ok := hello.(map[any]any)
	if !ok || m["version"] != commands.BuiltinRedisVersion {
		t.Fatalf("HELLO 3 through the proxy on the embedded store: %v, want version %s", hello, commands.BuiltinRedisVersion)
	}
}

// A command the store lacks is refused with Redis's words, and with the
// reason only when Redis has it (it told of a command no Redis has that a
// Redis would run it: found by a probe).
func TestEmbeddedUnknownCommand(t *testing.T) {
	if got, want := embeddedUnknown("NOSUCHCMD", []string{"a"}), "ERR unknown command 'nosuchcmd', with args beginning with: 'a' "; got != want {
		t.Errorf("a command Redis lacks too: %q, want %q", got, want)
	}
	if got := embeddedUnknown("LCS", []string{"a", "b"}); !strings.Contains(got, "embedded demo store lacks this command") {
		t.Errorf("a command only the store lacks: %q, want the reason", got)
	}
}

// embeddedClient starts an embedded store for the test and returns a
// client of it.
func embeddedClient(t *testing.T) *redis.Client {
	e, err := startEmbedded()
	check(t, err)
	t.Cleanup(e.Close)
	c := redis.NewClient(&redis.Options{Addr: e.Addr()})
	t.Cleanup(func() { c.Close() })
	return c
}
