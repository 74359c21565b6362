package proxy_test

// Limits one client cannot blow through (issue 9, items 8 and 9): the
// output it makes the proxy hold, the time it may leave replies unread,
// and the number of requests the proxy keeps bookkeeping for at once.

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"runtime"
	rtmetrics "runtime/metrics"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/redproxy/redproxy/internal/cluster"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// dialSmallBuffer connects to the proxy with a tiny receive buffer, so the
// kernel absorbs little of what the proxy writes to a client that does not
// read.
func dialSmallBuffer(t *testing.T, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 2 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return nc
}

// liveHeap is the heap the last garbage collection found reachable: what
// the proxy holds, without the garbage a collection has yet to free.
func liveHeap() int64 {
	s := []rtmetrics.Sample{{Name: "/gc/heap/live:bytes"}}
	rtmetrics.Read(s)
	return int64(s[0].Value.Uint64())
}

// memPeak samples the process's RSS and live Go heap until finish.
type memPeak struct {
	rss0, heap0 int64
	rss, heap   atomic.Int64
	stop        chan struct{}
	done        chan struct{}
}

func sampleMemory(t *testing.T) *memPeak {
	runtime.GC()
	m := &memPeak{rss0: vmRSS(t), heap0: liveHeap(), stop: make(chan struct{}), done: make(chan struct{})}
	m.rss.Store(m.rss0)
	m.heap.Store(m.heap0)
	go func() {
		defer close(m.done)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-m.stop:
				return
			case <-tick.C:
				m.rss.Store(max(m.rss.Load(), vmRSS(t)))
				m.heap.Store(max(m.heap.Load(), liveHeap()))
			}
		}
	}()
	return m
}

func (m *memPeak) finish() (rssGrowth, heapGrowth int64) {
	close(m.stop)
	<-m.done
	return m.rss.Load() - m.rss0, m.heap.Load() - m.heap0
}

func closedFor(p *proxytest.Proxy, reason string) float64 {
	return testutil.ToFloat64(p.Metrics.ClientsClosed.WithLabelValues(reason))
}

