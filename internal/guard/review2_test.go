package guard_test

// Guard defects found by a review, each reproduced against real servers.

import (
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/proxytest"
)

// sTTLPolicy: keys s:* must have a TTL, 24h by default.
func sTTLPolicy() policy.Config {
	return policy.Config{
		Mode: "enforce",
		TTL:  []policy.TTLRule{{Pattern: "s:*", Required: true, Default: policy.Duration{Duration: 24 * time.Hour}}},
	}
}

// COPY ... DB 01 (or +1) fails on Redis, whose string2ll refuses the
// number; the fix-up took it with Atoi, its own SELECT 01 failed too, and
// its EXPIRE ran in the client's database on a key nobody wrote.
func TestCopyToBadDatabaseNumberGetsNoFixup(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Policy = sTTLPolicy() })
	db0 := dbClient(t, p.Redis, 0)
	nc := p.Dial(t)
	for _, db := range []string{"01", "+1"} {
		db0.Del(ctx, "s:legacy")
		db0.Set(ctx, "s:legacy", "mine, no TTL", 0)
		db0.Set(ctx, "s:src", "x", time.Hour)
		got := roundTrip(t, nc, []string{"COPY", "s:src", "s:legacy", "DB", db}, []string{"PING"})
		if got[0] != "-ERR value is not an integer or out of range" {
			t.Fatalf("COPY ... DB %s: %q", db, got)
		}
		if d := pttl(t, db0, "s:legacy"); d != -1 {
			t.Errorf("COPY ... DB %s failed, yet s:legacy in database 0 now has PTTL %v", db, d)
		}
	}
}

// AUTH pipelined with more commands on a connection logged in as another
// user of the same namespace: the rest of the batch was decided under the
// previous user's policy scope, so a SET escaped the new user's TTL rule
// and a DBSIZE its denial.
func TestScopeAfterPipelinedAuth(t *testing.T) {
	const pw = "strict-pw"
	strict := sTTLPolicy()
	p := proxytest.Start(t, nil, func(c *config.Config) {
		c.Policy = policy.Config{
			Mode: "enforce",
			Scopes: []policy.Scope{{Name: "strict", Users: []string{"app"}, TTL: strict.TTL,
				Commands: &policy.CommandRules{Deny: []string{"dbsize"}}}},
		}
		c.Users = []auth.UserConfig{
			{Name: "app", PasswordSHA256: auth.HashPassword(pw), ACL: "+@all ~*"},
			{Name: "ops", PasswordSHA256: auth.HashPassword("ops-pw"), ACL: "+@all ~*"},
		}
	})
	direct := p.Redis.Client(t)

	// Control: AUTH, then the commands in another round trip.
	nc := p.Dial(t)
	roundTrip(t, nc, []string{"AUTH", "app", pw})
	got := roundTrip(t, nc, []string{"SET", "s:a", "v"}, []string{"DBSIZE"})
	if d := pttl(t, direct, "s:a"); d <= 0 || !strings.HasPrefix(got[1], "-ERR redproxy policy: DBSIZE is disabled") {
		t.Fatalf("control: PTTL s:a = %v, DBSIZE %q", d, got[1])
	}

	// The same commands in the write that carries AUTH, on a connection
	// that was another user (ops, no scope) before.
	nc2 := p.Dial(t)
	roundTrip(t, nc2, []string{"AUTH", "ops", "ops-pw"})
	got = roundTrip(t, nc2, []string{"AUTH", "app", pw}, []string{"SET", "s:b", "v"}, []string{"DBSIZE"})
	if got[0] != "+OK" {
		t.Fatalf("AUTH: %q", got[0])
	}
	if d := pttl(t, direct, "s:b"); d <= 0 {
		t.Errorf("PTTL s:b = %v: SET pipelined behind AUTH escaped the user's scope (TTL rule s:*)", d)
	}
	if !strings.HasPrefix(got[2], "-ERR redproxy policy: DBSIZE is disabled") {
		t.Errorf("DBSIZE pipelined behind AUTH = %q: the user's scope denies it", got[2])
	}
}
