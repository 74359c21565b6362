package guard_test

import (
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/proxytest"
)

// The look-ahead trusts a later EXPIRE of the batch to give a write's key
// its TTL, and skips the write's fix-up. It excluded only the EXPIREs the
// policy refuses; one the proxy's own ACL refuses (the user may write
// hashes but not EXPIRE) never runs either, and the key was left without a
// TTL. The HSET must get its fix-up.
func TestLookaheadIgnoresACLRefusedExpire(t *testing.T) {
	const pw = "hash-only-pw"
	p := proxytest.Start(t, nil, func(c *config.Config) {
		c.Policy = holesPolicy()
		c.Users = []auth.UserConfig{{Name: "app", PasswordSHA256: auth.HashPassword(pw), ACL: "+@all -expire ~*"}}
	})
	direct := p.Redis.Client(t)
	nc := p.Dial(t)
	equalReplies(t, roundTrip(t, nc, []string{"AUTH", "app", pw}), []string{"+OK"})
	got := roundTrip(t, nc, []string{"HSET", "s:1", "f", "v"}, []string{"EXPIRE", "s:1", "100"})
	if got[0] != ":1" || !strings.HasPrefix(got[1], "-NOPERM") {
		t.Fatalf("replies %q", got)
	}
	if d := pttl(t, direct, "s:1"); d <= 0 {
		t.Errorf("PTTL s:1 = %v: the HSET's fix-up was skipped for an EXPIRE the proxy itself refused", d)
	}

	// Control: an EXPIRE the ACL allows is still trusted: the HSET breaks
	// no rule, and the key has the EXPIRE's TTL.
	const pw2 = "all-pw"
	p2 := proxytest.Start(t, nil, func(c *config.Config) {
		c.Policy = holesPolicy()
		c.Users = []auth.UserConfig{{Name: "app", PasswordSHA256: auth.HashPassword(pw2), ACL: "+@all ~*"}}
	})
	direct2 := p2.Redis.Client(t)
	nc2 := p2.Dial(t)
	equalReplies(t, roundTrip(t, nc2, []string{"AUTH", "app", pw2}), []string{"+OK"})
	equalReplies(t, roundTrip(t, nc2, []string{"HSET", "s:2", "f", "v"}, []string{"EXPIRE", "s:2", "100"}), []string{":1", ":1"})
	wantTTL(t, direct2, "s:2", 100*time.Second)
	if row := findRow(reportJSON(t, p2.Guard()), policy.RuleTTL, "hset"); row != nil {
		t.Errorf("HSET followed by an allowed EXPIRE was taken for a violation: %+v", *row)
	}
}
