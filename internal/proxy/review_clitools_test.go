package proxy_test

// The operator tools platform engineers reach for first, redis-cli and
// redis-benchmark (7.0), run against Redis directly and through the proxy
// with the same data, and the outcomes compared.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// cliAt runs redis-cli against addr with stdin (if not nil) and returns its
// combined output, trimmed, and its exit code (-1 if it did not exit by
// itself within 10 s, in which case it is killed).
func cliAt(t *testing.T, addr string, stdin []byte, args ...string) (string, int) {
	t.Helper()
	bin, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Skip("redis-cli not installed (Debian/Ubuntu: apt-get install redis-tools)")
	}
	cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	host, port, _ := strings.Cut(addr, ":")
	cmd := exec.CommandContext(cctx, bin, append([]string{"-h", host, "-p", port}, args...)...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	code := 0
	if cctx.Err() != nil {
		code = -1
	} else if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("redis-cli %v: %v", args, err)
	}
	return strings.TrimSpace(string(out)), code
}

// clientCount is the number of connections Redis has, and how many of them
// are in MONITOR mode.
func clientCount(t testing.TB, direct *redis.Client) (all, monitors int) {
	t.Helper()
	list, err := direct.ClientList(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(list), "\n") {
		all++
		for _, f := range strings.Fields(line) {
			if strings.HasPrefix(f, "flags=") && strings.Contains(f, "O") {
				monitors++
			}
		}
	}
	return all, monitors
}

