package proxy_test

import (
	"bytes"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// holdingForwarder passes connections on to a server. The connection
// whose client sent a BLPOP can have what the server sends it held back
// (hold), as a reply still on its way is; the forwarder records whether
// a CLIENT UNBLOCK went through it and whether the blocked connection's
// client closed it.
type holdingForwarder struct {
	ln                 net.Listener
	hold               atomic.Bool
	release            chan struct{}
	sawUnblock, closed atomic.Bool
}

func startHoldingForwarder(t *testing.T, to string) *holdingForwarder {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &holdingForwarder{ln: ln, release: make(chan struct{})}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", to)
			if err != nil {
				nc.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, nc, up)
			mu.Unlock()
			var blocker atomic.Bool
			go func() { // client to server, watched
				buf := make([]byte, 64<<10)
				for {
					n, err := nc.Read(buf)
					if n > 0 {
						if bytes.Contains(buf[:n], []byte("BLPOP")) {
							blocker.Store(true)
						}
						if bytes.Contains(buf[:n], []byte("UNBLOCK")) {
							f.sawUnblock.Store(true)
						}
						up.Write(buf[:n])
					}
					if err != nil {
						if blocker.Load() {
							f.closed.Store(true)
						}
						up.Close()
						return
					}
				}
			}()
			go func() { // server to client, held while asked
				buf := make([]byte, 64<<10)
				for {
					n, err := up.Read(buf)
					if n > 0 && blocker.Load() && f.hold.Load() {
						<-f.release
					}
					if n > 0 {
						if _, werr := nc.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						nc.Close()
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return f
}

// A reload that moves the upstream to another server ends a client's
// block on the old one; what the old one popped for it just before is
// the client's reply, not lost with the connection. The pop's reply is
// held on its way here, so that the proxy sees the move before it: cut at
// once, the connection dropped it, an acknowledged push lost (found by a
// probe: 2 and 4 in about 2,100 over 100 reloads).
func TestReloadKeepsWhatTheOldUpstreamPopped(t *testing.T) {
	a, b := redistest.Start(t), redistest.Start(t)
	fw := startHoldingForwarder(t, a.Addr())
	p := proxytest.Start(t, a, func(c *config.Config) { c.Upstream.Address = fw.ln.Addr().String() })
	directA := a.Client(t)
	blocked := dialRaw(t, p.Addr)
	blocked.send([]string{"BLPOP", "moved:q", "0"})
	redistest.Eventually(t, 5*time.Second, func() bool { return blockedClients(directA) == 1 }, "BLPOP never blocked on A")

	fw.hold.Store(true)
	if err := directA.RPush(ctx, "moved:q", "job").Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := directA.LLen(ctx, "moved:q").Result(); err != nil || n != 0 {
		t.Fatalf("LLEN after the push = %d, %v: A did not pop it for the blocked client", n, err)
	}
	if _, err := p.Reload(reloaded(t, p, func(c *config.Config) { c.Upstream.Address = b.Addr() })); err != nil {
		t.Fatal(err)
	}
	// The proxy acts on the move: it asks A to end the block, or cuts
	// the connection.
	redistest.Eventually(t, 5*time.Second, func() bool { return fw.sawUnblock.Load() || fw.closed.Load() },
		"the blocked client's connection was neither unblocked nor cut after the move")
	close(fw.release)
	v, err := blocked.next(nil)
	if err != nil || fmt.Sprint(v) != "[moved:q job]" {
		left, _ := directA.LRange(ctx, "moved:q", 0, -1).Result()
		t.Fatalf("the blocked client got %#v, %v (left on A: %q); want the element A popped for it", v, err, left)
	}
	// The client goes on, on the new upstream.
	blocked.send([]string{"SET", "after:move", "1"})
	if v, _ := blocked.readReply(); v != "OK" {
		t.Fatalf("SET after the pop = %#v", v)
	}
	if got, _ := b.Client(t).Get(ctx, "after:move").Result(); got != "1" {
		t.Fatalf("the SET after the move went to A, not B (B has %q)", got)
	}
}
