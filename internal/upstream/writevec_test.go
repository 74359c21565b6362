package upstream

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/rawio"
	"github.com/redproxy/redproxy/internal/redistest"
)

// vecSizes are value sizes around vecPart (a SET's part is its value plus
// about 30 bytes of framing) and well past it.
var vecSizes = []int{0, 7, vecPart - 40, vecPart - 31, vecPart - 30, vecPart, vecPart + 1, 100_000, 1<<20 + 3}

// Requests with parts long enough to be written by reference (writev)
// reach Redis whole and in order, beside short parts that are copied, from
// many clients sharing one connection: straight to Redis, and through a
// forwarder that takes the proxy's bytes in small pieces with pauses, so
// the socket fills and a write stops inside a part and resumes. Each
// client overwrites its request buffer as soon as its Call completes, as a
// session reuses its read buffer: a part still referenced after its Call
// would reach Redis as garbage.
func TestPipeWritesLongPartsInPlace(t *testing.T) {
	srv := redistest.Start(t)
	slow := redistest.Forward(t, srv.Addr(), func(wg *sync.WaitGroup, c, u net.Conn) {
		wg.Go(func() {
			defer u.Close()
			rng := rand.New(rand.NewPCG(5, 5))
			buf := make([]byte, 32<<10)
			for {
				n, err := c.Read(buf[:1+rng.IntN(len(buf))])
				if n > 0 {
					if _, err := u.Write(buf[:n]); err != nil {
						return
					}
				}
				if err != nil {
					return
				}
				if rng.IntN(4) == 0 {
					time.Sleep(200 * time.Microsecond)
				}
			}
		})
		wg.Go(func() {
			copyAll(c, u)
			c.Close()
		})
	})
	for _, addr := range []string{srv.Addr(), slow} {
		opts := testOpts(addr)
		opts.ReplyTimeout = 20 * time.Second
		pool := NewPool(1, opts)
		waitUp(t, pool)
		var wg sync.WaitGroup
		for g := range 6 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(g), 7))
				c := NewCall()
				var req []byte
				for round := range 12 {
					c.Reset()
					req = req[:0]
					type kv struct {
						key string
						val []byte
					}
					var sets []kv
					var spans [][2]int
					add := func(b []byte) {
						start := len(req)
						req = append(req, b...)
						spans = append(spans, [2]int{start, len(req)})
					}
					for i := range 1 + rng.IntN(5) {
						k := fmt.Sprintf("vec:%d:%d:%d", g, round, i)
						v := redistest.TaggedValue(rng, k, vecSizes[rng.IntN(len(vecSizes))])
						sets = append(sets, kv{k, v})
						add(cmd("PING"))
						add(cmd("SET", k, string(v)))
						add(cmd("GET", k))
					}
					// Parts point into req, as a session's point into its
					// read buffer (req is not grown past this point).
					for _, s := range spans {
						c.Add(req[s[0]:s[1]:s[1]])
					}
					if err := pool.Send(c); err != nil {
						t.Error(err)
						return
					}
					c.Wait()
					if err := c.Err(); err != nil {
						t.Errorf("client %d round %d: %v", g, round, err)
						return
					}
					for i := range req {
						req[i] = '!' // the session's next read overwrites its buffer
					}
					for i, s := range sets {
						if r, err := c.Reply(3 * i); err != nil || string(r) != "+PONG\r\n" {
							t.Errorf("PING: %.64q, %v", r, err)
							return
						}
						if r, err := c.Reply(3*i + 1); err != nil || string(r) != "+OK\r\n" {
							t.Errorf("SET %s of %d bytes: %.64q, %v", s.key, len(s.val), r, err)
							return
						}
						want := "$" + strconv.Itoa(len(s.val)) + "\r\n" + string(s.val) + "\r\n"
						if r, err := c.Reply(3*i + 2); err != nil || string(r) != want {
							t.Errorf("GET %s: %d bytes, %v; want %d (first difference at %d)", s.key, len(r), err, len(want), redistest.FirstDifference(r, []byte(want)))
							return
						}
					}
				}
			})
		}
		wg.Wait()
		pool.Close()
	}
}

// A writeBatch writes its parts in order whether they are copied or
// referenced, and holds none of them once flushed.
func TestWriteBatchOrderAndRelease(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	peer, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	lc := &liveConn{nc: nc, w: rawio.NewWriter(nc)}
	if lc.w == nil {
		t.Skip("no raw writes here")
	}
	long := func(c byte) []byte { return bytes.Repeat([]byte{c}, vecPart+int(c)) }
	parts := [][]byte{[]byte("a"), long('b'), []byte("cc"), []byte("dd"), long('e'), long('f'), []byte("g")}
	wb := writeBatch{vectored: true}
	var want []byte
	for _, p := range parts {
		wb.add(p)
		want = append(want, p...)
	}
	if len(wb.vecs) != 5 || wb.size != len(want) { // "a", b, "ccdd", e, f; "g" still in buf
		t.Fatalf("%d vectors of %d bytes; want 5 of %d", len(wb.vecs), wb.size, len(want))
	}
	got := make(chan []byte, 1)
	go func() {
		buf := make([]byte, len(want))
		_, _ = io.ReadFull(peer, buf)
		got <- buf
	}()
	if err := wb.flush(lc); err != nil {
		t.Fatal(err)
	}
	if g := <-got; !bytes.Equal(g, want) {
		t.Fatalf("peer got other bytes than the parts in order (first difference at %d)", redistest.FirstDifference(g, want))
	}
	for i, v := range wb.vecs[:cap(wb.vecs)] {
		if v != nil {
			t.Fatalf("vector %d still refers to %d bytes after the flush", i, cap(v))
		}
	}
	if wb.size != 0 || len(wb.buf) != 0 || wb.copied != 0 {
		t.Fatalf("batch not empty after the flush: %+v", wb)
	}
}

// BenchmarkPipeSetLarge: 100 KB SETs, four clients on one connection.
// Compare the writer's copy (vectored off) with writev by benchstat of
// the CPU each costs (-cpuprofile, or user+sys time of the test binary):
// the round trip itself is mostly Redis's.
func BenchmarkPipeSetLarge(b *testing.B) {
	srv := redistest.Start(b)
	pool := NewPool(1, testOpts(srv.Addr()))
	defer pool.Close()
	if !pool.WaitUp(5 * time.Second) {
		b.Fatal("not up")
	}
	set := cmd("SET", "bench:large", string(bytes.Repeat([]byte("v"), 100_000)))
	b.ReportAllocs()
	b.SetBytes(int64(len(set)))
	b.RunParallel(func(pb *testing.PB) {
		c := NewCall()
		for pb.Next() {
			c.Reset()
			c.Add(set)
			pool.Do(c)
			if c.Err() != nil {
				b.Error(c.Err())
				return
			}
		}
	})
}
