package proxy_test

import (
	"context"
	"crypto/sha1"
	"fmt"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// startClusterProxy starts a 3+3 cluster and a proxy in cluster mode in
// front of it, seeded with every node.
func startClusterProxy(t *testing.T) (*redistest.Cluster, *proxytest.Proxy) {
	t.Helper()
	c := redistest.StartCluster(t, 3, 1)
	p := proxytest.Start(t, c.Nodes[0], func(cfg *config.Config) {
		cfg.Upstream.Mode = config.ModeCluster
		cfg.Upstream.Seeds = c.Seeds()
		// The whole-keyspace fan-outs are tested too.
		cfg.Policy.Commands.Allow = []string{"keys", "flushall", "flushdb"}
	})
	return c, p
}

// TestClusterMode drives one cluster through a plain (non-cluster) go-redis
// client pointed at the proxy: the client must see one ordinary Redis.
func TestClusterMode(t *testing.T) {
	c, p := startClusterProxy(t)
	rc := p.Client(t)
	direct := c.ClusterClient(t)
	ctx := context.Background()

	t.Run("KeysOnEveryNode", func(t *testing.T) {
		for i := range 300 {
			k := fmt.Sprintf("k:%d", i)
			if err := rc.Set(ctx, k, i, 0).Err(); err != nil {
				t.Fatalf("SET %s: %v", k, err)
			}
		}
		// What the proxy wrote is where a cluster client finds it, and
		// the keys spread over every primary.
		for i := range 300 {
			k := fmt.Sprintf("k:%d", i)
			if v, err := direct.Get(ctx, k).Int(); err != nil || v != i {
				t.Fatalf("cluster GET %s = %d, %v", k, v, err)
			}
			if v, err := rc.Get(ctx, k).Int(); err != nil || v != i {
				t.Fatalf("proxy GET %s = %d, %v", k, v, err)
			}
		}
		for _, n := range c.Primaries(t) {
			if size := n.Client(t).DBSize(ctx).Val(); size == 0 {
				t.Errorf("primary %s holds no key", n.Addr())
			}
		}
	})

	t.Run("DataTypes", func(t *testing.T) {
		checks := []struct {
			cmd  []any
			want string
		}{
			{[]any{"HSET", "h", "f", "v"}, "1"},
			{[]any{"HGET", "h", "f"}, "v"},
			{[]any{"RPUSH", "l", "a", "b"}, "2"},
			{[]any{"LRANGE", "l", 0, -1}, "[a b]"},
			{[]any{"SADD", "s", "x"}, "1"},
			{[]any{"SISMEMBER", "s", "x"}, "1"},
			{[]any{"ZADD", "z", 1, "m"}, "1"},
			{[]any{"ZSCORE", "z", "m"}, "1"},
			{[]any{"PFADD", "hll", "a"}, "1"},
			{[]any{"SETBIT", "bits", 7, 1}, "0"},
			{[]any{"BITCOUNT", "bits"}, "1"},
			{[]any{"GEOADD", "g", 13.36, 38.11, "pal"}, "1"},
			{[]any{"XLEN", "x"}, "0"},
			{[]any{"INCRBY", "counter", 5}, "5"},
			{[]any{"TYPE", "z"}, "zset"},
			{[]any{"OBJECT", "ENCODING", "counter"}, "int"},
		}
		for _, ck := range checks {
			v, err := rc.Do(ctx, ck.cmd...).Result()
			if got := fmt.Sprint(v); err != nil || got != ck.want {
				t.Errorf("%v = %v, %v; want %s", ck.cmd, v, err, ck.want)
			}
		}
		if _, err := rc.XAdd(ctx, &redis.XAddArgs{Stream: "x", Values: []string{"a", "1"}}).Result(); err != nil {
			t.Fatal(err)
		}
		if n := direct.XLen(ctx, "x").Val(); n != 1 {
			t.Fatalf("XLEN = %d", n)
		}
	})

	t.Run("MultiKeySplit", func(t *testing.T) {
		keys := []string{"m:1", "m:2", "m:3", "m:4", "m:5", "m:6"}
		if err := rc.MSet(ctx, "m:1", "a", "m:2", "b", "m:3", "c", "m:5", "e").Err(); err != nil {
			t.Fatal(err)
		}
		vals, err := rc.MGet(ctx, append(keys, "m:1")...).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(vals); got != "[a b c <nil> e <nil> a]" {
			t.Fatalf("MGET = %s", got)
		}
		if n := rc.Exists(ctx, "m:1", "m:2", "m:4", "m:1").Val(); n != 3 {
			t.Fatalf("EXISTS = %d, want 3", n)
		}
		if n := rc.Touch(ctx, keys...).Val(); n != 4 {
			t.Fatalf("TOUCH = %d, want 4", n)
		}
		if n := rc.Del(ctx, "m:1", "m:4", "m:2").Val(); n != 2 {
			t.Fatalf("DEL = %d, want 2", n)
		}
		if n := rc.Unlink(ctx, "m:3", "m:5", "m:6").Val(); n != 2 {
			t.Fatalf("UNLINK = %d, want 2", n)
		}
		if n := direct.Exists(ctx, keys...).Val(); n != 0 {
			t.Fatalf("%d keys left after DEL and UNLINK", n)
		}
		// A wrong argument count is Redis's own error, not a split.
		err = rc.Do(ctx, "MSET", "m:1", "a", "m:2").Err()
		if err == nil || !strings.Contains(err.Error(), "wrong number of arguments") {
			t.Fatalf("MSET with odd arguments: %v", err)
		}
	})

	t.Run("HashTagsAndCrossSlot", func(t *testing.T) {
		if err := rc.MSet(ctx, "{u1}a", "1", "{u1}b", "2").Err(); err != nil {
			t.Fatal(err)
		}
		if err := rc.SAdd(ctx, "{u1}s1", "x", "y").Err(); err != nil {
			t.Fatal(err)
		}
		if err := rc.SAdd(ctx, "{u1}s2", "z").Err(); err != nil {
			t.Fatal(err)
		}
		if n := rc.SUnionStore(ctx, "{u1}dst", "{u1}s1", "{u1}s2").Val(); n != 3 {
			t.Fatalf("SUNIONSTORE in one slot = %d", n)
		}
		if err := rc.Rename(ctx, "{u1}a", "{u1}c").Err(); err != nil {
			t.Fatalf("RENAME in one slot: %v", err)
		}
		const crossSlot = "CROSSSLOT Keys in request don't hash to the same slot"
		for _, cmd := range [][]any{
			{"RENAME", "{u1}c", "other"},
			{"SUNIONSTORE", "dst", "{u1}s1", "{u2}s2"},
			{"MSETNX", "a1", "1", "b1", "2"},
			{"EVAL", "return 1", 2, "{u1}a", "{u2}a"},
			{"BLMOVE", "{u1}l", "{u2}l", "LEFT", "RIGHT", 0},
		} {
			err := rc.Do(ctx, cmd...).Err()
			if err == nil || err.Error() != crossSlot {
				t.Errorf("%v: got %v, want %s", cmd, err, crossSlot)
			}
		}
		v, err := rc.Eval(ctx, "return redis.call('GET', KEYS[1]) .. redis.call('GET', KEYS[2])", []string{"{u1}b", "{u1}c"}).Result()
		if err != nil || v != "21" {
			t.Fatalf("EVAL in one slot = %v, %v", v, err)
		}
	})

	t.Run("PipelineOrder", func(t *testing.T) {
		// One batch, many nodes: the replies come back in the order sent.
		pipe := rc.Pipeline()
		var gets []*redis.StringCmd
		var incrs []*redis.IntCmd
		for i := range 200 {
			k := fmt.Sprintf("p:%d", i)
			pipe.Set(ctx, k, i, 0)
			incrs = append(incrs, pipe.Incr(ctx, k))
			gets = append(gets, pipe.Get(ctx, k))
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
		for i := range 200 {
			if incrs[i].Val() != int64(i+1) || gets[i].Val() != fmt.Sprint(i+1) {
				t.Fatalf("key %d: INCR %d GET %q", i, incrs[i].Val(), gets[i].Val())
			}
		}
	})

	t.Run("ProxyAnswered", func(t *testing.T) {
		if err := rc.Do(ctx, "CLUSTER", "INFO").Err(); err == nil || err.Error() != "ERR This instance has cluster support disabled" {
			t.Errorf("CLUSTER INFO: %v", err)
		}
		if err := rc.Do(ctx, "SELECT", 1).Err(); err == nil || err.Error() != "ERR SELECT is not allowed in cluster mode" {
			t.Errorf("SELECT 1: %v", err)
		}
		if err := rc.Do(ctx, "SELECT", 0).Err(); err != nil {
			t.Errorf("SELECT 0: %v", err)
		}
		if v := rc.Ping(ctx).Val(); v != "PONG" {
			t.Errorf("PING = %q", v)
		}
		if v := rc.Echo(ctx, "hi").Val(); v != "hi" {
			t.Errorf("ECHO = %q", v)
		}
		if v := rc.Info(ctx, "server").Val(); !strings.Contains(v, "redis_version") {
			t.Errorf("INFO server = %q", v)
		}
		if err := rc.Do(ctx, "ASKING").Err(); err != nil {
			t.Errorf("ASKING: %v", err)
		}
		// Tracking is per connection and node: refused, with the reason
		// (docs/COMPATIBILITY.md). MONITOR: TestClusterMonitor.
		if err := rc.Do(ctx, "CLIENT", "TRACKING", "ON").Err(); err == nil || !strings.Contains(err.Error(), "CLIENT TRACKING is not supported in cluster mode") {
			t.Errorf("CLIENT TRACKING ON: %v", err)
		}
	})

	t.Run("Scripts", func(t *testing.T) {
		sha, err := rc.ScriptLoad(ctx, "return redis.call('INCR', KEYS[1])").Result()
		if err != nil {
			t.Fatal(err)
		}
		// Loaded on every primary: EVALSHA works whatever node the key
		// lives on.
		for i := range 20 {
			if err := rc.EvalSha(ctx, sha, []string{fmt.Sprintf("sc:%d", i)}).Err(); err != nil {
				t.Fatalf("EVALSHA on sc:%d: %v", i, err)
			}
		}
		if ex := rc.ScriptExists(ctx, sha, "0000000000000000000000000000000000000000").Val(); fmt.Sprint(ex) != "[true false]" {
			t.Fatalf("SCRIPT EXISTS = %v", ex)
		}
		// A primary that lost its scripts (as a promoted replica or a new
		// node may lack them): the proxy loads the script there on NOSCRIPT.
		for _, n := range c.Primaries(t) {
			if err := n.Client(t).ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		for i := range 20 {
			if v, err := rc.EvalSha(ctx, sha, []string{fmt.Sprintf("sc:%d", i)}).Result(); err != nil || fmt.Sprint(v) != "2" {
				t.Fatalf("EVALSHA on sc:%d after the nodes lost their scripts = %v, %v", i, v, err)
			}
		}
		// A script seen only in an EVAL on one node runs by SHA on all.
		body := "return 'e' .. KEYS[1]"
		if err := rc.Eval(ctx, body, []string{"sc:0"}).Err(); err != nil {
			t.Fatal(err)
		}
		esha := fmt.Sprintf("%x", sha1.Sum([]byte(body)))
		for i := range 20 {
			k := fmt.Sprintf("sc:%d", i)
			if v, err := rc.EvalSha(ctx, esha, []string{k}).Result(); err != nil || v != "e"+k {
				t.Fatalf("EVALSHA of an EVAL'd script on %s = %v, %v", k, v, err)
			}
		}
		// A SHA the proxy never saw stays Redis's NOSCRIPT.
		if err := rc.EvalSha(ctx, "ffffffffffffffffffffffffffffffffffffffff", []string{"sc:1"}).Err(); err == nil || !strings.HasPrefix(err.Error(), "NOSCRIPT") {
			t.Fatalf("EVALSHA of an unknown script: %v", err)
		}
		lib := "#!lua name=clib\nredis.register_function('cget', function(keys) return redis.call('GET', keys[1]) end)"
		if err := rc.FunctionLoadReplace(ctx, lib).Err(); err != nil {
			t.Fatal(err)
		}
		for i := range 20 {
			if v, err := rc.FCall(ctx, "cget", []string{fmt.Sprintf("sc:%d", i)}).Result(); err != nil || fmt.Sprint(v) != "2" {
				t.Fatalf("FCALL on sc:%d = %v, %v", i, v, err)
			}
		}
	})

	t.Run("WholeKeyspace", func(t *testing.T) {
		if err := rc.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		const n = 10000
		pipe := rc.Pipeline()
		for i := range n {
			pipe.Set(ctx, fmt.Sprintf("scan:%d", i), i, 0)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
		for _, node := range c.Primaries(t) {
			if node.Client(t).DBSize(ctx).Val() == 0 {
				t.Fatalf("primary %s holds none of the keys", node.Addr())
			}
		}
		if size := rc.DBSize(ctx).Val(); size != n {
			t.Fatalf("DBSIZE = %d, want %d", size, n)
		}
		if k := rc.RandomKey(ctx).Val(); !strings.HasPrefix(k, "scan:") {
			t.Fatalf("RANDOMKEY = %q", k)
		}
		if keys := rc.Keys(ctx, "scan:99*").Val(); len(keys) != 111 {
			t.Fatalf("KEYS scan:99* found %d, want 111", len(keys))
		}
		seen := make(map[string]int, n)
		var cursor uint64
		calls := 0
		for {
			keys, next, err := rc.Scan(ctx, cursor, "scan:*", 500).Result()
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range keys {
				seen[k]++
			}
			calls++
			if cursor = next; cursor == 0 {
				break
			}
			if calls > n {
				t.Fatal("SCAN never ended")
			}
		}
		if len(seen) != n {
			t.Fatalf("SCAN returned %d distinct keys, want %d", len(seen), n)
		}
		for k, times := range seen {
			if times != 1 {
				t.Fatalf("SCAN returned %s %d times", k, times)
			}
		}
		for _, c := range []string{"notanumber", " 0", "18446744073709551616"} {
			if err := rc.Do(ctx, "SCAN", c).Err(); err == nil || err.Error() != "ERR invalid cursor" {
				t.Fatalf("SCAN %q: %v; want Redis's ERR invalid cursor", c, err)
			}
		}
		// Cursors Redis reads with strtoul: "+0" is 0, so a whole walk
		// from it; "-1" is 2^64-1, a made-up cursor whose walk ends.
		plus := 0
		for cursor, calls := "+0", 0; ; calls++ {
			page, err := rc.Do(ctx, "SCAN", cursor, "MATCH", "scan:*", "COUNT", 500).Slice()
			if err != nil || len(page) != 2 || calls > n {
				t.Fatalf("SCAN %s = %v, %v after %d calls", cursor, page, err, calls)
			}
			plus += len(page[1].([]any))
			if cursor = page[0].(string); cursor == "0" {
				break
			}
		}
		if plus < n {
			t.Fatalf("SCAN from +0 returned %d keys, want %d", plus, n)
		}
		for cursor, calls := "-1", 0; cursor != "0"; calls++ {
			page, err := rc.Do(ctx, "SCAN", cursor).Slice()
			if err != nil || len(page) != 2 || calls > n {
				t.Fatalf("SCAN %s = %v, %v after %d calls", cursor, page, err, calls)
			}
			cursor = page[0].(string)
		}
		if err := rc.FlushDB(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if size := rc.DBSize(ctx).Val(); size != 0 {
			t.Fatalf("DBSIZE after FLUSHDB = %d", size)
		}
		if k, err := rc.RandomKey(ctx).Result(); err != redis.Nil {
			t.Fatalf("RANDOMKEY on an empty cluster = %q, %v", k, err)
		}
	})
}
