package guard_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/seeds"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/guard"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/proxytest"
)

var ctx = context.Background()

const examplePath = "../../config.example.toml"

// examplePolicy is the policy config.example.toml ships.
func examplePolicy(t testing.TB) policy.Config {
	t.Helper()
	c, err := config.Load(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	return c.Policy
}

// strictExamplePolicy is the example's policy with its naming rules turned
// from report to enforce, as its comment tells an operator to do once
// /policy/report is clean.
func strictExamplePolicy(t testing.TB) policy.Config {
	t.Helper()
	pol := examplePolicy(t)
	if pol.Names.Action != "report" {
		t.Fatalf("the example's [policy.names] no longer ships in report mode: %+v", pol.Names)
	}
	pol.Names.Action = "" // Names is a value: the loaded config is not shared
	return pol
}

// setup starts redis-server and a proxy under pol. It returns the proxy, a
// client through the proxy and a client straight to Redis.
func setup(t *testing.T, pol policy.Config) (*proxytest.Proxy, *redis.Client, *redis.Client) {
	t.Helper()
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Policy = pol })
	return p, p.Client(t), p.Redis.Client(t)
}

// ttlNear checks that key's TTL, read straight from Redis, is in
// (want-slack, want].
func ttlNear(t *testing.T, direct *redis.Client, key string, want time.Duration) {
	t.Helper()
	got, err := direct.PTTL(ctx, key).Result()
	if err != nil || got > want || got <= want-5*time.Second {
		t.Errorf("PTTL %s = %v, %v; want about %v", key, got, err, want)
	}
}

