package upstream

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/resp"
)

// A Send joins the write a pipe's writer is about to make (Pool.Send), but
// never a pipe whose writer is stuck in a write: there Redis reads nothing
// (here: busy in a script), and everything sent to that pipe waits with it.
// Sends made meanwhile still go to the other pipe in turn.
func TestPoolSendsPastAWriterStuckInAWrite(t *testing.T) {
	srv := redistest.Start(t)
	opt := testOpts(srv.Addr())
	opt.ReplyTimeout = time.Minute // no pipe is marked lagging during the test
	pool := NewPool(2, opt)
	defer pool.Close()
	waitUp(t, pool)

	script := NewCall()
	script.Add(cmd("EVAL", redistest.LoopScript, "0", "3000"))
	if err := pool.Send(script); err != nil {
		t.Fatal(err)
	}
	// More than the socket buffers hold while Redis reads nothing.
	big := NewCall()
	big.Add(cmd("SET", "big", strings.Repeat("x", 48<<20)))
	if err := pool.Send(big); err != nil {
		t.Fatal(err)
	}
	var stuck *Pipe
	redistest.Eventually(t, 5*time.Second, func() bool {
		for _, pp := range pool.pipes {
			if pp.writing.Load() {
				stuck = pp
				return true
			}
		}
		return false
	}, "no writer got stuck writing the big command")
	// The writer adds to its count of written commands when a write is
	// done: unchanged after the Sends below, it was stuck all along.
	written := stuck.Stats().Commands
	before := make([]int, len(pool.pipes))
	for i, pp := range pool.pipes {
		before[i] = pp.Stats().Pending
	}
	const sends = 10
	calls := make([]*Call, sends)
	for i := range calls {
		calls[i] = NewCall()
		calls[i].Add(cmd("PING"))
		if err := pool.Send(calls[i]); err != nil {
			t.Fatal(err)
		}
		// Let the other pipe's writer write it, as it does between the
		// clients' batches of a busy proxy.
		redistest.Eventually(t, 5*time.Second, func() bool {
			for _, pp := range pool.pipes {
				if pp != stuck && pp.queued.Load() {
					return false
				}
			}
			return true
		}, "the pipe that is not stuck never wrote what was sent to it")
	}
	if !stuck.writing.Load() || stuck.Stats().Commands != written {
		t.Skip("Redis read the big command before the sends were made; nothing to judge")
	}
	onStuck := 0
	for i, pp := range pool.pipes {
		if pp == stuck {
			onStuck = pp.Stats().Pending - before[i]
		}
	}
	if onStuck > sends/2+1 {
		t.Fatalf("%d of %d Sends went to the pipe whose writer is stuck in a write; want them spread (at most %d)", onStuck, sends, sends/2+1)
	}
	for _, c := range append(calls, script, big) {
		c.Wait()
	}
}

// The spare connection is for reads while every pipe is up and waiting
// on a slow reply, never for a Redis that is down: a read then fails at
// once, as a write does, and no spare is dialled (found by review: the
// first read waited the whole dial timeout for a spare that could not
// connect, and left one more connection behind after the outage).
func TestPoolSpareNotDialledForARedisThatIsDown(t *testing.T) {
	srv := redistest.Start(t)
	pool := NewPool(2, testOpts(srv.Addr()))
	defer pool.Close()
	waitUp(t, pool)
	srv.Kill(t)
	redistest.Eventually(t, 10*time.Second, func() bool { return !pool.Up() }, "the pool still up after Redis was killed")
	read := NewCall()
	read.AddRead(cmd("GET", "k"))
	if err := pool.Send(read); err != ErrUnavailable {
		t.Fatalf("a read sent to a pool whose Redis is down: %v, want ErrUnavailable", err)
	}
	if pool.spare.Load() != nil {
		t.Fatal("a spare connection was dialled for a Redis that is down")
	}
}

