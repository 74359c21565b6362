package proxy_test

// The shipped config.example.toml is a drop-in: an application written the
// way the seed documents write it, and redis-benchmark's default suite, run
// through a proxy configured by the real file (only its addresses changed)
// and get no policy refusal, while KEYS/FLUSHALL/FLUSHDB stay refused and
// the TTL defaults stay applied.

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

const examplePath = "../../config.example.toml"

// startExample starts redis-server and a proxy configured by
// config.example.toml, parsed from the repository root, with only the
// listen, upstream and admin addresses replaced.
func startExample(t *testing.T) *proxytest.Proxy {
	t.Helper()
	data, err := os.ReadFile(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	example, err := config.Parse(data, examplePath)
	if err != nil {
		t.Fatalf("config.example.toml: %v", err)
	}
	rs := redistest.Start(t)
	return proxytest.Start(t, rs, func(c *config.Config) {
		*c = *example
		c.Server.Listen = "127.0.0.1:0"
		c.Server.Admin = ""
		c.Upstream.Address = rs.Addr()
	})
}

// refusalRules are the rules whose enforce action can only refuse; a
// ttl or ttl_max violation under enforce may also be a fix (default added,
// TTL clamped), so refusals are counted from the guard's report instead.
var refusalRules = []string{"command", "namespaces", "regex", "max_key_length", "require_version", "value_size"}

// wantNoRefusals fails if the guard refused anything since the proxy started.
func wantNoRefusals(t *testing.T, p *proxytest.Proxy) {
	t.Helper()
	for _, rule := range refusalRules {
		n, _, err := metrics.CounterSum(p.Metrics.Registry, "redproxy_policy_violations_total", "rule", rule, "action", "enforce")
		if err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("redproxy_policy_violations_total{rule=%q,action=\"enforce\"} = %v, want 0", rule, n)
		}
	}
	for _, row := range p.Guard().Report().Rows {
		if row.Refused != 0 {
			t.Errorf("refused %d times: %s %s (%s): %s", row.Refused, row.Command, row.ExampleKey, row.Rule, row.Message)
		}
	}
}

