package proxy_test

import (
	"bytes"
	"fmt"
	"io"
	"syscall"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
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

// The local tier's hot path, through a real client socket like the
// benchmarks above, so allocs/op are the proxy's: a 16-GET pipeline
// answered from the tier, and what the tier costs where it cannot help, a
// 16-SET pipeline and a 16-GET pipeline over keys too cold to be admitted,
// each with the tier on and off (issue 10).

func BenchmarkTierHitPipeline16(b *testing.B) {
	p := startBenchTier(b, true)
	cmd := "*2\r\n$3\r\nGET\r\n$16\r\nkey:000000012345\r\n"
	val := bytes.Repeat([]byte("v"), 64)
	if err := p.Redis.Client(b).Set(ctx, "key:000000012345", val, 0).Err(); err != nil {
		b.Fatal(err)
	}
	c := p.Client(b)
	redistestEventually(b, func() bool {
		c.Get(ctx, "key:000000012345")
		return tierHits(b, p) > 0
	})
	req := bytes.Repeat([]byte(cmd), 16)
	reply := "$64\r\n" + string(val) + "\r\n"
	h := tierHits(b, p)
	n := runPipelines(b, p, func() []byte { return req }, len(reply)*16, reply)
	if got := tierHits(b, p) - h; got < float64(16*n) {
		b.Fatalf("only %v of %d GETs were hits", got, 16*n)
	}
}

func BenchmarkTierSetPipeline16(b *testing.B) {
	for _, on := range []bool{true, false} {
		b.Run(onOff(on), func(b *testing.B) {
			p := startBenchTier(b, on)
			runPipelines(b, p, newKeyPipeline("SET", "$2\r\nvv\r\n").next, 16*len("+OK\r\n"), "+OK\r\n")
		})
	}
}

// BenchmarkTierColdGetPipeline16 reads a new key every time, so none is
// ever admitted: every read is a miss the tier only counts.
func BenchmarkTierColdGetPipeline16(b *testing.B) {
	for _, on := range []bool{true, false} {
		b.Run(onOff(on), func(b *testing.B) {
			p := startBenchTier(b, on)
			runPipelines(b, p, newKeyPipeline("GET", "").next, 16*len("$-1\r\n"), "$-1\r\n")
		})
	}
}

func onOff(on bool) string {
	if on {
		return "tier=on"
	}
	return "tier=off"
}

// startBenchTier starts a proxy with the tier on (at its defaults, as
// --local-tier=on runs it) or off. The default staleness bound is kept
// at 1s explicitly: a loaded machine must not turn hits into forwards in
// the middle of a run.
func startBenchTier(b *testing.B, on bool) *proxytest.Proxy {
	p := proxytest.Start(b, nil, func(c *config.Config) {
		c.LocalCache.Enabled = on
		c.LocalCache.Staleness = units.Duration{Duration: time.Second}
	})
	if on {
		p.LocalTier().Connect(0)
		redistestEventually(b, func() bool { return p.LocalTier().Live(0) })
	}
	return p
}

// keyPipeline is a pipeline of 16 commands "NAME key:NNNNNNNNNNNN [ARG]"
// whose keys next rewrites in place, so that every round names 16 new keys
// without the client allocating.
type keyPipeline struct {
	req    []byte
	digits []int // offsets of the keys' 12 digits
	n      int
}

// newKeyPipeline builds one; suffix is the RESP of the extra argument.
func newKeyPipeline(name, suffix string) *keyPipeline {
	nargs := 2
	if suffix != "" {
		nargs = 3
	}
	kp := &keyPipeline{}
	for range 16 {
		kp.req = fmt.Appendf(kp.req, "*%d\r\n$%d\r\n%s\r\n$16\r\nkey:", nargs, len(name), name)
		kp.digits = append(kp.digits, len(kp.req))
		kp.req = append(kp.req, "000000000000\r\n"+suffix...)
	}
	return kp
}

func (kp *keyPipeline) next() []byte {
	for _, at := range kp.digits {
		n := kp.n
		kp.n++
		for i := at + 11; i >= at; i-- {
			kp.req[i] = byte('0' + n%10)
			n /= 10
		}
	}
	return kp.req
}

// runPipelines sends next() pipelines, each answered by want bytes that
// start with first, and returns how many it sent while timed.
func runPipelines(b *testing.B, p *proxytest.Proxy, next func() []byte, want int, first string) int {
	nc := p.Dial(b)
	buf := make([]byte, want)
	round := func() {
		if _, err := nc.Write(next()); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(nc, buf); err != nil {
			b.Fatal(err)
		}
	}
	for range 100 {
		round()
	}
	if string(buf[:len(first)]) != first {
		b.Fatalf("unexpected reply %q", buf[:len(first)])
	}
	b.ReportAllocs()
	cpu0 := benchCPU(b)
	b.ResetTimer()
	for range b.N {
		round()
	}
	b.StopTimer()
	// The test process's CPU (proxy and the client's syscalls; Redis is
	// another process) per pipeline: unlike ns/op, it hardly moves when
	// other work on the machine takes the cores.
	b.ReportMetric(float64((benchCPU(b)-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
	return b.N
}

// benchCPU is the user plus system CPU time of this process so far.
func benchCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func tierHits(b *testing.B, p *proxytest.Proxy) float64 {
	fams, err := p.Metrics.Registry.Gather()
	if err != nil {
		b.Fatal(err)
	}
	total := 0.0
	for _, f := range fams {
		if f.GetName() == "redproxy_localcache_hits_total" {
			for _, m := range f.GetMetric() {
				total += m.GetCounter().GetValue()
			}
		}
	}
	return total
}

func redistestEventually(b *testing.B, cond func() bool) {
	redistest.Eventually(b, 10*time.Second, cond, "condition never met")
}

// BenchmarkTierEvalSHAPipeline16 is a hot script's cost (a rate limiter
// sends EVALSHA on every request) with the tier off, on, and on once a
// script mentioning swapdb was loaded through the proxy, which makes every
// EVALSHA look its SHA1 up (localcache/scripts.go).
func BenchmarkTierEvalSHAPipeline16(b *testing.B) {
	const body = "redis.call('SET', KEYS[1], ARGV[1]) return 1"
	for _, tc := range []struct {
		name     string
		on, swap bool
	}{{"tier=off", false, false}, {"tier=on", true, false}, {"tier=on,swapscript=seen", true, true}} {
		b.Run(tc.name, func(b *testing.B) {
			p := startBenchTier(b, tc.on)
			c := p.Client(b)
			sha, err := c.ScriptLoad(ctx, body).Result()
			if err != nil {
				b.Fatal(err)
			}
			if tc.swap {
				if err := c.ScriptLoad(ctx, "return redis.call('SWAPDB', 0, 1)").Err(); err != nil {
					b.Fatal(err)
				}
			}
			cmd := fmt.Sprintf("*5\r\n$7\r\nEVALSHA\r\n$40\r\n%s\r\n$1\r\n1\r\n$16\r\nkey:000000012345\r\n$2\r\nvv\r\n", sha)
			req := bytes.Repeat([]byte(cmd), 16)
			runPipelines(b, p, func() []byte { return req }, 16*len(":1\r\n"), ":1\r\n")
		})
	}
}