func check(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// TestSeedPatternsPassUntouched: every pattern the seeds recommend works
// through the proxy under config.example.toml's policy, with the TTLs and
// names the seeds use, and breaks no rule at all: nothing refused,
// rewritten, fixed or even reported.
func TestSeedPatternsPassUntouched(t *testing.T) {
	p, c, direct := setup(t, examplePolicy(t))

	t.Run("cache-aside", func(t *testing.T) {
		if err := c.Get(ctx, "product:123").Err(); !errors.Is(err, redis.Nil) {
			t.Fatalf("miss: %v", err)
		}
		check(t, "SETEX", c.SetEx(ctx, "product:123", `{"id":123,"name":"widget"}`, time.Hour).Err())
		if v, err := c.Get(ctx, "product:123").Result(); err != nil || v != `{"id":123,"name":"widget"}` {
			t.Fatalf("hit: %q %v", v, err)
		}
		ttlNear(t, direct, "product:123", time.Hour)
	})
	t.Run("write-through", func(t *testing.T) {
		check(t, "SETEX", c.SetEx(ctx, "product:124", `{"id":124}`, time.Hour).Err())
		ttlNear(t, direct, "product:124", time.Hour)
	})
	t.Run("tag-based invalidation", func(t *testing.T) {
		_, err := c.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
			pipe.SetEx(ctx, "product:1", `{"id":1}`, time.Hour)
			pipe.SAdd(ctx, "tag:category:7", "product:1")
			pipe.Expire(ctx, "tag:category:7", time.Hour)
			return nil
		})
		check(t, "MULTI", err)
		ttlNear(t, direct, "tag:category:7", time.Hour)
		members, err := c.SMembers(ctx, "tag:category:7").Result()
		check(t, "SMEMBERS", err)
		if len(members) != 1 || members[0] != "product:1" {
			t.Fatalf("members %v", members)
		}
		check(t, "DEL", c.Del(ctx, members...).Err())
		check(t, "DEL tag", c.Del(ctx, "tag:category:7").Err())
		if n := direct.Exists(ctx, "product:1", "tag:category:7").Val(); n != 0 {
			t.Fatalf("%d keys left", n)
		}
	})
	t.Run("session storage", func(t *testing.T) {
		key := "session:4f9c2d1e-8a7b-4c3d-9e2f-1a2b3c4d5e6f"
		_, err := c.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
			pipe.HSet(ctx, key, "user_id", "42", "created_at", "1700000000")
			pipe.Expire(ctx, key, 24*time.Hour)
			return nil
		})
		check(t, "MULTI", err)
		ttlNear(t, direct, key, 24*time.Hour)
		if m, err := c.HGetAll(ctx, key).Result(); err != nil || m["user_id"] != "42" {
			t.Fatalf("HGETALL %v %v", m, err)
		}
		check(t, "DEL", c.Del(ctx, key).Err())
	})
	t.Run("fixed window rate limit", func(t *testing.T) {
		key := "ratelimit:123:28333333"
		for i := 1; i <= 3; i++ {
			var incr *redis.IntCmd
			_, err := c.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
				incr = pipe.Incr(ctx, key)
				pipe.Expire(ctx, key, time.Minute)
				return nil
			})
			check(t, "MULTI", err)
			if incr.Val() != int64(i) {
				t.Fatalf("INCR = %d, want %d", incr.Val(), i)
			}
		}
		ttlNear(t, direct, key, time.Minute)
	})
	t.Run("sliding window rate limit", func(t *testing.T) {
		now := time.Now().UnixMilli()
		allowed, err := c.Eval(ctx, seeds.SlidingWindowScript, []string{"ratelimit:sliding:123"}, now, 60000, 100).Int()
		check(t, "EVAL", err)
		sha, err := c.ScriptLoad(ctx, seeds.SlidingWindowScript).Result()
		check(t, "SCRIPT LOAD", err)
		again, err := c.EvalSha(ctx, sha, []string{"ratelimit:sliding:123"}, now+1, 60000, 100).Int()
		check(t, "EVALSHA", err)
		if allowed != 1 || again != 1 {
			t.Fatalf("allowed %d, %d", allowed, again)
		}
		if n := direct.ZCard(ctx, "ratelimit:sliding:123").Val(); n != 2 {
			t.Fatalf("window holds %d", n)
		}
		ttlNear(t, direct, "ratelimit:sliding:123", time.Minute)
	})
	t.Run("distributed lock", func(t *testing.T) {
		key, token := "lock:order:payment:123", "9b2c7e4a-1d3f-4e5a-8b6c-7d8e9f0a1b2c"
		ok, err := c.SetNX(ctx, key, token, 5*time.Second).Result()
		if err != nil || !ok {
			t.Fatalf("acquire: %v %v", ok, err)
		}
		if ok, _ := c.SetNX(ctx, key, "other", 5*time.Second).Result(); ok {
			t.Fatal("lock acquired twice")
		}
		ttlNear(t, direct, key, 5*time.Second)
		if n, err := c.Eval(ctx, seeds.ReleaseLockScript, []string{key}, "wrong-token").Int(); err != nil || n != 0 {
			t.Fatalf("release with the wrong token: %d %v", n, err)
		}
		if n, err := c.Eval(ctx, seeds.ReleaseLockScript, []string{key}, token).Int(); err != nil || n != 1 {
			t.Fatalf("release: %d %v", n, err)
		}
	})
	t.Run("stampede-safe fill", func(t *testing.T) {
		if err := c.Get(ctx, "product:9").Err(); !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		ok, err := c.SetNX(ctx, "lock:product:9", "token", 5*time.Second).Result()
		if err != nil || !ok {
			t.Fatalf("lock: %v %v", ok, err)
		}
		check(t, "SETEX", c.SetEx(ctx, "product:9", `{"id":9}`, 5*time.Minute).Err())
		check(t, "DEL", c.Del(ctx, "lock:product:9").Err())
		ttlNear(t, direct, "product:9", 5*time.Minute)
	})
	t.Run("streams", func(t *testing.T) {
		for i := range 3 {
			err := c.XAdd(ctx, &redis.XAddArgs{Stream: "events:orders", MaxLen: 10000, Values: []any{"order_id", strconv.Itoa(i), "status", "paid"}}).Err()
			check(t, "XADD", err)
		}
		check(t, "XGROUP", c.XGroupCreateMkStream(ctx, "events:orders", "processor", "0").Err())
		res, err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "processor", Consumer: "worker-1", Streams: []string{"events:orders", ">"}, Count: 10, Block: 100 * time.Millisecond}).Result()
		check(t, "XREADGROUP", err)
		if len(res) != 1 || len(res[0].Messages) != 3 {
			t.Fatalf("read %v", res)
		}
		check(t, "XACK", c.XAck(ctx, "events:orders", "processor", res[0].Messages[0].ID).Err())
		if ttl := direct.PTTL(ctx, "events:orders").Val(); ttl != -1 {
			t.Fatalf("stream got a TTL: %v", ttl)
		}
	})
	t.Run("idempotency SET NX EX", func(t *testing.T) {
		first, err := c.SetNX(ctx, "cooldown:sms:user:42", "1", time.Minute).Result()
		check(t, "SET NX EX", err)
		second, err := c.SetNX(ctx, "cooldown:sms:user:42", "1", time.Minute).Result()
		check(t, "SET NX EX again", err)
		if !first || second {
			t.Fatalf("first %v second %v", first, second)
		}
		ttlNear(t, direct, "cooldown:sms:user:42", time.Minute)
	})
	t.Run("versioned cache keys and naming conventions", func(t *testing.T) {
		check(t, "SET states", c.Set(ctx, "states:all:v14", `{"states":[]}`, 10*time.Minute).Err())
		check(t, "SETEX cache", c.SetEx(ctx, "cache:product:v2:789", `{}`, 10*time.Minute).Err())
		check(t, "SET user", c.Set(ctx, "user:123:profile", "{}", time.Hour).Err())
		check(t, "SET stats", c.Set(ctx, "stats:pageviews:2024-01-01", "0", 24*time.Hour).Err())
		_, err := c.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			pipe.ZAdd(ctx, "scores:weekly", redis.Z{Score: 100, Member: "alice"})
			pipe.Expire(ctx, "scores:weekly", time.Hour)
			return nil
		})
		check(t, "ZADD+EXPIRE", err)
		ttlNear(t, direct, "cache:product:v2:789", 10*time.Minute)
		ttlNear(t, direct, "scores:weekly", time.Hour)
	})
	t.Run("pub/sub publish", func(t *testing.T) {
		check(t, "PUBLISH", c.Publish(ctx, "invalidation", `{"reason":"content_publish"}`).Err())
	})

	if rep := p.Guard().Report(); rep.Total != 0 {
		t.Fatalf("seed patterns broke rules: %+v", rep.Rows)
	}
}

