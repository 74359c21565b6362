package proxy_test

import (
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// A command in a database the proxy has no connection to yet, while a
// script runs past busy-reply-threshold: the new connection's handshake
// (SELECT) is refused with -BUSY, and the client gets that -BUSY, as from
// Redis directly, not "upstream unavailable: SELECT: handshake refused:
// -BUSY ..." (found by a probe: a client that retries on BUSY did not
// recognise it).
func TestHandshakeRefusedBusyAnswersBusy(t *testing.T) {
	rs := redistest.Start(t, "--busy-reply-threshold", "100")
	p := proxytest.Start(t, rs, nil)
	loop := startLoop(t, rs.Addr(), false, 3000) // on Redis directly: DB 7 has no proxy connection yet
	waitBusy(t, rs)
	c := dialRaw(t, p.Addr)
	c.wait = 10 * time.Second
	c.send([]string{"SELECT", "7"}, []string{"GET", "k"})
	if v, _ := c.readReply(); v != "OK" {
		t.Fatalf("SELECT 7: %v", v)
	}
	v, _ := c.readReply()
	if e, ok := v.(respError); !ok || !strings.HasPrefix(string(e), "BUSY Redis is busy running a script") {
		t.Fatalf("GET in a new database during a busy script: %q, want Redis's -BUSY", v)
	}
	if r := <-loop; r != "$4\r\ndone\r\n" {
		t.Fatalf("the loop's caller got %q", r)
	}
}

// SCRIPT KILL reaches a script still running on the server a reload moved
// the upstream away from: that server drains (the script's caller waits
// for its reply there), and the kill went to the new server alone, which
// answered NOTBUSY while the old one stayed busy (found by a probe).
func TestScriptKillReachesTheServerAReloadLeft(t *testing.T) {
	old, next := redistest.Start(t, "--busy-reply-threshold", "100"), redistest.Start(t)
	p := proxytest.Start(t, old, nil)
	loop := startLoop(t, p.Addr, false, 20000)
	waitBusy(t, old)
	cfg := *p.Config()
	cfg.Upstream.Address = next.Addr()
	if _, err := p.Reload(&cfg); err != nil {
		t.Fatal(err)
	}
	c := dialRaw(t, p.Addr)
	c.wait = 10 * time.Second
	c.send([]string{"SCRIPT", "KILL"})
	if v, _ := c.readReply(); v != "OK" {
		t.Fatalf("SCRIPT KILL after a reload moved the upstream: %v, want OK from the old server", v)
	}
	if r := <-loop; !strings.HasPrefix(r, "-ERR Script killed by user") {
		t.Fatalf("the killed loop's caller got %q", r)
	}
}
