package proxy_test

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// startLoopOn is startLoop for a loop whose one key is key, so that a
// cluster or the routes send it where key lives; ro runs it as EVAL_RO.
func startLoopOn(t *testing.T, addr, key string, function, ro bool, ms int) <-chan string {
	t.Helper()
	nc := dialAddr(t, addr)
	switch {
	case function:
		rawSend(t, nc, "FCALL", "busyloop", "1", key, fmt.Sprint(ms))
	case ro:
		rawSend(t, nc, "EVAL_RO", redistest.LoopScript, "1", key, fmt.Sprint(ms))
	default:
		rawSend(t, nc, "EVAL", redistest.LoopScript, "1", key, fmt.Sprint(ms))
	}
	done := make(chan string, 1)
	go func() {
		done <- readOneReply(nc, 30*time.Second)
	}()
	return done
}

// readOneReply reads one reply from nc (an error's text if the read fails).
func readOneReply(nc net.Conn, d time.Duration) string {
	nc.SetReadDeadline(time.Now().Add(d))
	var buf []byte
	tmp := make([]byte, 512)
	for {
		n, err := nc.Read(tmp)
		buf = append(buf, tmp[:n]...)
		if err != nil {
			return string(buf) + "(read: " + err.Error() + ")"
		}
		if strings.HasSuffix(string(buf), "\r\n") {
			return string(buf)
		}
	}
}

// killThrough sends kill through the proxy at addr while s is busy, and
// checks that the proxy answers OK, that the loop's caller was told it
// was killed, and that s answers again.
func killThrough(t *testing.T, addr string, s *redistest.Server, loop <-chan string, kill ...string) {
	t.Helper()
	redistest.Eventually(t, 5*time.Second, func() bool { return redisBusy(t, s) }, "%s never became busy", s.Addr())
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
		redistest.Eventually(t, 5*time.Second, func() bool { return redisBusy(t, s) }, "%s never became busy", addr)
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