// antiPatterns are the seeds' anti-patterns and the exact error each gets
// under the example policy's enforce mode.
var namespaces = "session, cache, ratelimit, lock, token, cooldown, leaderboard, scores, product, tag, events, user, order, feed, visitors, hll, stats, states, voice, sections"

var antiPatterns = []struct {
	name string
	args []any
	msg  string
	rule string
	key  string // the key that must not be written under enforce
}{
	{"KEYS *", []any{"KEYS", "*"}, "ERR redproxy policy: KEYS is disabled; use SCAN 0 MATCH pattern COUNT 100", "command", ""},
	{"key without TTL", []any{"SET", "lock:nightly-job", "worker-1", "NX"},
		`ERR redproxy policy: key "lock:nightly-job" needs a TTL (rule "lock:*"); set EX on the write, or EXPIRE the key in the same MULTI, or in the same pipeline sent in one write`, "ttl", "lock:nightly-job"},
	{"large blob", []any{"SETEX", "product:1", "3600", strings.Repeat("x", 200<<10)},
		`ERR redproxy policy: value of 204800 bytes exceeds 102400 (rule "value_size"); store large objects elsewhere and keep a reference in Redis`, "value_size", "product:1"},
	{"unnamed key", []any{"SET", "foo", "bar", "EX", "60"},
		`ERR redproxy policy: key "foo" does not match naming rule "namespaces"; start it with one of: ` + namespaces + `, followed by ':'`, "namespaces", "foo"},
	{"unversioned cache key", []any{"SET", "cache:product:789", "{}", "EX", "60"},
		`ERR redproxy policy: key "cache:product:789" does not match naming rule "require_version"; keys matching "cache:*" need a version segment, as in {module}:{scope}:v1`, "require_version", "cache:product:789"},
	{"debug", []any{"DEBUG", "SLEEP", "0"}, "ERR redproxy policy: DEBUG is disabled; run it with redis-cli against the server itself", "command", ""},
	{"config set", []any{"CONFIG", "SET", "maxmemory", "1"}, "ERR redproxy policy: CONFIG SET is disabled; change the Redis configuration through your operators, not the application", "command", ""},
}

