package main

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/mirror"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// /debug/mirror summarises the mirror (sent, dropped, errors, sampled,
// compared, mismatches by key pattern) behind the admin token, like
// /debug/hotkeys: key patterns are data.
func TestAdminDebugMirror(t *testing.T) {
	ms := redistest.Start(t)
	p := proxytest.Start(t, nil, func(c *config.Config) {
		c.Upstreams = map[string]config.Upstream{"new": {Address: ms.Addr()}}
		c.Mirror = mirror.DefaultConfig()
		c.Mirror.Upstream = "new"
		c.Mirror.ReadsSample = 1
		c.Mirror.Compare = true
	})
	adm := newAdmin(p.Server, p.Metrics, http.NotFoundHandler(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	adm.SetToken("m1rror-t0ken")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check(t, err)
	go adm.Serve(ln)
	t.Cleanup(func() { adm.Shutdown(ctx) })
	base := "http://" + ln.Addr().String()

	c := p.Client(t)
	check(t, c.Set(ctx, "order:17:state", "paid", 0).Err())
	redistest.Eventually(t, 5*time.Second, func() bool { return ms.Client(t).Get(ctx, "order:17:state").Val() == "paid" }, "the write never reached the mirror")
	check(t, ms.Client(t).Set(ctx, "order:17:state", "lost", 0).Err())
	check(t, c.Get(ctx, "order:17:state").Err())
	redistest.Eventually(t, 5*time.Second, func() bool { return p.Mirror().Report(0).Mismatches == 1 }, "the mismatch was never counted")

	fetch := func(path, token string) (int, string) {
		req, err := http.NewRequest("GET", base+path, nil)
		check(t, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		res, err := http.DefaultClient.Do(req)
		check(t, err)
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		check(t, err)
		return res.StatusCode, string(body)
	}
	for _, tok := range []string{"", "wrong"} {
		if code, body := fetch("/debug/mirror", tok); code != http.StatusUnauthorized || strings.Contains(body, "order") {
			t.Fatalf("/debug/mirror with token %q: %d %s", tok, code, body)
		}
	}
	code, body := fetch("/debug/mirror", "m1rror-t0ken")
	var rep mirror.Report
	if code != http.StatusOK || json.Unmarshal([]byte(body), &rep) != nil {
		t.Fatalf("/debug/mirror: %d %s", code, body)
	}
	if rep.Upstream != "new" || rep.Address != ms.Addr() || rep.Sent != 2 || rep.Sampled != 1 || rep.Compared != 1 || rep.Mismatches != 1 ||
		len(rep.Patterns) != 1 || rep.Patterns[0].Pattern != "order:*:*" || rep.Dropped[mirror.DropQueueFull] != 0 {
		t.Fatalf("/debug/mirror:\n%s", body)
	}
	if strings.Contains(body, "order:17") || strings.Contains(body, "paid") || strings.Contains(body, "lost") {
		t.Fatalf("/debug/mirror shows a key or a value:\n%s", body)
	}
	if code, body := fetch("/debug/mirror?top=0", "m1rror-t0ken"); code != http.StatusOK || !strings.Contains(body, `"mismatches_by_pattern": []`) {
		t.Fatalf("/debug/mirror?top=0: %d %s", code, body)
	}
	if code, _ := fetch("/debug/mirror?top=x", "m1rror-t0ken"); code != http.StatusBadRequest {
		t.Fatalf("/debug/mirror?top=x: %d", code)
	}
	_, metrics := fetch("/metrics", "m1rror-t0ken")
	if promtool, err := exec.LookPath("promtool"); err == nil {
		cmd := exec.Command(promtool, "check", "metrics")
		cmd.Stdin = strings.NewReader(metrics)
		if out, err := cmd.CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
			t.Errorf("promtool check metrics: %v\n%s", err, out)
		}
	}
	for _, want := range []string{`redproxy_mirror_sent_total 2`, `redproxy_mirror_dropped_total{reason="queue_full"} 0`, `redproxy_mirror_mismatches_total 1`, `redproxy_mirror_errors_total{kind="reply"} 0`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// /debug/mirror says mirroring is off rather than serving nothing.
func TestAdminDebugMirrorOff(t *testing.T) {
	_, base := opsProxy(t, nil, nil)
	if code, body, _ := get(t, "GET", base+"/debug/mirror"); code != http.StatusNotFound || !strings.Contains(body, "mirroring is off") {
		t.Fatalf("/debug/mirror with mirroring off: %d %s", code, body)
	}
}
