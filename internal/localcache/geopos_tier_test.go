package localcache_test

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/resp"
)

// A RESP2 client reading GEOPOS of missing members through the tier, from
// Redis and then from memory, gets the bytes Redis sends a RESP2 client.
func TestTierGeoposMissingMembersRESP2(t *testing.T) {
	p := startTier(t, nil)
	direct := p.Redis.Client(t)
	if err := direct.GeoAdd(ctx, "geo:t", &redis.GeoLocation{Name: "Palermo", Longitude: 13.361389, Latitude: 38.115556}).Err(); err != nil {
		t.Fatal(err)
	}
	want := rawOnce(t, p.Redis.Addr(), "GEOPOS", "geo:t", "Nowhere", "Nada")
	if want != "*2\r\n*-1\r\n*-1\r\n" {
		t.Fatalf("Redis itself sends %q; the test expects *-1 elements", want)
	}
	hits := metric(t, p.Metrics.Registry, "redproxy_localcache_hits_total")
	for i := range 3 {
		if got := rawOnce(t, p.Addr, "GEOPOS", "geo:t", "Nowhere", "Nada"); got != want {
			t.Fatalf("read %d through the tier: %q, Redis sends %q", i, got, want)
		}
	}
	if metric(t, p.Metrics.Registry, "redproxy_localcache_hits_total") == hits {
		t.Fatal("no read was served from the tier; the cached shape was never checked")
	}
}

func rawOnce(t *testing.T, addr string, args ...string) string {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	nc.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := nc.Write([]byte(b.String())); err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(nc)
	var buf []byte
	for {
		c, err := rd.ReadByte()
		if err != nil {
			t.Fatal(err)
		}
		buf = append(buf, c)
		if n, err := resp.ScanReply(buf); err != nil || n > 0 {
			return string(buf)
		}
	}
}
