package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

func directReplies(p *proxytest.Proxy) float64 { return testutil.ToFloat64(p.Metrics.DirectReplies) }

// Clients that mix lone commands (answered by the pipe's reader) with
// pipelines sent before the lone command's reply was read get every reply
// in order and none of another client's: the session must wait for a
// direct reply before it answers anything after it.
func TestDirectRepliesKeepEachClientsOrder(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	before := directReplies(p)
	const clients, rounds = 24, 300
	var wg sync.WaitGroup
	var alone atomic.Int64 // lone INCRs nothing was sent behind before their reply
	errs := make(chan error, clients)
	for ci := range clients {
		c := dialRaw(t, p.Addr) // here: it may fail the test
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("direct:order:%d", ci)
			rng := rand.New(rand.NewPCG(uint64(ci), 7))
			var want int64
			for r := range rounds {
				// A lone INCR (direct), then without reading its reply
				// sometimes a pipeline that reads and writes the key.
				if err := c.write([]string{"INCR", key}); err != nil {
					errs <- err
					return
				}
				want++
				expect := []any{want}
				if rng.IntN(2) == 1 {
					alone.Add(1)
				} else {
					v := strconv.Itoa(r)
					if err := c.write([]string{"GET", key}, []string{"SET", key + ":v", v}, []string{"GET", key + ":v"}, []string{"INCR", key}); err != nil {
						errs <- err
						return
					}
					expect = append(expect, strconv.FormatInt(want, 10), "OK", v, want+1)
					want++
				}
				for i, e := range expect {
					if got, err := c.next(nil); err != nil || got != e {
						errs <- fmt.Errorf("client %d round %d reply %d: got %q (%v), want %q", ci, r, i, got, err, e)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// A lone INCR with a pipeline sent right behind it may be read with
	// it in one batch; one with nothing behind it cannot.
	if got := directReplies(p) - before; got < float64(alone.Load()) {
		t.Fatalf("%v direct replies, want at least %d: the lone INCRs did not take the direct path", got, alone.Load())
	}
}

// A client whose lone command has a reply far larger than its socket takes
// at once, and which does not read, holds up no other client on the same
// upstream connections: the pipe's reader hands the rest to a goroutine.
// When the client reads at last, it gets the whole reply, then the reply
// of a command it sent behind it.
func TestDirectReplyToSlowReaderHoldsNoOneUp(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) {
		c.Upstream.Connections = 1 // everyone behind one reader
	})
	big := strings.Repeat("z", 4<<20)
	if err := p.Redis.Client(t).Set(ctx, "direct:big", big, 0).Err(); err != nil {
		t.Fatal(err)
	}
	before := directReplies(p)
	slowConn := dialSmallBuffer(t, p.Addr)
	slow := &rawConn{t: t, nc: slowConn, rd: bufio.NewReader(slowConn)}
	// MGET: not a single-key read, so not coalesced, so direct. 8 MB of
	// reply against a 4 KB receive buffer.
	slow.send([]string{"MGET", "direct:big", "direct:big"})
	// Wait until the reply is being written, then more behind it.
	deadline := time.Now().Add(10 * time.Second)
	for directReplies(p)-before < 1 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if directReplies(p)-before < 1 {
		t.Fatal("the MGET was not answered directly")
	}
	slow.send([]string{"PING"})

	good := p.Client(t)
	for i := range 500 {
		k, v := "direct:good:"+strconv.Itoa(i%7), strconv.Itoa(i)
		if err := good.Set(ctx, k, v, 0).Err(); err != nil {
			t.Fatalf("round %d: SET: %v", i, err)
		}
		if got, err := good.Get(ctx, k).Result(); err != nil || got != v {
			t.Fatalf("round %d: GET %s = %q, %v; want %q", i, k, got, err, v)
		}
	}
	if n := closedFor(p, metrics.CloseWriteTimeout) + closedFor(p, metrics.CloseOutputLimit); n != 0 {
		t.Fatalf("%v clients closed while the slow one still had time to read", n)
	}

	if got, _ := slow.readReply(); !reflect.DeepEqual(got, []any{big, big}) {
		t.Fatal("the slow client's MGET reply is not the two 4 MB values")
	}
	if got, _ := slow.readReply(); got != "PONG" {
		t.Fatalf("after the direct reply: %v, want PONG", got)
	}
}

// A lone command whose reply exceeds the client's output limit closes that
// client (output_limit) and only it, as when its session waits for the
// reply.
func TestDirectReplyOverOutputLimitClosesTheClient(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) {
		c.Server.ClientOutputLimit = units.ByteSize(1 << 20)
	})
	big := strings.Repeat("o", 700<<10)
	if err := p.Redis.Client(t).Set(ctx, "direct:over", big, 0).Err(); err != nil {
		t.Fatal(err)
	}
	before := directReplies(p)
	c := dialRaw(t, p.Addr)
	c.send([]string{"MGET", "direct:over", "direct:over"}) // 1.4 MB
	if !connClosed(c.nc) {
		t.Fatal("the client over its output limit was not closed")
	}
	if directReplies(p)-before < 1 {
		t.Fatal("the MGET was not sent as a direct reply")
	}
	deadline := time.Now().Add(10 * time.Second)
	for closedFor(p, metrics.CloseOutputLimit) < 1 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := closedFor(p, metrics.CloseOutputLimit); n != 1 {
		t.Fatalf("clients closed for output_limit = %v, want 1", n)
	}
	if got, err := p.Client(t).Get(ctx, "direct:over").Result(); err != nil || len(got) != len(big) {
		t.Fatalf("another client's GET: %d bytes, %v", len(got), err)
	}
}

