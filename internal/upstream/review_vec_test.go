package upstream

import (
	"bytes"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

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
	addr := forwarder(t, srv.Addr(), func(wg *sync.WaitGroup, c, u net.Conn) {
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
