package proxy_test

import (
	"bytes"
	"io"
	"testing"

	"github.com/redproxy/redproxy/internal/proxytest"
)

// BenchmarkForwardPipeline16 measures the whole forwarding path (client
// socket, parse, dispatch, shared upstream pipe, real redis-server, reply
// framing, write back) for a 16-command GET pipeline. The client side
// allocates nothing, so allocs/op are the proxy's.
func BenchmarkForwardPipeline16(b *testing.B) {
	benchForward(b, 16)
}

func BenchmarkForwardSingle(b *testing.B) {
	benchForward(b, 1)
}

func benchForward(b *testing.B, depth int) {
	p := proxytest.Start(b, nil, nil)
	if _, err := p.Redis.Client(b).Set(ctx, "key:000000012345", bytes.Repeat([]byte("v"), 64), 0).Result(); err != nil {
		b.Fatal(err)
	}
	benchForwardOn(b, p, depth)
}

// benchForwardOn is benchForward through p, whose upstream holds
// key:000000012345 = 64 v's.
func benchForwardOn(b *testing.B, p *proxytest.Proxy, depth int) {
	nc := p.Dial(b)
	var req bytes.Buffer
	for i := 0; i < depth; i++ {
		req.WriteString("*2\r\n$3\r\nGET\r\n$16\r\nkey:000000012345\r\n")
	}
	reply := "$64\r\n" + string(bytes.Repeat([]byte("v"), 64)) + "\r\n"
	want := len(reply) * depth
	buf := make([]byte, want)
	round := func() {
		if _, err := nc.Write(req.Bytes()); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(nc, buf); err != nil {
			b.Fatal(err)
		}
	}
	for i := 0; i < 100; i++ { // warm up buffers and pools
		round()
	}
	if string(buf[:len(reply)]) != reply {
		b.Fatalf("unexpected reply %q", buf[:len(reply)])
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		round()
	}
}
