package proxy_test

import (
	"bytes"
	"testing"

	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/resp"
)

// Redis looks a command up and checks its arity before its ACL: a user
// who may not run a command still gets "unknown command", "unknown
// subcommand" or "wrong number of arguments" for one that fails those
// checks, byte for byte as Redis answers the same user (found by a probe:
// the proxy answered NOPERM). Commands the ACL allows, and refusals of
// well-formed commands, are compared too.
func TestACLRefusalComesAfterRedisOwnChecks(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) {
		c.Users = []auth.UserConfig{{Name: "app", PasswordSHA256: auth.HashPassword("pw"), ACL: "+@read +client|tracking ~app:*"}}
	})
	if err := p.Redis.Client(t).Do(ctx, "ACL", "SETUSER", "app", "on", ">pw", "+@read", "+client|tracking", "~app:*").Err(); err != nil {
		t.Fatal(err)
	}
	cmds := [][]string{
		{"NOSUCHCMD", "a", "b"},
		{"CLIENT", "FOO"},
		{"CONFIG", "NOPE"},
		{"OBJECT", "NOPE", "x"},
		{"CLIENT"},
		{"CLIENT", "NO-EVICT"},
		{"SET", "app:1"},
		{"XADD", "secret"},
		{"GET", "secret", "x"},
		{"GET", "secret"},
		{"SET", "app:1", "v"},
		{"GET", "app:1"},
	}
	for _, relayed := range []bool{false, true} {
		compareACLOrder(t, p, cmds, relayed)
	}
}

// compareACLOrder sends cmds as the user app to Redis and to the proxy,
// on a tracking connection (a relay, through the proxy) when relayed, and
// compares the replies.
func compareACLOrder(t *testing.T, p *proxytest.Proxy, cmds [][]string, relayed bool) {
	t.Helper()
	wire := resp.AppendCommandStrings(nil, "AUTH", "app", "pw")
	n := len(cmds) + 1
	if relayed {
		wire = resp.AppendCommandStrings(wire, "HELLO", "3")
		wire = resp.AppendCommandStrings(wire, "CLIENT", "TRACKING", "ON")
		n += 2
	}
	for _, c := range cmds {
		wire = resp.AppendCommandStrings(wire, c...)
	}
	got := exchangeWithBoth(t, p, wire, n)
	got[0], got[1] = got[0][n-len(cmds):], got[1][n-len(cmds):]
	for i := range got[0] {
		// Redis 7.0 words NOPERM its way, the proxy as Redis 7.2: only
		// that the reply is a NOPERM is compared for those.
		if bytes.HasPrefix(got[0][i], []byte("-NOPERM")) && bytes.HasPrefix(got[1][i], []byte("-NOPERM")) {
			continue
		}
		if !bytes.Equal(got[0][i], got[1][i]) {
			t.Errorf("relayed %v, %q: Redis %q, proxy %q", relayed, cmds[i], got[0][i], got[1][i])
		}
	}
}

// exchangeWithBoth sends wire, one write, to Redis and to the proxy on a
// fresh connection each, and returns the n replies of each: [0] Redis's,
// [1] the proxy's.
func exchangeWithBoth(t *testing.T, p *proxytest.Proxy, wire []byte, n int) [2][][]byte {
	t.Helper()
	var got [2][][]byte
	for side, addr := range []string{p.Redis.Addr(), p.Addr} {
		c, err := dialDiff(addr)
		if err != nil {
			t.Fatal(err)
		}
		f, err := c.exchange(wire, n)
		c.nc.Close()
		if err != nil {
			t.Fatalf("side %d: %v (have %q)", side, err, f)
		}
		got[side] = f
	}
	return got
}