// TestReviewCLILdbDoesNotCommitScriptWrites: `redis-cli --ldb --eval` is how
// an operator steps through a script without touching the data: Redis runs
// it in a forked debugging session and rolls every write back ("Lua
// debugging session ended -- dataset changes rolled back"). redis-cli
// sends SCRIPT DEBUG YES first and ignores its reply, so the proxy's
// refusal of SCRIPT DEBUG (docs/COMPATIBILITY.md, "Scripting") never
// reaches the operator: redis-cli prints "Lua debugging session started",
// and the EVAL that follows runs for real on a shared connection, keeping
// its writes; each "restart" typed in the debugger runs it again, for real.
func TestReviewCLILdbDoesNotCommitScriptWrites(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	direct := p.Redis.Client(t)
	script := filepath.Join(t.TempDir(), "debug-me.lua")
	if err := os.WriteFile(script, []byte("redis.call('set', KEYS[1], ARGV[1])\nreturn redis.call('get', KEYS[1])\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	// Control: against Redis the debugging session leaves nothing behind.
	out, code := cliAt(t, p.Redis.Addr(), []byte("continue\n"), "--ldb", "--eval", script, "ldb:direct", ",", "v")
	if code != 0 || !strings.Contains(out, "dataset changes rolled back") {
		t.Fatalf("redis-cli --ldb against Redis: exit %d\n%s", code, out)
	}
	if n := direct.Exists(ctx, "ldb:direct").Val(); n != 0 {
		t.Fatalf("against Redis the debugged script's write was kept")
	}

	out, code = cliAt(t, p.Addr, []byte("continue\n"), "--ldb", "--eval", script, "ldb:proxy", ",", "v")
	if n := direct.Exists(ctx, "ldb:proxy").Val(); n != 0 {
		t.Errorf("redis-cli --ldb through the proxy ran the script for real: its write of ldb:proxy is in Redis "+
			"(Redis rolls a debugging session's writes back), and redis-cli (exit %d) said:\n%s", code, out)
	}
	// "restart" in the debugger runs the script again: for real, each time.
	incr := filepath.Join(t.TempDir(), "incr.lua")
	if err := os.WriteFile(incr, []byte("return redis.call('incr', KEYS[1])\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, code = cliAt(t, p.Addr, []byte("restart\nrestart\n"), "--ldb", "--eval", incr, "ldb:count")
	if n := direct.Exists(ctx, "ldb:count").Val(); n != 0 {
		t.Errorf("redis-cli --ldb through the proxy, \"restart\" twice: ldb:count = %s in Redis (exit %d):\n%s",
			direct.Get(ctx, "ldb:count").Val(), code, out)
	}
	if got := p.Client(t).Ping(ctx).Val(); got != "PONG" {
		t.Errorf("PING through the proxy after --ldb = %q", got)
	}
}

// TestReviewCLIToolsMatchRedis runs redis-cli's keyspace tools and its
// everyday options against Redis and through the proxy (default
// configuration) on the same data, and compares what they print.
func TestReviewCLIToolsMatchRedis(t *testing.T) {
	rs := redistest.Start(t, "--maxmemory-policy", "allkeys-lfu", "--lfu-decay-time", "0")
	p := proxytest.Start(t, rs, nil)
	direct := rs.Client(t)
	pipe := direct.Pipeline()
	for i := range 150 {
		pipe.Set(ctx, "seed:str:"+strconv.Itoa(i), strings.Repeat("x", i+1), 0)
	}
	pipe.RPush(ctx, "seed:list", 1, 2, 3, 4, 5)
	pipe.HSet(ctx, "seed:hash", "a", "1", "b", "2")
	pipe.SAdd(ctx, "seed:set", "a", "b", "c")
	pipe.ZAdd(ctx, "seed:zset", redis.Z{Score: 1, Member: "a"}, redis.Z{Score: 2, Member: "b"})
	pipe.XAdd(ctx, &redis.XAddArgs{Stream: "seed:stream", Values: []string{"f", "v"}})
	pipe.Set(ctx, "seed:hot", "h", 0)
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	pipe = direct.Pipeline()
	for range 3000 {
		pipe.Get(ctx, "seed:hot")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}

	same := func(t *testing.T, args ...string) string {
		t.Helper()
		want, wcode := cliAt(t, rs.Addr(), nil, args...)
		got, gcode := cliAt(t, p.Addr, nil, args...)
		if got != want || gcode != wcode {
			t.Errorf("redis-cli %v\nthrough the proxy (exit %d):\n%s\nagainst Redis (exit %d):\n%s", args, gcode, got, wcode, want)
		}
		return got
	}
	sortedLines := func(s string) []string {
		l := strings.Split(s, "\n")
		slices.Sort(l)
		return l
	}

	t.Run("scan", func(t *testing.T) {
		for _, args := range [][]string{{"--scan"}, {"--scan", "--pattern", "seed:str:1*"}, {"-i", "0.01", "--scan", "--pattern", "seed:*"}} {
			want, _ := cliAt(t, rs.Addr(), nil, args...)
			got, code := cliAt(t, p.Addr, nil, args...)
			if code != 0 || !slices.Equal(sortedLines(got), sortedLines(want)) {
				t.Errorf("redis-cli %v through the proxy (exit %d): %d keys, against Redis %d", args, code, len(sortedLines(got)), len(sortedLines(want)))
			}
		}
		if got, _ := cliAt(t, p.Addr, nil, "--scan", "--pattern", "seed:str:1?"); len(strings.Fields(got)) != 10 {
			t.Errorf("--scan --pattern seed:str:1? = %q, want 10 keys", got)
		}
	})
	// --hotkeys first: --bigkeys's STRLEN/LLEN... count as accesses for LFU.
	t.Run("hotkeys", func(t *testing.T) {
		out := same(t, "--hotkeys")
		if !strings.Contains(out, `keyname: "seed:hot"`) {
			t.Errorf("--hotkeys does not name seed:hot:\n%s", out)
		}
	})
	t.Run("memkeys", func(t *testing.T) {
		if out := same(t, "--memkeys"); !strings.Contains(out, `Biggest stream found '"seed:stream"' has`) || !strings.Contains(out, "Sampled 156 keys in the keyspace!") {
			t.Errorf("--memkeys summary:\n%s", out)
		}
	})
	t.Run("bigkeys", func(t *testing.T) {
		out := same(t, "--bigkeys")
		for _, want := range []string{`Biggest string found '"seed:str:149"' has 150 bytes`, `Biggest   list found '"seed:list"' has 5 items`, "Sampled 156 keys in the keyspace!"} {
			if !strings.Contains(out, want) {
				t.Errorf("--bigkeys lacks %q:\n%s", want, out)
			}
		}
	})

	// Everyday options: the same invocation with keys under "d:" against
	// Redis and under "p:" through the proxy must print the same.
	script := filepath.Join(t.TempDir(), "s.lua")
	if err := os.WriteFile(script, []byte("redis.call('set', KEYS[1], ARGV[1])\nreturn {KEYS[1], ARGV[2], redis.call('get', KEYS[1]), #KEYS, #ARGV}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// --pipe's input: RESP, built for each prefix (the lengths change).
	pipeProto := func(prefix string) []byte {
		var b bytes.Buffer
		for _, c := range [][]string{{"SET", prefix + ":pipe", "v"}, {"RPUSH", prefix + ":pl", "a", "b"}, {"INCR", prefix + ":pipe"}} {
			fmt.Fprintf(&b, "*%d\r\n", len(c))
			for _, a := range c {
				fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
			}
		}
		return b.Bytes()
	}
	for _, tc := range []struct {
		stdin string
		args  []string
	}{
		{"", []string{"-r", "3", "-i", "0.05", "INCR", "{k}:r"}},
		{"value from\nstdin \x00 bytes", []string{"-x", "SET", "{k}:x"}},
		{"", []string{"--no-raw", "GET", "{k}:x"}},
		{"", []string{"--eval", script, "{k}:e1", "{k}:e2", ",", "a1", "a2"}},
		{"", []string{"HSET", "{k}:h", "f1", "1", "f2", "2"}},
		{"", []string{"-3", "HGETALL", "{k}:h"}},
		{"", []string{"-3", "--no-raw", "HGETALL", "{k}:h"}},
		{"", []string{"-3", "--csv", "HGETALL", "{k}:h"}},
		{"", []string{"RPUSH", "{k}:l", "a", "b,c", `d"e`}},
		{"", []string{"--csv", "LRANGE", "{k}:l", "0", "-1"}},
		{"", []string{"-e", "INCR", "{k}:h"}},
		{"SET {k}:n2 two\nGET {k}:n2\nSELECT 0\nGET {k}:n2\nSELECT 2\nINCR {k}:n2c\n", []string{"-n", "2"}},
		{"MULTI\nSET {k}:t 1\nINCR {k}:t\nEXEC\nWATCH {k}:t\nUNWATCH\nCLIENT SETNAME cli\nCLIENT GETNAME\nECHO hi\nSELECT 3\nSET {k}:s3 x\nGET {k}:s3\nNOSUCH\nPING\n", nil},
		{"<pipe>", []string{"-n", "5", "--pipe"}},
		{"", []string{"-n", "5", "LRANGE", "{k}:pl", "0", "-1"}},
	} {
		run := func(addr, prefix string) (string, int) {
			args := make([]string, len(tc.args))
			for i, a := range tc.args {
				args[i] = strings.ReplaceAll(a, "{k}", prefix)
			}
			var stdin []byte
			if tc.stdin == "<pipe>" {
				stdin = pipeProto(prefix)
			} else if tc.stdin != "" {
				stdin = []byte(strings.ReplaceAll(tc.stdin, "{k}", prefix))
			}
			out, code := cliAt(t, addr, stdin, args...)
			return strings.ReplaceAll(out, prefix+":", "K:"), code
		}
		want, wcode := run(rs.Addr(), "d")
		got, gcode := run(p.Addr, "p")
		if got != want || gcode != wcode {
			t.Errorf("redis-cli %q <<< %q\nthrough the proxy (exit %d):\n%s\nagainst Redis (exit %d):\n%s", tc.args, tc.stdin, gcode, got, wcode, want)
		}
	}
	if got := rs.ClientDB(t, 2).Get(ctx, "p:n2").Val(); got != "two" {
		t.Errorf("redis-cli -n 2 stdin SET landed elsewhere: DB 2 p:n2 = %q", got)
	}
	if got := rs.ClientDB(t, 5).LLen(ctx, "p:pl").Val(); got != 2 {
		t.Errorf("redis-cli -n 5 --pipe: DB 5 p:pl has %d elements", got)
	}
}

// TestReviewCLIReplicationToolsRefused: --rdb, --replica and
// --functions-rdb get the proxy's refusal naming the reason, exit at once
// with status 1, and the proxy keeps serving.
func TestReviewCLIReplicationToolsRefused(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	dir := t.TempDir()
	for _, args := range [][]string{
		{"--rdb", filepath.Join(dir, "dump.rdb")},
		{"--functions-rdb", filepath.Join(dir, "functions.rdb")},
		{"--replica"},
	} {
		start := time.Now()
		out, code := cliAt(t, p.Addr, nil, args...)
		if code != 1 || !strings.Contains(out, "SYNC with master failed: -ERR redproxy: SYNC is for replicas, which must connect to Redis itself, not through the proxy") &&
			!strings.Contains(out, "REPLCONF rdb-filter-only error: ERR redproxy: REPLCONF is for replicas") {
			t.Errorf("redis-cli %v: exit %d after %v:\n%s", args, code, time.Since(start), out)
		}
		if _, err := os.Stat(filepath.Join(dir, "dump.rdb")); err == nil {
			t.Errorf("redis-cli %v wrote an RDB file", args)
		}
	}
	if out, code := cliAt(t, p.Addr, nil, "PING"); out != "PONG" || code != 0 {
		t.Errorf("PING after the refusals = %q (exit %d)", out, code)
	}
}

// TestReviewCLIMonitorAndSubscribeKilled: redis-cli in MONITOR and SUBSCRIBE
// mode shows what it would against Redis, and once killed (Ctrl-C), the
// relayed connection it held on Redis is gone: no subscriber left, no
// monitor left, Redis's client count back where it was.
func TestReviewCLIMonitorAndSubscribeKilled(t *testing.T) {
	bin, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Skip("redis-cli not installed")
	}
	p := proxytest.Start(t, nil, nil)
	direct := p.Redis.Client(t)
	c := p.Client(t)
	c.Ping(ctx)
	before, _ := clientCount(t, direct)
	host, port, _ := strings.Cut(p.Addr, ":")

	start := func(args ...string) (*exec.Cmd, *bufio.Reader) {
		cmd := exec.Command(bin, append([]string{"-h", host, "-p", port}, args...)...)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = cmd.Stdout
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd, bufio.NewReader(out)
	}
	readUntil := func(rd *bufio.Reader, want string) string {
		t.Helper()
		got := make(chan string, 1)
		go func() {
			var seen strings.Builder
			for {
				line, err := rd.ReadString('\n')
				seen.WriteString(line)
				if strings.Contains(line, want) || err != nil {
					got <- seen.String()
					return
				}
			}
		}()
		select {
		case s := <-got:
			if !strings.Contains(s, want) {
				t.Fatalf("redis-cli output ended without %q:\n%s", want, s)
			}
			return s
		case <-time.After(5 * time.Second):
			t.Fatalf("redis-cli printed no %q within 5s", want)
		}
		return ""
	}

	sub, subOut := start("SUBSCRIBE", "review:ch")
	readUntil(subOut, "review:ch")
	if n := c.Publish(ctx, "review:ch", "hello").Val(); n != 1 {
		t.Errorf("PUBLISH through the proxy reached %d subscribers", n)
	}
	if s := readUntil(subOut, "hello"); !strings.Contains(s, "message\nreview:ch\nhello") {
		t.Errorf("subscriber printed %q", s)
	}

	mon, monOut := start("MONITOR")
	readUntil(monOut, "OK")
	c.Set(ctx, "review:mon", "1", 0)
	readUntil(monOut, `"set" "review:mon" "1"`)
	if _, monitors := clientCount(t, direct); monitors != 1 {
		t.Errorf("%d monitors on Redis while redis-cli MONITOR runs", monitors)
	}

	for _, cmd := range []*exec.Cmd{sub, mon} {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
	}
	redistest.Eventually(t, 3*time.Second, func() bool {
		all, monitors := clientCount(t, direct)
		return all == before && monitors == 0 && direct.PubSubNumSub(ctx, "review:ch").Val()["review:ch"] == 0
	}, "after redis-cli SUBSCRIBE and MONITOR were interrupted, Redis still has their connections")
	if got := c.Get(ctx, "review:mon").Val(); got != "1" {
		t.Errorf("GET through the proxy afterwards = %q", got)
	}
}

// TestReviewCLIUsers: redis-cli's --user/--pass, -a, -u and
// --no-auth-warning print the same through a proxy with [[users]] as
// against a Redis with the same ACL users.
func TestReviewCLIUsers(t *testing.T) {
	// The same users on a Redis of their own (the proxy's Redis keeps its
	// default user open to the proxy).
	rs := redistest.Start(t)
	admin := rs.Client(t)
	for _, cmd := range [][]any{{"SET", "u:k", "v"}, {"ACL", "SETUSER", "app", "on", ">app-pass", "+@all", "~*"}, {"CONFIG", "SET", "requirepass", "dflt-pass"}} {
		if err := admin.Do(ctx, cmd...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	p := proxytest.Start(t, nil, func(c *config.Config) {
		c.Users = []auth.UserConfig{user("app", "app-pass", "+@all ~*"), user("default", "dflt-pass", "+@all ~*")}
	})
	if err := p.Redis.Client(t).Set(ctx, "u:k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"--user", "app", "--pass", "app-pass", "GET", "u:k"},
		{"--user", "app", "--pass", "app-pass", "--no-auth-warning", "GET", "u:k"},
		{"--user", "app", "--pass", "wrong", "GET", "u:k"},
		{"--user", "nosuch", "--pass", "x", "--no-auth-warning", "PING"},
		{"-a", "dflt-pass", "GET", "u:k"},
		{"-a", "dflt-pass", "--no-auth-warning", "-3", "GET", "u:k"},
		{"-a", "wrong", "--no-auth-warning", "PING"},
		{"PING"},
		{"--user", "app", "--pass", "app-pass", "--no-auth-warning", "--scan", "--pattern", "u:*"},
	} {
		want, wcode := cliAt(t, rs.Addr(), nil, args...)
		got, gcode := cliAt(t, p.Addr, nil, args...)
		if got != want || gcode != wcode {
			t.Errorf("redis-cli %v\nthrough the proxy (exit %d):\n%s\nagainst Redis (exit %d):\n%s", args, gcode, got, wcode, want)
		}
	}
	for _, uri := range []string{"redis://app:app-pass@%s/0", "redis://default:dflt-pass@%s/0", "redis://:wrong@%s"} {
		want, wcode := cliAt(t, rs.Addr(), nil, "--no-auth-warning", "-u", fmt.Sprintf(uri, rs.Addr()), "GET", "u:k")
		got, gcode := cliAt(t, p.Addr, nil, "--no-auth-warning", "-u", fmt.Sprintf(uri, p.Addr), "GET", "u:k")
		if got != want || gcode != wcode {
			t.Errorf("redis-cli -u %s\nthrough the proxy (exit %d):\n%s\nagainst Redis (exit %d):\n%s", uri, gcode, got, wcode, want)
		}
	}
}

// TestReviewBenchmarkVariants runs redis-benchmark's options beyond the
// default suite through the proxy and checks what they left in Redis.
func TestReviewBenchmarkVariants(t *testing.T) {
	bin, err := exec.LookPath("redis-benchmark")
	if err != nil {
		t.Skip("redis-benchmark not installed")
	}
	p := proxytest.Start(t, nil, nil)
	host, port, _ := strings.Cut(p.Addr, ":")
	direct := p.Redis.Client(t)
	bench := func(args ...string) string {
		t.Helper()
		defer func(start time.Time) { t.Logf("redis-benchmark %v: %v", args, time.Since(start)) }(time.Now())
		cmd := exec.Command(bin, append([]string{"-h", host, "-p", port, "-q"}, args...)...)
		out, err := cmd.CombinedOutput()
		text := strings.ReplaceAll(string(out), "\r", "\n")
		if err != nil || strings.Contains(text, "rror") {
			t.Errorf("redis-benchmark %v: %v\n%s", args, err, text)
		}
		return text
	}
	// Custom commands: every request ran once.
	bench("-n", "2000", "-r", "1000", "lpush", "bench:list", "__rand_int__")
	if n := direct.LLen(ctx, "bench:list").Val(); n != 2000 {
		t.Errorf("LLEN bench:list = %d, want 2000", n)
	}
	bench("-n", "2000", "-r", "1000", "eval", "return redis.call('incr', KEYS[1])", "1", "bench:k:__rand_int__")
	sum := 0
	for _, k := range direct.Keys(ctx, "bench:k:*").Val() {
		n, _ := direct.Get(ctx, k).Int()
		sum += n
	}
	if sum != 2000 {
		t.Errorf("the eval benchmark's INCRs add up to %d, want 2000", sum)
	}
	// -P 100: pipelined INCRs, each counted.
	bench("-P", "100", "-n", "5000", "-t", "incr")
	if n, _ := direct.Get(ctx, "counter:__rand_int__").Int(); n != 5000 {
		t.Errorf("counter after -P 100 -n 5000 INCR = %d", n)
	}
	// --dbnum 3: everything in DB 3.
	before := direct.DBSize(ctx).Val()
	bench("--dbnum", "3", "-n", "500", "-t", "set,lpush")
	db3 := p.Redis.ClientDB(t, 3)
	if n := db3.LLen(ctx, "mylist").Val(); n != 500 || db3.Exists(ctx, "key:__rand_int__").Val() != 1 || direct.DBSize(ctx).Val() != before {
		t.Errorf("--dbnum 3: DB 3 mylist has %d, DB 0 went from %d to %d keys", n, before, direct.DBSize(ctx).Val())
	}
	// -d 100000: the values arrive whole.
	bench("-d", "100000", "-n", "100", "-c", "10", "-t", "set,get")
	if n := direct.StrLen(ctx, "key:__rand_int__").Val(); n != 100000 {
		t.Errorf("STRLEN after -d 100000 = %d", n)
	}
	// Connection churn, threads, many clients, CSV.
	bench("-k", "0", "-c", "10", "-n", "500", "-t", "set,get")
	bench("--threads", "2", "-c", "20", "-n", "1000", "-t", "set,get")
	bench("-c", "500", "-n", "1000", "-t", "get")
	if out := bench("--csv", "-n", "500", "-t", "get"); !strings.Contains(out, `"test","rps","avg_latency_ms"`) || !strings.Contains(out, `"GET","`) {
		t.Errorf("--csv:\n%s", out)
	}
	redistest.Eventually(t, 3*time.Second, func() bool { return p.Clients() == 0 }, "the proxy still counts %d clients after the benchmarks", p.Clients())
}