// TestAntiPatternsRefusedUnderEnforce: each anti-pattern gets its exact
// error, writes nothing, and leaves the connection usable; FLUSHALL and
// FLUSHDB destroy nothing; every refusal is counted and reported.
func TestAntiPatternsRefusedUnderEnforce(t *testing.T) {
	p, c, direct := setup(t, strictExamplePolicy(t))
	c1 := p.Redis.Client(t)
	check(t, "seed", direct.Set(ctx, "product:keep", "1", time.Hour).Err())
	check(t, "SELECT 1", c1.Do(ctx, "SELECT", "1").Err())

	for _, ap := range antiPatterns {
		err := c.Do(ctx, ap.args...).Err()
		if err == nil || err.Error() != ap.msg {
			t.Errorf("%s: got %v\nwant %s", ap.name, err, ap.msg)
		}
		if ap.key != "" && direct.Exists(ctx, ap.key).Val() != 0 {
			t.Errorf("%s: %s was written", ap.name, ap.key)
		}
	}
	// FLUSHALL and FLUSHDB, also in DB 1 and with ASYNC.
	flushes := []struct {
		args []any
		msg  string
	}{
		{[]any{"FLUSHALL"}, "ERR redproxy policy: FLUSHALL is disabled; delete by pattern with SCAN 0 MATCH prefix:* COUNT 100 and UNLINK"},
		{[]any{"FLUSHALL", "ASYNC"}, "ERR redproxy policy: FLUSHALL is disabled; delete by pattern with SCAN 0 MATCH prefix:* COUNT 100 and UNLINK"},
		{[]any{"FLUSHDB"}, "ERR redproxy policy: FLUSHDB is disabled; delete by pattern with SCAN 0 MATCH prefix:* COUNT 100 and UNLINK"},
	}
	db1 := p.Client(t, func(o *redis.Options) { o.DB = 1 })
	check(t, "seed db1", c1.Set(ctx, "product:keep1", "1", time.Hour).Err())
	for _, f := range flushes {
		for _, cl := range []*redis.Client{c, db1} {
			if err := cl.Do(ctx, f.args...).Err(); err == nil || err.Error() != f.msg {
				t.Errorf("%v: %v", f.args, err)
			}
		}
	}
	if direct.Get(ctx, "product:keep").Val() != "1" || c1.Get(ctx, "product:keep1").Val() != "1" {
		t.Fatal("a refused flush destroyed data")
	}
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("connection unusable after refusals: %v", err)
	}

	reg := p.Metrics.Registry
	for rule, want := range map[string]float64{"command": 3 + 6, "ttl": 1, "value_size": 1, "namespaces": 1, "require_version": 1} {
		if got := metricValue(t, reg, "redproxy_policy_violations_total", "rule", rule, "action", "enforce"); got != want {
			t.Errorf("violations{rule=%s,action=enforce} = %v, want %v", rule, got, want)
		}
	}
	rep := reportJSON(t, p.Guard())
	if rep.Total != 13 {
		t.Errorf("report total %d", rep.Total)
	}
	row := findRow(rep, "ttl", "set")
	if row == nil || row.Refused != 1 || row.ExampleKey != "lock:nightly-job" || row.Pattern != "lock:*" || row.Message != antiPatterns[1].msg {
		t.Errorf("ttl row %+v", row)
	}
	if row := findRow(rep, "command", "flushall"); row == nil || row.Refused != 4 {
		t.Errorf("flushall row %+v", row)
	}
}

