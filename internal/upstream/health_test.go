package upstream

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/redistest"
)

// healthOpts makes the reply timeout short and the dead timeout a little
// longer, so the tests see both without waiting long.
func healthOpts(addr string, dead time.Duration) Options {
	opt := testOpts(addr)
	opt.ReplyTimeout = 150 * time.Millisecond
	opt.DeadTimeout = dead
	return opt
}

func startedPipe(t *testing.T, opt Options) *Pipe {
	t.Helper()
	p := NewPipe(opt)
	t.Cleanup(p.Close)
	redistest.Eventually(t, 5*time.Second, p.Up, "pipe not up")
	return p
}

// sendCall queues one Call of the given commands.
func sendCall(t *testing.T, p *Pipe, cmds ...[]byte) *Call {
	t.Helper()
	c := NewCall()
	for _, b := range cmds {
		c.Add(b)
	}
	if err := p.Send(c); err != nil {
		t.Fatal(err)
	}
	return c
}

func wantReply(t *testing.T, c *Call, i int, want string) {
	t.Helper()
	r, err := c.Reply(i)
	if err != nil || string(r) != want {
		t.Fatalf("reply %d: got %q, %v; want %q", i, r, err, want)
	}
}

// A script running longer than the reply timeout, and even longer than the
// dead timeout, keeps the connection: a fresh connection's PING gets -BUSY,
// which proves Redis alive. The script's caller and the Call queued behind it
// get their own replies when it ends, as on Redis itself.
func TestPipeWaitsForLongScript(t *testing.T) {
	srv := redistest.Start(t, "--busy-reply-threshold", "50")
	// A dead timeout of a second holds about six probes, any one of which
	// keeps the connection (with 400 ms two late probes on a loaded machine
	// would close it); the script runs well past it.
	p := startedPipe(t, healthOpts(srv.Addr(), time.Second))
	script := sendCall(t, p, cmd("EVAL", redistest.LoopScript, "0", "2500"))
	behind := sendCall(t, p, cmd("SET", "after-script", "1"), cmd("ECHO", "behind"))
	script.Wait()
	behind.Wait()
	wantReply(t, script, 0, bulk("done"))
	wantReply(t, behind, 0, "+OK\r\n")
	wantReply(t, behind, 1, bulk("behind"))
	if s := p.Stats(); s.Overdue == 0 || s.Timeouts != 0 || s.Failures != 0 {
		t.Fatalf("stats %+v: want an overdue reply and no lost connection", s)
	}
}

// DEBUG SLEEP blocks Redis entirely, probe included; shorter than the dead
// timeout, it only delays the replies.
func TestPipeWaitsForDebugSleep(t *testing.T) {
	srv := redistest.Start(t, "--enable-debug-command", "local")
	p := startedPipe(t, healthOpts(srv.Addr(), 5*time.Second))
	slow := sendCall(t, p, cmd("DEBUG", "SLEEP", "0.6"))
	behind := sendCall(t, p, cmd("ECHO", "behind"))
	slow.Wait()
	behind.Wait()
	wantReply(t, slow, 0, "+OK\r\n")
	wantReply(t, behind, 0, bulk("behind"))
}

// CLIENT PAUSE WRITE (which answers PING) and CLIENT PAUSE ALL (which does
// not) shorter than the dead timeout only delay the commands they hold.
func TestPipeWaitsForClientPause(t *testing.T) {
	srv := redistest.Start(t)
	direct := srv.Client(t)

	p := startedPipe(t, healthOpts(srv.Addr(), 5*time.Second))
	if err := direct.Do(t.Context(), "CLIENT", "PAUSE", "1000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	w := sendCall(t, p, cmd("INCR", "paused-write"))
	w.Wait()
	wantReply(t, w, 0, ":1\r\n")

	p2 := startedPipe(t, healthOpts(srv.Addr(), 5*time.Second))
	if err := direct.Do(t.Context(), "CLIENT", "PAUSE", "600", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	r := sendCall(t, p2, cmd("GET", "paused-write"))
	r.Wait()
	wantReply(t, r, 0, bulk("1"))
}

// A frozen Redis (SIGSTOP) accepts connections but answers nothing: after the
// dead timeout the connection is closed and its Calls fail. Once Redis
// resumes, the pipe's new connection answers new Calls with their own
// replies, never the frozen Call's.
func TestPipeFrozenRedisIsDeadAfterDeadTimeout(t *testing.T) {
	srv := redistest.Start(t)
	p := startedPipe(t, healthOpts(srv.Addr(), 500*time.Millisecond))
	srv.Freeze(t)
	frozen := sendCall(t, p, cmd("INCR", "frozen"))
	frozen.Wait()
	srv.Thaw(t)
	if _, err := frozen.Reply(0); !errors.Is(err, ErrTimeout) {
		t.Fatalf("frozen Call: got %v, want ErrTimeout", err)
	}
	if s := p.Stats(); s.Timeouts != 1 {
		t.Fatalf("stats %+v: want one timeout", s)
	}
	for i := range 20 {
		var c *Call
		redistest.Eventually(t, 5*time.Second, func() bool {
			c = NewCall()
			c.Add(cmd("ECHO", "after-"+strconv.Itoa(i)))
			if p.Send(c) != nil {
				return false
			}
			c.Wait()
			return c.Err() == nil
		}, "pipe never recovered after the thaw")
		wantReply(t, c, 0, bulk("after-"+strconv.Itoa(i)))
	}
}

// The probe tells the states apart on real servers: a live Redis answers,
// a busy one says so (also to a client that must authenticate first), a
// frozen one accepts but stays silent, a closed port refuses.
func TestProbeVerdicts(t *testing.T) {
	srv := redistest.Start(t, "--busy-reply-threshold", "50")
	if err := srv.Client(t).ConfigSet(t.Context(), "requirepass", "s3cret").Err(); err != nil {
		t.Fatal(err)
	}
	never := make(chan struct{})
	opt := testOpts(srv.Addr())
	opt.Password = "s3cret"
	opt.defaults()
	soon := func(d time.Duration) time.Time { return time.Now().Add(d) }
	if v := probe(opt, soon(2*time.Second), never); v != probeAnswered {
		t.Fatalf("live Redis: verdict %d", v)
	}
	p := startedPipe(t, func() Options { o := healthOpts(srv.Addr(), time.Minute); o.Password = "s3cret"; return o }())
	script := sendCall(t, p, cmd("EVAL", redistest.LoopScript, "0", "1500"))
	redistest.Eventually(t, 5*time.Second, func() bool { return probe(opt, soon(time.Second), never) == probeBusy }, "probe never saw -BUSY")
	script.Wait()
	wantReply(t, script, 0, bulk("done"))
	srv.Freeze(t)
	if v := probe(opt, soon(200*time.Millisecond), never); v != probeUnresponsive {
		t.Fatalf("frozen Redis: verdict %d", v)
	}
	srv.Thaw(t)
	srv.Kill(t)
	if v := probe(opt, soon(2*time.Second), never); v != probeDead {
		t.Fatalf("killed Redis: verdict %d", v)
	}
}
