package main

import (
	"bytes"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/redistest"
)

// TestUpstreamFlagRefusedOutsideStandalone: --upstream (or
// REDPROXY_UPSTREAM) sets upstream.address, which Sentinel and cluster
// mode do not use. It was accepted and did nothing, while the operator
// believed the proxy used that Redis (found by review). The proxy now
// refuses to start and check refuses the file, both with one line naming
// the variable or flag, the mode, and what to do.
func TestUpstreamFlagRefusedOutsideStandalone(t *testing.T) {
	nowhere := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	modes := []struct{ mode, section, from string }{
		{"sentinel", fmt.Sprintf("mode = \"sentinel\"\nsentinels = [%q]\nmaster_name = \"mymaster\"\n", nowhere), "upstream.sentinels"},
		{"cluster", fmt.Sprintf("mode = \"cluster\"\nseeds = [%q]\n", nowhere), "upstream.seeds"},
	}
	for _, m := range modes {
		for _, viaEnv := range []bool{false, true} {
			name, what := m.mode+"/flag", "--upstream"
			if viaEnv {
				name, what = m.mode+"/env", "REDPROXY_UPSTREAM"
			}
			t.Run(name, func(t *testing.T) {
				listen := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
				path := writeConfig(t, fmt.Sprintf("[server]\nlisten = %q\nadmin = \"\"\n\n[upstream]\n%s", listen, m.section))
				want := fmt.Sprintf(`upstream.address (%s): "10.0.0.5:6379" is not used with upstream.mode = %q, which finds Redis from %s: remove %s, or set upstream.mode = "standalone" to use that address`,
					what, m.mode, m.from, what)

				// The proxy, as a process: without the refusal it starts
				// and serves, and the test must not wait for it forever.
				args, env := []string{"--config", path}, childEnv()
				if viaEnv {
					env = append(env, "REDPROXY_UPSTREAM=10.0.0.5:6379")
				} else {
					args = append(args, "--upstream", "10.0.0.5:6379")
				}
				cmd := exec.Command(binary(t), args...)
				cmd.Env = env
				var logs redistest.LogBuffer
				cmd.Stderr = &logs
				check(t, cmd.Start())
				exited := make(chan error, 1)
				go func() { exited <- cmd.Wait() }()
				var err error
				done := false
				redistest.Eventually(t, 30*time.Second, func() bool {
					select {
					case err = <-exited:
						done = true
						return true
					default:
						return strings.Contains(logs.String(), "redproxy listening")
					}
				}, "the proxy neither exited nor listened; log:\n%s", &logs)
				if !done {
					cmd.Process.Kill()
					<-exited
					t.Fatalf("the proxy started with %s in %s mode; log:\n%s", what, m.mode, logs.String())
				}
				if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
					t.Errorf("exit: %v, want status 2", err)
				}
				if !strings.Contains(logs.String(), want) {
					t.Errorf("stderr lacks\n%s\nstderr:\n%s", want, logs.String())
				}

				// check says the same.
				cenv := map[string]string{}
				old := lookupEnv
				lookupEnv = func(k string) (string, bool) { v, ok := cenv[k]; return v, ok }
				t.Cleanup(func() { lookupEnv = old })
				cargs := []string{"--config", path}
				if viaEnv {
					cenv["REDPROXY_UPSTREAM"] = "10.0.0.5:6379"
				} else {
					cargs = append(cargs, "--upstream", "10.0.0.5:6379")
				}
				var stdout, stderr bytes.Buffer
				if code := runCheck(cargs, &stdout, &stderr); code != checkBad || !strings.Contains(stderr.String(), want) {
					t.Errorf("check: exit %d, stderr:\n%s\nwant %d and\n%s", code, stderr.String(), checkBad, want)
				}
			})
		}
	}
}
