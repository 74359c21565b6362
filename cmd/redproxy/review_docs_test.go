package main

// Tests written by the documentation review (branch review-docs): each shows
// a place where the binary does otherwise than README.md says. They fail
// until the product is fixed (or the README is changed to match).

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/redistest"
)

// TestDocsCheckReadsTheEnvironmentAsTheProxyDoes: README "Running it" says
// every flag can also be set in the environment (REDPROXY_LISTEN,
// REDPROXY_LOCAL_TIER, ...), and `redproxy check` prints "the effective
// settings" of a file plus the flags, "which override it as they do when the
// proxy runs" (check's usage). The proxy applies the variables; check
// ignores them, so in the Docker image (which sets REDPROXY_LISTEN and
// REDPROXY_ADMIN) `redproxy check` prints listen/admin addresses the proxy
// does not use.
func TestDocsCheckReadsTheEnvironmentAsTheProxyDoes(t *testing.T) {
	env := map[string]string{
		"REDPROXY_LISTEN":     "127.0.0.1:1",
		"REDPROXY_LOCAL_TIER": "off",
	}
	old := lookupEnv
	lookupEnv = func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	t.Cleanup(func() { lookupEnv = old })

	var stdout, stderr bytes.Buffer
	if code := runCheck([]string{"--config", examplePath}, &stdout, &stderr); code != checkOK {
		t.Fatalf("check = %d; stderr:\n%s", code, stderr.String())
	}
	out := stdout.String()
	if !strings.Contains(out, "listen = '127.0.0.1:1'") {
		t.Errorf("REDPROXY_LISTEN=127.0.0.1:1 not in check's effective settings (the proxy would listen there); [server] as printed:\n%s", section(out, "[server]"))
	}
	if !strings.Contains(section(out, "[localcache]"), "enabled = false") {
		t.Errorf("REDPROXY_LOCAL_TIER=off not in check's effective settings (the proxy would run with the tier off); [localcache] as printed:\n%s", section(out, "[localcache]"))
	}
}

// TestDocsCheckPassesAConfigTheProxyRefusesToStart: README says `redproxy
// check --config FILE` (plus the flags) checks a file "like nginx -t" and
// "tells beforehand whether a file is valid". A client listener on a
// non-loopback address with no [[users]] and no upstream password is refused
// at start (README "Exposure"), with exit 2, but check exits 0 and says
// "configuration is valid" for the same file and flags. Same for an admin
// address that is not loopback without [admin] token_file.
func TestDocsCheckPassesAConfigTheProxyRefusesToStart(t *testing.T) {
	rs := redistest.Start(t)
	bin := binary(t)
	cases := map[string]string{
		"exposed listener": fmt.Sprintf("[server]\nlisten = \"0.0.0.0:%d\"\nadmin = \"\"\n[upstream]\naddress = %q\n", redistest.FreePort(t), rs.Addr()),
		"exposed admin": fmt.Sprintf("[server]\nlisten = \"127.0.0.1:%d\"\nadmin = \"0.0.0.0:%d\"\n[upstream]\naddress = %q\n",
			redistest.FreePort(t), redistest.FreePort(t), rs.Addr()),
	}
	for name, doc := range cases {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "redproxy.toml")
			check(t, os.WriteFile(path, []byte(doc), 0o600))

			// The proxy itself refuses this file.
			cmd := exec.Command(bin, "--config", path)
			cmd.Env = []string{}
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "refusing to start") {
				t.Fatalf("proxy with %s: err %v, output:\n%s", name, err, out)
			}

			// check should say so beforehand.
			var stdout, stderr bytes.Buffer
			if code := runCheck([]string{"--config", path}, &stdout, &stderr); code != checkBad {
				t.Errorf("redproxy check = %d (%q) for a file the proxy refuses to start with (%q); want %d",
					code, strings.TrimSpace(stderr.String()), strings.TrimSpace(string(out)), checkBad)
			}
		})
	}
}

// TestDocsReloadReplyNamesThePolicyItChanged: README "Reloading" says the
// reply to POST /reload (and the log) lists the settings that changed. After
// POST /policy/reload has put another [policy] in force, a full reload of a
// file whose [policy] differs from it does change the policy in force (the
// naming rule goes back from enforce to report), but the reply says
// "configuration reloaded: nothing changed".
func TestDocsReloadReplyNamesThePolicyItChanged(t *testing.T) {
	rs := redistest.Start(t)
	bin := binary(t)
	listen := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	adminAddr := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	base := exampleConfig(t, listen, adminAddr, rs.Addr())
	const namesReport = "[policy.names]\n# Action of the naming rules."
	if !strings.Contains(base, namesReport) {
		t.Fatal("the example's [policy.names] moved; adjust the test")
	}
	// The same file with the naming rules enforced.
	i := strings.Index(base, namesReport)
	j := i + strings.Index(base[i:], "action = \"report\"")
	enforced := base[:j] + "action = \"\"" + base[j+len("action = \"report\""):]

	path := filepath.Join(t.TempDir(), "redproxy.toml")
	check(t, os.WriteFile(path, []byte(base), 0o600))
	_, c, logs := startProxy(t, bin, listen, nil, "--config", path)

	if err := c.Set(ctx, "foo", "1", 0).Err(); err != nil {
		t.Fatalf("SET foo under the example (names reported) = %v", err)
	}
	check(t, os.WriteFile(path, []byte(enforced), 0o600))
	if code, body := postReload(t, adminAddr, "/policy/reload"); code != http.StatusOK {
		t.Fatalf("POST /policy/reload = %d %q", code, body)
	}
	if err := c.Set(ctx, "foo", "1", 0).Err(); err == nil || !strings.Contains(err.Error(), `naming rule "namespaces"`) {
		t.Fatalf("SET foo with names enforced = %v", err)
	}

	// Back to the example file: the full reload puts the names rule back to
	// report...
	check(t, os.WriteFile(path, []byte(base), 0o600))
	code, body := postReload(t, adminAddr, "/reload")
	if code != http.StatusOK {
		t.Fatalf("POST /reload = %d %q", code, body)
	}
	if err := c.Set(ctx, "foo", "1", 0).Err(); err != nil {
		t.Fatalf("SET foo after the full reload = %v (the reload did not apply the file's [policy])", err)
	}
	// ...and its reply should say the policy changed.
	if strings.Contains(body, "nothing changed") || !strings.Contains(body, "policy") {
		t.Errorf("POST /reload changed the policy in force (names: enforce -> report) but replied %q; log:\n%s", body, logs.String())
	}
}