// connClosed reports whether the proxy closed nc: a read ends in EOF or a
// reset rather than waiting.
func connClosed(nc net.Conn) bool {
	nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := io.Copy(io.Discard, nc)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

// A client that pipelines GET of a 1 MB value for 10 s and never reads
// (the measurement, with the default limits) is forwarded only what
// fits under its output limit and is closed once it has taken nothing for
// the write timeout; the proxy's memory stays within the limit (two copies
// of 16 KB worth of GETs' replies took ~1.4 GB), and another client on the
// same shared connections is served throughout.
func TestPipelinedBigGetsWithoutReadingAreCutOff(t *testing.T) {
	var cfg config.Server
	p := proxytest.Start(t, nil, func(c *config.Config) { cfg = c.Server }) // the defaults
	limit := int64(cfg.ClientOutputLimit)
	direct := p.Redis.Client(t)
	big := strings.Repeat("b", 1<<20)
	if err := direct.Set(ctx, "big", big, 0).Err(); err != nil {
		t.Fatal(err)
	}

	good := p.Client(t)
	stopGood := make(chan struct{})
	goodDone := make(chan error, 1)
	var goodRounds atomic.Int64
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stopGood:
				goodDone <- nil
				return
			default:
			}
			k, v := "good:"+strconv.Itoa(i%10), strconv.Itoa(i)
			if err := good.Set(ctx, k, v, 0).Err(); err != nil {
				goodDone <- err
				return
			}
			if got, err := good.Get(ctx, k).Result(); err != nil || got != v {
				goodDone <- errors.New("GET " + k + " = " + got + ", want " + v)
				return
			}
			goodRounds.Add(1)
		}
	}()

	mem := sampleMemory(t)
	bad := dialSmallBuffer(t, p.Addr)
	get := []byte("*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n")
	chunk := bytes.Repeat(get, (16<<10)/len(get))
	var sent int64
	closed := false
	start := time.Now()
	// Pipelining for 10 s, and for as long again as the write timeout
	// takes to notice.
	for time.Since(start) < 10*time.Second+2*cfg.ClientWriteTimeout.Duration {
		if time.Since(start) > 10*time.Second {
			chunk = get[:0] // only wait now
		}
		bad.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
		n, err := bad.Write(chunk)
		sent += int64(n)
		var ne net.Error
		if err != nil && !(errors.As(err, &ne) && ne.Timeout()) {
			closed = true // reset by the proxy
			break
		}
		if closedFor(p, metrics.CloseOutputLimit)+closedFor(p, metrics.CloseWriteTimeout) > 0 {
			closed = connClosed(bad)
			break
		}
		if err == nil && len(chunk) == 0 {
			time.Sleep(50 * time.Millisecond)
		}
	}
	took := time.Since(start)
	rssGrowth, heapGrowth := mem.finish()
	close(stopGood)
	if err := <-goodDone; err != nil {
		t.Fatalf("a well-behaved client failed while another overran its output: %v", err)
	}
	t.Logf("pipelined %d GETs of a 1 MB value; closed after %v: %v (output_limit %v, write_timeout %v); proxy RSS +%d MB (peak %d MB), live Go heap +%d MB; limit %d MB, write timeout %v, race detector %v; good client rounds meanwhile: %d",
		sent/int64(len(get)), took.Round(time.Millisecond), closed, closedFor(p, metrics.CloseOutputLimit), closedFor(p, metrics.CloseWriteTimeout),
		rssGrowth>>20, mem.rss.Load()>>20, heapGrowth>>20, limit>>20, cfg.ClientWriteTimeout, raceEnabled(), goodRounds.Load())
	if !closed {
		t.Fatal("the client that never reads was not closed")
	}
	// The client can see its connection reset before the session that
	// closed it has ended and counted why (seen in CI: 0 right after the
	// reset); wait for the count, then check it is exactly one.
	closedForOutput := func() float64 {
		return closedFor(p, metrics.CloseOutputLimit) + closedFor(p, metrics.CloseWriteTimeout)
	}
	redistest.Eventually(t, 10*time.Second, func() bool { return closedForOutput() > 0 }, "the closed client was never counted as closed for its output")
	if n := closedForOutput(); n != 1 {
		t.Fatalf("clients closed for output = %v, want 1", n)
	}
	bound := limit + 32<<20
	if heapGrowth > bound {
		t.Fatalf("live Go heap grew by %d MB for one client; want at most the %d MB limit + 32 MB", heapGrowth>>20, limit>>20)
	}
	if !raceEnabled() && rssGrowth > bound+32<<20 {
		t.Fatalf("RSS grew by %d MB for one client; want at most the %d MB limit + 64 MB", rssGrowth>>20, limit>>20)
	}
	if v, err := p.Client(t).Get(ctx, "big").Result(); err != nil || len(v) != len(big) {
		t.Fatalf("GET big after the cut-off: %d bytes, %v", len(v), err)
	}
}

// When a client's replies turn out far larger than its recent ones, the
// Call holding them keeps no more than the output limit: the rest is
// dropped as it arrives and the client is closed (output_limit), while the
// shared connection it used goes on serving others.
func TestRepliesBeyondOutputLimitCloseClient(t *testing.T) {
	const limit = 8 << 20
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Server.ClientOutputLimit = limit })
	direct := p.Redis.Client(t)
	if err := direct.Set(ctx, "big", strings.Repeat("b", 1<<20), 0).Err(); err != nil {
		t.Fatal(err)
	}
	c := dialRaw(t, p.Addr)
	// Small replies for a while (two per batch, so they go through the
	// batch's Call): the proxy expects small ones next.
	for i := 0; i < 30; i++ {
		c.send([]string{"GET", "small"}, []string{"GET", "small"})
		for range 2 {
			if v, _ := c.readReply(); v != nil {
				t.Fatalf("GET small = %v", v)
			}
		}
	}
	mem := sampleMemory(t)
	cmds := make([][]string, 64) // 64 MB of replies
	for i := range cmds {
		cmds[i] = []string{"GET", "big"}
	}
	c.send(cmds...)
	// Read: the replies that fit in the limit are the client's
	// (TestRepliesThatFitTheOutputLimitAreSent).
	drained := make(chan struct{})
	go func() {
		io.Copy(io.Discard, c.nc)
		close(drained)
	}()
	redistest.Eventually(t, 10*time.Second, func() bool { return closedFor(p, metrics.CloseOutputLimit) == 1 },
		"the client was never closed for its output limit")
	_, heapGrowth := mem.finish()
	select {
	case <-drained:
	case <-time.After(10 * time.Second):
		t.Fatal("the output limit was counted but the connection stayed open")
	}
	t.Logf("live Go heap +%d MB for a client limited to %d MB", heapGrowth>>20, limit>>20)
	if heapGrowth > limit+32<<20 {
		t.Fatalf("live Go heap grew by %d MB for one client limited to %d MB", heapGrowth>>20, limit>>20)
	}
	for i := 0; i < 10; i++ {
		if err := p.Client(t).Set(ctx, "after", i, 0).Err(); err != nil {
			t.Fatalf("another client after the cut-off: %v", err)
		}
	}
}