// TestAntiPatternsForwardedUnderReport: with --policy-mode=report (and with
// mode = "report" in the file) nothing is refused: each anti-pattern reaches
// Redis unchanged, and is counted and reported.
func TestAntiPatternsForwardedUnderReport(t *testing.T) {
	p, c, direct := setup(t, examplePolicy(t))
	p.Guard().SetForcedMode(policy.Report)
	check(t, "seed", direct.Set(ctx, "product:keep", "1", time.Hour).Err())

	for _, ap := range antiPatterns {
		if ap.name == "debug" {
			continue // Redis 7 refuses DEBUG itself unless enable-debug-command is set
		}
		err := c.Do(ctx, ap.args...).Err()
		if err != nil {
			t.Errorf("%s: %v", ap.name, err)
		}
		if ap.key != "" && direct.Exists(ctx, ap.key).Val() != 1 {
			t.Errorf("%s: %s was not written", ap.name, ap.key)
		}
	}
	check(t, "CONFIG SET back", direct.ConfigSet(ctx, "maxmemory", "0").Err())
	if ttl := direct.PTTL(ctx, "lock:nightly-job").Val(); ttl != -1 {
		t.Errorf("report mode changed the write: TTL %v", ttl)
	}
	keys, err := c.Keys(ctx, "product:*").Result()
	if err != nil || len(keys) != 2 {
		t.Errorf("KEYS: %v %v", keys, err)
	}
	check(t, "FLUSHALL", c.FlushAll(ctx).Err())
	if n := direct.DBSize(ctx).Val(); n != 0 {
		t.Errorf("FLUSHALL was not forwarded: %d keys", n)
	}

	reg := p.Metrics.Registry
	for rule, want := range map[string]float64{"command": 4, "ttl": 1, "value_size": 1, "namespaces": 1, "require_version": 1} {
		if got := metricValue(t, reg, "redproxy_policy_violations_total", "rule", rule, "action", "report"); got != want {
			t.Errorf("violations{rule=%s,action=report} = %v, want %v", rule, got, want)
		}
		if got := metricValue(t, reg, "redproxy_policy_violations_total", "rule", rule, "action", "enforce"); got != 0 {
			t.Errorf("violations{rule=%s,action=enforce} = %v, want 0", rule, got)
		}
	}
	rep := reportJSON(t, p.Guard())
	if row := findRow(rep, "command", "flushall"); row == nil || row.Reported != 1 || row.Refused != 0 {
		t.Errorf("flushall row %+v", row)
	}
	if row := findRow(rep, "namespaces", "set"); row == nil || row.ExampleKey != "foo" || row.Reported != 1 ||
		!strings.HasPrefix(row.Message, `ERR redproxy policy: key "foo" does not match naming rule "namespaces"`) {
		t.Errorf("namespaces row %+v", row)
	}
	if rep.Policy.ForcedMode != "report" {
		t.Errorf("report says forced mode %q", rep.Policy.ForcedMode)
	}
	// What enforce would do, which the message alone does not say (a
	// user's trial): the lock without a TTL is refused (no default),
	// FLUSHALL too.
	for _, c := range []struct{ rule, cmd, want string }{{"ttl", "set", "refused"}, {"command", "flushall", "refused"}} {
		if row := findRow(rep, c.rule, c.cmd); row == nil || row.UnderEnforce != c.want {
			t.Errorf("%s %s row: under enforce %+v, want %s", c.rule, c.cmd, row, c.want)
		}
	}

	t.Run("mode = report in the file", func(t *testing.T) {
		pol := examplePolicy(t)
		pol.Mode = "report"
		p, c, _ := setup(t, pol)
		if err := c.Do(ctx, "KEYS", "*").Err(); err != nil {
			t.Fatal(err)
		}
		if got := metricValue(t, p.Metrics.Registry, "redproxy_policy_violations_total", "rule", "command", "action", "report"); got != 1 {
			t.Fatalf("counter %v", got)
		}
		// A forgotten session TTL: enforce gives it the default.
		check(t, "HSET", c.HSet(ctx, "session:forgot", "f", "v").Err())
		rep := reportJSON(t, p.Guard())
		if rep.Policy.Mode != "report" || rep.Policy.ForcedMode != "enforce" {
			t.Errorf("report's policy: %+v, want mode report, forced_mode enforce", rep.Policy)
		}
		if row := findRow(rep, "ttl", "hset"); row == nil || row.UnderEnforce != "fixed" || row.Reported != 1 {
			t.Errorf("hset row %+v, want reported=1 under_enforce fixed", row)
		}
		var text strings.Builder
		if err := rep.WriteText(&text, time.Now()); err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"; policy mode report", "reported=1 (enforce: fixed)", "reported=1 (enforce: refused)"} {
			if !strings.Contains(text.String(), want) {
				t.Errorf("text report lacks %q:\n%s", want, text.String())
			}
		}
	})
}

