package main

// Reload defects found by a review, each reproduced with the binary.

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/redproxy/redproxy/internal/redistest"
)

// POST /policy/reload changes the guard, not the configuration snapshot a
// full reload compares with. A file whose [policy] went back to what the
// snapshot held, then POST /reload, found no policy change and left the
// guard on the policy the file no longer had, answering OK.
func TestFullReloadAfterPolicyReload(t *testing.T) {
	rs := redistest.Start(t)
	bin := binary(t)
	listen := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	adminAddr := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	path := filepath.Join(t.TempDir(), "redproxy.toml")
	doc := func(maxClients int, allow string) string {
		return fmt.Sprintf("[server]\nlisten = %q\nadmin = %q\nmax_clients = %d\n[upstream]\naddress = %q\n[policy.commands]\nallow = %s\n",
			listen, adminAddr, maxClients, rs.Addr(), allow)
	}
	check(t, os.WriteFile(path, []byte(doc(1000, "[]")), 0o600))
	_, c, logs := startProxy(t, bin, listen, nil, "--config", path)
	if c.Keys(ctx, "*").Err() == nil {
		t.Fatal("KEYS allowed at start")
	}
	// 1. Allow KEYS, POST /policy/reload.
	check(t, os.WriteFile(path, []byte(doc(1000, `["keys"]`)), 0o600))
	if code, body := postReload(t, adminAddr, "/policy/reload"); code != http.StatusOK {
		t.Fatalf("policy reload: %d %s", code, body)
	}
	if err := c.Keys(ctx, "*").Err(); err != nil {
		t.Fatalf("KEYS after allowing it: %v", err)
	}
	// 2. Revert the policy (and change something else), POST /reload.
	check(t, os.WriteFile(path, []byte(doc(2000, "[]")), 0o600))
	code, body := postReload(t, adminAddr, "/reload")
	t.Logf("POST /reload = %d %q", code, body)
	if err := c.Keys(ctx, "*").Err(); err == nil {
		t.Errorf("the file refuses KEYS and POST /reload succeeded, yet KEYS is still allowed\nlog:\n%s", logs.String())
	}
}

// server.max_clients and [policy] mode apply at once on reload, but INFO
// proxy kept showing the values the proxy started with.
func TestInfoAfterReload(t *testing.T) {
	rs := redistest.Start(t)
	bin := binary(t)
	listen := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	adminAddr := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	path := filepath.Join(t.TempDir(), "redproxy.toml")
	doc := func(maxClients int, mode string) string {
		return fmt.Sprintf("[server]\nlisten = %q\nadmin = %q\nmax_clients = %d\n[upstream]\naddress = %q\n[policy]\nmode = %q\n",
			listen, adminAddr, maxClients, rs.Addr(), mode)
	}
	check(t, os.WriteFile(path, []byte(doc(1000, "enforce")), 0o600))
	_, c, logs := startProxy(t, bin, listen, nil, "--config", path)

	check(t, os.WriteFile(path, []byte(doc(77, "report")), 0o600))
	code, body := postReload(t, adminAddr, "/reload")
	if code != http.StatusOK {
		t.Fatalf("reload: %d %s", code, body)
	}
	t.Logf("reload: %s", body)
	if err := c.Keys(ctx, "*").Err(); err != nil {
		t.Fatalf("KEYS under policy.mode=report after reload: %v", err)
	}
	info := c.Info(ctx, "proxy").Val()
	if !strings.Contains(info, "proxy_max_clients:77") || !strings.Contains(info, "policy_mode:report") {
		t.Errorf("after reload (max_clients=77, policy.mode=report) INFO proxy says:\n%s\nlog:\n%s", info, logs.String())
	}
}
