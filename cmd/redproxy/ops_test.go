package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxy"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/slowlog"
)

// Environment variables stand in for flags; a flag on the command line
// wins; a bad value names its variable.
func TestEnvironmentStandsInForFlags(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	upstream := fs.String("upstream", "", "")
	cfgPath := fs.String("config", "", "")
	listen := fs.String("listen", "", "")
	admin := fs.String("admin", "", "")
	require := fs.Bool("require-upstream", false, "")
	logLevel := fs.String("log-level", "", "")
	if err := fs.Parse([]string{"--listen", "127.0.0.1:7000"}); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"REDPROXY_UPSTREAM":         "redis:6379",
		"REDPROXY_CONFIG":           "/etc/redproxy/redproxy.toml",
		"REDPROXY_LISTEN":           "0.0.0.0:6380",
		"REDPROXY_ADMIN":            "0.0.0.0:9121",
		"REDPROXY_REQUIRE_UPSTREAM": "1",
	}
	getenv := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	set, err := applyEnv(fs, getenv)
	if err != nil {
		t.Fatal(err)
	}
	if *upstream != "redis:6379" || *cfgPath != "/etc/redproxy/redproxy.toml" || *admin != "0.0.0.0:9121" || !*require {
		t.Errorf("env not applied: upstream %q config %q admin %q require %v", *upstream, *cfgPath, *admin, *require)
	}
	if *listen != "127.0.0.1:7000" || set["listen"] {
		t.Errorf("the environment overrode a flag: listen %q", *listen)
	}
	if *logLevel != "" || set["log-level"] {
		t.Errorf("an unset variable set a flag: %q", *logLevel)
	}

	// REDPROXY_VERSION is an image's own convention, never --version.
	fs3 := flag.NewFlagSet("t", flag.ContinueOnError)
	version := fs3.Bool("version", false, "")
	fs3.Parse(nil)
	for _, v := range []string{"1.4.2", "true"} {
		if set, err := applyEnv(fs3, func(k string) (string, bool) { return v, k == "REDPROXY_VERSION" }); err != nil || *version || set["version"] {
			t.Fatalf("REDPROXY_VERSION=%s: %v, version %v", v, err, *version)
		}
	}

	fs2 := flag.NewFlagSet("t", flag.ContinueOnError)
	fs2.Bool("require-upstream", false, "")
	fs2.Parse(nil)
	_, err = applyEnv(fs2, func(k string) (string, bool) { return "maybe", k == "REDPROXY_REQUIRE_UPSTREAM" })
	if err == nil || !strings.Contains(err.Error(), `REDPROXY_REQUIRE_UPSTREAM="maybe"`) || !strings.Contains(err.Error(), "want true or false") {
		t.Fatalf("bad value: %v; want the variable named and the values it takes", err)
	}
}

// --help lists the subcommands and the environment variables and exits 0;
// --version prints the version INFO reports.
func TestHelpAndVersion(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"--help"}, &out, &errOut); code != 0 {
		t.Fatalf("--help: exit %d", code)
	}
	for _, want := range []string{"redproxy check", "redproxy healthcheck", "redproxy audit", "REDPROXY_<FLAG>", "-upstream"} {
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("--help does not mention %q:\n%s", want, errOut.String())
		}
	}
	// Each subcommand's --help exits 0 as well (found by review: 2).
	for _, sub := range []string{"check", "healthcheck", "audit"} {
		errOut.Reset()
		if code := run([]string{sub, "--help"}, &out, &errOut); code != 0 || !strings.Contains(errOut.String(), "redproxy "+sub) {
			t.Errorf("%s --help: exit %d, want 0; output:\n%s", sub, code, errOut.String())
		}
	}
	for _, v := range []string{"--version", "version"} {
		out.Reset()
		if code := run([]string{v}, &out, io.Discard); code != 0 || !strings.HasPrefix(out.String(), "redproxy "+proxy.BuildVersion()+" (go") {
			t.Fatalf("%s: exit %d, %q", v, code, out.String())
		}
	}
	// "redproxy help" as --help (it was "unexpected argument").
	errOut.Reset()
	if code := run([]string{"help"}, &out, &errOut); code != 0 || !strings.Contains(errOut.String(), "--config") {
		t.Errorf("help: exit %d; output:\n%s", code, errOut.String())
	}
	errOut.Reset()
	if code := run([]string{"help", "check"}, &out, &errOut); code != 0 || !strings.Contains(errOut.String(), "usage: redproxy check") {
		t.Errorf("help check: exit %d; output:\n%s", code, errOut.String())
	}
}