// TestRulesInPipelinesTransactionsAndScripts: rules apply to each command
// of a pipeline, inside MULTI (where a refusal aborts EXEC as a
// queue-time error in Redis would), and to the declared keys of scripts.
func TestRulesInPipelinesTransactionsAndScripts(t *testing.T) {
	p, c, direct := setup(t, strictExamplePolicy(t))

	t.Run("pipeline", func(t *testing.T) {
		got := roundTrip(t, p.Dial(t),
			[]string{"SET", "cache:app:v1:a", "v", "EX", "60"},
			[]string{"KEYS", "*"},
			[]string{"SET", "foo", "bar", "EX", "60"},
			[]string{"GET", "cache:app:v1:a"},
			[]string{"PING"})
		want := []string{"+OK", "-" + antiPatterns[0].msg, "-" + antiPatterns[3].msg, "$v", "+PONG"}
		equalReplies(t, got, want)
		if direct.Exists(ctx, "foo").Val() != 0 {
			t.Fatal("foo written")
		}
	})

	t.Run("MULTI in one batch", func(t *testing.T) {
		got := roundTrip(t, p.Dial(t),
			[]string{"MULTI"},
			[]string{"SET", "cache:app:v1:t", "v", "EX", "60"},
			[]string{"SET", "lock:job", "worker", "NX"},
			[]string{"EXEC"},
			[]string{"EXISTS", "cache:app:v1:t"})
		want := []string{"+OK", "+QUEUED", "-" + strings.ReplaceAll(antiPatterns[1].msg, "lock:nightly-job", "lock:job"),
			"-EXECABORT Transaction discarded because of previous errors.", ":0"}
		equalReplies(t, got, want)
	})

	t.Run("MULTI across batches", func(t *testing.T) {
		nc := p.Dial(t)
		equalReplies(t, roundTrip(t, nc, []string{"MULTI"}), []string{"+OK"})
		equalReplies(t, roundTrip(t, nc, []string{"INCR", "ratelimit:t:1"}), []string{"+QUEUED"})
		equalReplies(t, roundTrip(t, nc, []string{"KEYS", "*"}), []string{"-" + antiPatterns[0].msg})
		equalReplies(t, roundTrip(t, nc, []string{"EXEC"}), []string{"-EXECABORT Transaction discarded because of previous errors."})
		if direct.Exists(ctx, "ratelimit:t:1").Val() != 0 {
			t.Fatal("the aborted transaction ran")
		}
		// The connection is a normal one again.
		equalReplies(t, roundTrip(t, nc, []string{"INCR", "ratelimit:t:2"}, []string{"PING"}), []string{":1", "+PONG"})
		ttlNear(t, direct, "ratelimit:t:2", time.Hour)
	})

	t.Run("go-redis TxPipelined", func(t *testing.T) {
		var set *redis.StatusCmd
		_, err := c.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
			pipe.SetEx(ctx, "product:tx", "1", time.Hour)
			set = pipe.Set(ctx, "bad key", "v", time.Minute)
			return nil
		})
		if err == nil || set.Err() == nil || !strings.HasPrefix(set.Err().Error(), `ERR redproxy policy: key "bad key" does not match naming rule "namespaces"`) {
			t.Fatalf("exec %v, set %v", err, set.Err())
		}
		if direct.Exists(ctx, "product:tx").Val() != 0 {
			t.Fatal("part of a refused transaction ran")
		}
	})

	t.Run("scripts: declared keys", func(t *testing.T) {
		const script = "return redis.call('SET', KEYS[1], ARGV[1], 'EX', 60)"
		err := c.Eval(ctx, script, []string{"badkey"}, "v").Err()
		if err == nil || !strings.HasPrefix(err.Error(), `ERR redproxy policy: key "badkey" does not match naming rule "namespaces"`) {
			t.Fatalf("EVAL: %v", err)
		}
		sha := c.ScriptLoad(ctx, script).Val()
		if err := c.EvalSha(ctx, sha, []string{"badkey"}, "v").Err(); err == nil || !strings.Contains(err.Error(), `key "badkey"`) {
			t.Fatalf("EVALSHA: %v", err)
		}
		if direct.Exists(ctx, "badkey").Val() != 0 {
			t.Fatal("refused script ran")
		}
		check(t, "EVAL good key", c.Eval(ctx, script, []string{"user:1:name"}, "v").Err())
		// What cannot be checked: keys a script builds itself. The keyspace
		// audit finds them afterwards (redproxy audit).
		check(t, "EVAL undeclared", c.Eval(ctx, "return redis.call('SET', 'undeclared', 'v')", nil).Err())
		if direct.Exists(ctx, "undeclared").Val() != 1 {
			t.Fatal("undeclared key not written")
		}
	})
}