// TestExampleConfigSeedPatterns runs every seed pattern under the shipped
// configuration.
func TestExampleConfigSeedPatterns(t *testing.T) {
	p := startExample(t)
	e := &seedEnv{p: p, c: p.Client(t, func(o *redis.Options) { o.PoolSize = 8 }), direct: p.Redis.Client(t)}
	e.runPatterns(t)
	t.Run("KeyExamples", e.keyExamples)
	wantNoRefusals(t, p)

	// What the example still enforces for every application.
	c := e.c
	for _, args := range [][]any{{"KEYS", "*"}, {"FLUSHALL"}, {"FLUSHDB"}} {
		if err := c.Do(ctx, args...).Err(); err == nil || !strings.HasPrefix(err.Error(), "ERR redproxy policy:") {
			t.Errorf("%v: got %v, want a policy refusal", args, err)
		}
	}
	if err := c.Set(ctx, "session:no-ttl", "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	wantTTL(t, e.direct, "session:no-ttl", 24*time.Hour)
}

// keyExamples writes every key example of both seed documents with the
// structure and TTL the seeds give it, including the ones that break the
// example's (report-only) naming rules.
func (e *seedEnv) keyExamples(t *testing.T) {
	c := e.c
	ttl := func(key string, d time.Duration) func(redis.Pipeliner) {
		return func(p redis.Pipeliner) { p.Expire(ctx, key, d) }
	}
	cases := []struct {
		key   string
		write func(p redis.Pipeliner)
		then  func(p redis.Pipeliner)
	}{
		// 000: data structure cheat sheet.
		{"product:123", func(p redis.Pipeliner) { p.SetEx(ctx, "product:123", "{}", time.Hour) }, nil},
		{"session:abc", func(p redis.Pipeliner) { p.HSet(ctx, "session:abc", "user_id", "1") }, ttl("session:abc", 24*time.Hour)},
		{"scores:weekly", func(p redis.Pipeliner) { p.ZAdd(ctx, "scores:weekly", redis.Z{Score: 1, Member: "a"}) }, ttl("scores:weekly", time.Hour)},
		{"visitors:2024-01-01", func(p redis.Pipeliner) { p.SAdd(ctx, "visitors:2024-01-01", "u1") }, ttl("visitors:2024-01-01", 24*time.Hour)},
		{"feed:user:456", func(p redis.Pipeliner) { p.LPush(ctx, "feed:user:456", "post") }, ttl("feed:user:456", time.Hour)},
		{"events:orders", func(p redis.Pipeliner) {
			p.XAdd(ctx, &redis.XAddArgs{Stream: "events:orders", MaxLen: 10000, Values: []any{"k", "v"}})
		}, nil},
		{"ratelimit:user:123", func(p redis.Pipeliner) { p.Incr(ctx, "ratelimit:user:123") }, ttl("ratelimit:user:123", time.Minute)},
		{"hll:pageviews", func(p redis.Pipeliner) { p.PFAdd(ctx, "hll:pageviews", "u1") }, ttl("hll:pageviews", 24*time.Hour)},
		// 000: naming conventions.
		{"user:123:profile", func(p redis.Pipeliner) { p.Set(ctx, "user:123:profile", "{}", time.Hour) }, nil},
		{"order:456:status", func(p redis.Pipeliner) { p.Set(ctx, "order:456:status", "paid", time.Hour) }, nil},
		{"cache:product:789", func(p redis.Pipeliner) { p.SetEx(ctx, "cache:product:789", "{}", 5*time.Minute) }, nil},
		{"myapp:session:abc123", func(p redis.Pipeliner) { p.HSet(ctx, "myapp:session:abc123", "user_id", "1") }, ttl("myapp:session:abc123", 24*time.Hour)},
		{"myapp:ratelimit:user:123", func(p redis.Pipeliner) { p.Incr(ctx, "myapp:ratelimit:user:123") }, ttl("myapp:ratelimit:user:123", time.Minute)},
		{"stats:pageviews:2024-01-01", func(p redis.Pipeliner) { p.Incr(ctx, "stats:pageviews:2024-01-01") }, ttl("stats:pageviews:2024-01-01", 24*time.Hour)},
		// 000: locks, tags, sliding window.
		{"lock:order:payment:123", func(p redis.Pipeliner) { p.SetNX(ctx, "lock:order:payment:123", "token", 5*time.Second) }, nil},
		{"tag:category:7", func(p redis.Pipeliner) { p.SAdd(ctx, "tag:category:7", "product:123") }, ttl("tag:category:7", time.Hour)},
		{"ratelimit:sliding:123", func(p redis.Pipeliner) { p.ZAdd(ctx, "ratelimit:sliding:123", redis.Z{Score: 1, Member: "1-1"}) }, ttl("ratelimit:sliding:123", time.Minute)},
		// 004: versioned accelerator keys, cooldowns, rate limit scopes.
		{"states:all:v14", func(p redis.Pipeliner) { p.Set(ctx, "states:all:v14", "{}", time.Hour) }, nil},
		{"voice:all:v2", func(p redis.Pipeliner) { p.Set(ctx, "voice:all:v2", "{}", time.Hour) }, nil},
		{"sections:v1:home", func(p redis.Pipeliner) { p.Set(ctx, "sections:v1:home", "{}", time.Hour) }, nil},
		{"cooldown:sms:42", func(p redis.Pipeliner) { p.SetNX(ctx, "cooldown:sms:42", "1", time.Minute) }, nil},
		{"user:42", func(p redis.Pipeliner) { p.Incr(ctx, "user:42") }, ttl("user:42", time.Minute)},
		{"anon:9f1c", func(p redis.Pipeliner) { p.Incr(ctx, "anon:9f1c") }, ttl("anon:9f1c", time.Minute)},
		{"ip:203.0.113.7", func(p redis.Pipeliner) { p.Incr(ctx, "ip:203.0.113.7") }, ttl("ip:203.0.113.7", time.Minute)},
	}
	for _, tc := range cases {
		cmds, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
			tc.write(p)
			if tc.then != nil {
				tc.then(p)
			}
			return nil
		})
		if err != nil {
			t.Errorf("%s: %v", tc.key, err)
			continue
		}
		for _, cmd := range cmds {
			if cmd.Err() != nil {
				t.Errorf("%s: %v: %v", tc.key, cmd.Args(), cmd.Err())
			}
		}
		if n := e.direct.Exists(ctx, tc.key).Val(); n != 1 {
			t.Errorf("%s was not written", tc.key)
		}
	}
}

