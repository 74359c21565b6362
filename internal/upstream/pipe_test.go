package upstream

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/tidwall/redcon"
)

func cmd(args ...string) []byte {
	var b []byte
	b = redcon.AppendArray(b, len(args))
	for _, a := range args {
		b = redcon.AppendBulkString(b, a)
	}
	return b
}

func bulk(s string) string { return "$" + strconv.Itoa(len(s)) + "\r\n" + s + "\r\n" }

func testOpts(addr string) Options {
	return Options{Addr: addr, DialTimeout: time.Second, ReplyTimeout: time.Second, ReconnectMin: 10 * time.Millisecond, ReconnectMax: 50 * time.Millisecond}
}

func waitUp(t *testing.T, p *Pool) {
	t.Helper()
	if !p.WaitUp(5 * time.Second) {
		t.Fatal("pool never came up")
	}
}

// Many goroutines share a few pipes; each checks that every reply it gets
// is the answer to its own command. A reply matched to the wrong Call would
// show up as another goroutine's value.
func TestPoolNoCrossTalk(t *testing.T) {
	srv := redistest.Start(t)
	pool := NewPool(3, testOpts(srv.Addr()))
	defer pool.Close()
	waitUp(t, pool)

	const workers, rounds, depth = 64, 50, 20
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			c := NewCall()
			for r := 0; r < rounds; r++ {
				c.Reset()
				for d := 0; d < depth; d++ {
					c.Add(cmd("ECHO", fmt.Sprintf("w%d-r%d-d%d", w, r, d)))
				}
				pool.Do(c)
				for d := 0; d < depth; d++ {
					got, err := c.Reply(d)
					want := bulk(fmt.Sprintf("w%d-r%d-d%d", w, r, d))
					if err != nil || string(got) != want {
						errs <- fmt.Errorf("worker %d round %d reply %d: got %q, %v; want %q", w, r, d, got, err, want)
						return
					}
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// Killing Redis fails pending and new Calls promptly; after a restart the
// pool reconnects by itself; closing it leaves no goroutine behind.
func TestPoolSurvivesRedisRestart(t *testing.T) {
	before := runtime.NumGoroutine()
	srv := redistest.Start(t)
	pool := NewPool(2, testOpts(srv.Addr()))
	waitUp(t, pool)

	c := NewCall()
	c.Add(cmd("SET", "k", "v"))
	pool.Do(c)
	if r, err := c.Reply(0); err != nil || string(r) != "+OK\r\n" {
		t.Fatalf("SET: %q %v", r, err)
	}

	srv.Kill(t)
	redistest.Eventually(t, 5*time.Second, func() bool {
		c.Reset()
		c.Add(cmd("PING"))
		start := time.Now()
		pool.Do(c)
		_, err := c.Reply(0)
		if err != nil && time.Since(start) > 2*time.Second {
			t.Fatalf("error took %v", time.Since(start))
		}
		return errors.Is(err, ErrUnavailable) || errors.Is(err, ErrConnLost)
	}, "calls never failed after Redis was killed")

	srv.Restart(t)
	redistest.Eventually(t, 5*time.Second, func() bool {
		c.Reset()
		c.Add(cmd("PING"))
		pool.Do(c)
		r, err := c.Reply(0)
		return err == nil && string(r) == "+PONG\r\n"
	}, "pool did not recover after Redis restarted")

	pool.Close()
	redistest.Eventually(t, 5*time.Second, func() bool {
		return runtime.NumGoroutine() <= before+2 // redistest's own process waiters
	}, "goroutines leaked: %d before, %d after", before, runtime.NumGoroutine())
}

// A reply that does not come before the dead timeout (DEBUG SLEEP blocks
// the probe too) closes the connection and fails the Call, rather than
// letting a late reply be matched to a later Call.
func TestPipeReplyTimeoutClosesConnection(t *testing.T) {
	srv := redistest.Start(t, "--enable-debug-command", "local")
	opt := testOpts(srv.Addr())
	opt.ReplyTimeout = 200 * time.Millisecond
	opt.DeadTimeout = 400 * time.Millisecond
	pipe := NewPipe(opt)
	defer pipe.Close()
	redistest.Eventually(t, 5*time.Second, pipe.Up, "pipe not up")

	slow := NewCall()
	slow.Add(cmd("DEBUG", "SLEEP", "1"))
	if err := pipe.Send(slow); err != nil {
		t.Fatal(err)
	}
	slow.Wait()
	if _, err := slow.Reply(0); !errors.Is(err, ErrTimeout) {
		t.Fatalf("slow call: want ErrTimeout, got %v", err)
	}
	// After reconnecting, a fresh call gets its own reply, not DEBUG's +OK.
	redistest.Eventually(t, 5*time.Second, func() bool {
		c := NewCall()
		c.Add(cmd("ECHO", "after"))
		if pipe.Send(c) != nil {
			return false
		}
		c.Wait()
		r, err := c.Reply(0)
		if err == nil && string(r) != bulk("after") {
			t.Fatalf("reply after timeout: %q", r)
		}
		return err == nil
	}, "pipe never recovered after the timeout")
	if s := pipe.Stats(); s.Timeouts == 0 {
		t.Fatalf("timeout not counted: %+v", s)
	}
}

func TestDialHandshakeErrors(t *testing.T) {
	srv := redistest.Start(t)
	if err := srv.Client(t).ConfigSet(context.Background(), "requirepass", "s3cret").Err(); err != nil {
		t.Fatal(err)
	}
	opt := testOpts(srv.Addr())
	opt.Password = "wrong"
	if _, err := Dial(opt); !errors.Is(err, ErrHandshake) {
		t.Fatalf("wrong password: %v", err)
	}
	opt.Password = "s3cret"
	opt.DB = 3
	opt.RESP3 = true
	nc, err := Dial(opt)
	if err != nil {
		t.Fatalf("right password: %v", err)
	}
	nc.Close()
}

func BenchmarkPoolPipeline16(b *testing.B) {
	srv := redistest.Start(b)
	pool := NewPool(2, testOpts(srv.Addr()))
	defer pool.Close()
	if !pool.WaitUp(5 * time.Second) {
		b.Fatal("not up")
	}
	get := cmd("GET", "key:000000012345")
	c := NewCall()
	b.ReportAllocs()
	for b.Loop() {
		c.Reset()
		for i := 0; i < 16; i++ {
			c.Add(get)
		}
		pool.Do(c)
		if c.Err() != nil {
			b.Fatal(c.Err())
		}
	}
}
