package main

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/redistest"
)

// TestNoSentinelAnsweringLoggedOnceAtStart: with every Sentinel down at
// start, "no Sentinel answered" is logged once. It was logged twice: by
// the watcher main asks the Sentinels with before the server exists, and
// again by the server's own watcher at its first check (found by review).
//
// The Sentinel is started, so it knows the primary, then killed: nothing
// listens on its port when the proxy starts. Once the server's watcher
// has checked (its gauge says 0 answered), the Sentinel comes back and
// the watcher says so; by then every warning is in the log.
func TestNoSentinelAnsweringLoggedOnceAtStart(t *testing.T) {
	primary := redistest.Start(t)
	o := redistest.SentinelOptions{Sentinels: 1}
	sen := redistest.StartSentinel(t, o, primary.Port(), 1)
	sen.Kill(t)

	e := startEarly(t, fmt.Sprintf("mode = \"sentinel\"\nsentinels = [%q]\nmaster_name = \"mymaster\"\n", sen.Addr()),
		"asking a Sentinel that is down")
	redistest.Eventually(t, 20*time.Second, func() bool {
		res, err := http.Get("http://" + e.admin + "/metrics")
		if err != nil {
			return false
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		return strings.Contains(string(body), "\nredproxy_sentinels_answering 0\n")
	}, "redproxy_sentinels_answering never 0; log:\n%s", e.logs)
	sen.Restart(t)
	redistest.Eventually(t, 20*time.Second, func() bool {
		return strings.Contains(e.logs.String(), "sentinel: Sentinels answer again")
	}, "the Sentinel's return was never logged; log:\n%s", e.logs)

	// The watcher the server took over moves it to the primary.
	redistest.Eventually(t, 20*time.Second, func() bool { return e.ready() == http.StatusOK },
		"never ready once the Sentinel named the primary; log:\n%s", e.logs)

	if n := strings.Count(e.logs.String(), "sentinel: no Sentinel answered"); n != 1 {
		t.Errorf("\"no Sentinel answered\" logged %d times, want once; log:\n%s", n, e.logs)
	}
}
