package main

import (
	"bytes"
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

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/redistest"
)

func writeConfig(t *testing.T, doc string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "redproxy.toml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestCheckValidPrintsEffective: a valid file exits 0 and prints every
// setting, the ones the file leaves out at their defaults, as TOML that
// loads back to the same configuration.
func TestCheckValidPrintsEffective(t *testing.T) {
	path := writeConfig(t, "[upstream]\naddress = \"10.0.0.7:6390\"\npassword = \"hunter22\"\n[server]\nmax_clients = 50\n")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"check", "--config", path, "--listen", "0.0.0.0:7000"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{
		`address = '10.0.0.7:6390'`, // from the file
		`max_clients = 50`,          // from the file
		`listen = '0.0.0.0:7000'`,   // from the flag
		`dial_timeout = '2s'`,       // default
		`max_request_bytes = '1GB'`, // default
		"[stampede]", "[localcache]", "[policy]",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "hunter22") {
		t.Errorf("the password is printed:\n%s", out)
	}
	back, err := config.Parse(stdout.Bytes(), "stdout")
	if err != nil {
		t.Fatalf("output does not parse: %v\n%s", err, out)
	}
	if back.Upstream.Address != "10.0.0.7:6390" || back.Server.MaxClients != 50 || back.Server.Listen != "0.0.0.0:7000" ||
		back.Upstream.ReplyTimeout != config.Default().Upstream.ReplyTimeout {
		t.Errorf("output loads as %+v", back)
	}
	if !strings.Contains(stderr.String(), "configuration is valid") {
		t.Errorf("stderr: %q", stderr.String())
	}
}

// TestCheckSaysThePolicyCap: --policy-mode (or REDPROXY_POLICY_MODE) below
// enforce caps every rule; check says so above the settings, which show
// the file's mode (found by a probe: the output said mode = 'enforce'
// alone under --policy-mode off). At enforce there is nothing to say.
func TestCheckSaysThePolicyCap(t *testing.T) {
	path := writeConfig(t, "[upstream]\naddress = \"10.0.0.7:6390\"\n")
	for _, tc := range []struct{ mode, want string }{
		{"off", "# --policy-mode off caps every policy rule below: no rule acts."},
		{"report", "# --policy-mode report caps every policy rule below: violations are logged and counted"},
		{"enforce", ""},
	} {
		var stdout, stderr bytes.Buffer
		if code := run([]string{"check", "--config", path, "--policy-mode", tc.mode}, &stdout, &stderr); code != 0 {
			t.Fatalf("%s: exit %d, stderr:\n%s", tc.mode, code, stderr.String())
		}
		out := stdout.String()
		if tc.want == "" && strings.Contains(out, "caps every policy rule") || tc.want != "" && !strings.Contains(out, tc.want) {
			t.Errorf("--policy-mode %s: output begins %.300q; want %q", tc.mode, out, tc.want)
		}
		if _, err := config.Parse(stdout.Bytes(), "stdout"); err != nil {
			t.Errorf("--policy-mode %s: output does not parse: %v", tc.mode, err)
		}
	}
}

// TestCheckExample: the shipped example passes.
func TestCheckExample(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"check", "--config", examplePath}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), "namespaces = [") {
		t.Errorf("the example's policy is not shown:\n%s", stdout.String())
	}
}

