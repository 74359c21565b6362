package main

// Tests written by the operations review (branch review-ops): each shows a
// place where a first deployment meets behaviour other than README.md or
// config.example.toml promise. Each failed before its fix.

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/redistest"
)

// TestOpsAdminTokenRotatedInPlace: the admin token is a secret an operator
// rotates (a leak, a schedule) by rewriting admin.token_file and reloading,
// as README "Rotating certificates" teaches for the TLS files. README
// "Reloading" says a reload that changes a restart-only setting ("everything
// in [admin]") is refused, and for the other secret file it reads at start,
// a [[users]] upstream_password_file, "a file rotated since start refuses the
// reload until a restart reads it". For admin.token_file the reload instead
// answers 200 "configuration reloaded: nothing changed" while the old token
// keeps working and the new one is refused: the operator believes the old
// token revoked. A reload now reads the file again and puts its token in
// force; a file that would not do at start refuses the reload.
func TestOpsAdminTokenRotatedInPlace(t *testing.T) {
	rs := redistest.Start(t)
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "admin.token")
	oldTok, newTok := "old-token-0123456789", "new-token-0123456789"
	check(t, os.WriteFile(tokenFile, []byte(oldTok+"\n"), 0o600))
	listen := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	adminAddr := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	path := filepath.Join(dir, "redproxy.toml")
	check(t, os.WriteFile(path, []byte(fmt.Sprintf("[server]\nlisten = %q\nadmin = %q\n[upstream]\naddress = %q\n[admin]\ntoken_file = %q\n",
		listen, adminAddr, rs.Addr(), tokenFile)), 0o600))
	_, _, logs := startProxy(t, binary(t), listen, nil, "--config", path)

	do := func(method, p, tok string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, "http://"+adminAddr+p, nil)
		check(t, err)
		req.Header.Set("Authorization", "Bearer "+tok)
		res, err := http.DefaultClient.Do(req)
		check(t, err)
		defer res.Body.Close()
		var b bytes.Buffer
		b.ReadFrom(res.Body)
		return res.StatusCode, b.String()
	}
	if code, _ := do("GET", "/metrics", oldTok); code != http.StatusOK {
		t.Fatalf("/metrics with the token in force: %d", code)
	}

	// A token too short is refused, as at start, and the one in force
	// stays.
	check(t, os.WriteFile(tokenFile, []byte("short\n"), 0o600))
	// With the file and line, as at start (found by a probe: neither).
	if code, body := do("POST", "/reload", oldTok); code == http.StatusOK || !strings.Contains(body, path+":") || !strings.Contains(body, "admin.token_file: ") {
		t.Errorf("reload with a token file holding a short token: %d %q, want it refused naming %s:LINE: admin.token_file", code, strings.TrimSpace(body), path)
	}
	if code, _ := do("GET", "/metrics", oldTok); code != http.StatusOK {
		t.Errorf("/metrics with the token in force after a refused reload: %d, want 200", code)
	}

	check(t, os.WriteFile(tokenFile, []byte(newTok+"\n"), 0o600))
	code, body := do("POST", "/reload", oldTok)
	if code != http.StatusOK || !strings.Contains(body, "admin.token_file") {
		t.Errorf("POST /reload after rewriting admin.token_file: %d %q, want 200 naming admin.token_file", code, strings.TrimSpace(body))
	}
	oldCode, _ := do("GET", "/metrics", oldTok)
	newCode, _ := do("GET", "/metrics", newTok)
	if oldCode != http.StatusUnauthorized || newCode != http.StatusOK {
		t.Errorf("after the reload the old token gets %d (want 401) and the new one %d (want 200); log:\n%s",
			oldCode, newCode, logs.String())
	}
}

// TestOpsAllowUnauthenticatedFalseOverridesFile: README "Running it" says
// every flag can be set as REDPROXY_<FLAG>, and "a flag on the command line
// wins over its variable, and both win over the file";
// REDPROXY_ALLOW_UNAUTHENTICATED takes "true or false (or 1 or 0)" (its
// error says so). A fleet that sets REDPROXY_ALLOW_UNAUTHENTICATED=false (or
// --allow-unauthenticated=false) to make sure no proxy is exposed without
// authentication gets it accepted and ignored: a file with
// allow_unauthenticated = true still starts open to anyone on 0.0.0.0.
// Apply only ever turns the setting on (internal/config/config.go, Apply).
func TestOpsAllowUnauthenticatedFalseOverridesFile(t *testing.T) {
	path := writeConfig(t, "[server]\nlisten = \"0.0.0.0:6380\"\nadmin = \"\"\nallow_unauthenticated = true\n")
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
	}{
		{"flag", []string{"--allow-unauthenticated=false"}, nil},
		{"variable", nil, map[string]string{"REDPROXY_ALLOW_UNAUTHENTICATED": "false"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := lookupEnv
			lookupEnv = func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
			t.Cleanup(func() { lookupEnv = old })
			var stdout, stderr bytes.Buffer
			code := runCheck(append([]string{"--config", path}, tc.args...), &stdout, &stderr)
			if code == checkOK {
				t.Errorf("check %v %v = 0 (%q), and prints %q: the explicit false lost to the file's true; want the exposure refusal",
					tc.args, tc.env, strings.TrimSpace(stderr.String()), grepLines(stdout.String(), "allow_unauthenticated"))
			}
		})
	}
}

