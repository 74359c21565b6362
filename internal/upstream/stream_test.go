package upstream

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redproxy/redproxy/internal/redistest"
)

func sendWait(t *testing.T, pool *Pool, c *Call) {
	t.Helper()
	if err := pool.Send(c); err != nil {
		t.Fatal(err)
	}
	c.Wait()
	if err := c.Err(); err != nil {
		t.Fatal(err)
	}
}

// A reply its Call will not keep is read past, never held whole: one
// longer than SetMaxReply arrives as its Digest (length, hash, first
// bytes), equal to DigestOf the bytes Redis sent; one past the reply limit
// is dropped as before. Either way a 32 MB reply costs a few hundred KB,
// not the ~100 MB of a read buffer doubled until the reply fitted, and the
// replies after it are framed as usual. In both protocols; an aggregate of
// 100000 elements and a reply shorter than the streaming threshold (but
// past SetMaxReply) are digested alike.
func TestPipeStreamsRepliesItDoesNotKeep(t *testing.T) {
	const size = 32 << 20
	srv := redistest.Start(t)
	rc := srv.Client(t)
	ctx := context.Background()
	if err := rc.SetRange(ctx, "big", size-1, "x").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rc.SetRange(ctx, "mid", 100<<10, "m").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rc.SetRange(ctx, "four", 4<<10, "f").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rc.Eval(ctx, "for i = 1, 100000 do redis.call('RPUSH', KEYS[1], i) end", []string{"list"}).Err(); err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	bigReply := append([]byte("$"+strconv.Itoa(size)+"\r\n"), make([]byte, size)...)
	bigReply[len(bigReply)-1] = 'x'
	bigReply = append(bigReply, "\r\n"...)
	want := DigestOf(bigReply)

	for _, resp3 := range []bool{false, true} {
		opts := testOpts(srv.Addr())
		opts.RESP3 = resp3
		pool := NewPool(1, opts)
		defer pool.Close()
		waitUp(t, pool)

		// The smaller replies as Redis sends them, kept whole.
		ref := NewCall()
		for _, k := range []string{"mid", "four"} {
			ref.Add(cmd("GET", k))
		}
		ref.Add(cmd("LRANGE", "list", "0", "-1"))
		sendWait(t, pool, ref)

		c := NewCall()
		c.SetMaxReply(1024)
		c.SetReplyLimit(1 << 20)
		for _, k := range []string{"big", "small", "mid", "four"} {
			c.Add(cmd("GET", k))
		}
		c.Add(cmd("LRANGE", "list", "0", "-1"))
		c.Add(cmd("PING"))
		n := redistest.Allocated(func() { sendWait(t, pool, c) })
		t.Logf("resp3=%v: %.2f MB allocated reading a %d MB reply and four others", resp3, float64(n)/(1<<20), size>>20)
		if n > 2<<20 {
			t.Errorf("resp3=%v: reading a %d MB reply to digest allocated %.1f MB; want under 2 MB", resp3, size>>20, float64(n)/(1<<20))
		}
		if _, err := c.Reply(0); !errors.Is(err, ErrDigested) {
			t.Fatalf("reply 0: err %v, want ErrDigested", err)
		}
		if d, ok := c.Digest(0); !ok || d.Len != want.Len || d.Sum != want.Sum || !bytes.Equal(d.Head, bigReply[:DigestHead]) {
			t.Fatalf("digest of the 32 MB reply: %v %+v; want %+v", ok, d, want)
		}
		if r, err := c.Reply(1); err != nil || (string(r) != "$-1\r\n" && string(r) != "_\r\n") {
			t.Fatalf("reply 1 after the digest: %q, %v", r, err)
		}
		for i := range 3 {
			r, _ := ref.Reply(i)
			if d, ok := c.Digest(2 + i); !ok || d.Len != int64(len(r)) || d.Sum != DigestOf(r).Sum || !bytes.Equal(d.Head, r[:DigestHead]) {
				t.Fatalf("digest of reply %d (%d bytes): %v %+v", 2+i, len(r), ok, d)
			}
		}
		if r, err := c.Reply(5); err != nil || string(r) != "+PONG\r\n" {
			t.Fatalf("PING after the digests: %q, %v", r, err)
		}

		// Past the reply limit: dropped, read past.
		c.Reset()
		c.SetReplyLimit(1 << 20)
		c.Add(cmd("GET", "four"))
		c.Add(cmd("GET", "big"))
		c.Add(cmd("GET", "four"))
		n = redistest.Allocated(func() { sendWait(t, pool, c) })
		t.Logf("resp3=%v: %.2f MB allocated dropping a %d MB reply", resp3, float64(n)/(1<<20), size>>20)
		// The read buffer grows as the reply might fit the limit (1 MB):
		// doubling to 1 MB allocates 2 MB in all.
		if n > 4<<20 {
			t.Errorf("resp3=%v: dropping a %d MB reply past the limit allocated %.1f MB; want under 4 MB", resp3, size>>20, float64(n)/(1<<20))
		}
		if _, err := c.Reply(0); err != nil {
			t.Fatalf("reply 0, within the limit: %v", err)
		}
		for i := 1; i < 3; i++ {
			if _, err := c.Reply(i); !errors.Is(err, ErrOutputLimit) {
				t.Fatalf("reply %d: err %v, want ErrOutputLimit", i, err)
			}
		}
		c.Reset()
		c.Add(cmd("PING"))
		sendWait(t, pool, c)
		if r, _ := c.Reply(0); string(r) != "+PONG\r\n" {
			t.Fatalf("PING after: %q", r)
		}
	}
}