// A pipe's count of pending writes, which keeps reads off it, goes back
// to 0 when they are answered and when the connection is lost with them
// pending: a count left behind would send every later read to the spare.
func TestPoolPendingWritesCounted(t *testing.T) {
	srv := redistest.Start(t)
	pool := NewPool(1, testOpts(srv.Addr()))
	defer pool.Close()
	waitUp(t, pool)
	pp := pool.pipes[0]
	for i := range 50 {
		c := NewCall()
		c.Add(cmd("INCR", "n"))
		if i%2 == 0 {
			c.AddRead(cmd("GET", "n"))
		}
		if err := pool.Send(c); err != nil {
			t.Fatal(err)
		}
		c.Wait()
	}
	if n := pp.writes.Load(); n != 0 {
		t.Fatalf("pending writes after every reply came: %d", n)
	}
	// Held by a pause, then lost with the connection.
	direct := srv.Client(t)
	if err := direct.Do(context.Background(), "CLIENT", "PAUSE", "60000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	held := NewCall()
	held.Add(cmd("INCR", "n"))
	if err := pool.Send(held); err != nil {
		t.Fatal(err)
	}
	if n := pp.writes.Load(); n != 1 {
		t.Fatalf("pending writes with one INCR held: %d, want 1", n)
	}
	srv.Kill(t)
	held.Wait()
	if held.Err() == nil {
		t.Fatal("the held INCR did not fail when Redis was killed")
	}
	if n := pp.writes.Load(); n != 0 {
		t.Fatalf("pending writes after the connection was lost: %d", n)
	}
}

// Others' commands avoid a pipe carrying a large request (or reply) while
// another is free: round robin put one in four behind a 512 MB SET, and
// every client stalled on it (found by a probe: 565-877 ms, where Redis's
// own clients waited at most 5 ms). Redis is paused so that every Call
// stays pending and where each went can be counted.
func TestPoolSendsAroundAHeavyCall(t *testing.T) {
	srv := redistest.Start(t)
	opt := testOpts(srv.Addr())
	opt.ReplyTimeout = time.Minute // no pipe lags during the pause
	pool := NewPool(2, opt)
	defer pool.Close()
	redistest.Eventually(t, 5*time.Second, func() bool { _, up := pool.Stats(); return up == 2 }, "pipes not up")
	direct := srv.Client(t)
	// (Redis holds a CLIENT UNPAUSE too: the pause runs out by itself.)
	if err := direct.Do(context.Background(), "CLIENT", "PAUSE", "3000", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	heavy := NewCall()
	heavy.Add(resp.AppendCommandStrings(nil, "SET", "heavy", strings.Repeat("h", 2<<20)))
	if err := pool.Send(heavy); err != nil {
		t.Fatal(err)
	}
	var light []*Call
	for range 10 {
		c := NewCall()
		c.Add(cmd("PING"))
		if err := pool.Send(c); err != nil {
			t.Fatal(err)
		}
		light = append(light, c)
	}
	pending := []int{pool.pipes[0].Stats().Pending, pool.pipes[1].Stats().Pending}
	if !(pending[0] == 1 && pending[1] == 10 || pending[0] == 10 && pending[1] == 1) {
		t.Errorf("pending per pipe %v: want the SET of 2 MB alone on its pipe and the 10 PINGs on the other", pending)
	}
	heavy.Wait()
	if r, err := heavy.Reply(0); err != nil || string(r) != "+OK\r\n" {
		t.Fatalf("SET: %q, %v", r, err)
	}
	for _, c := range light {
		c.Wait()
		if r, err := c.Reply(0); err != nil || string(r) != "+PONG\r\n" {
			t.Fatalf("PING: %q, %v", r, err)
		}
	}
	// Large replies, filled (a bulk string) and grown (an aggregate), are
	// counted while read and no longer once answered.
	for i := range 300 {
		if err := direct.RPush(context.Background(), "heavy:list", strings.Repeat("e", 8<<10), i).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, command := range []string{"GET heavy", "LRANGE heavy:list 0 -1"} {
		c := NewCall()
		c.Add(resp.AppendCommandStrings(nil, strings.Fields(command)...))
		pool.Do(c)
		if r, err := c.Reply(0); err != nil || len(r) < 2<<20 {
			t.Fatalf("%s: %d bytes, %v", command, len(r), err)
		}
		if !c.heavy {
			t.Errorf("%s: its reply of %d bytes was not counted as heavy", command, len(c.out))
		}
	}
	if n := pool.pipes[0].heavy.Load() + pool.pipes[1].heavy.Load(); n != 0 {
		t.Fatalf("%d heavy Calls still counted once all were answered", n)
	}
}
