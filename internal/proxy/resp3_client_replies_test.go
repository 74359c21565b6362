package proxy_test

// Replies the proxy builds itself for CLIENT subcommands must have the
// RESP3 types Redis gives them (found by review): CLIENT INFO and CLIENT
// LIST were sent as bulk strings ('$') where Redis sends a verbatim string
// ('=', "txt:"), as for INFO, so a RESP3 client library saw another type
// (rueidis: a verbatim string is a different message type); CLIENT
// TRACKINGINFO's "flags" was an array ('*') where Redis sends a set ('~').

import (
	"strings"
	"testing"
)

func TestResp3ClientInfoAndListAreVerbatim(t *testing.T) {
	c, _, _ := newDirectPair(t)
	c.do(t, "HELLO", "3")
	for _, cmd := range [][]string{{"CLIENT", "INFO"}, {"CLIENT", "LIST"}, {"CLIENT", "LIST", "TYPE", "normal"}, {"CLIENT", "LIST", "ID", "1"}} {
		d, p := c.do(t, cmd...)
		if d[0] != p[0] || strings.HasPrefix(d, "=") != strings.Contains(p, "\r\ntxt:") {
			t.Errorf("%s on RESP3: Redis answers %q..., the proxy %q...", strings.Join(cmd, " "), replyHead(d), replyHead(p))
		}
	}
	// RESP2 keeps the bulk string.
	c.do(t, "HELLO", "2")
	for _, cmd := range [][]string{{"CLIENT", "INFO"}, {"CLIENT", "LIST"}} {
		if d, p := c.do(t, cmd...); d[0] != '$' || p[0] != '$' {
			t.Errorf("%s on RESP2: Redis answers %q..., the proxy %q...", strings.Join(cmd, " "), replyHead(d), replyHead(p))
		}
	}
}

func TestResp3TrackingInfoFlagsIsASet(t *testing.T) {
	c, _, _ := newDirectPair(t)
	for _, proto := range []string{"2", "3"} {
		c.do(t, "HELLO", proto)
		if d, p := c.do(t, "CLIENT", "TRACKINGINFO"); d != p {
			t.Errorf("CLIENT TRACKINGINFO on RESP%s:\nRedis:    %q\nproxy:    %q", proto, d, p)
		}
	}
}