// section returns the lines of a TOML document from header to the next
// table header.
func section(doc, header string) string {
	i := strings.Index(doc, "\n"+header+"\n")
	if i < 0 {
		return ""
	}
	rest := doc[i+1:]
	if j := strings.Index(rest[len(header)+1:], "\n["); j >= 0 {
		return rest[:len(header)+1+j]
	}
	return rest
}

// TestDocsSIGHUPDuringShutdownIsLogged: README "Reloading" says that once
// the proxy has begun to shut down a reload is refused (HTTP 503; "a SIGHUP
// is logged and ignored"). POST /reload does answer 503, but a SIGHUP sent
// while clients drain is ignored without a word: the main loop stops
// reading the SIGHUP channel when SIGTERM arrives, so reloadAndLog's
// "SIGHUP ignored" branch for ErrShuttingDown is never reached.
func TestDocsSIGHUPDuringShutdownIsLogged(t *testing.T) {
	rs := redistest.Start(t)
	bin := binary(t)
	listen := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	adminAddr := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	path := filepath.Join(t.TempDir(), "redproxy.toml")
	check(t, os.WriteFile(path, []byte(fmt.Sprintf("[server]\nlisten = %q\nadmin = %q\n[upstream]\naddress = %q\n", listen, adminAddr, rs.Addr())), 0o600))
	cmd, c, logs := startProxy(t, bin, listen, nil, "--config", path)

	// A script that keeps Redis (and so this client's batch) busy for a
	// while, so the proxy is still draining when the SIGHUP comes.
	done := make(chan error, 1)
	go func() {
		done <- c.Eval(ctx, "local i=0 while i<150000000 do i=i+1 end return 1", nil).Err()
	}()
	time.Sleep(300 * time.Millisecond)
	check(t, cmd.Process.Signal(syscall.SIGTERM))
	redistest.Eventually(t, 5*time.Second, func() bool { return strings.Contains(logs.String(), "shutting down") },
		"no shutdown logged; log:\n%s", logs)
	if code, body := postReload(t, adminAddr, "/reload"); code != http.StatusServiceUnavailable {
		t.Fatalf("POST /reload while draining = %d %q, want 503", code, body)
	}
	check(t, cmd.Process.Signal(syscall.SIGHUP))
	<-done
	werr := make(chan error, 1)
	go func() { werr <- cmd.Wait() }()
	select {
	case err := <-werr:
		if err != nil {
			t.Fatalf("proxy exit: %v; log:\n%s", err, logs.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("proxy did not exit; log:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "SIGHUP") {
		t.Errorf("a SIGHUP during shutdown was not logged (README: \"a SIGHUP is logged and ignored\"); log:\n%s", logs.String())
	}
}

// TestDocsCheckShowsNamedUpstreamDatabasesItIgnores: config.example.toml
// says of [upstreams.NAME] that "databases is [upstream]'s" (the proxy
// builds every named upstream's pools with [upstream]'s databases), and
// that unknown keys are errors "so a misspelt setting cannot be silently
// ignored". A `databases` set on a named upstream is accepted, printed by
// `redproxy check` as that upstream's effective setting, and then ignored.
// Either check should refuse it or print the value in force.
func TestDocsCheckShowsNamedUpstreamDatabasesItIgnores(t *testing.T) {
	a, q := redistest.Start(t), redistest.Start(t)
	listen := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	path := writeConfig(t, fmt.Sprintf("[server]\nlisten = %q\nadmin = \"\"\n", listen)+
		fmt.Sprintf("[upstream]\naddress = %q\ndatabases = 16\n", a.Addr())+
		fmt.Sprintf("[upstreams.q]\naddress = %q\ndatabases = 8\n", q.Addr())+
		"[[route]]\npattern = \"q:*\"\nupstream = \"q\"\n")
	var stdout, stderr bytes.Buffer
	code := runCheck([]string{"--config", path}, &stdout, &stderr)
	if code == checkBad {
		return // refused: fine
	}
	printed := section(stdout.String(), "[upstreams.q]")
	if !strings.Contains(printed, "databases = 8") {
		return // check shows the value in force: fine
	}
	// The proxy ignores it: database 10, outside upstreams.q's "8", reaches q.
	_, c, _ := startProxy(t, binary(t), listen, nil, "--config", path)
	pipe := c.Pipeline()
	pipe.Select(ctx, 10)
	set := pipe.Set(ctx, "q:1", "v", 0)
	_, _ = pipe.Exec(ctx)
	q10 := redis.NewClient(&redis.Options{Addr: q.Addr(), DB: 10})
	defer q10.Close()
	if set.Err() == nil && q10.Get(ctx, "q:1").Val() == "v" {
		t.Errorf("check accepts [upstreams.q] databases = 8 and prints it as q's effective setting, but the proxy ignores it "+
			"(SET q:1 in database 10 through the proxy: %v, and q:1 is in q's database 10); printed:\n%s", set.Err(), printed)
	}
}