// hostile forwards to Redis, but answers a command holding marker with
// answer, then writes filler over and over: what no Redis sends, a reply
// that claims a huge size, or never ends.
func hostile(t *testing.T, target, marker string, answer, filler []byte) string {
	t.Helper()
	return hostileUpTo(t, target, marker, answer, filler, 0)
}

// hostileUpTo is hostile, but writes at most total bytes of filler (0: no
// end) and then nothing more, leaving the connection open: enough to show
// a reader holding what it is sent, without letting one that holds all of
// it take the machine's memory.
func hostileUpTo(t *testing.T, target, marker string, answer, filler []byte, total int) string {
	t.Helper()
	return redistest.Forward(t, target, func(wg *sync.WaitGroup, c, u net.Conn) {
		wg.Go(func() { io.Copy(c, u) })
		wg.Go(func() {
			defer u.Close()
			buf := make([]byte, 64<<10)
			for {
				n, err := c.Read(buf)
				if err != nil {
					return
				}
				if !bytes.Contains(buf[:n], []byte(marker)) {
					u.Write(buf[:n])
					continue
				}
				u.Close() // nothing more from Redis on this connection
				c.Write(answer)
				fill := bytes.Repeat(filler, (64<<10)/len(filler))
				for sent := 0; total == 0 || sent < total; sent += len(fill) {
					if _, err := c.Write(fill); err != nil {
						return
					}
				}
				io.Copy(io.Discard, c) // until the pipe closes the connection
			}
		})
	})
}

// A reply that claims a huge length, or a line that never ends, is read
// past with bounded memory, and the Call ends at the dead timeout rather
// than hanging (nothing Redis sends: a broken or hostile server).
func TestPipeHostileReplyBounded(t *testing.T) {
	srv := redistest.Start(t)
	for _, h := range []struct{ answer, filler string }{
		{"$999999999999999999\r\n", "\x00"},
		{"*1099511627776\r\n", ":1\r\n"},
		{"-ERR ", "e"},
	} {
		answer := h.answer
		addr := hostile(t, srv.Addr(), "HOSTILE", []byte(answer), []byte(h.filler))
		opts := testOpts(addr)
		opts.ReplyTimeout, opts.DeadTimeout = 200*time.Millisecond, time.Second
		pool := NewPool(1, opts)
		waitUp(t, pool)
		c := NewCall()
		c.SetMaxReply(1024)
		c.Add(cmd("GET", "HOSTILE"))
		n := redistest.Allocated(func() {
			if err := pool.Send(c); err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			go func() { c.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Fatalf("%q: the Call never ended", answer)
			}
		})
		if err := c.Err(); err == nil {
			t.Errorf("%q: the Call succeeded", answer)
		}
		t.Logf("%q: %v, %.2f MB allocated", answer, c.Err(), float64(n)/(1<<20))
		if n > 8<<20 {
			t.Errorf("%q: allocated %.1f MB reading an endless reply; want under 8 MB", answer, float64(n)/(1<<20))
		}
		pool.Close()
	}
}

