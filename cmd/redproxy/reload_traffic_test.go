package main

// Reload defects a review found (configuration reload while traffic
// flows), each reproduced with the binary.

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