// A client that sends one GET at a time and never reads stays under the
// output limit, but the proxy stops writing to it at the write timeout and
// closes it, rather than blocking on it forever.
func TestClientThatStopsReadingIsClosedAtWriteTimeout(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) {
		c.Server.ClientWriteTimeout = units.Duration{Duration: 300 * time.Millisecond}
	})
	if err := p.Redis.Client(t).Set(ctx, "big", strings.Repeat("b", 256<<10), 0).Err(); err != nil {
		t.Fatal(err)
	}
	bad := dialSmallBuffer(t, p.Addr)
	get := []byte("*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n")
	redistest.Eventually(t, 30*time.Second, func() bool {
		bad.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
		bad.Write(get)
		return closedFor(p, metrics.CloseWriteTimeout) == 1
	}, "a client that never reads was never closed at the write timeout")
	if !connClosed(bad) {
		t.Fatal("the write timeout was counted but the connection stayed open")
	}
	if n := closedFor(p, metrics.CloseOutputLimit); n != 0 {
		t.Fatalf("output_limit closes = %v; one GET at a time never exceeds the limit", n)
	}
	waitClients(t, p, 0)
}

// A client that reads its replies is not cut off when a pipeline's
// replies add up to more than the output limit: the proxy answers the
// pipeline in parts below the limit.
func TestBigPipelineOfReadingClientIsSplit(t *testing.T) {
	const limit = 8 << 20
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Server.ClientOutputLimit = limit })
	val := strings.Repeat("v", 512<<10)
	if err := p.Redis.Client(t).Set(ctx, "big", val, 0).Err(); err != nil {
		t.Fatal(err)
	}
	c := dialRaw(t, p.Addr)
	const n = 64 // 32 MB of replies, four times the limit
	cmds := make([][]string, 0, 2*n)
	for i := 0; i < n; i++ {
		cmds = append(cmds, []string{"GET", "big"}, []string{"ECHO", strconv.Itoa(i)})
	}
	c.send(cmds...)
	for i := 0; i < n; i++ {
		if v, _ := c.readReply(); v != val {
			t.Fatalf("reply %d: not the value", 2*i)
		}
		if v, _ := c.readReply(); v != strconv.Itoa(i) {
			t.Fatalf("reply %d: %v, want %d", 2*i+1, v, i)
		}
	}
	if n := closedFor(p, metrics.CloseOutputLimit); n != 0 {
		t.Fatalf("a client reading its replies was closed for its output limit")
	}
}