// redisBenchmarkTests is every test redis-benchmark 7 knows, for -t.
const redisBenchmarkTests = "ping_inline,ping_mbulk,set,get,incr,lpush,rpush,lpop,rpop,sadd,hset,spop,zadd,zpopmin,lrange_100,lrange_300,lrange_500,lrange_600,mset,xadd"

// TestExampleConfigRedisBenchmark runs redis-benchmark's default suite, and
// every test by name, through the shipped configuration.
func TestExampleConfigRedisBenchmark(t *testing.T) {
	bench, err := exec.LookPath("redis-benchmark")
	if err != nil {
		t.Skip("redis-benchmark not installed (Debian/Ubuntu: apt-get install redis-tools)")
	}
	p := startExample(t)
	host, port, _ := strings.Cut(p.Addr, ":")
	for _, extra := range [][]string{nil, {"-t", redisBenchmarkTests}, {"-t", redisBenchmarkTests, "-P", "8"}} {
		args := append([]string{"-h", host, "-p", port, "-q", "-n", "2000", "-r", "1000", "-c", "10"}, extra...)
		cmd := exec.Command(bench, args...)
		out, err := cmd.CombinedOutput()
		text := string(out)
		if err != nil {
			t.Fatalf("redis-benchmark %v: %v\n%s", extra, err, text)
		}
		lines := 0
		for _, line := range strings.Split(text, "\n") {
			// -q prints "\r"-separated progress before each result line.
			if i := strings.LastIndexByte(line, '\r'); i >= 0 {
				line = line[i+1:]
			}
			line = strings.TrimSpace(line)
			if line == "" {
				continue
			}
			if !strings.Contains(line, "requests per second") {
				t.Errorf("redis-benchmark %v: %q", extra, line)
				continue
			}
			lines++
		}
		// The default suite and -t run the same tests; LRANGE_100..600
		// each need their LPUSH, so at least one line per named test.
		if want := strings.Count(redisBenchmarkTests, ",") + 1; lines < want {
			t.Errorf("redis-benchmark %v: %d results, want at least %d:\n%s", extra, lines, want, text)
		}
		t.Logf("redis-benchmark %v:\n%s", extra, strings.TrimSpace(strings.ReplaceAll(text, "\r", "\n")))
	}
	wantNoRefusals(t, p)
	errs, _, err := metrics.CounterSum(p.Metrics.Registry, "redproxy_command_errors_total")
	if err != nil {
		t.Fatal(err)
	}
	if errs != 0 {
		t.Errorf("redproxy_command_errors_total = %v, want 0", errs)
	}
}

// TestExampleConfigSeedPatternsTracking runs every seed pattern under the
// shipped configuration from a client whose every connection has sent
// CLIENT TRACKING ON, as rueidis and redis-py's client-side caching do: each
// is a relay (a raw stream to its own Redis connection), where the TTL
// defaults are applied by fix-ups whose replies the relay cuts from the
// stream. The session write without a TTL gets the default as on a shared
// connection.
func TestExampleConfigSeedPatternsTracking(t *testing.T) {
	p := startExample(t)
	tracking := func(o *redis.Options) {
		o.Protocol = 3
		o.OnConnect = func(ctx context.Context, cn *redis.Conn) error {
			return cn.Do(ctx, "CLIENT", "TRACKING", "ON").Err()
		}
	}
	e := &seedEnv{p: p, direct: p.Redis.Client(t)}
	e.c = p.Client(t, func(o *redis.Options) { o.PoolSize = 8 }, tracking)
	e.client = func(t testing.TB, mutate ...func(*redis.Options)) *redis.Client {
		return p.Client(t, append(mutate, tracking)...)
	}
	e.runPatterns(t)
	t.Run("KeyExamples", e.keyExamples)
	wantNoRefusals(t, p)
	// The proxy's CLIENT LIST marks a tracking client with flag t.
	list, err := e.c.ClientList(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(list, "flags=t") {
		t.Fatalf("no connection is tracking, so none was relayed:\n%s", list)
	}
	if err := e.c.Set(ctx, "session:no-ttl-tracked", "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	wantTTL(t, e.direct, "session:no-ttl-tracked", 24*time.Hour)
	if err := e.c.HSet(ctx, "session:hash-tracked", "f", "v").Err(); err != nil {
		t.Fatal(err)
	}
	wantTTL(t, e.direct, "session:hash-tracked", 24*time.Hour)
}