// A client that hangs up while its lone command runs (a slow script) ends
// cleanly: its session waits for the reply the pipe's reader fails to
// write, and the connection count comes back down.
func TestDirectReplyToClientThatLeft(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	before := directReplies(p)
	connected := func() float64 { return testutil.ToFloat64(p.Metrics.ClientsConnected) }
	base := connected()
	for range 5 {
		c := dialRaw(t, p.Addr)
		// About 100 ms of Lua, then the reply to a closed socket.
		c.send([]string{"EVAL", "local t = redis.call('TIME'); local s = t[1] * 1000000 + t[2]; repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] - s > 100000; return 'done'", "0"})
		time.Sleep(10 * time.Millisecond)
		c.nc.Close()
	}
	deadline := time.Now().Add(10 * time.Second)
	for connected() > base && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := connected(); got != base {
		t.Fatalf("%v clients still connected after all hung up, want %v", got, base)
	}
	if directReplies(p)-before < 5 {
		t.Fatalf("%v of the 5 scripts were sent as direct replies", directReplies(p)-before)
	}
	if got, err := p.Client(t).Ping(ctx).Result(); err != nil || got != "PONG" {
		t.Fatalf("PING after: %q, %v", got, err)
	}
}

// Lone GETs lead their fetches as direct replies while clients hang up
// with a GET in flight, overflow the output limit, mute replies (CLIENT
// REPLY OFF), pipeline, send back to back and park: afterwards every key
// still answers at once, in RESP2 (a lead of its own) and RESP3 (through
// the group). A lead left un-ended would block its key's next readers
// forever.
func TestLeadsNeverBlockAKey(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) {
		c.Server.ClientOutputLimit = units.ByteSize(512 << 10)
		c.Server.IdleParkAfter = units.Duration{Duration: 20 * time.Millisecond}
		c.Upstream.Connections = 2
	})
	rc := p.Redis.Client(t)
	keys := []string{"lead:a", "lead:b", "lead:c"}
	for _, k := range keys {
		if err := rc.Set(ctx, k, "v"+k, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := rc.Set(ctx, "lead:big", strings.Repeat("x", 700<<10), 0).Err(); err != nil {
		t.Fatal(err)
	}
	before := directReplies(p)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for ci := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(ci), 11))
			for range 40 {
				nc, err := p.DialErr()
				if err != nil {
					errs <- err
					return
				}
				c := &rawConn{t: t, nc: nc, rd: bufio.NewReader(nc)}
				if err := leadChurn(c, rng, keys); err != nil {
					nc.Close()
					errs <- err
					return
				}
				nc.Close()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if directReplies(p) == before {
		t.Fatal("no GET went as a direct reply: the test misses leads")
	}
	for _, k := range keys {
		c := dialRaw(t, p.Addr)
		if v := c.do("GET", k); v != "v"+k {
			t.Fatalf("RESP2 GET %s after the churn = %v", k, v)
		}
		if v, err := p.Client(t).Get(ctx, k).Result(); err != nil || v != "v"+k {
			t.Fatalf("RESP3 GET %s after the churn = %q, %v", k, v, err)
		}
	}
}

