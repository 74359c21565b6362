package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/audit"
	"github.com/redproxy/redproxy/internal/redistest"
)

var ctx = context.Background()

const examplePath = "../../config.example.toml"

// seedAudit writes a keyspace with known violations of config.example.toml's
// policy among keys that follow it.
func seedAudit(t *testing.T, c *redis.Client) {
	t.Helper()
	pipe := c.Pipeline()
	for i := range 300 {
		pipe.Set(ctx, fmt.Sprintf("product:%d", i), "{}", time.Hour)
		pipe.Set(ctx, fmt.Sprintf("session:ok%d", i), "{}", 24*time.Hour)
	}
	pipe.XAdd(ctx, &redis.XAddArgs{Stream: "events:orders", Values: []any{"a", "1"}}) // exempt from TTLs
	for i := range 5 {
		pipe.HSet(ctx, fmt.Sprintf("session:lost%d", i), "f", "v") // no TTL: rule session:*
	}
	for i := range 2 {
		pipe.Set(ctx, fmt.Sprintf("cache:app:v1:%d", i), "v", 2*time.Hour) // over cache:* max 15m
	}
	for i := range 3 {
		pipe.Set(ctx, fmt.Sprintf("legacy%d", i), "v", time.Hour) // no namespace
	}
	pipe.Set(ctx, "cache:product:1", "v", time.Minute)                    // no version segment
	pipe.Set(ctx, "product:big", strings.Repeat("x", 300<<10), time.Hour) // big
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestAuditCommand(t *testing.T) {
	rs := redistest.Start(t)
	direct := rs.Client(t)
	seedAudit(t, direct)

	var stdout, stderr bytes.Buffer
	code := runAudit([]string{"--upstream", rs.Addr(), "--config", examplePath, "--json", "--count", "50", "--pause", "0"}, &stdout, &stderr)
	if code != auditViolations {
		t.Fatalf("exit %d, stderr %s", code, stderr.String())
	}
	if stderr.Len() != 0 {
		t.Errorf("progress written to a non-terminal: %q", stderr.String())
	}
	var rep audit.Report
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("%v\n%s", err, stdout.String())
	}
	if rep.Keys != 613 || !rep.Complete || rep.NoTTL.Count != 6 {
		t.Errorf("keys %d complete %v no-TTL %d", rep.Keys, rep.Complete, rep.NoTTL.Count)
	}
	got := map[string]int64{}
	for _, f := range append(rep.TTL, rep.Names...) {
		got[f.Rule+" "+f.Pattern] = f.Count
	}
	want := map[string]int64{"ttl session:*": 5, "ttl_max cache:*": 2, "namespaces ": 3, "require_version cache:*": 1}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("findings %v, want %v", got, want)
	}
	if rep.BigKeys.Count != 1 || rep.BigKeys.Examples[0].Key != "product:big" {
		t.Errorf("big keys %+v", rep.BigKeys)
	}

	// The text table, big-key detection off.
	stdout.Reset()
	code = runAudit([]string{"--upstream", rs.Addr(), "--config", examplePath, "--skip-memory"}, &stdout, &stderr)
	if code != auditViolations || !strings.Contains(stdout.String(), "redproxy audit: 613 keys scanned") ||
		!strings.Contains(stdout.String(), "ttl session:*") || !strings.Contains(stdout.String(), "not checked") {
		t.Errorf("text: exit %d\n%s", code, stdout.String())
	}

	// Without --config there are no rules: keys without TTL are listed but
	// are not findings; a lower big-key threshold is.
	stdout.Reset()
	if code := runAudit([]string{"--upstream", rs.Addr()}, &stdout, &stderr); code != auditViolations {
		t.Errorf("no config, big key: exit %d\n%s", code, stdout.String())
	}
	check(t, direct.Del(ctx, "product:big").Err())
	if code := runAudit([]string{"--upstream", rs.Addr(), "--json"}, io.Discard, &stderr); code != auditClean {
		t.Errorf("no config, no big key: exit %d", code)
	}
	if code := runAudit([]string{"--upstream", rs.Addr(), "--big-bytes", "1KB"}, io.Discard, &stderr); code != auditViolations {
		t.Errorf("--big-bytes 1KB: exit %d", code)
	}

	// A clean keyspace under the example policy.
	check(t, direct.FlushAll(ctx).Err())
	check(t, direct.Set(ctx, "session:1", "v", time.Hour).Err())
	if code := runAudit([]string{"--upstream", rs.Addr(), "--config", examplePath}, io.Discard, &stderr); code != auditClean {
		t.Errorf("clean keyspace: exit %d, %s", code, stderr.String())
	}

	// Usage and connection errors.
	for _, args := range [][]string{
		{},
		{"--upstream", "127.0.0.1:1"},
		{"--upstream", rs.Addr(), "--big-bytes", "lots"},
		{"--upstream", rs.Addr(), "--count", "0"},
		{"--upstream", rs.Addr(), "extra"},
		{"--upstream", rs.Addr(), "--config", "/nonexistent.toml"},
	} {
		stderr.Reset()
		if code := runAudit(args, io.Discard, &stderr); code != auditFailed || stderr.Len() == 0 {
			t.Errorf("%q: exit %d, stderr %q", args, code, stderr.String())
		}
	}
	// Dispatched from run().
	if code := run([]string{"audit", "--upstream", rs.Addr(), "--count", "0"}, io.Discard, io.Discard); code != auditFailed {
		t.Errorf("run audit: exit %d", code)
	}
	if code := run([]string{"--policy-mode", "sometimes"}, io.Discard, io.Discard); code != 2 {
		t.Errorf("bad --policy-mode: exit %d", code)
	}
}

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// binary builds redproxy once for the tests that run it as a process.
func binary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "redproxy-bin")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "redproxy")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}

