package upstream

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/redistest"
)

// A pipe gives back the buffer a large aggregate reply grew once the reply
// is read, not at its next read: a pipe that went quiet after a 256 MB
// reply kept a 128 MB buffer (heap profile).
func TestPipeGivesBackTheBufferALargeReplyGrew(t *testing.T) {
	srv := redistest.Start(t)
	rc := srv.Client(t)
	value := strings.Repeat("v", 1<<20)
	for i := 0; i < 64; i++ {
		if err := rc.RPush(context.Background(), "big", value).Err(); err != nil {
			t.Fatal(err)
		}
	}
	opt := testOpts(srv.Addr())
	opt.ReplyLimit = 256 << 20
	pipe := NewPipe(opt)
	defer pipe.Close()
	redistest.Eventually(t, 5*time.Second, pipe.Up, "pipe not up")
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	before := heap()
	c := NewCall()
	c.Add(cmd("LRANGE", "big", "0", "-1"))
	if err := pipe.Send(c); err != nil {
		t.Fatal(err)
	}
	c.Wait()
	if r, err := c.Reply(0); err != nil || len(r) < 64<<20 {
		t.Fatalf("LRANGE: %d bytes, %v", len(r), err)
	}
	c.Release()
	// The pipe's reader gives the buffer back once it has delivered the
	// reply and before it waits for Redis again: the Call's end may come
	// before the reader gets there (seen in CI under load).
	var grew int64
	redistest.Eventually(t, 5*time.Second, func() bool {
		grew = int64(heap()) - int64(before)
		return grew <= 16<<20
	}, "the heap holds %v MB more after a 64 MB reply than before it", lazyMB{&grew})
}

// lazyMB formats *p in MB when printed, so a failure message shows the
// last value an Eventually condition saw.
type lazyMB struct{ p *int64 }

func (m lazyMB) String() string { return strconv.FormatInt(*m.p>>20, 10) }

// A pipe stops lagging as soon as its late replies are in, not at the
// watchdog's next tick: until then a pool whose pipes Redis had all kept
// waiting (a script before busy-reply-threshold) sent round robin, some
// commands onto the pipe behind the script, where they waited for its end
// (found by a probe: 5 s, where directly they got -BUSY at once).
func TestPipeStopsLaggingWhenItsRepliesAreIn(t *testing.T) {
	srv := redistest.Start(t, "--enable-debug-command", "local")
	opt := testOpts(srv.Addr())
	opt.ReplyTimeout = 2 * time.Second // lagging past 200 ms
	opt.DeadTimeout = 10 * time.Second
	pipe := NewPipe(opt)
	defer pipe.Close()
	redistest.Eventually(t, 5*time.Second, pipe.Up, "pipe not up")
	c := NewCall()
	c.Add(cmd("DEBUG", "SLEEP", "0.6"))
	if err := pipe.Send(c); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 5*time.Second, pipe.lagging.Load, "the pipe never lagged behind DEBUG SLEEP")
	c.Wait()
	if _, err := c.Reply(0); err != nil {
		t.Fatal(err)
	}
	if pipe.lagging.Load() {
		t.Fatal("the pipe still lags once its late reply is in")
	}
}

// A pool's first client stops waiting for its dials once Redis refused
// them for its state (-BUSY, -LOADING), which the client is then answered
// with, as by Redis directly; other refusals may clear in a moment and
// are waited for (found by a probe: a GET in a new database during a
// script past busy-reply-threshold waited the dial timeout).
func TestFirstClientWaitsNotForAStateRefusal(t *testing.T) {
	p := &Pool{pipes: []*Pipe{{}, {}}}
	refuse := func(reply string) {
		for _, pp := range p.pipes {
			err := error(&HandshakeRefusal{Cmd: "SELECT", Reply: []byte(reply)})
			pp.refused.Store(&err)
		}
	}
	refuse("-ERR max number of clients reached\r\n")
	if p.allDialsFailed() {
		t.Fatal("a maxclients refusal ended the first client's wait")
	}
	refuse("-BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.\r\n")
	if !p.allDialsFailed() {
		t.Fatal("a -BUSY refusal did not end the first client's wait")
	}
	refuse("-LOADING Redis is loading the dataset in memory\r\n")
	if !p.allDialsFailed() {
		t.Fatal("a -LOADING refusal did not end the first client's wait")
	}
}