// TestAutoTTL: under enforce, writes that would leave a key without its
// required TTL get the rule's default, and the client sees exactly the
// replies it expects: none of the proxy's fix-ups leak, in a pipeline, in
// MULTI (where EXEC's array is cut back) or in a single command.
func TestAutoTTL(t *testing.T) {
	p, c, direct := setup(t, examplePolicy(t))

	check(t, "seed live session", direct.HSet(ctx, "session:live", "f", "old").Err())
	check(t, "seed live session TTL", direct.Expire(ctx, "session:live", 100*time.Second).Err())

	nc := p.Dial(t)
	got := roundTrip(t, nc,
		[]string{"SET", "cache:app:v1:k", "v"},           // rewritten: SET ... EX 300
		[]string{"HSET", "session:x", "f", "v"},          // followed by EXPIRE session:x 86400 NX
		[]string{"GET", "cache:app:v1:k"},                //
		[]string{"HGET", "session:x", "f"},               //
		[]string{"INCR", "ratelimit:api:1"},              // EXPIRE ... 3600 NX
		[]string{"PING"},                                 //
		[]string{"LPUSH", "feed:1", "a"},                 // catch-all rule: reported, not fixed
		[]string{"HSET", "session:live", "f", "v"},       // NX leaves the live session's TTL alone
		[]string{"MSET", "token:a", "1", "token:b", "2"}, // one fix-up per key
		[]string{"SET", "session:plain", "v"})            // rewritten with the session default
	equalReplies(t, got, []string{"+OK", ":1", "$v", "$v", ":1", "+PONG", ":1", ":0", "+OK", "+OK"})
	// Nothing else arrives: the next reply on the connection is the next
	// command's.
	equalReplies(t, roundTrip(t, nc, []string{"ECHO", "next"}), []string{"$next"})

	ttlNear(t, direct, "cache:app:v1:k", 5*time.Minute)
	ttlNear(t, direct, "session:x", 24*time.Hour)
	ttlNear(t, direct, "ratelimit:api:1", time.Hour)
	ttlNear(t, direct, "session:live", 100*time.Second)
	ttlNear(t, direct, "token:a", 5*time.Minute)
	ttlNear(t, direct, "token:b", 5*time.Minute)
	ttlNear(t, direct, "session:plain", 24*time.Hour)
	if ttl := direct.PTTL(ctx, "feed:1").Val(); ttl != -1 {
		t.Errorf("reported-only key got a TTL: %v", ttl)
	}

	t.Run("inside MULTI", func(t *testing.T) {
		got := roundTrip(t, nc,
			[]string{"MULTI"},
			[]string{"HSET", "session:m", "f", "v"},
			[]string{"SET", "cache:app:v1:m", "v"},
			[]string{"INCR", "ratelimit:m"},
			[]string{"EXEC"},
			[]string{"PING"})
		equalReplies(t, got, []string{"+OK", "+QUEUED", "+QUEUED", "+QUEUED", "*[:1 +OK :1]", "+PONG"})
		ttlNear(t, direct, "session:m", 24*time.Hour)
		ttlNear(t, direct, "cache:app:v1:m", 5*time.Minute)
		ttlNear(t, direct, "ratelimit:m", time.Hour)
	})

	t.Run("go-redis", func(t *testing.T) {
		check(t, "SADD", c.SAdd(ctx, "tag:t", "a", "b").Err())
		ttlNear(t, direct, "tag:t", time.Hour)
		n, err := c.HSet(ctx, "session:g", "a", "1", "b", "2").Result()
		if err != nil || n != 2 {
			t.Fatalf("HSET %d %v", n, err)
		}
		ttlNear(t, direct, "session:g", 24*time.Hour)
		cmds, err := c.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
			pipe.HSet(ctx, "session:gt", "a", "1")
			pipe.Get(ctx, "cache:app:v1:k")
			return nil
		})
		if err != nil || len(cmds) != 2 || cmds[0].(*redis.IntCmd).Val() != 1 || cmds[1].(*redis.StringCmd).Val() != "v" {
			t.Fatalf("TxPipelined: %v %v", cmds, err)
		}
		ttlNear(t, direct, "session:gt", 24*time.Hour)
	})

	t.Run("max clamps", func(t *testing.T) {
		check(t, "SET EX over max", c.Set(ctx, "cache:app:v1:long", "v", 24*time.Hour).Err())
		ttlNear(t, direct, "cache:app:v1:long", 15*time.Minute)
		check(t, "EXPIRE over max", c.Expire(ctx, "session:x", 30*24*time.Hour).Err())
		ttlNear(t, direct, "session:x", 7*24*time.Hour)
		err := c.Set(ctx, "lock:long", "v", 2*time.Hour).Err()
		if err == nil || err.Error() != `ERR redproxy policy: TTL of 7200s for key "lock:long" exceeds the maximum of 3600s (rule "lock:*")` {
			t.Fatalf("lock over max: %v", err)
		}
	})

	rep := reportJSON(t, p.Guard())
	if row := findRow(rep, "ttl", "hset"); row == nil || row.Fixed == 0 || row.Refused != 0 {
		t.Errorf("hset row %+v", row)
	}
	if got := metricValue(t, p.Metrics.Registry, "redproxy_policy_fixup_failures_total"); got != 0 {
		t.Errorf("fix-up failures: %v", got)
	}
}