// TestCheckInvalid: every problem is reported as file:line: key: reason
// on stderr, nothing on stdout, exit 2.
func TestCheckInvalid(t *testing.T) {
	cases := []struct {
		name, doc string
		want      []string // lines of stderr, with FILE for the path
		flags     []string
	}{
		{"validation", "[server]\nmax_clients = -1\nlog_level = \"loud\"\n", []string{
			"FILE:2: server.max_clients: must be > 0, got -1",
			`FILE:3: server.log_level: invalid level "loud" (use debug, info, warn or error)`,
		}, nil},
		{"unknown key", "[upstream]\nadress = \"x:1\"\n", []string{"FILE:2: upstream.adress: unknown key"}, nil},
		{"unit", "[upstream]\ndial_timeout = 5\n", []string{`FILE:2: upstream.dial_timeout: invalid value 5: write it as a string with a unit (e.g. "500ms", "2s")`}, nil},
		{"policy", "[[policy.ttl]]\npattern = \"a:*\"\nmax = \"forever\"\n", []string{"FILE:3: policy.ttl[0].max: invalid duration"}, nil},
		{"flag", "", []string{"server.listen (--listen)"}, []string{"--listen", "nowhere"}},
		// What the proxy would refuse to start with is located too.
		{"exposed listener", "[server]\nadmin = \"\"\nlisten = \"0.0.0.0:6380\"\n", []string{
			`FILE:3: server.listen: listener "plain" at "0.0.0.0:6380" is not a loopback address`}, nil},
		{"tls files", "[server.tls]\nlisten = \"127.0.0.1:6390\"\ncert_file = \"/nonexistent/server.crt\"\nkey_file = \"/nonexistent/server.key\"\nmin_version = \"1.0\"\n[upstream.tls]\nca_file = \"/nonexistent/ca.crt\"\n", []string{
			`FILE:3: server.tls.cert_file: cannot open "/nonexistent/server.crt": no such file or directory`,
			`FILE:4: server.tls.key_file: cannot open "/nonexistent/server.key"`,
			`FILE:5: server.tls.min_version: invalid version "1.0"`,
			`FILE:7: upstream.tls.ca_file: cannot open "/nonexistent/ca.crt"`,
		}, nil},
		{"admin token file", "[server]\nadmin = \"127.0.0.1:9121\"\n[admin]\ntoken_file = \"/nonexistent/token\"\n", []string{
			`FILE:4: admin.token_file: open /nonexistent/token: no such file or directory (the proxy would refuse to start)`}, nil},
		{"exposed admin", "[server]\nadmin = \"0.0.0.0:9121\"\n", []string{
			`FILE:2: server.admin: the admin endpoint is not on a loopback address`}, nil},
		// Set by a flag: named, not located at the file's line, whose value
		// is not the one in force (found by review).
		{"exposed admin by flag", "[server]\nadmin = \"127.0.0.1:9121\"\n", []string{
			`server.admin (--admin): the admin endpoint is not on a loopback address`}, []string{"--admin", "0.0.0.0:9121"}},
		{"token file by flag", "[server]\nadmin = \"127.0.0.1:9121\"\n[admin]\ntoken_file = \"/etc/hosts\"\n", []string{
			`admin.token_file (--admin-token-file): open /nonexistent/tok: no such file or directory`}, []string{"--admin-token-file", "/nonexistent/tok"}},
		// Read at start (found by review: check passed it).
		{"upstream password file", "[[users]]\nname = \"app\"\npassword_sha256 = \"" + strings.Repeat("ab", 32) + "\"\nacl = \"+@all\"\nupstream_user = \"app\"\nupstream_password_file = \"/nonexistent/app.pw\"\n", []string{
			`FILE:6: users[0].upstream_password_file: open /nonexistent/app.pw: no such file or directory (the proxy would refuse to start)`}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := writeConfig(t, tc.doc)
			var stdout, stderr bytes.Buffer
			args := append([]string{"check", "--config", path}, tc.flags...)
			if code := run(args, &stdout, &stderr); code != 2 {
				t.Fatalf("exit %d, want 2; stderr:\n%s", code, stderr.String())
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout not empty:\n%s", stdout.String())
			}
			for _, w := range tc.want {
				if w = strings.ReplaceAll(w, "FILE", path); !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr.String())
				}
			}
		})
	}
}

