package proxy_test

// Found by the tools review (redis-cli against Redis 7.0.15 and through the
// proxy): CLIENT KILL's MAXAGE filter is Redis 7.4's. Redis 7.0 (the
// version the proxy is tested with, and whose built-in table it ships)
// refuses it with a syntax error and kills nobody; the proxy, which answers
// CLIENT KILL itself (internal/proxy/local.go, clientKill, case "maxage"),
// accepts it whatever the upstream's version and kills every other client
// of the proxy older than the age given. The proxy gates CLIENT NO-TOUCH
// (7.2) on the upstream's command table; MAXAGE is not gated.
//
//	redis-cli -p <redis 7.0> CLIENT KILL MAXAGE 1   -> ERR syntax error
//	redis-cli -p <proxy>     CLIENT KILL MAXAGE 1   -> (integer) N, N clients gone

import (
	"strings"
	"testing"
)

func TestReviewToolsClientKillMaxAgeFollowsUpstreamVersion(t *testing.T) {
	_, p, direct := newDirectPair(t)
	info := rawDo(t, dialAddr(t, direct.Addr()), "INFO", "server")
	if !strings.Contains(info, "redis_version:7.0.") && !strings.Contains(info, "redis_version:7.2.") {
		t.Skip("needs a Redis before 7.4, which has no CLIENT KILL MAXAGE")
	}
	compareWithRedis(t, direct.Addr(), p.Addr, [][]string{
		{"CLIENT", "KILL", "MAXAGE", "0"},
		{"CLIENT", "KILL", "MAXAGE", "abc"},
		{"CLIENT", "KILL", "MAXAGE", "0", "SKIPME", "no"},
	})

	// What it does: another client of the proxy is killed by a filter its
	// Redis refuses.
	victim := dialAddr(t, p.Addr)
	if got := rawDo(t, victim, "PING"); got != "+PONG\r\n" {
		t.Fatalf("PING = %q", got)
	}
	killer := dialAddr(t, p.Addr)
	got := rawDo(t, killer, "CLIENT", "KILL", "MAXAGE", "0")
	if want := rawDo(t, dialAddr(t, direct.Addr()), "CLIENT", "KILL", "MAXAGE", "0"); got != want {
		t.Errorf("CLIENT KILL MAXAGE 0 through the proxy answered %q; Redis answers %q", got, want)
	}
	rawSend(t, victim, "PING")
	one := make([]byte, 7)
	if n, err := victim.Read(one); err != nil || string(one[:n]) != "+PONG\r\n" {
		t.Errorf("the other client's PING after CLIENT KILL MAXAGE 0: %q, %v (Redis would have killed nobody)", one[:n], err)
	}
}