// After a large request grows the read buffer, a deep pipeline of small
// requests behind it is answered completely and in order, in batches of
// at most 1024 requests.
func TestDeepPipelineAfterLargeRequestIsSplit(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	nc := p.Dial(t)
	const n = 200_000
	go func() {
		var b bytes.Buffer
		v := strings.Repeat("x", 8<<20)
		b.WriteString("*3\r\n$3\r\nSET\r\n$5\r\nlarge\r\n$" + strconv.Itoa(len(v)) + "\r\n" + v + "\r\n")
		for i := 0; i < n; i++ {
			s := strconv.Itoa(i)
			b.WriteString("*2\r\n$4\r\nPING\r\n$" + strconv.Itoa(len(s)) + "\r\n" + s + "\r\n")
		}
		nc.Write(b.Bytes())
	}()
	rd := bufio.NewReader(nc)
	nc.SetReadDeadline(time.Now().Add(60 * time.Second))
	if line, err := rd.ReadString('\n'); err != nil || line != "+OK\r\n" {
		t.Fatalf("SET: %q %v", line, err)
	}
	for i := 0; i < n; i++ {
		s := strconv.Itoa(i)
		want := "$" + strconv.Itoa(len(s)) + "\r\n" + s + "\r\n"
		got := make([]byte, len(want))
		if _, err := io.ReadFull(rd, got); err != nil || string(got) != want {
			t.Fatalf("reply %d: %q %v, want %q", i, got, err, want)
		}
	}
	var h dto.Metric
	if err := p.Metrics.BatchRequests.Write(&h); err != nil {
		t.Fatal(err)
	}
	hist := h.GetHistogram()
	var capped uint64
	for _, b := range hist.GetBucket() {
		if b.GetUpperBound() == 1024 {
			capped = b.GetCumulativeCount()
		}
	}
	if hist.GetSampleCount() == 0 || capped != hist.GetSampleCount() {
		t.Fatalf("%d of %d batches held more than 1024 requests", hist.GetSampleCount()-capped, hist.GetSampleCount())
	}
	t.Logf("%d requests in %d batches", n+1, hist.GetSampleCount())
}

// batchSizes returns how many batches the proxy has counted, and how many
// of those held more than 64 requests.
func batchSizes(t *testing.T, p *proxytest.Proxy) (all, over64 uint64) {
	t.Helper()
	var m dto.Metric
	if err := p.Metrics.BatchRequests.Write(&m); err != nil {
		t.Fatal(err)
	}
	h := m.GetHistogram()
	for _, b := range h.GetBucket() {
		if b.GetUpperBound() == 64 {
			return h.GetSampleCount(), h.GetSampleCount() - b.GetCumulativeCount()
		}
	}
	t.Fatal("no bucket at 64")
	return 0, 0
}

// While many sessions answer a batch at once, every client's batches are
// capped at 64 requests (limits.go, batchLoad), and its replies still come
// complete and in order. Here the threshold is 4 and Redis is paused, so
// the first six clients' pipelines stay in flight; the next four clients'
// 600-command pipelines then go in batches of at most 64.
func TestManyBusySessionsGetSmallerBatches(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	p.SetBatchLoadThreshold(4)
	if err := p.Redis.Client(t).Set(ctx, "bl", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	pipeline := bytes.Repeat([]byte("*2\r\n$3\r\nGET\r\n$2\r\nbl\r\n"), 600)
	want := bytes.Repeat([]byte("$1\r\nv\r\n"), 600)
	// Paused for 2 s (CLIENT UNPAUSE would wait behind the pause itself):
	// time enough to read the pipelines below.
	if err := p.Redis.Client(t).Do(ctx, "CLIENT", "PAUSE", "2000", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	send := func(n int) {
		for range n {
			nc := p.Dial(t)
			if _, err := nc.Write(pipeline); err != nil {
				t.Fatal(err)
			}
			conns = append(conns, nc)
		}
	}
	send(6)
	redistest.Eventually(t, 5*time.Second, func() bool { all, _ := batchSizes(t, p); return p.BatchCap() == 64 && all >= 6 },
		"six sessions waiting for a paused Redis did not cap the batches")
	all0, before := batchSizes(t, p)
	send(4)
	// Their first batches, read while Redis is still paused.
	redistest.Eventually(t, 5*time.Second, func() bool { all, _ := batchSizes(t, p); return all >= all0+4 },
		"the next four pipelines were never read")
	all, over := batchSizes(t, p)
	if over != before {
		t.Fatalf("%d batches over 64 requests while six sessions were busy (%d batches in all)", over-before, all)
	}
	for i, nc := range conns {
		nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		got := make([]byte, len(want))
		if _, err := io.ReadFull(nc, got); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("client %d: %d bytes, %v; want its 600 replies", i, len(got), err)
		}
	}
	redistest.Eventually(t, 5*time.Second, func() bool { return p.BatchCap() == 0 },
		"the cap stayed on after the sessions were answered")
}

// One request of a million arguments (7 MB on the wire, within max_args)
// grew the Reader's per-argument bookkeeping and the guard's key positions
// to about 50 MB, given back only when the client parked: a client that
// cannot park (here under WATCH; also TLS, MULTI, idle_park_after = 0)
// kept them for as long as it stayed connected (found by review). They are
// now dropped when the client goes idle.
func TestManyArgumentsAreNotKeptWhileIdle(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	c := dialRaw(t, p.Addr)
	if got := c.do("WATCH", "idle:w"); got != "OK" { // a client that does not park
		t.Fatalf("WATCH: %v", got)
	}
	runtime.GC()
	before := liveHeap()
	const n = 1 << 20
	args := make([]string, 0, n)
	args = append(args, "EXISTS")
	for len(args) < n {
		args = append(args, "k")
	}
	c.send(args)
	// A million keys under -race on a loaded machine took over the
	// default 5 s in CI (the deadline set here was overridden by next).
	c.wait = 30 * time.Second
	if v, err := c.readReply(); v != int64(0) {
		t.Fatalf("EXISTS of %d keys: %v, %v", n-1, v, err)
	}
	args = nil
	// The session goes idle once its reply is written: poll rather than
	// guess when.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		runtime.GC()
		kept := liveHeap() - before
		if kept < 8<<20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("an idle client holds %d MB of the proxy's heap after one request of %d arguments", kept>>20, n)
		}
	}
}