// TestOpsCheckReportsOnlyRealProblems: after a TOML structure error,
// decodeAll blanks the offending line and decodes again (config.go,
// decodeAll); when the blanked line was a table header, the keys under it
// move to the top level and a second, made-up error follows, in Go's terms
// ("cannot decode TOML string into struct field config.Config.Admin of type
// config.Admin") about a key the file sets correctly. README: "one
// file:line: key: reason line per problem".
func TestOpsCheckReportsOnlyRealProblems(t *testing.T) {
	path := writeConfig(t, "server.listen = \"127.0.0.1:6380\"\n[server]\nadmin = \"127.0.0.1:9121\"\n")
	var stdout, stderr bytes.Buffer
	if code := runCheck([]string{"--config", path}, &stdout, &stderr); code != checkBad {
		t.Fatalf("check = %d, want %d", code, checkBad)
	}
	if strings.Contains(stderr.String(), "struct field") || strings.Contains(stderr.String(), ":3:") {
		t.Errorf("check reports a problem on line 3, which is fine, in Go's terms:\n%s", stderr.String())
	}
}

// TestOpsSentinelModeReloadOfUnusedAddress: config.example.toml says of
// upstream.address that in "sentinel" mode "address is not used", and the
// proxy accepts the key there without a word. A reload of a file that sets
// or changes it (a leftover from standalone days, edited by a colleague)
// answers 200 "changed: upstream.address" and drains and switches every
// upstream connection to the same primary (with the local tier on it also
// drops everything it holds): the reply tells the operator an address took
// effect that is not used, and the switch costs a redial of every pool.
// proxy/reload.go compared the whole [upstream] section (onlyMaxPinned),
// address included, in every mode; now an address the mode does not use
// is no change (config.Changed, TestChangedIgnoresAnAddressTheModeDoesNotUse
// for cluster mode).
func TestOpsSentinelModeReloadOfUnusedAddress(t *testing.T) {
	primary := redistest.Start(t)
	sen := redistest.StartSentinel(t, redistest.SentinelOptions{Sentinels: 1}, primary.Port(), 1)
	listen := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	adminAddr := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	doc := fmt.Sprintf("[server]\nlisten = %q\nadmin = %q\n[upstream]\nmode = \"sentinel\"\nsentinels = [%q]\nmaster_name = \"mymaster\"\n",
		listen, adminAddr, sen.Addr())
	path := filepath.Join(t.TempDir(), "redproxy.toml")
	check(t, os.WriteFile(path, []byte(doc), 0o600))
	_, c, logs := startProxy(t, binary(t), listen, nil, "--config", path)
	check(t, c.Set(ctx, "k", "v", 0).Err())

	check(t, os.WriteFile(path, []byte(doc+"address = \"10.9.9.9:6379\"\n"), 0o600))
	code, body := postReload(t, adminAddr, "/reload")
	if code != http.StatusOK || strings.Contains(body, "upstream.address") || strings.Contains(logs.String(), "upstream switched") {
		t.Errorf("reload of an upstream.address that sentinel mode does not use: %d %q, want 200 and nothing changed, no switch; log:\n%s",
			code, strings.TrimSpace(body), logs.String())
	}
	if v, err := c.Get(ctx, "k").Result(); err != nil || v != "v" {
		t.Errorf("GET k after the reload: %q, %v", v, err)
	}
	// A reload that changed nothing is logged as SIGHUP's is: POST /reload
	// logged only changes, so an operator could not tell it from a reload
	// that never arrived.
	redistest.Eventually(t, 5*time.Second, func() bool {
		return strings.Contains(logs.String(), `msg="configuration reloaded"`) && strings.Contains(logs.String(), `via="POST /reload" changed=nothing`)
	}, "POST /reload that changed nothing was not logged:\n%s", logs)
}

// TestOpsOneRouteDownKeepsTheProxyReady: README "Routes" says "One upstream
// down fails only its own keys", and the point of routes is keeping queues,
// caches and the rest apart. But /readyz answers 503 as soon as any named
// upstream is down (proxy/routes.go, routesReady), while keys of
// [upstream] are served fine. Behind a load balancer or a Kubernetes
// Service, which take unready instances out of rotation, every proxy
// instance is then withdrawn at once, and the outage of the queue Redis
// becomes an outage of every key. README "Running it" describes /readyz
// as "503 unless Redis answers PING", without saying that with routes it
// means every upstream.
func TestOpsOneRouteDownKeepsTheProxyReady(t *testing.T) {
	main, queue := redistest.Start(t), redistest.Start(t)
	listen := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	adminAddr := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	path := writeConfig(t, fmt.Sprintf("[server]\nlisten = %q\nadmin = %q\n[upstream]\naddress = %q\n[upstreams.queue]\naddress = %q\n[[route]]\npattern = \"queue:*\"\nupstream = \"queue\"\n",
		listen, adminAddr, main.Addr(), queue.Addr()))
	_, c, logs := startProxy(t, binary(t), listen, nil, "--config", path)
	redistest.Eventually(t, 5*time.Second, func() bool { return status("http://"+adminAddr+"/readyz") == http.StatusOK },
		"never ready; log:\n%s", logs)

	queue.Kill(t)
	redistest.Eventually(t, 5*time.Second, func() bool { return c.Set(ctx, "queue:1", "x", 0).Err() != nil },
		"queue:1 still written with its upstream down")
	if err := c.Set(ctx, "user:1", "x", 0).Err(); err != nil {
		t.Fatalf("user:1, on the upstream that is up: %v", err)
	}
	if code := status("http://" + adminAddr + "/readyz"); code != http.StatusOK {
		t.Errorf("/readyz = %d with only the queue upstream down and [upstream] serving: a load balancer would withdraw every instance; log:\n%s",
			code, logs.String())
	}
}
