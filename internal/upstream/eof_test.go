package upstream

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/redistest"
)

// closer forwards to Redis, but answers a command holding marker with
// part of a reply and closes the connection at once, as Redis does after
// a protocol error or an output buffer limit, or as a crash mid-write or
// a middlebox does: the data and the FIN arrive back to back.
func closer(t *testing.T, target, marker string, part []byte) string {
	t.Helper()
	return redistest.Forward(t, target, func(wg *sync.WaitGroup, c, u net.Conn) {
		wg.Go(func() {
			io.Copy(c, u)
			c.Close()
		})
		wg.Go(func() {
			defer u.Close()
			buf := make([]byte, 64<<10)
			for {
				n, err := c.Read(buf)
				if err != nil {
					return
				}
				if bytes.Contains(buf[:n], []byte(marker)) {
					c.Write(part)
					c.Close()
					return
				}
				u.Write(buf[:n])
			}
		})
	})
}

// TestPipeEOFRightAfterDataFailsCallAtOnce: a connection the server closes
// right after a partial reply fails its pending Call at once with
// ErrConnLost. The reader read the data with a short read and then waited
// for readability, which the FIN, arrived with the data, never raised
// again: the Call waited for the dead timeout (found by review: 38 of 40
// rounds took the whole 4 s dead timeout here).
func TestPipeEOFRightAfterDataFailsCallAtOnce(t *testing.T) {
	srv := redistest.Start(t)
	addr := closer(t, srv.Addr(), "CUTME", []byte("$100\r\nabc"))
	opts := testOpts(addr)
	opts.ReplyTimeout, opts.DeadTimeout = 500*time.Millisecond, 4*time.Second
	pool := NewPool(1, opts)
	defer pool.Close()
	slow := 0
	const rounds = 20
	for i := range rounds {
		waitUp(t, pool)
		c := NewCall()
		c.Add(cmd("GET", "CUTME"))
		start := time.Now()
		if err := pool.Send(c); err != nil {
			t.Fatal(err)
		}
		c.Wait()
		took := time.Since(start)
		if !errors.Is(c.Err(), ErrConnLost) || took > 2*time.Second {
			slow++
			t.Logf("round %d: the Call ended after %v: %v", i, took.Round(time.Millisecond), c.Err())
		}
	}
	if slow > 0 {
		t.Fatalf("%d of %d Calls whose connection the server closed right after a partial reply did not fail at once with ErrConnLost", slow, rounds)
	}
}