// leadChurn runs up to 20 random operations of TestLeadsNeverBlockAKey on
// c, and stops early where the operation leaves the connection unusable.
func leadChurn(c *rawConn, rng *rand.Rand, keys []string) error {
	for range 20 {
		k := keys[rng.IntN(len(keys))]
		switch x := rng.IntN(100); {
		case x < 50:
			if err := c.write([]string{"GET", k}); err != nil {
				return err
			}
			if v, err := c.next(nil); err != nil || v != "v"+k {
				return fmt.Errorf("GET %s = %v, %v", k, v, err)
			}
		case x < 55: // hang up with a GET in flight
			c.write([]string{"GET", k})
			return nil
		case x < 60: // a reply over the output limit: the client is closed
			c.write([]string{"GET", "lead:big"})
			return nil
		case x < 70:
			c.write([]string{"CLIENT", "REPLY", "OFF"}, []string{"GET", k})
			time.Sleep(time.Millisecond)
			c.write([]string{"CLIENT", "REPLY", "ON"})
			if v, err := c.next(nil); err != nil || v != "OK" {
				return fmt.Errorf("CLIENT REPLY ON = %v, %v", v, err)
			}
		case x < 80:
			c.write([]string{"GET", k}, []string{"GET", k})
			for range 2 {
				if v, err := c.next(nil); err != nil || v != "v"+k {
					return fmt.Errorf("pipelined GET %s = %v, %v", k, v, err)
				}
			}
		case x < 85:
			time.Sleep(30 * time.Millisecond) // long enough to park
		default: // the second GET may arrive while the first is in flight
			c.write([]string{"GET", k})
			c.write([]string{"GET", k})
			for range 2 {
				if v, err := c.next(nil); err != nil || v != "v"+k {
					return fmt.Errorf("back-to-back GET %s = %v, %v", k, v, err)
				}
			}
		}
	}
	return nil
}

// writeBigDirect sends, as a lone command (so a direct reply), an MGET
// whose reply (8 MB) a client with a small receive buffer that reads
// nothing cannot take: the pipe's reader writes what fits and a goroutine
// waits for room under client_write_timeout.
func writeBigDirect(t *testing.T, p *proxytest.Proxy) net.Conn {
	t.Helper()
	if err := p.Redis.Client(t).Set(context.Background(), "wt:big", strings.Repeat("b", 4<<20), 0).Err(); err != nil {
		t.Fatal(err)
	}
	before := directReplies(p)
	nc := dialSmallBuffer(t, p.Addr)
	if _, err := nc.Write([]byte("*3\r\n$4\r\nMGET\r\n$6\r\nwt:big\r\n$6\r\nwt:big\r\n")); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 10*time.Second, func() bool { return directReplies(p) > before },
		"the MGET was not answered as a direct reply")
	return nc
}

// A direct reply the client does not take within client_write_timeout
// ends the client at once, as a failed write of its session's own does:
// the session is blocked reading the client, which, waiting for the rest
// of its reply, sends nothing to wake it. (It stayed open, with part of
// a reply sent and no idle_timeout to end it.)
func TestDirectReplyWriteTimeoutClosesTheClient(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) {
		c.Server.ClientWriteTimeout = units.Duration{Duration: 300 * time.Millisecond}
		c.Server.IdleParkAfter = units.Duration{} // parking off
	})
	before := closedFor(p, metrics.CloseWriteTimeout)
	nc := writeBigDirect(t, p)
	redistest.Eventually(t, 10*time.Second, func() bool { return closedFor(p, metrics.CloseWriteTimeout) > before },
		"the client whose direct reply timed out was not closed (close reasons %v)", closeCounts(p))
	if !connClosed(nc) {
		t.Fatal("the client's connection is still open")
	}
}

// With parking on, a session whose direct reply timed out was asked to
// park while it waited, then parked with its failure forgotten: the
// client's next command was answered after the cut-off reply, a stream
// out of step. It must end instead, and answer nothing more.
func TestDirectReplyWriteTimeoutIsNotParked(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) {
		c.Server.ClientWriteTimeout = units.Duration{Duration: 300 * time.Millisecond}
		c.Server.IdleParkAfter = units.Duration{Duration: 20 * time.Millisecond}
	})
	before := closedFor(p, metrics.CloseWriteTimeout)
	nc := writeBigDirect(t, p)
	redistest.Eventually(t, 10*time.Second, func() bool { return closedFor(p, metrics.CloseWriteTimeout) > before },
		"the client whose direct reply timed out was not closed (close reasons %v)", closeCounts(p))
	nc.Write([]byte("*1\r\n$4\r\nPING\r\n")) // may fail: the proxy has closed it
	nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(nc)
	if bytes.HasSuffix(got, []byte("+PONG\r\n")) {
		t.Fatalf("PING answered after a cut-off reply (%d bytes of 8 MB)", len(got))
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the client's connection is still open after %d bytes", len(got))
	}
}
