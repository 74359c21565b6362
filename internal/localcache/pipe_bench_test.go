package localcache_test

import (
	"bytes"
	"io"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
)

// BenchmarkHitPipeline16 measures a 16-GET pipeline answered from the tier
// through a real client socket; BenchmarkPingPipeline16 the same with PING,
// which the proxy answers itself: the front end's own cost, the ceiling a
// hit can approach. The client side allocates nothing.
func BenchmarkHitPipeline16(b *testing.B) {
	benchPipeline(b, "*2\r\n$3\r\nGET\r\n$16\r\nkey:000000012345\r\n", "$64\r\n"+string(bytes.Repeat([]byte("v"), 64))+"\r\n")
}

func BenchmarkPingPipeline16(b *testing.B) {
	benchPipeline(b, "*1\r\n$4\r\nPING\r\n", "+PONG\r\n")
}

func benchPipeline(b *testing.B, cmd, reply string) {
	// S = 1s: a loaded machine must not make a heartbeat late and turn
	// hits into forwards in the middle of the measurement.
	p := startTier(b, nil, func(c *config.Config) { c.LocalCache.Staleness = units.Duration{Duration: time.Second} })
	p.Redis.Client(b).Set(ctx, "key:000000012345", bytes.Repeat([]byte("v"), 64), 0)
	cacheIt(b, p, p.Client(b), "key:000000012345")
	nc := p.Dial(b)
	req := bytes.Repeat([]byte(cmd), 16)
	buf := make([]byte, 16*len(reply))
	round := func() {
		if _, err := nc.Write(req); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(nc, buf); err != nil {
			b.Fatal(err)
		}
	}
	for range 100 {
		round()
	}
	if string(buf[:len(reply)]) != reply {
		b.Fatalf("unexpected reply %q", buf[:len(reply)])
	}
	h := hits(b, p)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		round()
	}
	b.StopTimer()
	if cmd[4] == '$' && cmd[8] == 'G' && hits(b, p)-h < float64(16*b.N) {
		b.Fatalf("only %v of %d GETs were hits", hits(b, p)-h, 16*b.N)
	}
}
