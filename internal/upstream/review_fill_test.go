package upstream

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/redistest"
)

// On a RESP3 connection with CLIENT TRACKING on, invalidation pushes
// arrive between the replies of Calls whose large replies are filled
// (another client rewrites the keys as they are read): every reply is
// framed byte for byte and every push reaches OnPush whole.
func TestReviewFillWithTrackingPushes(t *testing.T) {
	srv := redistest.Start(t)
	vals := loadFillValues(t, srv, "trk", 5)
	var pushes, bad atomic.Int64
	opts := testOpts(srv.Addr())
	opts.RESP3 = true
	opts.ReplyTimeout = 10 * time.Second
	opts.OnPush = func(frame []byte) {
		pushes.Add(1)
		if len(frame) < 4 || frame[0] != '>' || frame[len(frame)-2] != '\r' || frame[len(frame)-1] != '\n' {
			bad.Add(1)
		}
	}
	pool := NewPool(1, opts)
	defer pool.Close()
	waitUp(t, pool)
	on := NewCall()
	on.Add(cmd("CLIENT", "TRACKING", "ON"))
	sendWait(t, pool, on)
	if r, _ := on.Reply(0); string(r) != "+OK\r\n" {
		t.Fatalf("CLIENT TRACKING ON: %q", r)
	}
	keys := make([]string, 0, len(fillSizes))
	for _, n := range fillSizes[:len(fillSizes)-1] {
		keys = append(keys, fmt.Sprintf("trk:%d", n))
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		rc := srv.Client(t)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			k := keys[i%len(keys)]
			rc.Set(context.Background(), k, vals[k], 0)
		}
	})
	c := NewCall()
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		checkFillCall(t, pool, c, keys, vals, true)
		c.Trim(64 << 10)
	}
	close(stop)
	wg.Wait()
	t.Logf("%d pushes", pushes.Load())
	if pushes.Load() == 0 || bad.Load() != 0 {
		t.Fatalf("%d pushes, %d malformed", pushes.Load(), bad.Load())
	}
}

// Filled replies over TLS (readLoop, not readRaw), both protocols.
func TestReviewFillOverTLS(t *testing.T) {
	certs := redistest.NewCerts(t)
	rs := redistest.StartTLS(t, certs, "yes")
	vals := loadFillValues(t, rs, "tlsfill", 9)
	if err := rs.Client(t).ConfigSet(t.Context(), "requirepass", "s3cret").Err(); err != nil {
		t.Fatal(err)
	}
	keys := make([]string, 0, len(fillSizes))
	for _, n := range fillSizes {
		keys = append(keys, fmt.Sprintf("tlsfill:%d", n))
	}
	for _, resp3 := range []bool{false, true} {
		opts := tlsOpts(t, certs, rs.TLSAddr())
		opts.RESP3 = resp3
		opts.ReplyTimeout = 10 * time.Second
		pool := NewPool(1, opts)
		waitUp(t, pool)
		c := NewCall()
		for range 3 {
			for _, k := range keys {
				checkFillCall(t, pool, c, []string{k}, vals, resp3)
			}
			checkFillCall(t, pool, c, keys, vals, resp3)
			c.Trim(64 << 10)
		}
		pool.Close()
	}
}

// A Redis killed in the middle of a large reply: the Call fails, and the
// pool's next Calls, on a new connection to the restarted Redis, get
// their replies framed right.
func TestReviewFillRedisRestartMidReply(t *testing.T) {
	srv := redistest.Start(t)
	vals := loadFillValues(t, srv, "rst", 3)
	big := fmt.Sprintf("rst:%d", fillSizes[len(fillSizes)-1])
	opts := testOpts(srv.Addr())
	opts.ReplyTimeout = 10 * time.Second
	pool := NewPool(1, opts)
	defer pool.Close()
	waitUp(t, pool)
	c := NewCall()
	for range 20 {
		c.Add(cmd("GET", big))
	}
	if err := pool.Send(c); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	srv.Restart(t)
	c.Wait()
	t.Logf("Call across the restart: %v", c.Err())
	// The restarted Redis has no keys (no persistence): reload them.
	vals = loadFillValues(t, srv, "rst", 3)
	waitUp(t, pool)
	keys := make([]string, 0, len(fillSizes))
	for _, n := range fillSizes {
		keys = append(keys, fmt.Sprintf("rst:%d", n))
	}
	redistest.Eventually(t, 5*time.Second, func() bool {
		p := NewCall()
		p.Add(cmd("PING"))
		pool.Send(p)
		p.Wait()
		return p.Err() == nil
	}, "pool back")
	d := NewCall()
	checkFillCall(t, pool, d, keys, vals, false)
}

// A hostile (or just slow) upstream that declares a large bulk reply and
// sends a little of it: how much the pipe holds for the bytes it got.
// Before the fill the read buffer grew as the bytes came (about twice
// what had arrived); now startFill sizes the Call's buffer for the whole
// declared reply up to fillAhead (4 MB) from the header alone.
func TestReviewFillDeclaredSizeHeldAhead(t *testing.T) {
	srv := redistest.Start(t)
	const pipes = 16
	const declared = 4<<20 - 100
	answer := []byte(fmt.Sprintf("$%d\r\n", declared))
	addr := hostileUpTo(t, srv.Addr(), "SLOWBIG", answer, []byte("x"), 64<<10)
	opts := testOpts(addr)
	opts.ReplyTimeout, opts.DeadTimeout = 30*time.Second, 60*time.Second
	pool := NewPool(pipes, opts)
	defer pool.Close()
	waitUp(t, pool)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	calls := make([]*Call, 0, pipes)
	for i := range pipes {
		c := NewCall()
		c.Add(cmd("GET", fmt.Sprintf("SLOWBIG%d", i)))
		if err := pool.Send(c); err != nil {
			t.Fatal(err)
		}
		calls = append(calls, c)
		time.Sleep(20 * time.Millisecond) // the pool spreads them
	}
	time.Sleep(300 * time.Millisecond) // 64 KB of each has arrived
	runtime.GC()
	runtime.ReadMemStats(&after)
	held := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	arrived := int64(pipes * (64<<10 + len(answer)))
	t.Logf("%d pipes, %d KB arrived in all, %d KB held", pipes, arrived>>10, held>>10)
	if held > 4*arrived+(4<<20) {
		t.Errorf("the pipes hold %d KB for %d KB of replies that arrived: about %d KB each, for each pipe's declared %d byte reply",
			held>>10, arrived>>10, held/pipes>>10, declared)
	}
	runtime.KeepAlive(calls)
}