// sendEnd sends c and waits for it to end, however it ends.
func sendEnd(t *testing.T, pool *Pool, c *Call) {
	t.Helper()
	if err := pool.Send(c); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the Call never ended")
	}
}

// hostileFill is what a hostile upstream sends after its answer in the
// tests below: with a reader that holds it all, a few hundred MB
// allocated; with one that does not, a few.
const hostileFill = 128 << 20

// A push frame goes to OnPush whole, so it is never streamed: one longer
// than the connection's ReplyLimit closes the connection, with an error
// logged, as soon as that much of it has arrived. Before, it grew the read
// buffer for as long as the hostile server sent (here 128 MB, about 500 MB
// allocated), until the dead timeout. A key claiming 10 GB, an endless
// aggregate, keys without end.
func TestPipeHostilePushBounded(t *testing.T) {
	srv := redistest.Start(t)
	const limit = 1 << 20
	for _, h := range []struct{ answer, filler string }{
		{">2\r\n$10\r\ninvalidate\r\n$9999999999\r\n", "\x00"},
		{">1099511627776\r\n", ":1\r\n"},
		{">2\r\n$10\r\ninvalidate\r\n*100000000\r\n", "$3\r\nkey\r\n"},
	} {
		answer := h.answer
		addr := hostileUpTo(t, srv.Addr(), "HOSTILE", []byte(answer), []byte(h.filler), hostileFill)
		opts := testOpts(addr)
		opts.RESP3 = true
		opts.ReplyLimit = limit
		opts.ReplyTimeout, opts.DeadTimeout = 200*time.Millisecond, time.Second
		var pushes atomic.Int64
		opts.OnPush = func([]byte) { pushes.Add(1) }
		var logs redistest.LogBuffer
		opts.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		pool := NewPool(1, opts)
		waitUp(t, pool)
		c := NewCall()
		c.Add(cmd("GET", "HOSTILE"))
		n := redistest.Allocated(func() { sendEnd(t, pool, c) })
		t.Logf("%q: %v, %.2f MB allocated", answer, c.Err(), float64(n)/(1<<20))
		if !errors.Is(c.Err(), errPushTooLong) {
			t.Errorf("%q: the Call ended with %v, want %v", answer, c.Err(), errPushTooLong)
		}
		if n > 8<<20 {
			t.Errorf("%q: allocated %.1f MB reading a push that does not end; want under 8 MB", answer, float64(n)/(1<<20))
		}
		if pushes.Load() != 0 {
			t.Errorf("%q: OnPush ran %d times", answer, pushes.Load())
		}
		if !strings.Contains(logs.String(), "push frame longer than the connection's reply limit") {
			t.Errorf("%q: nothing logged about the push; log:\n%s", answer, logs.String())
		}
		pool.Close()
	}
}

