package proxy_test

import (
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// TestLocalReplyOverOutputLimitCloses: a reply the proxy answers itself
// (here a local-tier hit; also a coalesced read's follower) counts against
// server.client_output_limit as a reply from Redis does: the client is
// closed, as Redis closes a client past its output buffer's hard limit.
// Before, only replies of the batch's Call were held to it: a review saw
// two coalesced followers of a 1 MB read get the whole value under a
// 256 KB limit while their leader was closed, and a tier hit did the same.
// Here two hits of a 160 KB value in one batch: a value longer than the
// limit no longer reaches the tier, whose fill is read past at the
// tracking connection's reply limit (client_output_limit) and forwarded.
func TestLocalReplyOverOutputLimitCloses(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) {
		c.Server.ClientOutputLimit = 256 << 10
		c.LocalCache.Enabled = true
		c.LocalCache.AdmitMinReads = 0
	})
	big := strings.Repeat("x", 160<<10)
	if err := p.Redis.Client(t).Set(ctx, "big", big, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	get := "*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n"
	served := 0
	redistest.Eventually(t, 10*time.Second, func() bool {
		nc := dialAddr(t, p.Addr)
		defer nc.Close()
		if _, err := nc.Write([]byte(get + get)); err != nil { // one batch
			t.Fatal(err)
		}
		nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 64<<10)
		got := 0
		for {
			n, err := nc.Read(buf)
			got += n
			if err != nil || got > 1<<20 {
				break
			}
		}
		if got > 256<<10 {
			served++
		}
		return metricSum(t, p, "redproxy_localcache_hits_total") > 0
	}, "the local tier never served a hit")
	if served > 0 {
		t.Fatalf("%d pairs of GETs of a 160 KB value got more than the 256 KB client_output_limit", served)
	}
}
