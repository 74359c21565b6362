package proxy_test

import (
	"bytes"
	"regexp"
	"testing"

	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/resp"
)

// SORT's BY (with a pattern) and GET, for a user who may not read every
// key, are refused with Redis's own error naming the option, checked in
// Redis's order: the sorted key first, then the options as SORT reads
// them, a syntax error before them left to Redis. Found by a probe: the
// proxy answered "NOPERM No permissions to access a key" where Redis
// answers "ERR BY option of SORT denied ...". Compared with Redis given
// the same user.
func TestSortByPatternRefusedAsRedisDoes(t *testing.T) {
	const acl = "+@all ~cache:*"
	p := proxytest.Start(t, nil, func(c *config.Config) {
		c.Users = []auth.UserConfig{{Name: "app", PasswordSHA256: auth.HashPassword("pw"), ACL: acl}}
	})
	admin := p.Redis.Client(t)
	if err := admin.Do(ctx, "ACL", "SETUSER", "app", "on", ">pw", "+@all", "~cache:*").Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.RPush(ctx, "cache:l", 2, 1).Err(); err != nil {
		t.Fatal(err)
	}
	cmds := [][]string{
		{"SORT", "cache:l", "BY", "cache:w_*"},
		{"SORT", "cache:l", "GET", "#"},
		{"SORT", "cache:l", "get", "cache:o_*", "BY", "cache:w_*"},
		{"SORT", "cache:l", "BY", "nosort", "GET", "#"},
		{"SORT", "cache:l", "BY", "nosort"},
		{"SORT", "cache:l", "LIMIT", "0", "1", "DESC", "ALPHA", "BY", "cache:w_*"},
		{"SORT", "cache:l", "LIMIT", "0", "x", "BY", "cache:w_*"},
		{"SORT", "cache:l", "nosuchoption", "GET", "#"},
		{"SORT", "cache:l", "STORE", "cache:out", "GET", "#"},
		{"SORT", "session:l", "BY", "cache:w_*"},
		{"SORT_RO", "cache:l", "BY", "cache:w_*"},
		{"SORT_RO", "cache:l", "STORE", "cache:out", "GET", "#"},
		{"SORT", "cache:l", "GET"},
	}
	var wire []byte
	wire = resp.AppendCommandStrings(wire, "AUTH", "app", "pw")
	for _, c := range cmds {
		wire = resp.AppendCommandStrings(wire, c...)
	}
	got := exchangeWithBoth(t, p, wire, len(cmds)+1)
	// Redis 7.0 words a key refusal "this user has no permissions to
	// access one of the keys used as arguments"; the proxy as Redis 7.2.
	key := regexp.MustCompile(`NOPERM (this user has no permissions to access one of the keys used as arguments|No permissions to access a key)`)
	for i := range got[0] {
		r, q := key.ReplaceAll(got[0][i], []byte("NOPERM key")), key.ReplaceAll(got[1][i], []byte("NOPERM key"))
		if !bytes.Equal(r, q) {
			what := []string{"AUTH"}
			if i > 0 {
				what = cmds[i-1]
			}
			t.Errorf("%q: Redis %q, proxy %q", what, got[0][i], got[1][i])
		}
	}
}