// Big invalidation pushes from Redis still arrive whole: CLIENT TRACKING
// BCAST sends every key a script wrote in one push, here 500000 keys, 9 MB,
// under the default reply limit; and one push of the same keys with the
// limit just above it.
func TestPipeBigInvalidationPushesArriveWhole(t *testing.T) {
	srv := redistest.Start(t)
	// The script runs for seconds on a loaded machine: past go-redis's
	// 3 s read timeout the client sent it again and got BUSY (seen in
	// CI), so this client waits and never retries.
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr(), ReadTimeout: time.Minute, MaxRetries: -1})
	t.Cleanup(func() { _ = rc.Close() })
	ctx := context.Background()
	const keys = 500000
	write := func() {
		t.Helper()
		if err := rc.Eval(ctx, "for i = 1, tonumber(ARGV[1]) do redis.call('SET', 'key:' .. i, 'v') end", nil, keys).Err(); err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
	}
	var biggest int
	for _, limit := range []int{0, -1} {
		if limit < 0 {
			limit = biggest + 1 // just above the push seen under the default
		}
		var (
			mu      sync.Mutex
			got     int
			largest int
		)
		opts := testOpts(srv.Addr())
		opts.RESP3 = true
		opts.ReplyLimit = limit
		opts.Handshake = [][]string{{"CLIENT", "TRACKING", "ON", "BCAST"}}
		opts.OnPush = func(frame []byte) {
			// >2 $10 invalidate *N: count the keys.
			i := bytes.Index(frame, []byte("invalidate\r\n*"))
			if i < 0 {
				return
			}
			line := frame[i+len("invalidate\r\n*"):]
			n, _ := strconv.Atoi(string(line[:bytes.IndexByte(line, '\r')]))
			mu.Lock()
			got += n
			largest = max(largest, len(frame))
			mu.Unlock()
		}
		pipe := NewPipe(opts)
		redistest.Eventually(t, 5*time.Second, pipe.Up, "pipe not up")
		write()
		redistest.Eventually(t, 30*time.Second, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return got >= keys
		}, "limit %d: %d of %d keys invalidated", limit, got, keys)
		c := NewCall()
		c.Add(cmd("PING"))
		if err := pipe.Send(c); err != nil {
			t.Fatal(err)
		}
		c.Wait()
		if r, err := c.Reply(0); err != nil || string(r) != "+PONG\r\n" {
			t.Fatalf("limit %d: PING after the pushes: %q %v", limit, r, err)
		}
		if s := pipe.Stats(); s.Failures != 0 {
			t.Fatalf("limit %d: the connection failed: %+v", limit, s)
		}
		t.Logf("limit %d: %d keys invalidated, largest push %.1f MB", limit, got, float64(largest)/(1<<20))
		if largest < 4<<20 {
			t.Fatalf("limit %d: the largest push was %d bytes: Redis split the keys, the test shows nothing", limit, largest)
		}
		biggest = largest
		pipe.Close()
	}
}