// childEnv is this process's environment without REDPROXY_ variables,
// plus extra.
func childEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, envPrefix) {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// healthcheck runs "redproxy healthcheck args" and returns its exit code.
func healthcheck(t *testing.T, env []string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(binary(t), append([]string{"healthcheck", "--timeout", "2s"}, args...)...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case errors.As(err, &ee):
		return ee.ExitCode(), string(out)
	}
	t.Fatalf("healthcheck: %v", err)
	return -1, ""
}

// The container's contract, run as the binary: upstream, listen and admin
// from the environment with flags winning; no silent embedded store under
// REDPROXY_REQUIRE_UPSTREAM, but the embedded store when asked for; and
// "redproxy healthcheck" answering 0 or 1 from /healthz and /readyz.
func TestContainerEnvironmentAndHealthcheck(t *testing.T) {
	bin := binary(t)

	cmd := exec.Command(bin)
	cmd.Env = childEnv("REDPROXY_REQUIRE_UPSTREAM=1", fmt.Sprintf("REDPROXY_LISTEN=127.0.0.1:%d", redistest.FreePort(t)), "REDPROXY_ADMIN=")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "REDPROXY_UPSTREAM") {
		t.Fatalf("no upstream under REDPROXY_REQUIRE_UPSTREAM: %v\n%s", err, out)
	}

	rs := redistest.Start(t)
	listen := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	adminAddr := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	// REDPROXY_LISTEN is not an address: the flag must win over it.
	cmd, c, logs := startProxy(t, bin, listen,
		childEnv("REDPROXY_REQUIRE_UPSTREAM=1", "REDPROXY_UPSTREAM="+rs.Addr(), "REDPROXY_LISTEN=not-an-address", "REDPROXY_ADMIN="+adminAddr),
		"--listen", listen)
	check(t, c.Set(ctx, "k", "through-env-upstream", 0).Err())
	if v, _ := rs.Client(t).Get(ctx, "k").Result(); v != "through-env-upstream" {
		t.Fatalf("the proxy is not in front of REDPROXY_UPSTREAM: %q", v)
	}

	env := childEnv("REDPROXY_ADMIN=" + adminAddr)
	if code, out := healthcheck(t, env); code != 0 || !strings.Contains(out, "/healthz") {
		t.Fatalf("healthcheck: %d %s", code, out)
	}
	if code, out := healthcheck(t, env, "--ready"); code != 0 || !strings.Contains(out, "/readyz") {
		t.Fatalf("healthcheck --ready: %d %s", code, out)
	}
	_, port, _ := net.SplitHostPort(adminAddr)
	if code, out := healthcheck(t, childEnv(), "--admin", "0.0.0.0:"+port); code != 0 {
		t.Fatalf("a wildcard admin address is not reached on loopback: %d %s", code, out)
	}
	if code, _ := healthcheck(t, env, "--admin", fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))); code != 1 {
		t.Fatalf("--admin did not win over REDPROXY_ADMIN: %d", code)
	}
	// The admin server turned off the way the proxy's own variable does
	// it: said so, not asked at the default address.
	if code, out := healthcheck(t, childEnv("REDPROXY_ADMIN=")); code != 1 || !strings.Contains(out, "admin server is off") {
		t.Fatalf("healthcheck with REDPROXY_ADMIN empty: %d %s", code, out)
	}
	cfgFile := filepath.Join(t.TempDir(), "redproxy.toml")
	check(t, os.WriteFile(cfgFile, []byte("[server]\nadmin = \""+adminAddr+"\"\n"), 0o600))
	if code, out := healthcheck(t, childEnv("REDPROXY_CONFIG="+cfgFile)); code != 0 {
		t.Fatalf("admin address from REDPROXY_CONFIG: %d %s", code, out)
	}

	rs.Kill(t)
	redistest.Eventually(t, 10*time.Second, func() bool { code, _ := healthcheck(t, env, "--ready"); return code == 1 },
		"healthcheck --ready still 0 with Redis down")
	if code, out := healthcheck(t, env); code != 0 {
		t.Fatalf("liveness must not follow Redis: %d %s", code, out)
	}
	check(t, cmd.Process.Signal(syscall.SIGTERM))
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit: %v\n%s", err, logs.String())
	}
	if code, _ := healthcheck(t, env); code != 1 {
		t.Fatalf("healthcheck of a stopped proxy: %d", code)
	}

	// REDPROXY_UPSTREAM=embedded asks for the demo store explicitly.
	cmd = exec.Command(bin)
	cmd.Env = childEnv("REDPROXY_REQUIRE_UPSTREAM=1", "REDPROXY_UPSTREAM=embedded", "REDPROXY_LISTEN="+listen, "REDPROXY_ADMIN=")
	var logs2 redistest.LogBuffer
	cmd.Stderr = &logs2
	check(t, cmd.Start())
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	redistest.Eventually(t, 10*time.Second, func() bool { return c.Set(ctx, "k", "v", 0).Err() == nil }, "embedded proxy never answered; log:\n%s", &logs2)
	if !strings.Contains(logs2.String(), "EMBEDDED UPSTREAM") {
		t.Fatalf("the embedded store was not announced:\n%s", logs2.String())
	}
}