// A write queued in a pinned MULTI is kept until EXEC for the write hooks
// (the local tier, stampede holds), which need its keys. It kept a copy of
// every argument: a client that queued 160 MB and never sent EXEC grew
// the proxy's heap by 160 MB, in standalone and in cluster mode once the
// transaction is placed (found by review). Values are no longer kept.
func TestQueuedWritesAreNotCopiedWhole(t *testing.T) {
	_, cp := startClusterProxy(t)
	for _, tc := range []struct {
		name string
		addr string
	}{
		{"standalone", proxytest.Start(t, nil, nil).Addr},
		{"cluster", cp.Addr},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialRaw(t, tc.addr)
			if got := c.do("MULTI"); got != "OK" {
				t.Fatalf("MULTI: %v", got)
			}
			val := strings.Repeat("v", 1<<20)
			runtime.GC()
			before := liveHeap()
			const n = 64 // MB queued
			for i := 0; i < n; i++ {
				if got := c.do("SET", "{q}k:"+strconv.Itoa(i), val); got != "QUEUED" {
					t.Fatalf("SET %d in MULTI: %v", i, got)
				}
			}
			runtime.GC()
			grown := liveHeap() - before
			if got := c.do("DISCARD"); got != "OK" {
				t.Fatalf("DISCARD: %v", got)
			}
			if grown > 16<<20 {
				t.Fatalf("%d MB queued in MULTI grew the proxy's heap by %d MB", n, grown>>20)
			}
		})
	}
}