// A Call that sets no reply limit (a health check, a fetch) gets its
// connection's ReplyLimit: a reply longer than that is read past like any
// reply past a limit, never kept whole. A real 32 MB reply on a pipe
// limited to 1 MB is dropped (ErrOutputLimit) with a few MB allocated (the
// reply whole, about 160 MB before) and the connection serves on; a
// hostile reply claiming a huge length is read past until the dead timeout
// instead of filling the read buffer (about 500 MB before). Under the
// default limit the 32 MB reply arrives whole.
func TestPipeLimitlessCallBounded(t *testing.T) {
	const size, limit = 32 << 20, 1 << 20
	srv := redistest.Start(t)
	if err := srv.Client(t).SetRange(context.Background(), "big", size-1, "x").Err(); err != nil {
		t.Fatal(err)
	}

	opts := testOpts(srv.Addr())
	opts.ReplyLimit = limit
	pool := NewPool(1, opts)
	defer pool.Close()
	waitUp(t, pool)
	c := NewCall()
	c.Add(cmd("GET", "big"))
	c.Add(cmd("PING"))
	n := redistest.Allocated(func() { sendEnd(t, pool, c) })
	t.Logf("a %d MB reply to a Call with no limit, on a pipe limited to %d MB: %.2f MB allocated", size>>20, limit>>20, float64(n)/(1<<20))
	// The read buffer grows as the reply might fit the limit (1 MB):
	// doubling to 2 MB allocates about 4 MB in all.
	if n > 8<<20 {
		t.Errorf("allocated %.1f MB for a %d MB reply past the connection's limit; want under 8 MB", float64(n)/(1<<20), size>>20)
	}
	for i := range 2 {
		if _, err := c.Reply(i); !errors.Is(err, ErrOutputLimit) {
			t.Errorf("reply %d: err %v, want ErrOutputLimit", i, err)
		}
	}
	if c.ReplyLimit() != limit {
		t.Errorf("ReplyLimit after Send: %d, want the connection's %d", c.ReplyLimit(), limit)
	}
	c.Reset()
	c.Add(cmd("PING"))
	sendWait(t, pool, c)
	if r, _ := c.Reply(0); string(r) != "+PONG\r\n" {
		t.Fatalf("PING after: %q", r)
	}

	def := NewPool(1, testOpts(srv.Addr()))
	defer def.Close()
	waitUp(t, def)
	c.Reset()
	c.Add(cmd("GET", "big"))
	sendWait(t, def, c)
	if r, err := c.Reply(0); err != nil || len(r) != size+len("$33554432\r\n\r\n") {
		t.Fatalf("the %d MB reply under the default limit: %d bytes, %v", size>>20, len(r), err)
	}

	for _, h := range []struct{ answer, filler string }{
		{"$999999999999999999\r\n", "\x00"},
		{"*1099511627776\r\n", ":1\r\n"},
	} {
		answer := h.answer
		opts := testOpts(hostileUpTo(t, srv.Addr(), "HOSTILE", []byte(answer), []byte(h.filler), hostileFill))
		opts.ReplyLimit = limit
		opts.ReplyTimeout, opts.DeadTimeout = 200*time.Millisecond, time.Second
		pool := NewPool(1, opts)
		waitUp(t, pool)
		c := NewCall()
		c.Add(cmd("GET", "HOSTILE"))
		n := redistest.Allocated(func() { sendEnd(t, pool, c) })
		t.Logf("%q to a Call with no limit: %v, %.2f MB allocated", answer, c.Err(), float64(n)/(1<<20))
		if c.Err() == nil {
			t.Errorf("%q: the Call succeeded", answer)
		}
		if n > 8<<20 {
			t.Errorf("%q: allocated %.1f MB reading a reply that does not end; want under 8 MB", answer, float64(n)/(1<<20))
		}
		pool.Close()
	}
}

// A reply with no Call waiting for it closes the connection as soon as its
// first bytes arrive, with the BUG logged: before, it was reported only
// once whole, so a reply that claims a huge length (or never ends) was
// held in the read buffer first, for as long as it came, and since no
// Call was late the watchdog never closed the connection (128 MB held, the
// connection open, 20 s on).
func TestPipeUnsolicitedReplyClosesAtOnce(t *testing.T) {
	srv := redistest.Start(t)
	for _, h := range []struct{ answer, filler string }{
		{"+OK\r\n$999999999999\r\n", "\x00"},
		{"+OK\r\n*1099511627776\r\n", ":1\r\n"},
	} {
		answer := h.answer
		opts := testOpts(hostileUpTo(t, srv.Addr(), "HOSTILE", []byte(answer), []byte(h.filler), hostileFill))
		var logs redistest.LogBuffer
		opts.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		pipe := NewPipe(opts)
		redistest.Eventually(t, 5*time.Second, pipe.Up, "pipe not up")
		c := NewCall()
		c.Add(cmd("ECHO", "HOSTILE"))
		closed := false
		n := redistest.Allocated(func() {
			if err := pipe.Send(c); err != nil {
				t.Fatal(err)
			}
			c.Wait()
			for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				if pipe.Stats().Failures > 0 {
					closed = true
					break
				}
			}
		})
		t.Logf("%q: closed %v, %.2f MB allocated", answer, closed, float64(n)/(1<<20))
		if r, err := c.Reply(0); err != nil || string(r) != "+OK\r\n" {
			t.Errorf("%q: the Call's own reply: %q %v", answer, r, err)
		}
		if !closed {
			t.Errorf("%q: the connection was never closed for the reply nobody asked for", answer)
		}
		if n > 4<<20 {
			t.Errorf("%q: allocated %.1f MB for a reply nobody asked for; want under 4 MB", answer, float64(n)/(1<<20))
		}
		if !strings.Contains(logs.String(), "BUG: upstream reply with no request waiting") {
			t.Errorf("%q: no BUG logged; log:\n%s", answer, logs.String())
		}
		pipe.Close()
	}
}