// The image's Dockerfile: a static build, a non-root user, the proxy on
// every interface, no silent embedded store, and a HEALTHCHECK that the
// binary can run without a shell. The image build itself needs a container
// engine; this reads the file.
func TestDockerfile(t *testing.T) {
	data, err := os.ReadFile("../../Dockerfile")
	check(t, err)
	// Join continuation lines, drop comments.
	var lines []string
	cur := ""
	for _, l := range strings.Split(string(data), "\n") {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "#") || l == "" && cur == "" {
			continue
		}
		if s, ok := strings.CutSuffix(l, "\\"); ok {
			cur += s + " "
			continue
		}
		lines = append(lines, strings.TrimSpace(cur+l))
		cur = ""
	}
	stages := 0
	var final []string
	build := ""
	for _, l := range lines {
		if strings.HasPrefix(l, "FROM ") {
			stages++
			final = nil
		}
		final = append(final, l)
		if strings.HasPrefix(l, "RUN ") && strings.Contains(l, "go build") {
			build = l
		}
	}
	if stages < 2 || !strings.Contains(build, "CGO_ENABLED=0") || !strings.Contains(build, "./cmd/redproxy") {
		t.Fatalf("not a multi-stage static build: %d stages, %q", stages, build)
	}
	env := map[string]string{}
	var user, health, entry string
	var expose []string
	for _, l := range final {
		word, rest, _ := strings.Cut(l, " ")
		switch word {
		case "USER":
			user = rest
		case "HEALTHCHECK":
			health = rest
		case "ENTRYPOINT":
			entry = rest
		case "EXPOSE":
			expose = strings.Fields(rest)
		case "ENV":
			for _, kv := range strings.Fields(rest) {
				k, v, _ := strings.Cut(kv, "=")
				env[k] = v
			}
		}
	}
	if u, _, _ := strings.Cut(user, ":"); u == "" || u == "root" || u == "0" {
		t.Errorf("USER %q: must be a non-root user", user)
	}
	if !strings.Contains(health, `CMD ["/usr/local/bin/redproxy", "healthcheck"`) {
		t.Errorf("HEALTHCHECK %q does not run the binary's healthcheck in exec form", health)
	}
	if entry != `["/usr/local/bin/redproxy"]` {
		t.Errorf("ENTRYPOINT %q", entry)
	}
	if env["REDPROXY_REQUIRE_UPSTREAM"] != "1" {
		t.Errorf("REDPROXY_REQUIRE_UPSTREAM not set: the image would fall back to the embedded store")
	}
	for _, k := range []string{"REDPROXY_LISTEN", "REDPROXY_ADMIN"} {
		host, port, err := net.SplitHostPort(env[k])
		if err != nil || host != "0.0.0.0" || !slices.Contains(expose, port) {
			t.Errorf("%s=%q: must be 0.0.0.0 on an EXPOSEd port (%v)", k, env[k], expose)
		}
	}
	// Every variable the image sets is one the binary reads.
	flags := proxyFlags(t)
	for k := range env {
		name := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(k, envPrefix), "_", "-"))
		if !flags[name] {
			t.Errorf("ENV %s matches no flag of redproxy", k)
		}
	}
}