// In cluster mode a read split across nodes (MGET) had each node's share
// capped at the client's output limit, not all of them together: the
// proxy held up to the limit per node, then the shares again in the
// router's arena, then the merged reply, before the client's Call found it
// over the limit. One MGET of 45 MB across three nodes held 120 MB of live
// heap for a client limited to 16 MB (found by review). The node calls now
// share one budget, and nothing is merged once it is spent.
func TestClusterSplitMGETHoldsAboutTheLimit(t *testing.T) {
	const limit = 16 << 20
	c := redistest.StartCluster(t, 3, 0)
	p := proxytest.Start(t, c.Nodes[0], func(cfg *config.Config) {
		cfg.Upstream.Mode = config.ModeCluster
		cfg.Upstream.Seeds = c.Seeds()
		cfg.Server.ClientOutputLimit = limit
	})
	rc := p.Client(t)
	m := p.Router().Map()
	perNode := map[string]int{}
	var keys []string
	val := strings.Repeat("m", 1<<20)
	for i := 0; len(keys) < 3*15; i++ {
		k := "split:mget:" + strconv.Itoa(i)
		o := m.Owner(cluster.Slot([]byte(k)))
		if perNode[o] >= 15 { // 15 MB per node: each share under the limit
			continue
		}
		perNode[o]++
		keys = append(keys, k)
		if err := rc.Set(ctx, k, val, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	mem := sampleMemory(t)
	raw := dialRaw(t, p.Addr)
	raw.send(append([]string{"MGET"}, keys...))
	redistest.Eventually(t, 20*time.Second, func() bool { return closedFor(p, "output_limit") == 1 },
		"the client was never closed for its output limit")
	_, heap := mem.finish()
	t.Logf("MGET of %d MB across 3 nodes, limit %d MB: live heap peak +%d MB", len(keys), limit>>20, heap>>20)
	// Measured alone: 112-120 MB before the fix, 21-30 MB after it; up to
	// 52 MB amid other tests, whose leftovers share this process's heap.
	if heap > 4*limit {
		t.Fatalf("one MGET made the proxy hold %d MB (live heap) for a client limited to %d MB", heap>>20, limit>>20)
	}
	// Under the limit, the same split read is answered whole.
	small := keys[:12]
	got, err := rc.MGet(ctx, small...).Result()
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range got {
		if v != val {
			t.Fatalf("MGET's value %d: %.20v", i, v)
		}
	}
}

// The replies that fit in the output limit are the client's, up to the
// first one dropped for it, and then the client is closed: four pipelined
// reads of 2.5 MB on a new connection (forwarded together: 1 MB each is
// assumed) with an 8 MB limit get three replies. Found by a probe: four
// 20 MB reads at the 64 MB default got nothing (Redis, which has no such
// limit, sends all four).
func TestRepliesThatFitTheOutputLimitAreSent(t *testing.T) {
	const limit = 8 << 20
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Server.ClientOutputLimit = limit })
	value := strings.Repeat("v", 2500<<10)
	if err := p.Redis.Client(t).Set(ctx, "big", value, 0).Err(); err != nil {
		t.Fatal(err)
	}
	c := dialRaw(t, p.Addr)
	c.send([]string{"GET", "big"}, []string{"GET", "big"}, []string{"GET", "big"}, []string{"GET", "big"})
	got := 0
	for {
		v, err := c.next(nil)
		if err != nil {
			break
		}
		if v != value {
			t.Fatalf("reply %d is not the value", got)
		}
		got++
	}
	if got != 3 {
		t.Fatalf("%d replies before the close, want the 3 that fit in the limit", got)
	}
	if closedFor(p, metrics.CloseOutputLimit) != 1 {
		t.Fatal("not closed for its output limit")
	}
}

// The same when the reply that passes the limit is a command the guard
// wrapped in a MULTI with its TTL fix-up: the replies before it are
// written first (found by review: the check looked at the wrapped
// command's QUEUED, not its EXEC, and the reply that fit was lost).
func TestRepliesThatFitTheOutputLimitAreSentBeforeAWrappedOne(t *testing.T) {
	const limit = 8 << 20
	p := proxytest.Start(t, nil, func(c *config.Config) {
		c.Server.ClientOutputLimit = limit
		c.Policy.TTL = []policy.TTLRule{{Pattern: "h:*", Required: true, Default: policy.Duration{Duration: time.Hour}}}
	})
	direct := p.Redis.Client(t)
	small := strings.Repeat("s", 100<<10)
	if err := direct.Set(ctx, "small", small, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := direct.Set(ctx, "h:big", strings.Repeat("b", 9<<20), 0).Err(); err != nil {
		t.Fatal(err)
	}
	c := dialRaw(t, p.Addr)
	c.send([]string{"GET", "small"}, []string{"GETSET", "h:big", "v"})
	var got []any
	for {
		v, err := c.next(nil)
		if err != nil {
			break
		}
		got = append(got, v)
	}
	if len(got) != 1 || got[0] != small {
		t.Fatalf("%d replies before the close (first %.20v), want the GET's alone", len(got), got)
	}
}
