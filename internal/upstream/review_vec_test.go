package upstream

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/redistest"
)

// Review of 512f2d1: a Call can complete while the writer still reads its
// part in place. Redis answers a request it rejects while parsing (a bulk
// longer than its proto-max-bulk-len, here 1 MB, while the proxy's own
// server.max_bulk_bytes is 512 MB) as soon as it has read the header, long
// before the writer has written the value. The Call completes with that
// reply; its owner reuses the bytes (a session's next read, a bufpool
// buffer handed to another client); the writer's WriteVec is still
// writing from them. A middlebox between the proxy and Redis (here a
// forwarder that reads the proxy's side at its own pace) receives the
// bytes written after the Call returned: the overwritten ones. Before
// 512f2d1 the writer had copied the part before writing any of it.
func TestReviewEarlyReplyPartReadAfterCallCompleted(t *testing.T) {
	srv := redistest.Start(t, "--proto-max-bulk-len", "1mb")
	const head = 256 << 10 // forwarded before the forwarder pauses
	seen := make(chan int, 1)
	addr := redistest.Forward(t, srv.Addr(), func(wg *sync.WaitGroup, c, u net.Conn) {
		wg.Go(func() { copyAll(c, u) }) // Redis's replies; c stays open
		wg.Go(func() {
			buf := make([]byte, 64<<10)
			for fwd := 0; fwd < head; {
				n, err := c.Read(buf[:min(len(buf), head-fwd)])
				u.Write(buf[:n])
				fwd += n
				if err != nil {
					seen <- -1
					return
				}
			}
			// A slow path: Redis's early answer reaches the Call while
			// the rest of the request waits here, and a Call completed
			// now lets the test overwrite the bytes still to come.
			time.Sleep(300 * time.Millisecond)
			bang := 0
			for {
				c.SetReadDeadline(time.Now().Add(time.Second))
				n, err := c.Read(buf)
				bang += bytes.Count(buf[:n], []byte("!"))
				if err != nil {
					break
				}
			}
			seen <- bang
		})
	})
	opts := testOpts(addr)
	opts.ReplyTimeout = 20 * time.Second
	pool := NewPool(1, opts)
	defer pool.Close()
	waitUp(t, pool)

	val := strings.Repeat("v", 64<<20)
	req := cmd("SET", "early", val) // one part, far over vecPart: written in place
	c := NewCall()
	c.Add(req)
	if err := pool.Send(c); err != nil {
		t.Fatal(err)
	}
	c.Wait()
	r, err := c.Reply(0)
	t.Logf("reply: %.60q, %v", r, err)
	if err != nil || !bytes.HasPrefix(r, []byte("-ERR Protocol error")) {
		t.Skipf("Redis did not reject the bulk early: %q, %v", r, err)
	}
	// The Call has returned: its owner may do what it likes with req.
	for i := range req {
		req[i] = '!'
	}
	if n := <-seen; n > 0 {
		t.Fatalf("%d bytes of the request, overwritten after its Call completed, were written upstream: "+
			"WriteVec read the part after the Call returned", n)
	}
}

// Review of 0ea31aa: WaitDialed gives up on the first failed dial of every
// pipe, even when the failure is not "Redis is down" but a refusal that
// ends a moment later. The first client of a database (a pool made on
// first use) then fails at once with ErrUnavailable, where WaitUp waited
// up to the dial timeout and the redial, 50-200 ms later, served it.
func TestReviewWaitDialedFirstClientOfDBTransientRefusal(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name           string
		refuse, accept func(t *testing.T, srv *redistest.Server, admin *redis.Client)
	}{
		{
			// Redis at maxclients: the dial is answered "-ERR max number
			// of clients reached"; a client leaves 200 ms later.
			name: "maxclients",
			refuse: func(t *testing.T, srv *redistest.Server, admin *redis.Client) {
				info, _ := admin.Info(ctx, "clients").Result()
				n := 0
				for _, l := range strings.Split(info, "\n") {
					if v, ok := strings.CutPrefix(strings.TrimSpace(l), "connected_clients:"); ok {
						n, _ = strconv.Atoi(v)
					}
				}
				if err := admin.ConfigSet(ctx, "maxclients", strconv.Itoa(n)).Err(); err != nil {
					t.Fatal(err)
				}
			},
			accept: func(t *testing.T, srv *redistest.Server, admin *redis.Client) {
				if err := admin.ConfigSet(ctx, "maxclients", "10000").Err(); err != nil {
					t.Error(err)
				}
			},
		},
		{
			// A 300 ms script past busy-reply-threshold: SELECT answers
			// -BUSY, which fails the dial (ErrHandshake) of a DB 1 pipe.
			name: "busy-script",
			refuse: func(t *testing.T, srv *redistest.Server, admin *redis.Client) {
				if err := admin.ConfigSet(ctx, "busy-reply-threshold", "20").Err(); err != nil {
					t.Fatal(err)
				}
				go srv.Client(t).Eval(ctx, "while true do end", nil).Err()
				time.Sleep(100 * time.Millisecond)
			},
			accept: func(t *testing.T, srv *redistest.Server, admin *redis.Client) {
				admin.ScriptKill(ctx)
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			b := NewBackend(BackendOptions{Addr: srv.Addr(), Connections: 1, Databases: 2,
				DialTimeout: 2 * time.Second, ReplyTimeout: 2 * time.Second,
				ReconnectMin: 20 * time.Millisecond, ReconnectMax: 100 * time.Millisecond})
			defer b.Close()
			if !b.Pool(0, false).Up() {
				t.Fatal("DB 0 not up")
			}
			// One connection, made now: it must still get in once Redis
			// refuses new ones.
			admin := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 1})
			defer admin.Close()
			if err := admin.Ping(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			tc.refuse(t, srv, admin)
			var wg sync.WaitGroup
			defer wg.Wait()
			wg.Go(func() {
				time.Sleep(200 * time.Millisecond)
				tc.accept(t, srv, admin)
			})
			start := time.Now()
			p := b.Pool(1, false) // the first client of DB 1
			c := NewCall()
			c.Add(cmd("PING"))
			p.Do(c)
			r, err := c.Reply(0)
			t.Logf("first command on DB 1 after %v: %q, %v", time.Since(start).Round(time.Millisecond), r, err)
			var refusal *HandshakeRefusal
			if tc.name == "busy-script" && errors.As(err, &refusal) && refusal.StateReply() != nil {
				// Not waited for since ee2454b: the client is answered
				// Redis's -BUSY at once (the proxy sends StateReply), as
				// every client of a DB already connected is, and as Redis
				// answers a client directly.
				return
			}
			if err != nil {
				t.Fatalf("first client of DB 1 failed with %v after %v, though Redis took connections again %v after it "+
					"came, well within dial_timeout (2 s)", err, time.Since(start).Round(time.Millisecond), 200*time.Millisecond)
			}
		})
	}
}
