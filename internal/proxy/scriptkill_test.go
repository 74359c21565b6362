package proxy_test

import (
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// waitLoopBusy waits for s to run the loop whose reply comes on loop, and
// fails at once if the loop was answered instead. 15 s: on a loaded CI
// machine 5 s passed before a busyloop FCALL had reached its node.
func waitLoopBusy(t *testing.T, s *redistest.Server, loop <-chan string) {
	t.Helper()
	redistest.Eventually(t, 15*time.Second, func() bool {
		select {
		case r := <-loop:
			t.Fatalf("the loop on %s was answered before it was killed: %q", s.Addr(), r)
		default:
		}
		return redisBusy(t, s)
	}, "%s never became busy", s.Addr())
}

// killThrough sends kill through the proxy at addr while s is busy, and
// checks that the proxy answers OK, that the loop's caller was told it
// was killed, and that s answers again.
func killThrough(t *testing.T, addr string, s *redistest.Server, loop <-chan string, kill ...string) {
	t.Helper()
	waitLoopBusy(t, s, loop)
	if got := rawDo(t, dialAddr(t, addr), kill...); got != "+OK\r\n" {
		t.Fatalf("%v through the proxy while %s runs the script: %q, want +OK", kill, s.Addr(), got)
	}
	if r := <-loop; !strings.HasPrefix(r, "-ERR Script killed by user") {
		t.Fatalf("the killed loop's caller got %q", r)
	}
	if redisBusy(t, s) {
		t.Fatalf("%s still busy after %v answered OK", s.Addr(), kill)
	}
}

// In cluster mode a script runs on its key's primary, which need not be
// the node the proxy sends keyless commands to: SCRIPT KILL, FUNCTION KILL
// and FUNCTION STATS go to every primary (found by review: SCRIPT KILL
// answered NOTBUSY from the startup node while another stayed busy).
func TestScriptKillReachesEveryClusterPrimary(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0, "--busy-reply-threshold", "50")
	p := proxytest.Start(t, c.Nodes[0], func(cfg *config.Config) {
		cfg.Upstream.Mode = config.ModeCluster
		cfg.Upstream.Seeds = c.Seeds()
		cfg.Upstream.DeadTimeout = units.Duration{Duration: 30 * time.Second}
	})
	cc := c.ClusterClient(t)
	// A key on each primary.
	keyOf := map[string]string{}
	for i := 0; len(keyOf) < 3 && i < 1000; i++ {
		key := fmt.Sprintf("loop:%d", i)
		m, err := cc.MasterForKey(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := keyOf[m.Options().Addr]; !ok {
			keyOf[m.Options().Addr] = key
		}
	}
	node := func(addr string) *redistest.Server {
		for _, s := range c.Nodes {
			if s.Addr() == addr {
				return s
			}
		}
		t.Fatalf("no node at %s", addr)
		return nil
	}
	idle := rawDo(t, dialAddr(t, p.Addr), "SCRIPT", "KILL")
	if want := "-NOTBUSY No scripts in execution right now.\r\n"; idle != want {
		t.Fatalf("SCRIPT KILL with nothing running: %q, want Redis's %q", idle, want)
	}
	for addr, key := range keyOf {
		loop := startLoopOn(t, p.Addr, key, false, false, 20000)
		killThrough(t, p.Addr, node(addr), loop, "SCRIPT", "KILL")
	}
	for _, s := range c.Nodes {
		if err := s.Client(t).FunctionLoad(ctx, loopLibrary).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for addr, key := range keyOf {
		loop := startLoopOn(t, p.Addr, key, true, false, 20000)
		s := node(addr)
		waitLoopBusy(t, s, loop)
		stats := rawDo(t, dialAddr(t, p.Addr), "FUNCTION", "STATS")
		if !strings.Contains(stats, "busyloop") {
			t.Fatalf("FUNCTION STATS through the proxy while %s runs busyloop: %q", addr, stats)
		}
		killThrough(t, p.Addr, s, loop, "FUNCTION", "KILL")
	}
}

// With routes, a script runs on the upstream of its key: the kill goes to
// every upstream.
func TestScriptKillReachesEveryRoutedUpstream(t *testing.T) {
	var queue *redistest.Server
	r := startRoutedAfter(t, func(r *routed) {
		queue = redistest.Start(t, "--busy-reply-threshold", "50")
		r.queue = queue
	}, nil)
	loop := startLoopOn(t, r.p.Addr, "queue:loop", false, false, 20000)
	killThrough(t, r.p.Addr, queue, loop, "SCRIPT", "KILL")
	if redisBusy(t, r.def) {
		t.Fatal("the default upstream is busy")
	}
}

// With read_from = "replica", EVAL_RO runs on a replica: the kill goes
// there too.
func TestScriptKillReachesAReplicaRunningEvalRO(t *testing.T) {
	primary := redistest.Start(t, "--busy-reply-threshold", "50", "--repl-diskless-sync-delay", "0")
	replica := redistest.Start(t, "--busy-reply-threshold", "50", "--replicaof", "127.0.0.1", fmt.Sprint(primary.Port()))
	g := &replicated{primary: primary, replicas: []*redistest.Server{replica}}
	redistest.Eventually(t, 20*time.Second, func() bool {
		info, err := primary.Client(t).Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "state=online")
	}, "the replica never came online")
	p := g.proxy(t, config.ReadReplica, func(c *config.Config) {
		// The loop must stay on the replica, not time out to anywhere.
		c.Upstream.ReplyTimeout = units.Duration{Duration: 30 * time.Second}
	})
	loop := startLoopOn(t, p.Addr, "ro:loop", false, true, 20000)
	killThrough(t, p.Addr, replica, loop, "SCRIPT", "KILL")
	if redisBusy(t, primary) {
		t.Fatal("the primary is busy: the EVAL_RO did not run on the replica")
	}
}

// delayedForwarder passes connections on to a server; once armed, each
// new connection waits before it is passed on: a server far away or
// slow to accept.
type delayedForwarder struct {
	ln    net.Listener
	armed atomic.Bool
}

func startDelayedForwarder(t *testing.T, to string, delay time.Duration) *delayedForwarder {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &delayedForwarder{ln: ln}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			armed := f.armed.Load()
			go func() {
				if armed {
					time.Sleep(delay)
				}
				up, err := net.Dial("tcp", to)
				if err != nil {
					nc.Close()
					return
				}
				mu.Lock()
				conns = append(conns, nc, up)
				mu.Unlock()
				go io.Copy(up, nc)
				io.Copy(nc, up)
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

// A server that answers the kill late (here one whose new connections
// are delayed) gets the kill itself, not what the client's read buffer
// holds by then: the kill answers at the first OK and the other sends go
// on, and they sent the buffer the client, or another, had reused (found
// by review: the late upstream received another client's DEL).
func TestScriptKillSentLateIsStillTheKill(t *testing.T) {
	var queue, cache *redistest.Server
	var fw *delayedForwarder
	r := startRoutedAfter(t, func(r *routed) {
		queue = redistest.Start(t, "--busy-reply-threshold", "50")
		r.queue = queue
		cache = r.cach
		fw = startDelayedForwarder(t, cache.Addr(), 1500*time.Millisecond)
	}, func(c *config.Config) {
		u := c.Upstreams["cache"]
		u.Address = fw.ln.Addr().String()
		c.Upstreams["cache"] = u
	})
	loop := startLoopOn(t, r.p.Addr, "queue:loop", false, false, 20000)
	fw.armed.Store(true) // the kill's connection of its own to cache comes late
	killThrough(t, r.p.Addr, queue, loop, "SCRIPT", "KILL")
	// Other clients read requests meanwhile, into buffers the kill's
	// may have been.
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := dialRaw(t, r.p.Addr)
			for range 50 {
				c.send([]string{"DEL", "plain:y", strings.Repeat("x", i)})
				c.readReply()
			}
		}()
	}
	wg.Wait()
	redistest.Eventually(t, 10*time.Second, func() bool { return calls(t, cache, "script|kill") >= 1 },
		"no SCRIPT KILL reached the cache upstream (DELs it ran: %v)", lazyInt(func() int { return calls(t, cache, "del") }))
	if n := calls(t, cache, "del"); n != 0 {
		t.Fatalf("the cache upstream ran %d DELs, which no client sent it: the late kill sent another client's request", n)
	}
	if n := calls(t, cache, "script|kill"); n != 1 {
		t.Fatalf("the cache upstream ran SCRIPT KILL %d times, want 1", n)
	}
}

// A replica that is frozen or gone, which its primary still lists (up to
// repl-timeout), does not hold the kill or turn NOTBUSY into an error: a
// busy Redis answers a kill at once, so the proxy answers from the
// servers that did within a second (found by review: "upstream reply
// timeout" after dead_timeout, 30 s, with a frozen replica; "upstream
// unavailable" with a dead one).
func TestScriptKillWithAnUnreachableReplica(t *testing.T) {
	for _, how := range []string{"frozen", "killed"} {
		t.Run(how, func(t *testing.T) {
			g := startReplicated(t, 1)
			p := g.proxy(t, config.ReadReplica, func(c *config.Config) {
				c.Upstream.DeadTimeout = units.Duration{Duration: 30 * time.Second}
				c.Upstream.ReplyTimeout = units.Duration{Duration: 5 * time.Second}
			})
			const notBusy = "-NOTBUSY No scripts in execution right now.\r\n"
			if got := rawDo(t, dialAddr(t, p.Addr), "SCRIPT", "KILL"); got != notBusy {
				t.Fatalf("SCRIPT KILL, nothing running: %q", got)
			}
			if how == "frozen" {
				g.replicas[0].Freeze(t)
				t.Cleanup(func() { g.replicas[0].Thaw(t) })
			} else {
				g.replicas[0].Kill(t)
			}
			for range 2 {
				if got := rawDo(t, dialAddr(t, p.Addr), "SCRIPT", "KILL"); got != notBusy {
					t.Fatalf("SCRIPT KILL with the replica %s: %q, want the primary's NOTBUSY", how, got)
				}
			}
		})
	}
}
