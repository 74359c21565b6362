package main

// Reload defects a review found (configuration reload while traffic
// flows), each reproduced with the binary.

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/redistest"
)

// Found: POST /policy/reload puts the file's [policy] in force in the
// guard, but INFO proxy's policy_mode was read from the configuration
// snapshot, which only a full reload replaces. After switching policy.mode
// from report to enforce with POST /policy/reload (the README's "rolling
// it out" path), KEYS was refused while INFO proxy still said
// policy_mode:report; the other way round, an operator checking that
// report mode is in force was told enforce. INFO now reports the mode of
// the policy the guard has loaded.
func TestInfoPolicyModeFollowsPolicyReload(t *testing.T) {
	rs := redistest.Start(t)
	bin := binary(t)
	listen := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	adminAddr := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	path := filepath.Join(t.TempDir(), "redproxy.toml")
	doc := func(mode string) string {
		return fmt.Sprintf("[server]\nlisten = %q\nadmin = %q\n[upstream]\naddress = %q\n[policy]\nmode = %q\n",
			listen, adminAddr, rs.Addr(), mode)
	}
	check(t, os.WriteFile(path, []byte(doc("report")), 0o600))
	_, c, logs := startProxy(t, bin, listen, nil, "--config", path)
	if err := c.Keys(ctx, "*").Err(); err != nil {
		t.Fatalf("KEYS under report at start: %v", err)
	}
	if info := c.Info(ctx, "proxy").Val(); !strings.Contains(info, "policy_mode:report\r\n") {
		t.Fatalf("at start INFO proxy says:\n%s", info)
	}

	for _, mode := range []string{"enforce", "report"} {
		check(t, os.WriteFile(path, []byte(doc(mode)), 0o600))
		if code, body := postReload(t, adminAddr, "/policy/reload"); code != http.StatusOK {
			t.Fatalf("POST /policy/reload: %d %s", code, body)
		}
		if err := c.Keys(ctx, "*").Err(); (err == nil) != (mode == "report") {
			t.Fatalf("KEYS after POST /policy/reload to %s: %v", mode, err)
		}
		if info := c.Info(ctx, "proxy").Val(); !strings.Contains(info, "policy_mode:"+mode+"\r\n") {
			t.Errorf("after POST /policy/reload to %s, INFO proxy says:\n%s\nlog:\n%s", mode, grepLines(info, "policy"), logs.String())
		}
	}
}

// Found: README ("Policy") says an invalid file keeps the policy in force
// and the reload says why "in the log, in the HTTP reply (422) and in the
// report", and redproxy_policy_reloads_total{result} counts reloads. A
// full reload (SIGHUP, POST /reload) whose [policy] did not validate was
// refused by config.Load before the guard was asked, so /policy/report
// showed no failed reload and the error counter stayed at 0: after a
// SIGHUP (which has no reply) the report, where the README sends policy
// authors, said the last reload went fine while the old policy stayed.
// Decided: a full reload counts as a failed policy reload only when some
// of its errors are about [policy]; one refused for anything else (here
// server.max_clients) is not called a policy error and leaves the report
// and the counter alone.
func TestBadPolicyFullReloadShowsInReport(t *testing.T) {
	rs := redistest.Start(t)
	bin := binary(t)
	listen := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	adminAddr := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	path := filepath.Join(t.TempDir(), "redproxy.toml")
	doc := fmt.Sprintf("[server]\nlisten = %q\nadmin = %q\nmax_clients = 100\n[upstream]\naddress = %q\n[policy]\nmode = \"enforce\"\n", listen, adminAddr, rs.Addr())
	check(t, os.WriteFile(path, []byte(doc), 0o600))
	cmd, _, logs := startProxy(t, bin, listen, nil, "--config", path)
	errorCount := func() string {
		_, metricsText, _ := get(t, "GET", "http://"+adminAddr+"/metrics")
		return strings.TrimSpace(grepLines(metricsText, `redproxy_policy_reloads_total{result="error"}`))
	}
	report := func() string {
		_, r, _ := get(t, "GET", "http://"+adminAddr+"/policy/report")
		return r
	}

	// Not a policy error: neither the report nor the counter hear of it.
	check(t, os.WriteFile(path, []byte(strings.Replace(doc, "max_clients = 100", `max_clients = "many"`, 1)), 0o600))
	if code, body := postReload(t, adminAddr, "/reload"); code != http.StatusUnprocessableEntity {
		t.Fatalf("POST /reload with a bad max_clients: %d %s", code, body)
	}
	if r := report(); strings.Contains(r, "last reload failed") {
		t.Errorf("a reload refused for server.max_clients shows as a failed policy reload:\n%s", r)
	}
	if line := errorCount(); !strings.HasSuffix(line, " 0") {
		t.Errorf("redproxy_policy_reloads_total after a reload refused for server.max_clients: %q", line)
	}

	// A bad [policy] by SIGHUP: the report and the counter say so.
	check(t, os.WriteFile(path, []byte(strings.Replace(doc, `mode = "enforce"`, `mode = "bogus"`, 1)), 0o600))
	check(t, cmd.Process.Signal(syscall.SIGHUP))
	redistest.Eventually(t, 5*time.Second, func() bool { return strings.Contains(logs.String(), "policy.mode") },
		"the bad file was not reported in the log:\n%s", logs)
	if r := report(); !strings.Contains(r, "last reload failed") || !strings.Contains(r, "policy.mode") {
		t.Errorf("after a SIGHUP with an invalid [policy] (the log says why), /policy/report says nothing of it:\n%s", r)
	}
	if line := errorCount(); !strings.HasSuffix(line, " 1") {
		t.Errorf("redproxy_policy_reloads_total after one failed policy reload: %q", line)
	}

	// Fixed: the next reload clears it.
	check(t, os.WriteFile(path, []byte(doc), 0o600))
	if code, body := postReload(t, adminAddr, "/reload"); code != http.StatusOK {
		t.Fatalf("POST /reload with the good file: %d %s", code, body)
	}
	if r := report(); strings.Contains(r, "last reload failed") {
		t.Errorf("after a good reload the report still shows the failed one:\n%s", r)
	}
}