// TestAuditBinaryExitCodes: the exit status scripts rely on.
func TestAuditBinaryExitCodes(t *testing.T) {
	rs := redistest.Start(t)
	seedAudit(t, rs.Client(t))
	bin := binary(t)
	cmd := exec.Command(bin, "audit", "--upstream", rs.Addr(), "--config", examplePath, "--json")
	out, err := cmd.Output()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !json.Valid(out) {
		t.Fatalf("violations: %v, output %.200s", err, out)
	}
	cmd = exec.Command(bin, "audit", "--upstream", "127.0.0.1:1")
	if err := cmd.Run(); !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Fatalf("unreachable: %v", err)
	}
	// Reached and refused is said as such, not as unreachable (it said
	// "cannot reach" for a database out of range, found by a probe).
	cmd = exec.Command(bin, "audit", "--upstream", rs.Addr(), "--db", "99")
	stderr, err := cmd.CombinedOutput()
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(stderr), "refused the connection: ERR DB index is out of range") {
		t.Fatalf("--db 99: %v, %s", err, stderr)
	}
}

// startProxy runs bin with args (and env, when not nil, as its whole
// environment), waits until it answers PING on listen, and returns the
// process, a client of listen with no retries, and the process's stderr.
// The process is killed when the test ends.
func startProxy(t *testing.T, bin, listen string, env []string, args ...string) (*exec.Cmd, *redis.Client, *redistest.LogBuffer) {
	t.Helper()
	logs := &redistest.LogBuffer{}
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Stderr = logs
	check(t, cmd.Start())
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	c := redis.NewClient(&redis.Options{Addr: listen, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	// The log is read when the wait fails, not when it starts: the child's
	// reason for not answering (a bind error, say) is written meanwhile.
	deadline := time.Now().Add(10 * time.Second)
	for c.Ping(ctx).Err() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("proxy on %s never answered within 10s; log:\n%s", listen, logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return cmd, c, logs
}

// TestSIGHUPReloadsPolicy runs the proxy binary with the example config,
// then changes the file and sends SIGHUP: a valid file takes effect, an
// invalid one is logged and the policy stays. --policy-mode=report caps it.
func TestSIGHUPReloadsPolicy(t *testing.T) {
	rs := redistest.Start(t)
	bin := binary(t)
	listen := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	adminAddr := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	doc := exampleConfig(t, listen, adminAddr, rs.Addr())
	path := filepath.Join(t.TempDir(), "redproxy.toml")
	check(t, os.WriteFile(path, []byte(doc), 0o600))

	cmd, c, logs := startProxy(t, bin, listen, nil, "--config", path)

	keysMsg := "ERR redproxy policy: KEYS is disabled; use SCAN 0 MATCH pattern COUNT 100"
	if err := c.Keys(ctx, "*").Err(); err == nil || err.Error() != keysMsg {
		t.Fatalf("KEYS: %v", err)
	}
	res, err := http.Get("http://" + adminAddr + "/policy/report")
	check(t, err)
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if !strings.Contains(string(body), "1 violations") || !strings.Contains(string(body), "refused=1") {
		t.Fatalf("report:\n%s", body)
	}

	check(t, os.WriteFile(path, []byte(strings.Replace(doc, "allow = []", `allow = ["keys"]`, 1)), 0o600))
	check(t, cmd.Process.Signal(syscall.SIGHUP))
	redistest.Eventually(t, 5*time.Second, func() bool { return c.Keys(ctx, "*").Err() == nil }, "SIGHUP did not reload; log:\n%s", logs)

	check(t, os.WriteFile(path, []byte(doc+"\n[policy.bogus]\n[policy.bogus2]\n"), 0o600))
	check(t, cmd.Process.Signal(syscall.SIGHUP))
	redistest.Eventually(t, 5*time.Second, func() bool { return strings.Count(logs.String(), "configuration not reloaded") == 2 },
		"bad file not reported, a line per problem; log:\n%s", logs)
	if !strings.Contains(logs.String(), path+":") || !strings.Contains(logs.String(), "policy.bogus:") || !strings.Contains(logs.String(), "policy.bogus2:") {
		t.Errorf("log does not say where:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), `\n`) {
		t.Errorf("the problems are joined in one line with escaped newlines:\n%s", logs.String())
	}
	if err := c.Keys(ctx, "*").Err(); err != nil {
		t.Fatalf("a bad file replaced the policy: %v", err)
	}

	check(t, cmd.Process.Signal(syscall.SIGTERM))
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit: %v\n%s", err, logs.String())
	}

	// --policy-mode=report: the same file refuses nothing.
	check(t, os.WriteFile(path, []byte(doc), 0o600))
	_, c, _ = startProxy(t, bin, listen, nil, "--config", path, "--policy-mode=report")
	if err := c.Keys(ctx, "*").Err(); err != nil {
		t.Fatalf("KEYS under --policy-mode=report: %v", err)
	}
}

func check(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// exampleConfig is config.example.toml with the proxy listening on listen
// and adminAddr and, unless redisAddr is "", [upstream] at redisAddr.
func exampleConfig(t *testing.T, listen, adminAddr, redisAddr string) string {
	t.Helper()
	example, err := os.ReadFile(examplePath)
	check(t, err)
	pairs := []string{
		`listen = "127.0.0.1:6380"`, `listen = "` + listen + `"`,
		`admin = "127.0.0.1:9121"`, `admin = "` + adminAddr + `"`,
	}
	if redisAddr != "" {
		pairs = append(pairs, `address = "127.0.0.1:6379"`, `address = "`+redisAddr+`"`)
	}
	return strings.NewReplacer(pairs...).Replace(string(example))
}

// TestAuditNeedsUpstreamOutsideStandalone: without --upstream the audit
// walks upstream.address of --config, which Sentinel and cluster mode do
// not use: it audited a Redis the proxy does not serve (here one the file
// names but ignores), or the default 127.0.0.1:6379 (found by review). It
// now asks for --upstream.
func TestAuditNeedsUpstreamOutsideStandalone(t *testing.T) {
	rs := redistest.Start(t)
	for _, section := range []string{
		fmt.Sprintf("mode = \"sentinel\"\naddress = %q\nsentinels = [\"127.0.0.1:1\"]\nmaster_name = \"mymaster\"\n", rs.Addr()),
		fmt.Sprintf("mode = \"cluster\"\naddress = %q\nseeds = [\"127.0.0.1:1\"]\n", rs.Addr()),
	} {
		path := writeConfig(t, "[upstream]\n"+section)
		var stderr bytes.Buffer
		code := runAudit([]string{"--config", path}, io.Discard, &stderr)
		if code != auditFailed || !strings.Contains(stderr.String(), "give --upstream ADDR") {
			t.Errorf("%s: exit %d, stderr %q; want %d and a request for --upstream", section, code, stderr.String(), auditFailed)
		}
		// With --upstream it walks that Redis.
		if code := runAudit([]string{"--config", path, "--upstream", rs.Addr()}, io.Discard, &stderr); code != auditClean {
			t.Errorf("%s with --upstream: exit %d, stderr %q", section, code, stderr.String())
		}
	}
}

// Pointed at one node of a cluster, the audit walks every primary, one
// report each, and counts every key (found by a probe: one node of three
// audited, 998 keys of 3,000, and the report said complete). Also: a
// --count past the bound is refused, and a report that cannot be written
// is a failure.
func TestAuditWalksEveryClusterPrimary(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	cc := c.ClusterClient(t)
	const n = 600
	for i := range n {
		check(t, cc.Set(ctx, fmt.Sprintf("misc:%d", i), "v", 0).Err())
	}
	node := c.Primaries(t)[1].Addr()
	var stdout, stderr bytes.Buffer
	code := runAudit([]string{"--upstream", node, "--json", "--pause", "0"}, &stdout, &stderr)
	if code != auditClean {
		t.Fatalf("exit %d, stderr %s", code, stderr.String())
	}
	var out struct {
		Cluster bool
		Nodes   []struct {
			Address string
			Report  audit.Report
		}
	}
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("%v\n%s", err, stdout.String())
	}
	var keys int64
	for _, nr := range out.Nodes {
		if !nr.Report.Complete {
			t.Errorf("%s: incomplete", nr.Address)
		}
		keys += nr.Report.Keys
	}
	if !out.Cluster || len(out.Nodes) != 3 || keys != n {
		t.Fatalf("cluster %v, %d nodes, %d keys; want 3 primaries and %d keys:\n%s", out.Cluster, len(out.Nodes), keys, n, stdout.String())
	}
	stdout.Reset()
	if code := runAudit([]string{"--upstream", node, "--pause", "0"}, &stdout, &stderr); code != auditClean ||
		strings.Count(stdout.String(), "== cluster primary") != 3 || !strings.Contains(stdout.String(), "(1 of 3 primaries)") ||
		!strings.Contains(stdout.String(), "(3 of 3 primaries)") {
		t.Errorf("text: exit %d\n%s", code, stdout.String())
	}
	if code := runAudit([]string{"--upstream", node, "--count", "100000000"}, io.Discard, io.Discard); code != auditFailed {
		t.Errorf("--count 100000000: exit %d, want it refused", code)
	}
	if code := runAudit([]string{"--upstream", node, "--pause", "0"}, failingWriter{}, io.Discard); code != auditFailed {
		t.Errorf("report not written: exit %d, want %d", code, auditFailed)
	}
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("no space left on device") }

// CLUSTER NODES as Redis prints it: every primary holding slots is walked,
// whatever its other flags (found by review: "nofailover" matched "fail"
// and its slots were skipped); an IPv6 address comes without brackets and
// a node that met no peer without its host.
func TestAuditReadsClusterNodes(t *testing.T) {
	nodes := strings.Join([]string{
		"a1 10.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460",
		"a2 ::1:7001@17001 master,nofailover - 0 0 2 connected 5461-10922 [5461->-a3]",
		"a3 :7002@17002 master,fail? - 0 0 3 connected 10923-16383",
		"a4 10.0.0.4:7003@17003,redis-4.example master - 0 0 4 connected 100",
		"r1 10.0.0.5:7004@17004 slave a1 0 0 1 connected",
		"e1 10.0.0.6:7005@17005 master - 0 0 5 connected",
		"",
	}, "\n")
	got, err := primariesIn(nodes, "192.0.2.9")
	want := []string{"10.0.0.1:7000", "10.0.0.4:7003", "192.0.2.9:7002", "[::1]:7001"}
	if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("primaries %q, %v; want %q", got, err, want)
	}
	if _, err := primariesIn("r1 10.0.0.5:7004@17004 slave a1 0 0 1 connected\n", ""); err == nil {
		t.Error("no primary with slots, and no error")
	}
}
