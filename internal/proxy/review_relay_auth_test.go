package proxy_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// Failed AUTH is rate-limited per client address (README "Security": after
// 10 failures an address may try once a second). Without [[users]] (the
// requirepass mode) a client in a relay (CLIENT TRACKING ON, SUBSCRIBE,
// MONITOR) has its AUTH forwarded to Redis as it is: every guess is
// answered by Redis, never limited and never counted, so a client that
// knows the proxy's password can guess any other Redis user's password at
// full speed through the proxy.
func TestReviewRelayAuthEscapesFailedAuthLimit(t *testing.T) {
	p := startPasswordOnlyWithAdmin(t)

	c := dialRaw(t, p.Addr)
	if v := c.do("AUTH", "up-pass-123"); v != "OK" {
		t.Fatalf("AUTH = %v", v)
	}
	if v := c.do("CLIENT", "TRACKING", "ON"); v != "OK" {
		t.Fatalf("CLIENT TRACKING ON = %v", v)
	}
	var replies []string
	limited := false
	for i := range 20 {
		v := fmt.Sprint(c.do("AUTH", "admin", fmt.Sprintf("guess-%d", i)))
		replies = append(replies, v)
		if strings.Contains(v, "too many failed AUTH attempts") {
			limited = true
			break
		}
	}
	if !limited {
		t.Errorf("20 wrong AUTH admin <guess> on a tracking relay were never rate-limited (replies: %q ...); a plain connection is limited after 10", replies[:2])
	}
	// And the guesses did not count for the address either.
	c2 := dialRaw(t, p.Addr)
	if v := fmt.Sprint(c2.do("AUTH", "wrong")); !strings.Contains(v, "too many failed AUTH attempts") {
		t.Errorf("AUTH from the same address after 20 failed guesses = %q; want the rate-limit refusal", v)
	}
	// The relay's AUTH also makes it a Redis user the proxy never lets a
	// client be: through the proxy, only the upstream credential logs in.
	c3 := dialRaw(t, p.Addr)
	if v := fmt.Sprint(c3.do("AUTH", "admin", "admin-secret")); !strings.Contains(v, "WRONGPASS") && !strings.Contains(v, "too many") {
		t.Fatalf("AUTH admin on a plain connection = %q; want a refusal", v)
	}
	if v := fmt.Sprint(c.do("AUTH", "admin", "admin-secret")); v == "OK" {
		t.Errorf("AUTH admin admin-secret on the relay = OK: the relay's upstream connection now runs as Redis user admin, not the proxy's credential")
	}
}

// TestRelayAuthInEveryRelayKind: without [[users]], AUTH on a relay is the
// proxy's (right password OK, wrong one WRONGPASS and counted), never
// Redis's, whatever kind of relay: in the client's MULTI it is refused and
// EXEC aborts (Redis 7.0 would queue AUTH and run it at EXEC), in MONITOR
// mode (where Redis runs AUTH) it is refused, in RESP2's subscribed mode
// Redis refuses it itself; HELLO with AUTH is refused on any relay.
func TestRelayAuthInEveryRelayKind(t *testing.T) {
	p := startPasswordOnlyWithAdmin(t)
	login := func(t *testing.T) *rawConn {
		c := dialRaw(t, p.Addr)
		if v := c.do("AUTH", "up-pass-123"); v != "OK" {
			t.Fatalf("AUTH = %v", v)
		}
		return c
	}
	whoami := func(t *testing.T, c *rawConn) {
		if v := c.do("ACL", "WHOAMI"); v != "default" {
			t.Errorf("relay runs as Redis user %v, want default", v)
		}
	}

	t.Run("tracking", func(t *testing.T) {
		c := login(t)
		c.do("CLIENT", "TRACKING", "ON")
		if v := c.do("AUTH", "up-pass-123"); v != "OK" {
			t.Errorf("AUTH with the proxy's password = %v, want OK", v)
		}
		if v := fmt.Sprint(c.do("AUTH", "admin", "admin-secret")); !strings.HasPrefix(v, "WRONGPASS") {
			t.Errorf("AUTH admin = %v, want WRONGPASS", v)
		}
		if v := fmt.Sprint(c.do("HELLO", "3", "AUTH", "admin", "admin-secret")); !strings.Contains(v, "HELLO with AUTH is not supported") {
			t.Errorf("HELLO 3 AUTH admin = %v, want the refusal", v)
		}
		whoami(t, c)
	})
	t.Run("multi", func(t *testing.T) {
		c := login(t)
		c.do("CLIENT", "TRACKING", "ON")
		c.do("MULTI")
		if v := fmt.Sprint(c.do("AUTH", "admin", "admin-secret")); !strings.Contains(v, "inside MULTI is not supported") {
			t.Errorf("AUTH in MULTI = %v, want the refusal", v)
		}
		if v := fmt.Sprint(c.do("EXEC")); !strings.HasPrefix(v, "EXECABORT") {
			t.Errorf("EXEC = %v, want EXECABORT", v)
		}
		whoami(t, c)
	})
	t.Run("monitor", func(t *testing.T) {
		c := login(t)
		c.do("MONITOR")
		c.send([]string{"AUTH", "admin", "admin-secret"})
		// Redis's MONITOR feed may come first: skip what is not a reply
		// to AUTH.
		for {
			v, _ := c.readReply()
			if s, isStatus := v.(string); isStatus && strings.HasPrefix(s, "1") {
				continue // a feed line
			}
			if !strings.Contains(fmt.Sprint(v), "not supported on a connection in MONITOR mode") {
				t.Errorf("AUTH on MONITOR = %v, want the refusal", v)
			}
			break
		}
	})
	t.Run("resp2 subscribed", func(t *testing.T) {
		c := login(t)
		c.do("SUBSCRIBE", "ch")
		if v := fmt.Sprint(c.do("AUTH", "admin", "admin-secret")); !strings.Contains(v, "Can't execute 'auth'") {
			t.Errorf("AUTH while subscribed = %v, want Redis's refusal", v)
		}
	})
}

// startPasswordOnlyWithAdmin starts Redis with requirepass up-pass-123 and
// a Redis user admin (password admin-secret) the proxy never logs in as,
// and a proxy in password mode (no [[users]]) in front of it.
func startPasswordOnlyWithAdmin(t *testing.T) *proxytest.Proxy {
	t.Helper()
	rs := redistest.Start(t)
	rc := rs.Client(t)
	if err := rc.Do(ctx, "acl", "setuser", "admin", "on", ">admin-secret", "~*", "&*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rc.ConfigSet(ctx, "requirepass", "up-pass-123").Err(); err != nil {
		t.Fatal(err)
	}
	return proxytest.Start(t, rs, func(c *config.Config) { c.Upstream.Password = "up-pass-123" })
}