// TestStartRefusalIsLocatedAndFirst: the proxy refuses to start with an
// exposed or tokenless admin endpoint saying file:line: key, as check
// does, and before it dials its upstream, whose warnings came first and
// buried the reason (found by a probe: "token_missing.toml:
// admin.token_file: open ...", after the upstream's warnings).
func TestStartRefusalIsLocatedAndFirst(t *testing.T) {
	for _, tc := range []struct{ name, doc, want string }{
		{"token file", "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n[admin]\ntoken_file = \"/nonexistent/token\"\n[upstream]\naddress = \"127.0.0.1:1\"\n",
			"refusing to start: FILE:5: admin.token_file: open /nonexistent/token: no such file or directory"},
		{"exposed admin", "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"0.0.0.0:0\"\n[upstream]\naddress = \"127.0.0.1:1\"\n",
			"refusing to start: FILE:3: server.admin: the admin endpoint is not on a loopback address"},
		// Found by a probe: check located it, the proxy itself did not.
		{"upstream password file", "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"\"\n[upstream]\naddress = \"127.0.0.1:1\"\n[[users]]\nname = \"app\"\npassword_sha256 = \"" + strings.Repeat("ab", 32) + "\"\nacl = \"+@all\"\nupstream_user = \"app\"\nupstream_password_file = \"/nonexistent/app.pw\"\n",
			"FILE:11: users[0].upstream_password_file: open /nonexistent/app.pw: no such file or directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeConfig(t, tc.doc)
			var stdout, stderr bytes.Buffer
			if code := run([]string{"--config", path}, &stdout, &stderr); code != 2 {
				t.Fatalf("exit %d, want 2; stderr:\n%s", code, stderr.String())
			}
			if w := strings.ReplaceAll(tc.want, "FILE", path); !strings.Contains(stderr.String(), w) {
				t.Errorf("stderr lacks %q:\n%s", w, stderr.String())
			}
			if strings.Contains(stderr.String(), "level=") {
				t.Errorf("the proxy logged before refusing (it went on to its upstream):\n%s", stderr.String())
			}
		})
	}
}

// TestCheckUsage: no --config, a missing file or a stray argument exit 2.
func TestCheckUsage(t *testing.T) {
	for _, args := range [][]string{{"check"}, {"check", "--config", "/nonexistent/redproxy.toml"}, {"check", "--config", examplePath, "extra"}} {
		var stdout, stderr bytes.Buffer
		if code := run(args, &stdout, &stderr); code != 2 || stderr.Len() == 0 {
			t.Errorf("%v: exit %d, stderr %q", args, code, stderr.String())
		}
	}
}

// TestEmptyAdminFlagTurnsAdminOff: --admin "" overrides the file's
// server.admin and no admin server listens, as bench/README.md relies on;
// no --admin keeps the file's.
func TestEmptyAdminFlagTurnsAdminOff(t *testing.T) {
	adminAddr := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	path := writeConfig(t, fmt.Sprintf("[server]\nadmin = %q\n", adminAddr))
	var stdout, stderr bytes.Buffer
	if code := run([]string{"check", "--config", path, "--admin", ""}, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "admin = ''") {
		t.Fatalf("check --admin \"\": exit %d\n%s%s", code, stdout.String(), stderr.String())
	}

	rs := redistest.Start(t)
	bin := binary(t)
	for _, tc := range []struct {
		args      []string
		adminWant bool
	}{
		{[]string{"--admin", ""}, false},
		{nil, true},
	} {
		listen := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
		var logs redistest.LogBuffer
		cmd := exec.Command(bin, append([]string{"--config", path, "--listen", listen, "--upstream", rs.Addr()}, tc.args...)...)
		cmd.Stderr = &logs
		check(t, cmd.Start())
		c := redis.NewClient(&redis.Options{Addr: listen, MaxRetries: -1})
		redistest.Eventually(t, 10*time.Second, func() bool { return c.Ping(ctx).Err() == nil }, "proxy never answered; log:\n%s", &logs)
		c.Close()
		// The admin server starts listening before the proxy does (see
		// run), so by now it would answer.
		res, err := http.Get("http://" + adminAddr + "/healthz")
		if err == nil {
			res.Body.Close()
		}
		if got := err == nil; got != tc.adminWant {
			t.Errorf("%v: admin answers = %v, want %v; log:\n%s", tc.args, got, tc.adminWant, logs.String())
		}
		check(t, cmd.Process.Signal(syscall.SIGTERM))
		if err := cmd.Wait(); err != nil {
			t.Errorf("exit: %v\n%s", err, logs.String())
		}
	}
}
