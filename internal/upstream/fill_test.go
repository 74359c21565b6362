package upstream

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/bufpool"
	"github.com/redproxy/redproxy/internal/redistest"
)

// fillSizes are value sizes around the thresholds of the fill (fillMin,
// bufpool's classes, the read buffer's 32 KB), and past bufpool's largest
// class, whose buffers are made and collected rather than pooled.
var fillSizes = []int{0, 5, fillMin - 20, fillMin - 14, fillMin - 13, fillMin, 32 << 10, 100_000, 1 << 20, 1<<20 - 13, bufpool.MaxSize - 13, bufpool.MaxSize + 100_000}

// loadFillValues stores one value of each of fillSizes under prefix.
func loadFillValues(t *testing.T, srv *redistest.Server, prefix string, seed uint64) map[string][]byte {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	rc := srv.Client(t)
	vals := map[string][]byte{}
	for _, n := range fillSizes {
		k := fmt.Sprintf("%s:%d", prefix, n)
		vals[k] = redistest.TaggedValue(rng, k, n)
		if err := rc.Set(context.Background(), k, vals[k], 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	return vals
}

// checkFillCall sends GETs of every key in keys, each between a PING and
// a small GET, on one Call, and requires every reply byte for byte.
func checkFillCall(t *testing.T, pool *Pool, c *Call, keys []string, vals map[string][]byte, resp3 bool) {
	t.Helper()
	c.Reset()
	for _, k := range keys {
		c.Add(cmd("PING"))
		c.Add(cmd("GET", k))
		c.Add(cmd("GET", "fill:missing"))
	}
	sendWait(t, pool, c)
	null := "$-1\r\n"
	if resp3 {
		null = "_\r\n"
	}
	for i, k := range keys {
		if r, err := c.Reply(3 * i); err != nil || string(r) != "+PONG\r\n" {
			t.Fatalf("PING before GET %s: %q, %v", k, r, err)
		}
		want := "$" + strconv.Itoa(len(vals[k])) + "\r\n" + string(vals[k]) + "\r\n"
		r, err := c.Reply(3*i + 1)
		if err != nil || string(r) != want {
			t.Fatalf("GET %s: %d bytes, %v; want %d bytes (first difference at %d)", k, len(r), err, len(want), redistest.FirstDifference(r, []byte(want)))
		}
		if r, err := c.Reply(3*i + 2); err != nil || string(r) != null {
			t.Fatalf("GET of a missing key after GET %s: %q, %v", k, r, err)
		}
	}
}

// A large bulk reply is read straight into its Call (startFill), and the
// replies around it are framed as before: every size around the fill's
// thresholds, alone and pipelined with others, in both protocols, on a
// Call reused with Reset and Trim as a session reuses its own, byte for
// byte; and on a connection that hands the proxy Redis's replies in
// pieces of 1 byte to 64 KB, so the header, the body and the CRLF of a
// filled reply, and the next reply after it, are cut at every kind of
// place.
func TestPipeFillsLargeRepliesExactly(t *testing.T) {
	srv := redistest.Start(t)
	vals := loadFillValues(t, srv, "fill", 1)
	keys := make([]string, 0, len(fillSizes))
	for _, n := range fillSizes {
		keys = append(keys, fmt.Sprintf("fill:%d", n))
	}
	trickle := redistest.Forward(t, srv.Addr(), func(wg *sync.WaitGroup, c, u net.Conn) {
		wg.Go(func() {
			copyAll(u, c)
			u.Close() // the pipe has gone: so has its Redis connection
		})
		wg.Go(func() {
			defer c.Close()
			rng := rand.New(rand.NewPCG(2, 2))
			buf := make([]byte, 64<<10)
			for {
				n, err := u.Read(buf[:1+rng.IntN(len(buf))])
				for b := buf[:n]; len(b) > 0; {
					k := min(len(b), 1+rng.IntN(1+len(b)))
					if _, err := c.Write(b[:k]); err != nil {
						return
					}
					b = b[k:]
					if rng.IntN(8) == 0 {
						time.Sleep(50 * time.Microsecond)
					}
				}
				if err != nil {
					return
				}
			}
		})
	})
	for _, addr := range []string{srv.Addr(), trickle} {
		for _, resp3 := range []bool{false, true} {
			opts := testOpts(addr)
			opts.RESP3 = resp3
			opts.ReplyTimeout = 10 * time.Second
			pool := NewPool(1, opts)
			waitUp(t, pool)
			c := NewCall()
			for round := range 3 {
				for _, k := range keys {
					checkFillCall(t, pool, c, []string{k}, vals, resp3)
				}
				checkFillCall(t, pool, c, keys, vals, resp3)
				order := append([]string(nil), keys...)
				rand.New(rand.NewPCG(uint64(round), 3)).Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
				checkFillCall(t, pool, c, order, vals, resp3)
				c.Trim(64 << 10) // as an idle session does: the buffer goes back to bufpool
			}
			pool.Close()
		}
	}
}

// copyAll copies until either side fails.
func copyAll(dst, src net.Conn) {
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Clients sharing one connection, each reading large values of its own
// through Calls that go back to bufpool between uses, never see another's
// bytes: what startFill and Trim hand to the pool is no longer anybody's.
func TestPipeFilledRepliesNoCrossTalk(t *testing.T) {
	srv := redistest.Start(t)
	const clients = 8
	vals := make([]map[string][]byte, clients)
	for i := range clients {
		vals[i] = loadFillValues(t, srv, "fx"+strconv.Itoa(i), uint64(10+i))
	}
	pool := NewPool(2, testOpts(srv.Addr()))
	defer pool.Close()
	waitUp(t, pool)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 4))
			c := NewCall()
			for range 30 {
				n := fillSizes[rng.IntN(len(fillSizes)-1)] // the 4 MB one: once below
				k := fmt.Sprintf("fx%d:%d", i, n)
				checkFillCall(t, pool, c, []string{k}, vals[i], false)
				c.Trim(64 << 10)
			}
			k := fmt.Sprintf("fx%d:%d", i, fillSizes[len(fillSizes)-1])
			checkFillCall(t, pool, c, []string{k}, vals[i], false)
			c.Release()
		})
	}
	wg.Wait()
}