// TestReload: a bad file keeps the old policy (and says why); a good one
// changes behaviour at once, for connections already open too.
func TestReloadThroughProxy(t *testing.T) {
	p, c, direct := setup(t, examplePolicy(t))
	example, err := os.ReadFile(examplePath)
	check(t, "read example", err)
	path := filepath.Join(t.TempDir(), "redproxy.toml")
	g := p.Guard()
	g.SetSource(func() (policy.Config, error) {
		cfg, err := config.Load(path)
		if err != nil {
			return policy.Config{}, err
		}
		return cfg.Policy, nil
	})
	reload := func() *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		g.ReloadHandler().ServeHTTP(rec, httptest.NewRequest("POST", "/policy/reload", nil))
		return rec
	}

	bad := strings.Replace(string(example), `default = "24h"`, `default = "24x"`, 1)
	check(t, "write", os.WriteFile(path, []byte(bad), 0o600))
	rec := reload()
	if rec.Code != http.StatusUnprocessableEntity || !strings.Contains(rec.Body.String(), path+":") ||
		!strings.Contains(rec.Body.String(), "policy.ttl[0].default") {
		t.Fatalf("bad file: %d %s", rec.Code, rec.Body.String())
	}
	if err := c.Keys(ctx, "*").Err(); err == nil {
		t.Fatal("bad reload dropped the policy")
	}
	check(t, "HSET", c.HSet(ctx, "session:a", "f", "v").Err())
	ttlNear(t, direct, "session:a", 24*time.Hour)
	if rep := reportJSON(t, g); !strings.Contains(rep.Policy.LastReloadError, "24x") {
		t.Fatalf("report: %+v", rep.Policy)
	}

	good := strings.Replace(string(example), `default = "24h"`, `default = "1h"`, 1)
	good = strings.Replace(good, "allow = []", `allow = ["keys"]`, 1)
	check(t, "write", os.WriteFile(path, []byte(good), 0o600))
	if rec := reload(); rec.Code != http.StatusOK {
		t.Fatalf("good file: %d %s", rec.Code, rec.Body.String())
	}
	if err := c.Keys(ctx, "*").Err(); err != nil {
		t.Fatalf("KEYS after allowing it: %v", err)
	}
	check(t, "HSET", c.HSet(ctx, "session:b", "f", "v").Err())
	ttlNear(t, direct, "session:b", time.Hour)
	if got := metricValue(t, p.Metrics.Registry, "redproxy_policy_reloads_total", "result", "error"); got != 1 {
		t.Errorf("reload errors %v", got)
	}
}

// roundTrip sends cmds in one write (one batch) and reads one reply per
// command, rendered by render.
func roundTrip(t *testing.T, nc net.Conn, cmds ...[]string) []string {
	t.Helper()
	var b []byte
	for _, c := range cmds {
		b = fmt.Appendf(b, "*%d\r\n", len(c))
		for _, a := range c {
			b = fmt.Appendf(b, "$%d\r\n%s\r\n", len(a), a)
		}
	}
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := nc.Write(b); err != nil {
		t.Fatal(err)
	}
	r := readers[nc]
	if r == nil {
		r = bufio.NewReader(nc)
		readers[nc] = r
	}
	out := make([]string, len(cmds))
	for i := range cmds {
		s, err := render(r)
		if err != nil {
			t.Fatalf("reply %d: %v", i, err)
		}
		out[i] = s
	}
	return out
}

// readers keeps one buffered reader per connection (tests are sequential).
var readers = map[net.Conn]*bufio.Reader{}

// render reads one RESP2/RESP3 reply: "+OK", "-ERR ...", ":1", "$value",
// "$(nil)", "*[a b]".
func render(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return "", errors.New("empty line")
	}
	switch line[0] {
	case '+', '-', ':':
		return line, nil
	case '_':
		return "$(nil)", nil
	case '$':
		n, _ := strconv.Atoi(line[1:])
		if n < 0 {
			return "$(nil)", nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return "$" + string(buf[:n]), nil
	case '*', '%', '~':
		n, _ := strconv.Atoi(line[1:])
		if line[0] == '%' {
			n *= 2
		}
		if n < 0 {
			return "*(nil)", nil
		}
		parts := make([]string, n)
		for i := range parts {
			if parts[i], err = render(r); err != nil {
				return "", err
			}
		}
		return "*[" + strings.Join(parts, " ") + "]", nil
	}
	return "", fmt.Errorf("unexpected reply %q", line)
}

func equalReplies(t *testing.T, got, want []string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d replies %q, want %q", len(got), got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("reply %d = %q, want %q", i, got[i], want[i])
		}
	}
}

func reportJSON(t *testing.T, g *guard.Guard) guard.Report {
	t.Helper()
	req := httptest.NewRequest("GET", "/policy/report", nil)
	req.Header.Set("Accept", "application/json")
	rec := httptest.NewRecorder()
	g.ReportHandler().ServeHTTP(rec, req)
	var rep guard.Report
	if err := json.Unmarshal(rec.Body.Bytes(), &rep); err != nil {
		t.Fatalf("report: %v\n%s", err, rec.Body.String())
	}
	return rep
}

func findRow(rep guard.Report, rule, command string) *guard.Row {
	for i := range rep.Rows {
		if rep.Rows[i].Rule == rule && rep.Rows[i].Command == command {
			return &rep.Rows[i]
		}
	}
	return nil
}

// metricValue returns the value of the counter series name{labels...} in
// reg (labels as name, value pairs), or -1 when there is none.
func metricValue(t testing.TB, reg prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	v, found, err := metrics.CounterSum(reg, name, labels...)
	if err != nil {
		t.Fatal(err)
	}
	if !found {
		return -1
	}
	return v
}
