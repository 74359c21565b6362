package proxy_test

// SELECT with an index outside a C int: Redis refuses it as an int out of
// range ("value is out of range, value must between ..."), the proxy
// answered "DB index is out of range", and for a 19-digit index within
// int64 "value is not an integer" (its integer parser stopped at 18
// digits) (found by review).

import (
	"testing"

	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

func TestSelectBadIndex(t *testing.T) {
	direct := redistest.Start(t)
	p := proxytest.Start(t, nil, nil)
	compareWithRedis(t, direct.Addr(), p.Addr, [][]string{
		{"SELECT", "16"}, {"SELECT", "-1"}, {"SELECT", "abc"}, {"SELECT", "1.5"}, {"SELECT", "01"},
		{"SELECT", "2147483647"}, {"SELECT", "-2147483648"},
		{"SELECT", "2147483648"}, {"SELECT", "-2147483649"}, {"SELECT", "1000000000000000000"},
		{"SELECT", "9223372036854775807"}, {"SELECT", "-9223372036854775808"},
		{"SELECT", "9223372036854775808"}, {"SELECT", "99999999999999999999"},
	})
}

// The same under WATCH, where SELECT goes to the pinned connection: Redis
// answers there, and the session's database must not change.
func TestSelectBadIndexUnderWatch(t *testing.T) {
	c, _, _ := newDirectPair(t)
	c.do(t, "WATCH", "k")
	for _, idx := range []string{"2147483648", "1000000000000000000", "99999999999999999999"} {
		if d, p := c.do(t, "SELECT", idx); d != p {
			t.Errorf("SELECT %s under WATCH: Redis %q, proxy %q", idx, d, p)
		}
	}
	c.do(t, "SET", "k", "v")
	if d, p := c.do(t, "GET", "k"); d != p || d != "$1\r\nv\r\n" {
		t.Errorf("GET after the refused SELECTs: Redis %q, proxy %q", d, p)
	}
}
