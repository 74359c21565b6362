package proxy_test

import (
	"bytes"
	"regexp"
	"testing"

	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/resp"
)

// An EXEC the client's user may not run ends the transaction as on Redis:
// EXECABORT quoting the refusal, the transaction (and any WATCH)
// discarded, so what the client sends next runs. Found by review: the proxy
// answered NOPERM and kept the transaction open, so the next commands were
// answered QUEUED where Redis runs them. Compared with Redis itself given
// the same user; through the proxy also on a tracking relay.
func TestExecRefusedByACLEndsTheTransaction(t *testing.T) {
	const acl = "+@all -exec ~* &*"
	p := proxytest.Start(t, nil, func(c *config.Config) {
		c.Users = []auth.UserConfig{{Name: "app", PasswordSHA256: auth.HashPassword("pw"), ACL: acl}}
	})
	admin := p.Redis.Client(t)
	if err := admin.Do(ctx, "ACL", "SETUSER", "app", "on", ">pw", "+@all", "-exec", "~*", "&*").Err(); err != nil {
		t.Fatal(err)
	}
	wire := func(cmds ...[]string) []byte {
		var b []byte
		for _, c := range cmds {
			b = resp.AppendCommandStrings(b, c...)
		}
		return b
	}
	cl := redistest.StartCluster(t, 3, 0)
	pc := proxytest.Start(t, cl.Nodes[0], func(c *config.Config) {
		c.Upstream.Mode = config.ModeCluster
		c.Upstream.Seeds = cl.Seeds()
		c.Users = []auth.UserConfig{{Name: "app", PasswordSHA256: auth.HashPassword("pw"), ACL: acl}}
	})
	for _, tc := range []struct {
		name  string
		setup [][]string
		proxy string
	}{
		{"shared", nil, p.Addr},
		{"watch", [][]string{{"WATCH", "{xa}w"}}, p.Addr},
		{"resp3", [][]string{{"HELLO", "3"}}, p.Addr},
		{"tracking resp3", [][]string{{"HELLO", "3"}, {"CLIENT", "TRACKING", "ON"}}, p.Addr}, // a relay
		{"tracking resp2", [][]string{{"CLIENT", "TRACKING", "ON"}}, p.Addr},
		{"tracking watch", [][]string{{"HELLO", "3"}, {"CLIENT", "TRACKING", "ON"}, {"WATCH", "{xa}w"}}, p.Addr},
		{"cluster", nil, pc.Addr}, // MULTI held until its first key
		{"cluster watch", [][]string{{"WATCH", "{xa}w"}}, pc.Addr},
	} {
		t.Run(tc.name, func(t *testing.T) {
			steps := [][][]string{
				{{"MULTI"}, {"SET", "{xa}a", "1"}, {"EXEC"}, {"SET", "{xa}b", "2"}, {"GET", "{xa}a"}, {"DISCARD"}},
				{{"EXEC"}, {"GET", "{xa}b"}},
				{{"MULTI"}, {"PING"}, {"EXEC"}, {"PING"}},
				{{"MULTI"}, {"INCR", "{xa}c"}},
				{{"EXEC"}},
				{{"INCR", "{xa}c"}, {"EXEC", "x"}},
			}
			var got [2][][]byte
			for side, addr := range []string{p.Redis.Addr(), tc.proxy} {
				admin.Del(ctx, "{xa}a", "{xa}b", "{xa}c")
				cl.ClusterClient(t).Del(ctx, "{xa}a", "{xa}b", "{xa}c")
				c, err := dialDiff(addr)
				if err != nil {
					t.Fatal(err)
				}
				defer c.nc.Close()
				setup := append([][]string{{"AUTH", "app", "pw"}}, tc.setup...)
				if _, err := c.exchange(wire(setup...), len(setup)); err != nil {
					t.Fatal(err)
				}
				for _, s := range steps {
					f, err := c.exchange(wire(s...), len(s))
					if err != nil {
						t.Fatalf("side %d, %q: %v (have %q)", side, s, err, f)
					}
					got[side] = append(got[side], f...)
				}
			}
			// Redis 7.0 words the refusal "this user has ..."; the proxy
			// as Redis 7.2 does, "User app has ...".
			who := regexp.MustCompile(`NOPERM (this user|User app) has`)
			for i := range got[0] {
				if !bytes.Equal(who.ReplaceAll(got[0][i], []byte("NOPERM $$who has")), who.ReplaceAll(got[1][i], []byte("NOPERM $$who has"))) {
					t.Errorf("reply %d: Redis %q, proxy %q", i, got[0][i], got[1][i])
				}
			}
		})
	}
}