// A 1 MB reply read into its Call allocates its own buffer in a few steps
// (128 KB, 512 KB, 1 MB: each at most fillFactor times what has come):
// 1.6 MB, where before the fill it went through the connection's read
// buffer, doubled from 32 KB to 1 MB, and was copied into the Call:
// 2.9 MB.
func TestPipeFillSkipsTheReadBuffer(t *testing.T) {
	srv := redistest.Start(t)
	const size = 1_000_000
	v := bytes.Repeat([]byte("v"), size)
	if err := srv.Client(t).Set(context.Background(), "fill:one", v, 0).Err(); err != nil {
		t.Fatal(err)
	}
	pool := NewPool(1, testOpts(srv.Addr()))
	defer pool.Close()
	waitUp(t, pool)
	warm := NewCall()
	warm.Add(cmd("PING"))
	sendWait(t, pool, warm)

	c := NewCall()
	c.Add(cmd("GET", "fill:one"))
	n := redistest.Allocated(func() { sendWait(t, pool, c) })
	if r, err := c.Reply(0); err != nil || len(r) != size+len("$1000000\r\n\r\n") {
		t.Fatalf("GET: %d bytes, %v", len(r), err)
	}
	t.Logf("%.2f MB allocated reading a %d byte reply", float64(n)/(1<<20), size)
	if n > 2<<20 {
		t.Errorf("reading a %d byte reply allocated %.2f MB; want under 2 MB (its own buffer, in steps)", size, float64(n)/(1<<20))
	}
}

// A bulk reply whose declared end is not CRLF is a broken upstream: the
// connection is closed and the Call fails, as a reply the scanner cannot
// frame does; the pool's next Calls go on a new connection.
func TestPipeFilledReplyWithoutCRLFClosesTheConnection(t *testing.T) {
	srv := redistest.Start(t)
	body := bytes.Repeat([]byte("b"), 100_000)
	answer := append([]byte("$100000\r\n"), body...)
	answer = append(answer, "XY"...)
	addr := hostileUpTo(t, srv.Addr(), "BADEND", answer, []byte("z"), 1)
	pool := NewPool(1, testOpts(addr))
	defer pool.Close()
	waitUp(t, pool)
	c := NewCall()
	c.Add(cmd("GET", "BADEND"))
	sendEnd(t, pool, c)
	if c.Err() == nil {
		r, _ := c.Reply(0)
		t.Fatalf("a reply without its CRLF was accepted: %d bytes", len(r))
	}
	t.Logf("the Call failed with: %v", c.Err())
	waitUp(t, pool)
	ok := NewCall()
	ok.Add(cmd("PING"))
	sendWait(t, pool, ok)
	if r, _ := ok.Reply(0); string(r) != "+PONG\r\n" {
		t.Fatalf("PING on the new connection: %q", r)
	}
}
