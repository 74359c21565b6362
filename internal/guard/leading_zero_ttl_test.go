package guard_test

import (
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/proxytest"
)

// maxTTLPolicy: s:* keys need a TTL, 24h by default, at most 7 days
// (clamped); l:* keys need one, have no default and refuse more than a
// minute.
func maxTTLPolicy() policy.Config {
	return policy.Config{
		Mode: "enforce",
		TTL: []policy.TTLRule{
			{Pattern: "s:*", Required: true, Default: policy.Duration{Duration: 24 * time.Hour}, Max: policy.Duration{Duration: 7 * 24 * time.Hour}},
			{Pattern: "l:*", Required: true, Max: policy.Duration{Duration: time.Minute}, MaxAction: "refuse"},
		},
	}
}

// TestLeadingZeroTTL shows that a TTL Redis refuses for its leading zero
// ("0100") is not trusted by the policy's look-ahead to give an earlier
// write's key its TTL.
//
// What went wrong (found by review): Redis parses integers with string2ll,
// which refuses a leading zero, but the policy's parseInt took "0100" as
// 100. So HSET k + EXPIRE k 0100 dropped the HSET's fix-up, Redis refused
// the EXPIRE, and k was left without a TTL; SET l:lock me NX + EXPIRE
// l:lock 030 let a lock through under a rule with no default that must
// refuse a write it cannot give a TTL (doc.go: the later command must
// carry "a number Redis accepts").
func TestLeadingZeroTTL(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Policy = maxTTLPolicy() })
	db0 := dbClient(t, p.Redis, 0)

	// What Redis itself says.
	if err := db0.Do(ctx, "EXPIRE", "anything", "0100").Err(); err == nil || err.Error() != "ERR value is not an integer or out of range" {
		t.Fatalf("Redis: EXPIRE anything 0100 = %v", err)
	}

	t.Run("look-ahead trusts it", func(t *testing.T) {
		got := roundTrip(t, p.Dial(t), []string{"HSET", "s:lz", "f", "v"}, []string{"EXPIRE", "s:lz", "0100"})
		equalReplies(t, got, []string{":1", "-ERR value is not an integer or out of range"})
		if d := pttl(t, db0, "s:lz"); d < 0 {
			t.Errorf("HSET s:lz + EXPIRE s:lz 0100 (refused by Redis) left s:lz with PTTL %v: rule s:* requires a TTL (default 24h)", d)
		}
	})

	t.Run("lock without default not refused", func(t *testing.T) {
		got := roundTrip(t, p.Dial(t), []string{"SET", "l:lock", "me", "NX"}, []string{"EXPIRE", "l:lock", "030"})
		if got[0] == "+OK" {
			t.Errorf("SET l:lock me NX + EXPIRE l:lock 030 = %q: the lock was taken and has PTTL %v; rule l:* (no default) must refuse a write it cannot give a TTL",
				got, pttl(t, db0, "l:lock"))
		}
	})
}