// proxyFlags returns the names of the proxy's flags, from its usage text.
func proxyFlags(t *testing.T) map[string]bool {
	var usage bytes.Buffer
	if code := run([]string{"-h"}, io.Discard, &usage); code != 0 {
		t.Fatalf("-h: exit %d", code)
	}
	flags := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+-([a-z-]+)`).FindAllStringSubmatch(usage.String(), -1) {
		flags[m[1]] = true
	}
	if !flags["upstream"] || !flags["config"] {
		t.Fatalf("usage parsed wrong: %v", flags)
	}
	return flags
}

// The compose file configures redproxy only through variables the binary
// reads, and the Prometheus it starts scrapes the admin port.
func TestComposeFile(t *testing.T) {
	data, err := os.ReadFile("../../deploy/docker-compose.yml")
	check(t, err)
	flags := proxyFlags(t)
	vars := regexp.MustCompile(`\b(REDPROXY_[A-Z_]+):`).FindAllStringSubmatch(string(data), -1)
	if len(vars) == 0 {
		t.Fatal("the compose file sets no REDPROXY_ variable")
	}
	for _, m := range vars {
		name := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(m[1], envPrefix), "_", "-"))
		if !flags[name] {
			t.Errorf("%s matches no flag of redproxy", m[1])
		}
	}
	for _, want := range []string{"REDPROXY_UPSTREAM: redis:6379", "./prometheus.yml:", "./grafana/redproxy.json:", "./grafana/provisioning:"} {
		if !strings.Contains(string(data), want) {
			t.Errorf("compose file lacks %q", want)
		}
	}
	prom, err := os.ReadFile("../../deploy/prometheus.yml")
	check(t, err)
	if !strings.Contains(string(prom), `targets: ["redproxy:9121"]`) {
		t.Errorf("prometheus.yml does not scrape redproxy's admin port")
	}
}

// opsProxy is a proxy in front of a real Redis with its admin server, the
// local tier on and every batch entered in the slow log. It returns the
// proxy and the admin base URL.
func opsProxy(t *testing.T, rs *redistest.Server, mutate func(*config.Config)) (*proxytest.Proxy, string) {
	t.Helper()
	p := proxytest.Start(t, rs, func(c *config.Config) {
		c.LocalCache.Enabled = true
		c.LocalCache.AdmitMinReads = 2
		c.Server.SlowlogThreshold.Duration = 0
		if mutate != nil {
			mutate(c)
		}
	})
	adm := newAdmin(p.Server, p.Metrics, http.NotFoundHandler(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check(t, err)
	go adm.Serve(ln)
	t.Cleanup(func() { adm.Shutdown(ctx) })
	return p, "http://" + ln.Addr().String()
}

// driveTraffic sends what makes every labelled series of the dashboard
// appear: reads the local tier serves, a policy refusal, a protocol error,
// a QUIT, pipelines.
func driveTraffic(t *testing.T, p *proxytest.Proxy) {
	t.Helper()
	c := p.Client(t)
	check(t, c.Set(ctx, "product:1", "v", time.Hour).Err())
	for range 50 {
		check(t, c.Get(ctx, "product:1").Err())
	}
	redistest.Eventually(t, 5*time.Second, func() bool {
		c.Get(ctx, "product:1")
		return p.LocalTier().Hits() > 0
	}, "the local tier never served a hit")
	if err := c.Keys(ctx, "*").Err(); err == nil {
		t.Fatal("KEYS was not refused by the default policy")
	}
	pipe := c.Pipeline()
	for i := range 10 {
		pipe.Incr(ctx, fmt.Sprintf("counter:%d", i))
	}
	_, err := pipe.Exec(ctx)
	check(t, err)
	nc := p.Dial(t)
	nc.Write([]byte("*1\r\n$x\r\n"))
	bufio.NewReader(nc).ReadString('\n')
	nc = p.Dial(t)
	nc.Write([]byte("QUIT\r\n"))
	bufio.NewReader(nc).ReadString('\n')
}

func get(t *testing.T, method, url string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	check(t, err)
	res, err := http.DefaultClient.Do(req)
	check(t, err)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	check(t, err)
	return res.StatusCode, string(body), res.Header
}

// Every admin endpoint over HTTP, against a proxy in front of a real Redis.
func TestAdminEndpoints(t *testing.T) {
	rs := redistest.Start(t)
	p, base := opsProxy(t, rs, nil)
	driveTraffic(t, p)

	// The QUIT's close is counted when the session ends, which may be
	// just after its +OK reached the client (a CI run read /metrics
	// between the two): ask again until it is there.
	var (
		code int
		body string
		hdr  http.Header
	)
	metricsOK := func() bool {
		code, body, hdr = get(t, "GET", base+"/metrics")
		return code == 200 && strings.HasPrefix(hdr.Get("Content-Type"), "text/plain") &&
			strings.Contains(body, `redproxy_commands_total{command="get"}`) && strings.Contains(body, "redproxy_clients_closed_total{reason=\"quit\"} 1")
	}
	deadline := time.Now().Add(5 * time.Second)
	for !metricsOK() {
		if time.Now().After(deadline) {
			t.Fatalf("/metrics: %d %s\n%s", code, hdr.Get("Content-Type"), grepLines(body, "redproxy_commands_total", "redproxy_clients_closed_total"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code, body, _ := get(t, "GET", base+"/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("/healthz: %d %q", code, body)
	}
	if code, body, _ := get(t, "GET", base+"/readyz"); code != 200 || body != "ok\n" {
		t.Fatalf("/readyz with Redis up: %d %q", code, body)
	}

	code, body, _ = get(t, "GET", base+"/policy/report")
	if code != 200 || !strings.Contains(body, "command  refused=1  keys") {
		t.Fatalf("/policy/report: %d\n%s", code, body)
	}
	code, body, _ = get(t, "GET", base+"/policy/report?format=json")
	var rep struct{ Total int64 }
	if code != 200 || json.Unmarshal([]byte(body), &rep) != nil || rep.Total != 1 {
		t.Fatalf("/policy/report?format=json: %d\n%s", code, body)
	}

	if code, _, _ := get(t, "POST", base+"/policy/reload"); code != http.StatusConflict {
		t.Fatalf("reload without a file: %d", code)
	}
	path := filepath.Join(t.TempDir(), "redproxy.toml")
	p.Guard().SetSource((&reloader{path: path}).policySource)
	check(t, os.WriteFile(path, []byte("[policy.commands]\nallow = [\"keys\"]\n"), 0o600))
	if code, body, _ := get(t, "POST", base+"/policy/reload"); code != 200 {
		t.Fatalf("reload of a good file: %d %s", code, body)
	}
	c := p.Client(t)
	if err := c.Keys(ctx, "*").Err(); err != nil {
		t.Fatalf("the reloaded policy is not in force: %v", err)
	}
	check(t, os.WriteFile(path, []byte("[policy.bogus]\n"), 0o600))
	if code, body, _ := get(t, "POST", base+"/policy/reload"); code != http.StatusUnprocessableEntity || !strings.Contains(body, "policy.bogus") {
		t.Fatalf("reload of a bad file: %d %s", code, body)
	}
	if err := c.Keys(ctx, "*").Err(); err != nil {
		t.Fatalf("a bad file replaced the policy: %v", err)
	}

	code, body, _ = get(t, "GET", base+"/debug/hotkeys")
	if code != 200 || !strings.Contains(body, "product:1") {
		t.Fatalf("/debug/hotkeys: %d\n%s", code, body)
	}

	code, body, _ = get(t, "GET", base+"/debug/slowlog")
	var slow slowlog.Report
	if code != 200 || json.Unmarshal([]byte(body), &slow) != nil || len(slow.Entries) == 0 || slow.ThresholdMicros != 0 {
		t.Fatalf("/debug/slowlog: %d\n%.500s", code, body)
	}
	for _, e := range slow.Entries {
		if strings.Contains(e.KeyPattern, "1") {
			t.Errorf("a key's identifier in the slow log: %+v", e)
		}
	}
	if code, _, _ := get(t, "DELETE", base+"/debug/slowlog"); code != http.StatusNoContent {
		t.Fatalf("DELETE /debug/slowlog: %d", code)
	}

	if code, body, _ := get(t, "GET", base+"/debug/pprof/"); code != 200 || !strings.Contains(body, "goroutine") {
		t.Fatalf("/debug/pprof/: %d", code)
	}

	// Methods: each endpoint answers only its own.
	for _, tc := range []struct{ method, path string }{
		{"GET", "/policy/reload"},
		{"POST", "/metrics"},
		{"POST", "/healthz"},
		{"POST", "/readyz"},
		{"POST", "/policy/report"},
		{"POST", "/debug/hotkeys"},
		{"POST", "/debug/slowlog"},
		{"PUT", "/debug/slowlog"},
	} {
		code, _, hdr := get(t, tc.method, base+tc.path)
		if code != http.StatusMethodNotAllowed || hdr.Get("Allow") == "" {
			t.Errorf("%s %s: %d, Allow %q; want 405 with Allow", tc.method, tc.path, code, hdr.Get("Allow"))
		}
	}

	// /readyz follows Redis: 503 while it is down, 200 once it is back.
	rs.Kill(t)
	redistest.Eventually(t, 5*time.Second, func() bool { code, _, _ := get(t, "GET", base+"/readyz"); return code == http.StatusServiceUnavailable },
		"/readyz not 503 with Redis down")
	if code, _, _ := get(t, "GET", base+"/healthz"); code != 200 {
		t.Fatalf("/healthz with Redis down: %d", code)
	}
	rs.Restart(t)
	redistest.Eventually(t, 10*time.Second, func() bool { code, _, _ := get(t, "GET", base+"/readyz"); return code == 200 },
		"/readyz not 200 after Redis came back")
}

// /debug/hotkeys says the local tier is off rather than serving nothing.
func TestAdminHotkeysWithTierOff(t *testing.T) {
	_, base := opsProxy(t, nil, func(c *config.Config) { c.LocalCache.Enabled = false })
	if code, body, _ := get(t, "GET", base+"/debug/hotkeys"); code != http.StatusNotFound || !strings.Contains(body, "off") {
		t.Fatalf("/debug/hotkeys with the tier off: %d %s", code, body)
	}
}

// metricFamilies reads the names and types of a /metrics exposition.
func metricFamilies(text string) map[string]string {
	fams := map[string]string{}
	for _, l := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(l, "# TYPE "); ok {
			if name, typ, ok := strings.Cut(rest, " "); ok {
				fams[name] = typ
			}
		}
	}
	return fams
}

// Every metric the Grafana dashboard queries exists on a real proxy's
// /metrics, with the series the query selects present after traffic.
func TestDashboardMetricsExist(t *testing.T) {
	data, err := os.ReadFile("../../deploy/grafana/redproxy.json")
	check(t, err)
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
		Templating struct{ List []struct{ Definition string } }
	}
	check(t, json.Unmarshal(data, &dash))
	var exprs []string
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	for _, v := range dash.Templating.List {
		exprs = append(exprs, v.Definition)
	}
	if len(exprs) < 20 {
		t.Fatalf("only %d queries in the dashboard", len(exprs))
	}

	p, base := opsProxy(t, nil, nil)
	driveTraffic(t, p)
	_, text, _ := get(t, "GET", base+"/metrics")
	fams := metricFamilies(text)
	name := regexp.MustCompile(`\b(?:redproxy|process|go)_[a-zA-Z0-9_]+`)
	seen := map[string]bool{}
	for _, e := range exprs {
		for _, n := range name.FindAllString(e, -1) {
			seen[n] = true
			fam, typ := n, fams[n]
			for _, suf := range []string{"_bucket", "_sum", "_count"} {
				if base, ok := strings.CutSuffix(n, suf); ok && typ == "" && fams[base] == "histogram" {
					fam, typ = base, "histogram"
				}
			}
			if typ == "" {
				t.Errorf("the dashboard queries %s, which /metrics does not have (in %s)", n, e)
				continue
			}
			// A series of it must be there, not only its HELP and TYPE.
			if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(fam) + `(_bucket|_sum|_count)?[{ ]`).MatchString(text) {
				t.Errorf("%s has no series after traffic", fam)
			}
		}
	}
	for _, must := range []string{"redproxy_commands_total", "redproxy_command_duration_seconds_bucket", "redproxy_upstream_connections_up",
		"redproxy_policy_violations_total", "redproxy_stampede_fetches_saved_total", "redproxy_localcache_hits_total",
		"redproxy_client_connections", "redproxy_clients_closed_total"} {
		if !seen[must] {
			t.Errorf("the dashboard has no panel on %s", must)
		}
	}
}

// /metrics passes promtool's checks (names, help, types, units), and the
// shipped Prometheus configuration passes promtool check config.
func TestMetricsPassPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("promtool not installed in CI: scripts/test.sh should have installed Debian's prometheus package")
		}
		t.Skip("promtool not installed (Debian package prometheus; scripts/test.sh installs it)")
	}
	p, base := opsProxy(t, nil, nil)
	driveTraffic(t, p)
	_, text, _ := get(t, "GET", base+"/metrics")
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(text)
	if out, err := cmd.CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
	if out, err := exec.Command(promtool, "check", "config", "../../deploy/prometheus.yml").CombinedOutput(); err != nil {
		t.Errorf("promtool check config deploy/prometheus.yml: %v\n%s", err, out)
	}
}

// The image's addresses are wildcards (REDPROXY_LISTEN=0.0.0.0:…,
// REDPROXY_ADMIN=0.0.0.0:…): with no users and no upstream password the
// proxy refuses to start and says which variable accepts that; with
// REDPROXY_ALLOW_UNAUTHENTICATED and the token file deploy/docker-compose.yml
// mounts (REDPROXY_ADMIN_TOKEN_FILE) it starts, and /metrics wants the token.
func TestContainerWildcardAddressesNeedAuthDecisions(t *testing.T) {
	bin := binary(t)
	rs := redistest.Start(t)
	port, adminPort := redistest.FreePort(t), redistest.FreePort(t)
	base := []string{"REDPROXY_UPSTREAM=" + rs.Addr(), fmt.Sprintf("REDPROXY_LISTEN=0.0.0.0:%d", port), fmt.Sprintf("REDPROXY_ADMIN=0.0.0.0:%d", adminPort)}

	cmd := exec.Command(bin)
	cmd.Env = childEnv(base...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || !strings.Contains(string(out), "REDPROXY_ALLOW_UNAUTHENTICATED") {
		t.Fatalf("open wildcard listener: want a refusal naming REDPROXY_ALLOW_UNAUTHENTICATED, got %v\n%s", err, out)
	}
	cmd = exec.Command(bin)
	cmd.Env = childEnv(append(base, "REDPROXY_ALLOW_UNAUTHENTICATED=true")...)
	out, err = cmd.CombinedOutput()
	if !errors.As(err, &ee) || !strings.Contains(string(out), "REDPROXY_ADMIN_TOKEN_FILE") {
		t.Fatalf("wildcard admin without a token: want a refusal naming REDPROXY_ADMIN_TOKEN_FILE, got %v\n%s", err, out)
	}

	token, err := os.ReadFile("../../deploy/demo-admin.token")
	check(t, err)
	listen := fmt.Sprintf("127.0.0.1:%d", port)
	startProxy(t, bin, listen, childEnv(append(base, "REDPROXY_ALLOW_UNAUTHENTICATED=true", "REDPROXY_ADMIN_TOKEN_FILE=../../deploy/demo-admin.token")...))
	metrics := fmt.Sprintf("http://127.0.0.1:%d/metrics", adminPort)
	get := func(auth string) int {
		req, _ := http.NewRequest("GET", metrics, nil)
		if auth != "" {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		resp, err := http.DefaultClient.Do(req)
		check(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get(""); code != http.StatusUnauthorized {
		t.Fatalf("/metrics without the token: %d", code)
	}
	if code := get(strings.TrimSpace(string(token))); code != http.StatusOK {
		t.Fatalf("/metrics with the token: %d", code)
	}
}

// grepLines is the lines of text that contain one of words: what a failure
// message needs from a long /metrics page.
func grepLines(text string, words ...string) string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		for _, w := range words {
			if strings.Contains(line, w) {
				out = append(out, line)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

// With log_format = "json" every line the proxy writes is JSON, go-redis's
// own messages (its retries dialling the command table's upstream, here
// one that refuses connections) included, at debug under
// component=go-redis: they used to come out as plain text among the JSON.
func TestJSONLogHasNoPlainLines(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "redproxy.toml")
	if err := os.WriteFile(path, []byte("[server]\nlog_format = \"json\"\nlog_level = \"debug\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	closed := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t)) // nothing listens
	cmd := exec.Command(binary(t), "--config", path, "--upstream", closed, "--admin", "",
		"--listen", fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t)))
	cmd.Env = childEnv()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	lines, done := make(chan string), make(chan struct{})
	defer close(done) // before the Kill and Wait above: the reader stops sending
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-done:
				return
			}
		}
	}()
	var fromGoRedis, tableWarning bool
	timeout := time.After(20 * time.Second)
	for !(fromGoRedis && tableWarning) {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("the proxy exited; go-redis line seen %v, command table warning seen %v", fromGoRedis, tableWarning)
			}
			var rec map[string]any
			if err := json.Unmarshal([]byte(line), &rec); err != nil {
				t.Fatalf("a log line is not JSON: %q", line)
			}
			if rec["component"] == "go-redis" {
				fromGoRedis = true
				if rec["level"] != "DEBUG" || rec["msg"] == "" {
					t.Errorf("go-redis line: %q", line)
				}
			}
			if rec["msg"] == "using the built-in command table" {
				tableWarning = true
			}
		case <-timeout:
			t.Fatalf("after 20 s: go-redis line seen %v, command table warning seen %v", fromGoRedis, tableWarning)
		}
	}
}

// A bad value from a REDPROXY_ variable is named as the variable, not as
// the flag the operator never gave (a user's trial); a bad flag as the
// flag. Both for the proxy and for `redproxy check`.
func TestBadValueNamesItsVariable(t *testing.T) {
	env := map[string]string{}
	old := lookupEnv
	lookupEnv = func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	t.Cleanup(func() { lookupEnv = old })
	cases := []struct {
		env  map[string]string
		args []string
		want string
	}{
		{map[string]string{"REDPROXY_POLICY_MODE": "bogus"}, nil, `redproxy: REDPROXY_POLICY_MODE: invalid action "bogus"`},
		{nil, []string{"--policy-mode", "bogus"}, `redproxy: --policy-mode: invalid action "bogus"`},
		{map[string]string{"REDPROXY_LOG_LEVEL": "loud"}, nil, `server.log_level (REDPROXY_LOG_LEVEL): invalid level "loud"`},
		{nil, []string{"--log-level", "loud"}, `server.log_level (--log-level): invalid level "loud"`},
		{map[string]string{"REDPROXY_LOCAL_TIER": "maybe"}, nil, `localcache.enabled (REDPROXY_LOCAL_TIER): invalid value "maybe"`},
		{map[string]string{"REDPROXY_LISTEN": "nope"}, nil, `server.listen (REDPROXY_LISTEN): invalid address "nope"`},
	}
	for _, c := range cases {
		clear(env)
		maps.Copy(env, c.env)
		var errOut bytes.Buffer
		if code := run(c.args, io.Discard, &errOut); code != 2 || !strings.Contains(errOut.String(), c.want) {
			t.Errorf("env %v args %q: exit %d, stderr %q; want 2 and %q", c.env, c.args, code, errOut.String(), c.want)
		}
	}
	clear(env)
	env["REDPROXY_LOG_LEVEL"] = "loud"
	var errOut bytes.Buffer
	if code := runCheck([]string{"--config", examplePath}, io.Discard, &errOut); code != checkBad || !strings.Contains(errOut.String(), "(REDPROXY_LOG_LEVEL)") {
		t.Errorf("check with REDPROXY_LOG_LEVEL=loud: exit %d, stderr %q", code, errOut.String())
	}
	// check takes --policy-mode and REDPROXY_POLICY_MODE as the proxy does
	// (found by a probe: it passed the variable's bad value, which the
	// proxy then refused to start with, and refused the flag as unknown).
	clear(env)
	env["REDPROXY_POLICY_MODE"] = "bogus"
	errOut.Reset()
	if code := runCheck([]string{"--config", examplePath}, io.Discard, &errOut); code != checkBad || !strings.Contains(errOut.String(), `REDPROXY_POLICY_MODE: invalid action "bogus"`) {
		t.Errorf("check with REDPROXY_POLICY_MODE=bogus: exit %d, stderr %q", code, errOut.String())
	}
	clear(env)
	for _, c := range []struct {
		mode string
		code int
	}{{"report", checkOK}, {"off", checkOK}, {"sometimes", checkBad}} {
		errOut.Reset()
		if code := runCheck([]string{"--config", examplePath, "--policy-mode", c.mode}, io.Discard, &errOut); code != c.code {
			t.Errorf("check --policy-mode %s: exit %d, want %d; stderr %q", c.mode, code, c.code, errOut.String())
		}
	}
}

// A container HEALTHCHECK reserves exit status 2: healthcheck's usage
// errors exit 1, as an unhealthy proxy does (found by a probe: 2), and a
// --timeout that cannot succeed is a usage error.
func TestHealthcheckUsageErrorsExitOne(t *testing.T) {
	for _, args := range [][]string{{"--bogus"}, {"extra"}, {"--timeout", "-1s"}, {"--timeout", "0s"}} {
		var errOut bytes.Buffer
		if code := run(append([]string{"healthcheck"}, args...), io.Discard, &errOut); code != 1 || errOut.Len() == 0 {
			t.Errorf("healthcheck %q: exit %d, stderr %q; want 1 and a message", args, code, errOut.String())
		}
	}
}

// A duration reads the same in both log formats: "1.5s", not the JSON
// handler's own integer of nanoseconds (found by a probe: "down_for" came
// out as 1500000000 where the shutdown line's timeout said "10s").
func TestJSONLogDurationsAreText(t *testing.T) {
	for _, format := range []string{"json", "text"} {
		var buf bytes.Buffer
		cfg := config.Default()
		cfg.Server.LogFormat = format
		newLogger(cfg, new(slog.LevelVar), &buf).Info("x", "down_for", 1500*time.Millisecond)
		want := map[string]string{"json": `"down_for":"1.5s"`, "text": `down_for=1.5s`}[format]
		if line := buf.String(); !strings.Contains(line, want) {
			t.Errorf("%s: %q, want %s in it", format, line, want)
		}
	}
}
