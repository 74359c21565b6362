package main

// Tests written by the operations review (branch review-ops): each shows a
// place where a first deployment meets behaviour other than README.md or
// config.example.toml promise. Each failed before its fix.

import (
	"bytes"
	"strings"
	"testing"
)

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
