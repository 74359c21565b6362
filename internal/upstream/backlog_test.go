package upstream

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/redistest"
)

// Clients that pipeline reads of a large value (and may have left) must
// not make Redis hold their replies without bound: Redis builds a
// connection's replies as fast as it reads the commands and keeps what the
// proxy has not read in that connection's output buffer. Here 300 batches
// of three GETs of a 1 MB value, 900 MB of replies, are sent at once from
// 300 goroutines; the pool holds them back once its pipes' replies pass
// backlogMax, so the output buffers Redis reports stay far below what was
// asked for.
func TestPoolHoldsCallsWhileRedisHoldsTheirReplies(t *testing.T) {
	value := strings.Repeat("v", 1<<20)
	srv := startWith(t, "big", value)
	rc := srv.Client(t)
	ctx := context.Background()
	opt := testOpts(srv.Addr())
	opt.ReplyTimeout = time.Minute // a held Send waits its turn, never gives up here
	pool := NewPool(2, opt)
	defer pool.Close()
	waitUp(t, pool)
	// The value was read before: the pool knows how large its reply is
	// (replySizes), as a proxy serving it does by the time clients
	// pile up on it.
	readOnce(t, pool, "big", value)

	// Redis's own account of what it holds for the pool's connections:
	// the largest output buffer (omem) any of them had while the calls
	// ran, polled from a connection of the test's.
	var peak atomic.Int64
	stop := make(chan struct{})
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for {
			select {
			case <-stop:
				return
			default:
			}
			list, err := rc.ClientList(ctx).Result()
			if err == nil {
				var sum int64
				for _, f := range strings.Fields(list) {
					if v, ok := strings.CutPrefix(f, "omem="); ok {
						n, _ := strconv.ParseInt(v, 10, 64)
						sum += n
					}
				}
				if sum > peak.Load() {
					peak.Store(sum)
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()

	const batches = 300
	var wg sync.WaitGroup
	var wrong atomic.Int32
	for range batches {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := gets("big", 3)
			pool.Do(c)
			for i := range 3 {
				if r, err := c.Reply(i); err != nil || string(r) != bulk(value) {
					wrong.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-polled
	if n := wrong.Load(); n > 0 {
		t.Fatalf("%d of %d replies were not the value", n, 3*batches)
	}
	st, _ := pool.Stats()
	t.Logf("Redis held at most %d MB for the pool's connections; %d Sends waited for room", peak.Load()>>20, st.Held)
	if st.Held == 0 {
		t.Fatal("no Send waited while Redis held the pool's replies")
	}
	// Without the hold Redis held 700-900 MB here; with it, the
	// estimate's bound (two pipes' backlogMax) and the commands sent
	// before the first replies taught the pipes their size.
	if max := int64(400 << 20); peak.Load() > max {
		t.Fatalf("Redis held %d MB of replies for the pool's connections, over %d MB", peak.Load()>>20, max>>20)
	}
}

// While Redis holds as much as the pipes allow, Calls expected to be
// large wait (and all get their replies once Redis answers again), while
// a Call of a command never seen with a large reply is sent at once: the
// hold costs nothing to clients of small values. Redis is frozen
// (SIGSTOP) so that nothing drains meanwhile.
func TestPoolHoldsOnlyCallsExpectedToBeLarge(t *testing.T) {
	value := strings.Repeat("w", 1<<20)
	srv := startWith(t, "big", value)
	opt := testOpts(srv.Addr())
	opt.ReplyTimeout = time.Minute // the freeze is no stall to probe
	pool := NewPool(2, opt)
	defer pool.Close()
	waitUp(t, pool)
	readOnce(t, pool, "big", value)

	srv.Freeze(t)
	thawed := false
	defer func() {
		if !thawed {
			srv.Thaw(t)
		}
	}()
	// 100 batches of three GETs, 300 MB expected: the two pipes take
	// 64 MB each, the rest wait.
	const batches = 100
	calls := make([]*Call, batches)
	sent := make(chan error, batches)
	for i := range calls {
		c := gets("big", 3)
		calls[i] = c
		go func() { sent <- pool.Send(c) }()
	}
	redistest.Eventually(t, 10*time.Second, func() bool {
		st, _ := pool.Stats()
		return st.Held >= batches-2*(backlogMax/(3<<20))
	}, "the batches past the pipes' backlog never waited")
	st, _ := pool.Stats()
	if pending := st.Pending; pending > 2*(backlogMax/(3<<20)) {
		t.Fatalf("%d batches sent to a frozen Redis; the pipes' backlog allows %d", pending, 2*(backlogMax/(3<<20)))
	}
	small := NewCall()
	small.Add(cmd("SET", "small", "1"))
	if err := pool.Send(small); err != nil { // returns at once: it is not held
		t.Fatal(err)
	}
	if st2, _ := pool.Stats(); st2.Held != st.Held {
		t.Fatalf("a SET of a small value waited for room (held %d, then %d)", st.Held, st2.Held)
	}

	srv.Thaw(t)
	thawed = true
	for range batches {
		if err := <-sent; err != nil {
			t.Fatal(err)
		}
	}
	for i, c := range calls {
		c.Wait()
		for j := range 3 {
			if r, err := c.Reply(j); err != nil || string(r) != bulk(value) {
				t.Fatalf("batch %d reply %d: %.40q, %v", i, j, r, err)
			}
		}
	}
	small.Wait()
	if r, err := small.Reply(0); err != nil || string(r) != "+OK\r\n" {
		t.Fatalf("SET: %q, %v", r, err)
	}
}

// A pipe at most half full takes a Call of any size: a large batch is
// not held behind a pipe that small Calls keep from emptying (found by
// review: a 50 MB batch waited the whole dead timeout behind 15-23 MB of
// 2 MB batches, then failed). Past half, the next one waits, and is sent
// once the replies before it are in. Redis is frozen meanwhile, so that
// nothing drains before the checks.
func TestPoolTakesALargeCallWhileAPipeIsAtMostHalfFull(t *testing.T) {
	ten, sixty := strings.Repeat("t", 10<<20), strings.Repeat("s", 60<<20)
	srv := startWith(t, "ten", ten, "sixty", sixty)
	opt := testOpts(srv.Addr())
	opt.ReplyTimeout = 10 * time.Minute
	opt.DeadTimeout = 10 * time.Minute
	opt.ReplyLimit = 256 << 20
	pool := NewPool(1, opt)
	defer pool.Close()
	waitUp(t, pool)
	readOnce(t, pool, "ten", ten)
	readOnce(t, pool, "sixty", sixty)

	srv.Freeze(t)
	thawed := false
	defer func() {
		if !thawed {
			srv.Thaw(t)
		}
	}()
	first, large, last := gets("ten", 1), gets("sixty", 1), gets("ten", 1)
	if err := pool.Send(first); err != nil {
		t.Fatal(err)
	}
	largeSent := make(chan error, 1)
	go func() { largeSent <- pool.Send(large) }()
	select {
	case err := <-largeSent:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the 60 MB GET is held behind 10 MB of replies")
	}
	if st, _ := pool.Stats(); st.Held != 0 {
		t.Fatalf("the 60 MB GET waited behind 10 MB (%d waits)", st.Held)
	}
	sent := make(chan error, 1)
	go func() { sent <- pool.Send(last) }()
	redistest.Eventually(t, 10*time.Second, func() bool {
		st, _ := pool.Stats()
		return st.Held == 1
	}, "a GET sent behind 70 MB of replies did not wait")
	srv.Thaw(t)
	thawed = true
	select {
	case err := <-sent:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the waiting GET was still held a minute after Redis answered")
	}
	for _, c := range []struct {
		call  *Call
		value string
	}{{first, ten}, {large, sixty}, {last, ten}} {
		c.call.Wait()
		if r, err := c.call.Reply(0); err != nil || string(r) != bulk(c.value) {
			t.Fatalf("GET: %d bytes, %v; want %d", len(r), err, len(bulk(c.value)))
		}
	}
}

// The size of a reply is learnt from its header, before the reply is in:
// Redis sends the first 64 KB of a connection's replies and builds all
// the others before it sends more, so waiting for the whole first reply
// lets every batch sent meanwhile through. Here Redis's replies to the
// pipe stop after 64 KB (a forwarder holds the rest) and the batches sent
// then are held.
func TestPoolLearnsAReplySizeFromItsHeader(t *testing.T) {
	value := strings.Repeat("v", 1<<20)
	srv := startWith(t, "big", value)
	var armed atomic.Bool
	gate := make(chan struct{})
	var openGate sync.Once
	open := func() { openGate.Do(func() { close(gate) }) }
	addr := redistest.Forward(t, srv.Addr(), func(wg *sync.WaitGroup, c, u net.Conn) {
		wg.Go(func() {
			io.Copy(u, c)
			u.Close()
		})
		wg.Go(func() {
			defer c.Close()
			buf := make([]byte, 16<<10)
			passed := 0
			for {
				n, err := u.Read(buf)
				if n > 0 {
					if armed.Load() {
						if passed >= 64<<10 {
							<-gate
						}
						passed += n
					}
					if _, err := c.Write(buf[:n]); err != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		})
	})
	t.Cleanup(open) // before the forwarder's cleanup waits for it (LIFO)
	opt := testOpts(addr)
	opt.ReplyTimeout = 10 * time.Minute // the held replies are no stall to probe
	opt.DeadTimeout = 10 * time.Minute
	pool := NewPool(1, opt)
	defer pool.Close()
	waitUp(t, pool)

	armed.Store(true)
	first := gets("big", 1)
	if err := pool.Send(first); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 10*time.Second, func() bool { return pool.shared.sizes.n.Load() > 0 },
		"the reply's size was not learnt from the 64 KB that came")
	select {
	case <-first.Done():
		t.Fatal("the first GET completed: its reply was not held back")
	default:
	}
	const batches = 100
	calls := make([]*Call, batches)
	sent := make(chan error, batches)
	for i := range calls {
		c := gets("big", 3)
		calls[i] = c
		go func() { sent <- pool.Send(c) }()
	}
	fit := int(backlogMax / (3 << 20)) // 21 batches of 3 MB: 63 MB
	redistest.Eventually(t, 10*time.Second, func() bool {
		st, _ := pool.Stats()
		return st.Held >= uint64(batches-fit)
	}, "the batches sent behind the first reply's header were not held")
	if st, _ := pool.Stats(); st.Pending > fit+1 {
		t.Fatalf("%d Calls pending behind the held reply; at most %d fit", st.Pending, fit+1)
	}
	open()
	for range batches {
		if err := <-sent; err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range append(calls, first) {
		c.Wait()
		for j := range c.Len() {
			if r, err := c.Reply(j); err != nil || string(r) != bulk(value) {
				t.Fatalf("reply %d: %.40q, %v", j, r, err)
			}
		}
	}
}

// A Call that found no room within the dead timeout goes on as any Call
// would: sent, to the full pipe if need be, and answered. The pipe is
// made to look full (its expected replies set by hand), with nothing
// pending that would drain it; the GET is sent as a write would be, so
// that the spare, which takes reads, is no way out.
func TestPoolSendsAsBeforeWhenNoRoomCameInTime(t *testing.T) {
	value := strings.Repeat("v", 1<<20)
	srv := startWith(t, "big", value)
	opt := testOpts(srv.Addr())
	opt.DeadTimeout = time.Second
	pool := NewPool(1, opt)
	defer pool.Close()
	waitUp(t, pool)
	readOnce(t, pool, "big", value)

	pp := pool.pipes[0]
	pp.mu.Lock()
	pp.expected = backlogMax
	pp.backlogged.Store(true)
	pp.mu.Unlock()
	c := NewCall()
	c.Add(cmd("GET", "big"))
	if err := pool.Send(c); err != nil {
		t.Fatalf("after waiting out the dead timeout: %v", err)
	}
	c.Wait()
	if r, err := c.Reply(0); err != nil || string(r) != bulk(value) {
		t.Fatalf("GET: %.40q, %v", r, err)
	}
	if st, _ := pool.Stats(); st.Held != 1 {
		t.Fatalf("%d Sends waited for room; want 1", st.Held)
	}
}

// startWith starts a Redis holding the given keys and values.
func startWith(t *testing.T, keysAndValues ...string) *redistest.Server {
	t.Helper()
	srv := redistest.Start(t)
	args := make([]any, len(keysAndValues))
	for i, a := range keysAndValues {
		args[i] = a
	}
	if err := srv.Client(t).MSet(context.Background(), args...).Err(); err != nil {
		t.Fatal(err)
	}
	return srv
}

// gets is a Call of n GETs of key.
func gets(key string, n int) *Call {
	c := NewCall()
	for range n {
		c.AddRead(cmd("GET", key))
	}
	return c
}

// readOnce reads key through pool, which learns the size of its reply.
func readOnce(t *testing.T, pool *Pool, key, value string) {
	t.Helper()
	c := gets(key, 1)
	pool.Do(c)
	if r, err := c.Reply(0); err != nil || string(r) != bulk(value) {
		t.Fatalf("GET %s: %.40q, %v", key, r, err)
	}
}

// A Call waiting for room has not been sent: when the backend fails over
// to another server meanwhile, it goes there, as a Send made then would
// (before, the old primary's pipes, abandoned, failed every waiting Call
// with "upstream unavailable"). The Calls already sent to
// the old server fail with ErrConnLost, as any do at a failover. The old
// server is frozen so that its pipes stay full.
func TestPoolSendsWaitingCallsToTheServerAFailoverChose(t *testing.T) {
	oldValue, newValue := strings.Repeat("o", 1<<20), strings.Repeat("n", 1<<20)
	oldSrv, newSrv := startWith(t, "big", oldValue), startWith(t, "big", newValue)
	opt := testOptions(oldSrv.Addr())
	opt.ReplyTimeout = 10 * time.Minute
	opt.DeadTimeout = 10 * time.Minute
	be := NewBackend(opt)
	t.Cleanup(be.Close)
	readOnce(t, be.Pool(0, false), "big", oldValue)

	oldSrv.Freeze(t)
	defer oldSrv.Thaw(t)
	const batches = 60
	calls := make([]*Call, batches)
	sent := make(chan error, batches)
	for i := range calls {
		c := gets("big", 3)
		calls[i] = c
		go func() { sent <- be.Pool(0, false).Send(c) }()
	}
	var held uint64
	redistest.Eventually(t, 10*time.Second, func() bool {
		st, _ := be.Pool(0, false).Stats()
		held = st.Held
		return held > 0 && int(held)+st.Pending == batches
	}, "the batches past the pipes' backlog did not wait")

	opt.Addr = newSrv.Addr()
	be.Failover(opt)
	for range batches {
		if err := <-sent; err != nil {
			t.Fatalf("a waiting batch failed at the failover: %v", err)
		}
	}
	var lost, moved int
	for _, c := range calls {
		c.Wait()
		if errors.Is(c.Err(), ErrConnLost) {
			lost++
			continue
		}
		for j := range 3 {
			if r, err := c.Reply(j); err != nil || string(r) != bulk(newValue) {
				t.Fatalf("reply %d: %.40q, %v", j, r, err)
			}
		}
		moved++
	}
	t.Logf("%d batches waited; %d failed on the old server, %d answered by the new one", held, lost, moved)
	if moved != int(held) {
		t.Fatalf("%d batches were answered by the new server; %d had waited", moved, held)
	}
}
