package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

func reviewBulk(v []byte) []byte { return fmt.Appendf(nil, "$%d\r\n%s\r\n", len(v), v) }

func reviewCmd(args ...[]byte) []byte {
	b := fmt.Appendf(nil, "*%d\r\n", len(args))
	for _, a := range args {
		b = append(b, reviewBulk(a)...)
	}
	return b
}

// reviewSizes straddle fillMin, idleKeep, bufpool's classes, eagerMax and
// outSpill.
var reviewSizes = []int{100, 20 << 10, 32<<10 - 20, 40 << 10, 64<<10 + 1, 100_000, 200_000, 256<<10 + 7, 300_000, 1<<20 + 3}

// Many clients, each with keys of its own and all sharing some, write and
// read large values through the proxy (RESP2, whose lone GETs go direct;
// RESP3, whose replies the session writes; pipelines of several GETs and
// SETs; idle gaps that send buffers back to bufpool), with and without the
// local tier. Every reply must be the value byte for byte: a pooled buffer
// handed to one client while another's reply or request still used it
// shows as another key's tag.
func TestReviewLargeValuesNoCrossTalkThroughProxy(t *testing.T) {
	for _, tier := range []bool{false, true} {
		t.Run("tier="+strconv.FormatBool(tier), func(t *testing.T) {
			rs := redistest.Start(t)
			p := proxytest.Start(t, rs, func(c *config.Config) {
				c.LocalCache.Enabled = tier
				c.LocalCache.Staleness = units.Duration{Duration: time.Second}
				c.Server.ClientOutputLimit = 64 * units.MB
			})
			if tier {
				p.LocalTier().Connect(0)
				redistest.Eventually(t, 5*time.Second, func() bool { return p.LocalTier().Live(0) }, "tier live")
			}
			// Shared keys: one value each, written once.
			rng := rand.New(rand.NewPCG(7, 7))
			shared := map[string][]byte{}
			rc := rs.Client(t)
			for _, n := range reviewSizes {
				k := "shared:" + strconv.Itoa(n)
				shared[k] = redistest.TaggedValue(rng, k, n)
				if err := rc.Set(context.Background(), k, shared[k], 0).Err(); err != nil {
					t.Fatal(err)
				}
			}
			const clients = 12
			deadline := time.Now().Add(4 * time.Second)
			var wg sync.WaitGroup
			errs := make(chan error, clients)
			for ci := range clients {
				wg.Go(func() {
					if err := reviewClient(p, ci, shared, deadline); err != nil {
						errs <- err
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
		})
	}
}

func reviewClient(p *proxytest.Proxy, ci int, shared map[string][]byte, deadline time.Time) error {
	nc, err := p.DialErr()
	if err != nil {
		return err
	}
	defer nc.Close()
	rd := bufio.NewReaderSize(nc, 64<<10)
	rng := rand.New(rand.NewPCG(uint64(ci), 99))
	proto := "2"
	if ci%2 == 1 {
		proto = "3"
	}
	nc.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := nc.Write(reviewCmd([]byte("HELLO"), []byte(proto))); err != nil {
		return err
	}
	if err := skipReply(rd); err != nil {
		return err
	}
	own := map[string][]byte{}
	sharedKeys := make([]string, 0, len(shared))
	for k := range shared {
		sharedKeys = append(sharedKeys, k)
	}
	ownKey := func() string { return fmt.Sprintf("c%d:%d", ci, rng.IntN(4)) }
	for round := 0; time.Now().Before(deadline); round++ {
		// A batch of 1..4 commands.
		var req []byte
		var want [][]byte
		for range 1 + rng.IntN(4)*(rng.IntN(2)) {
			switch rng.IntN(3) {
			case 0: // SET own key
				k := ownKey()
				n := reviewSizes[rng.IntN(len(reviewSizes))]
				v := redistest.TaggedValue(rng, k+"#"+strconv.Itoa(round), n)
				own[k] = v
				req = append(req, reviewCmd([]byte("SET"), []byte(k), v)...)
				want = append(want, []byte("+OK\r\n"))
			case 1: // GET own key
				k := ownKey()
				req = append(req, reviewCmd([]byte("GET"), []byte(k))...)
				if v, ok := own[k]; ok {
					want = append(want, reviewBulk(v))
				} else if proto == "3" {
					want = append(want, []byte("_\r\n"))
				} else {
					want = append(want, []byte("$-1\r\n"))
				}
			default: // GET shared key
				k := sharedKeys[rng.IntN(len(sharedKeys))]
				req = append(req, reviewCmd([]byte("GET"), []byte(k))...)
				want = append(want, reviewBulk(shared[k]))
			}
		}
		nc.SetDeadline(time.Now().Add(30 * time.Second))
		// Written in pieces, so large arguments arrive over several reads.
		for b := req; len(b) > 0; {
			n := min(len(b), 1+rng.IntN(96<<10))
			if _, err := nc.Write(b[:n]); err != nil {
				return err
			}
			b = b[n:]
		}
		for i, w := range want {
			got := make([]byte, len(w))
			if _, err := io.ReadFull(rd, got); err != nil {
				return fmt.Errorf("client %d round %d reply %d: %v", ci, round, i, err)
			}
			if !bytes.Equal(got, w) {
				d := redistest.FirstDifference(got, w)
				return fmt.Errorf("client %d round %d reply %d (%d bytes): differs at %d: got %q want %q", ci, round, i, len(w), d, got[d:min(d+40, len(got))], w[d:min(d+40, len(w))])
			}
		}
		if rng.IntN(4) == 0 {
			time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond) // idle: buffers back to the pools
		}
	}
	return nil
}

// skipReply reads one RESP reply (HELLO's map or array) line by line.
func skipReply(rd *bufio.Reader) error {
	pending := 1
	for pending > 0 {
		line, err := rd.ReadString('\n')
		if err != nil {
			return err
		}
		pending--
		switch line[0] {
		case '*', '%', '~':
			n, _ := strconv.Atoi(line[1 : len(line)-2])
			if line[0] == '%' {
				n *= 2
			}
			pending += n
		case '$', '=':
			n, _ := strconv.Atoi(line[1 : len(line)-2])
			if n >= 0 {
				if _, err := rd.Discard(n + 2); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// Clients that declare a 10 MB argument and send 20 KB of it: how much
// the proxy holds for them. Before, each one's read buffer grew as the
// bytes came (16 KB, then 32 KB); now grow sizes it for the declared
// argument up to eagerMax (256 KB) as soon as the first 16 KB are in.
func TestReviewDeclaredArgumentsHeldAhead(t *testing.T) {
	rs := redistest.Start(t)
	p := proxytest.Start(t, rs, nil)
	const conns = 200
	const sent = 20 << 10
	req := append([]byte("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$10000000\r\n"), bytes.Repeat([]byte("v"), sent)...)
	runtimeGC()
	before := heapAlloc()
	ncs := make([]net.Conn, 0, conns)
	for range conns {
		nc := p.Dial(t)
		if _, err := nc.Write(req); err != nil {
			t.Fatal(err)
		}
		ncs = append(ncs, nc)
	}
	time.Sleep(500 * time.Millisecond) // every session has read what came
	runtimeGC()
	held := int64(heapAlloc()) - int64(before)
	arrived := int64(conns * len(req))
	t.Logf("%d clients, %d KB sent in all, %d KB held", conns, arrived>>10, held>>10)
	if held > 4*arrived {
		t.Errorf("the proxy holds %d KB for %d KB its clients sent: about %d KB per client that sent %d KB of a declared 10 MB argument",
			held>>10, arrived>>10, held/conns>>10, len(req)>>10)
	}
	for _, nc := range ncs {
		nc.Close()
	}
}

func runtimeGC() { runtime.GC() }

func heapAlloc() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
