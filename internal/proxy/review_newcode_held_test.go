package proxy_test

import (
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/resp"
)

// Review of c835be7, af9bd8e, d793c77, 5b98f0a (branch newcode).

// Pipelined in one batch, writes to two upstreams and then WAIT: the WAIT
// must count the upstream with no replica.
func TestReviewNewcodeWaitPipelinedBehindWrites(t *testing.T) {
	r := startRoutedAfter(t, func(r *routed) { onlineReplica(t, r.def) }, nil)
	c := dialAddr(t, r.p.Addr)
	if _, err := c.Write([]byte("*3\r\n$3\r\nSET\r\n$5\r\nplain\r\n$1\r\nv\r\n*3\r\n$3\r\nSET\r\n$7\r\nqueue:1\r\n$1\r\nv\r\n*3\r\n$4\r\nWAIT\r\n$1\r\n1\r\n$3\r\n300\r\n")); err != nil {
		t.Fatal(err)
	}
	var got []string
	for i := 0; i < 3; i++ {
		got = append(got, rawRead(t, c))
	}
	if strings.Join(got, "") != "+OK\r\n+OK\r\n:0\r\n" {
		t.Fatalf("SET plain; SET queue:1; WAIT 1 300 in one batch: %q, want OK OK 0", got)
	}
}

// WAIT inside MULTI is answered at EXEC without blocking on Redis; with
// writes on two upstreams it must not block through the proxy either.
func TestReviewNewcodeWaitInMultiOnSeveral(t *testing.T) {
	r := startRouted(t, nil)
	c := dialAddr(t, r.p.Addr)
	for _, k := range []string{"plain", "queue:1"} {
		if got := rawDo(t, c, "SET", k, "v"); got != "+OK\r\n" {
			t.Fatalf("SET %s: %q", k, got)
		}
	}
	if got := rawDo(t, c, "MULTI"); got != "+OK\r\n" {
		t.Fatalf("MULTI: %q", got)
	}
	if got := rawDo(t, c, "WAIT", "1", "0"); got != "+QUEUED\r\n" {
		t.Fatalf("WAIT 1 0 in MULTI: %q, want +QUEUED", got)
	}
	start := time.Now()
	got := rawDo(t, c, "EXEC")
	if time.Since(start) > 3*time.Second || !strings.HasPrefix(got, "*1\r\n:") {
		t.Fatalf("EXEC of a MULTI with WAIT 1 0: %q after %v, want *1 :n at once", got, time.Since(start))
	}
}

// CLIENT REPLY SKIP before a WAIT on several upstreams: no reply to it.
func TestReviewNewcodeWaitOnSeveralReplySkip(t *testing.T) {
	r := startRouted(t, nil)
	c := dialAddr(t, r.p.Addr)
	for _, k := range []string{"plain", "queue:1"} {
		if got := rawDo(t, c, "SET", k, "v"); got != "+OK\r\n" {
			t.Fatalf("SET %s: %q", k, got)
		}
	}
	rawSend(t, c, "CLIENT", "REPLY", "SKIP")
	rawSend(t, c, "WAIT", "0", "0")
	if got := rawDo(t, c, "PING"); got != "+PONG\r\n" {
		t.Fatalf("CLIENT REPLY SKIP; WAIT 0 0; PING: %q, want +PONG alone", got)
	}
}

// RESP3: a WAIT on several upstreams answers an integer.
func TestReviewNewcodeWaitOnSeveralRESP3(t *testing.T) {
	r := startRouted(t, nil)
	c := dialAddr(t, r.p.Addr)
	if got := rawDo(t, c, "HELLO", "3"); !strings.HasPrefix(got, "%") {
		t.Fatalf("HELLO 3: %q", got)
	}
	for _, k := range []string{"plain", "queue:1"} {
		if got := rawDo(t, c, "SET", k, "v"); got != "+OK\r\n" {
			t.Fatalf("SET %s: %q", k, got)
		}
	}
	if got := rawDo(t, c, "WAIT", "0", "0"); got != ":0\r\n" {
		t.Fatalf("WAIT 0 0 in RESP3: %q", got)
	}
}

// A client that leaves during a WAIT on several upstreams: every borrowed
// connection goes, none stays blocked.
func TestReviewNewcodeWaitOnSeveralClientLeaves(t *testing.T) {
	r := startRouted(t, nil)
	c := dialAddr(t, r.p.Addr)
	for _, k := range []string{"plain", "queue:1", "cache:1"} {
		if got := rawDo(t, c, "SET", k, "v"); got != "+OK\r\n" {
			t.Fatalf("SET %s: %q", k, got)
		}
	}
	rawSend(t, c, "WAIT", "1", "0")
	blockedOn(t, r.def, 1)
	blockedOn(t, r.queue, 1)
	blockedOn(t, r.cach, 1)
	c.Close()
	blockedOn(t, r.def, 0)
	blockedOn(t, r.queue, 0)
	blockedOn(t, r.cach, 0)
	for _, s := range []*redistest.Server{r.def, r.queue, r.cach} {
		rc := s.Client(t)
		redistest.Eventually(t, 5*time.Second, func() bool {
			list, _ := rc.ClientList(ctx).Result()
			return !strings.Contains(list, "cmd=wait")
		}, "a connection of the WAIT stayed on %s", s.Addr())
	}

}

// rvKillBlocked kills, on Redis, the connection blocked in cmd.
func rvKillBlocked(t *testing.T, rs *redistest.Server, cmd string) {
	t.Helper()
	rc := rs.Client(t)
	list, err := rc.ClientList(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(list, "\n") {
		if strings.Contains(line, "cmd="+cmd+" ") {
			for _, f := range strings.Fields(line) {
				if strings.HasPrefix(f, "id=") {
					if err := rc.Do(ctx, "CLIENT", "KILL", "ID", f[3:]).Err(); err != nil {
						t.Fatal(err)
					}
					return
				}
			}
		}
	}
	t.Fatalf("no connection in %s on Redis: %s", cmd, list)
}

// Every reply before a blocked command reaches the client before the
// close, when they were pipelined in one write with it (and nothing after
// it is answered).
func TestReviewNewcodeLostBlockedPipelinedOrder(t *testing.T) {
	rs := redistest.Start(t)
	p := proxytest.Start(t, rs, nil)
	for i := 0; i < 5; i++ {
		c := dialAddr(t, p.Addr)
		var buf []byte
		buf = resp.AppendCommandStrings(buf, "ECHO", "a")
		buf = resp.AppendCommandStrings(buf, "SET", "k", "v")
		buf = resp.AppendCommandStrings(buf, "BLPOP", "rv:q", "0")
		buf = resp.AppendCommandStrings(buf, "ECHO", "b")
		if _, err := c.Write(buf); err != nil {
			t.Fatal(err)
		}
		blockedOn(t, rs, 1)
		rvKillBlocked(t, rs, "blpop")
		got, closed := readToClose(t, c, 5*time.Second)
		if !closed || got != "$1\r\na\r\n+OK\r\n" {
			t.Fatalf("ECHO a; SET; BLPOP 0; ECHO b, blocked connection killed: %q closed=%v, want the two replies then the close", got, closed)
		}
		blockedOn(t, rs, 0)
	}
	upstreamLostClosed(t, p, 5)
}

// A BLPOP under WATCH runs on the pinned connection; lost, it closes the
// client and frees the pin (max_pinned = 1: the next client can pin).
func TestReviewNewcodeLostBlockedUnderWatchFreesPin(t *testing.T) {
	rs := redistest.Start(t)
	p := proxytest.Start(t, rs, func(c *config.Config) { c.Upstream.MaxPinned = 1 })
	c := dialAddr(t, p.Addr)
	if got := rawDo(t, c, "WATCH", "rv:w"); got != "+OK\r\n" {
		t.Fatalf("WATCH: %q", got)
	}
	rawSend(t, c, "BLPOP", "rv:q", "0")
	blockedOn(t, rs, 1)
	rvKillBlocked(t, rs, "blpop")
	if got, closed := readToClose(t, c, 5*time.Second); !closed || got != "" {
		t.Fatalf("BLPOP under WATCH, connection killed: %q closed=%v", got, closed)
	}
	upstreamLostClosed(t, p, 1)
	d := dialAddr(t, p.Addr)
	var got string
	redistest.Eventually(t, 5*time.Second, func() bool {
		got = rawDo(t, d, "WATCH", "rv:w2")
		return got == "+OK\r\n"
	}, "WATCH after the pinned client was closed: %q (pin leaked?)", got)
}

// Reloads that move a key and back, concurrent with WATCH/MULTI/EXEC
// clients (-race): no data race, and every EXEC answers.
func TestReviewNewcodeReloadsAndExecsRace(t *testing.T) {
	r := startRouted(t, nil)
	stop := make(chan struct{})
	errs := make(chan error, 4)
	for w := 0; w < 3; w++ {
		go func(w int) {
			c := r.p.Client(t).Conn()
			defer c.Close()
			for {
				select {
				case <-stop:
					errs <- nil
					return
				default:
				}
				if err := c.Do(ctx, "WATCH", "queue:r").Err(); err != nil {
					errs <- err
					return
				}
				c.Do(ctx, "MULTI")
				c.Do(ctx, "INCR", "queue:r")
				if err := c.Do(ctx, "EXEC").Err(); err != nil && err.Error() != "redis: nil" && !strings.Contains(err.Error(), "EXECABORT") {
					errs <- err
					return
				}
			}
		}(w)
	}
	for i := 0; i < 40; i++ {
		target := "queue"
		if i%2 == 1 {
			target = "cache"
		}
		if _, err := r.p.Reload(reloaded(t, r.p, func(c *config.Config) {
			c.Routes = []config.Route{{Pattern: "queue:*", Upstream: target}, {Pattern: "cache:*", Upstream: "cache"}}
		})); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(stop)
	for w := 0; w < 3; w++ {
		if err := <-errs; err != nil {
			t.Fatalf("EXEC under reloads: %v", err)
		}
	}
}

// Definitive refusals of a relay keep the client: the proxy user's ACL
// refusing SUBSCRIBE to a channel (NOPERM), while Redis is up.
func TestReviewNewcodeSubscribeNoPermKeepsClient(t *testing.T) {
	p := usersProxy(t, func(c *config.Config) {
		c.Users = append(c.Users, user("sub", "sub-pass", "~cache:* +@read +@pubsub +@connection &ch"))
	})
	nc := p.Dial(t)
	if got := rawDo(t, nc, "AUTH", "sub", "sub-pass"); got != "+OK\r\n" {
		t.Fatalf("AUTH: %q", got)
	}
	if got := rawDo(t, nc, "SUBSCRIBE", "other"); !strings.HasPrefix(got, "-NOPERM") {
		t.Fatalf("SUBSCRIBE other: %q", got)
	}
	if got := rawDo(t, nc, "ECHO", "open"); got != "$4\r\nopen\r\n" {
		t.Fatalf("ECHO after the refused SUBSCRIBE: %q", got)
	}
}

// A WAIT on several upstreams refused for max_pinned on the second one
// gives back the first one's connection, and works once there is room.
func TestReviewNewcodeWaitOnSeveralMaxPinnedNoLeak(t *testing.T) {
	r := startRouted(t, func(c *config.Config) {
		c.Upstream.MaxPinned = 1
		q := c.Upstreams["queue"]
		q.MaxPinned = 1
		c.Upstreams["queue"] = q
	})
	holder := dialAddr(t, r.p.Addr)
	rawSend(t, holder, "BLPOP", "queue:hold", "0")
	blockedOn(t, r.queue, 1)
	c := dialAddr(t, r.p.Addr)
	for _, k := range []string{"plain", "queue:1"} {
		if got := rawDo(t, c, "SET", k, "v"); got != "+OK\r\n" {
			t.Fatalf("SET %s: %q", k, got)
		}
	}
	got := rawDo(t, c, "WAIT", "0", "0")
	t.Logf("WAIT 0 0 with queue at max_pinned: %q", got)
	if got := rawDo(t, r.p.Dial(t), "RPUSH", "queue:hold", "x"); got != ":1\r\n" {
		t.Fatalf("RPUSH: %q", got)
	}
	rawRead(t, holder)
	if got := rawDo(t, c, "WAIT", "0", "0"); got != ":0\r\n" {
		t.Fatalf("WAIT 0 0 once queue has room: %q", got)
	}
	// [upstream]'s one dedicated connection is free.
	d := dialAddr(t, r.p.Addr)
	if got := rawDo(t, d, "WATCH", "plain"); got != "+OK\r\n" {
		t.Fatalf("WATCH on [upstream] after the refused WAIT: %q (its pin leaked?)", got)
	}
}

// Replies to what follows a WAIT on several upstreams in the same batch.
func TestReviewNewcodeWaitOnSeveralThenMoreInBatch(t *testing.T) {
	r := startRouted(t, nil)
	c := dialAddr(t, r.p.Addr)
	var buf []byte
	for _, cmd := range [][]string{{"SET", "plain", "a"}, {"SET", "queue:1", "b"}, {"WAIT", "0", "0"}, {"GET", "plain"}, {"GET", "queue:1"}, {"WAIT", "0", "0"}} {
		buf = resp.AppendCommandStrings(buf, cmd...)
	}
	if _, err := c.Write(buf); err != nil {
		t.Fatal(err)
	}
	var got []string
	for i := 0; i < 6; i++ {
		got = append(got, rawRead(t, c))
	}
	if strings.Join(got, "") != "+OK\r\n+OK\r\n:0\r\n$1\r\na\r\n$1\r\nb\r\n:0\r\n" {
		t.Fatalf("batch with WAIT on several: %q", got)
	}
}

// A reload moving [upstream] to another server while a client waits on
// several upstreams: CLIENT UNBLOCK still reaches the connections it waits
// on (the old server's), and the WAIT is answered.
func TestReviewNewcodeWaitOnSeveralReloadMidWait(t *testing.T) {
	r := startRouted(t, nil)
	c := dialAddr(t, r.p.Addr)
	for _, k := range []string{"plain", "queue:1"} {
		if got := rawDo(t, c, "SET", k, "v"); got != "+OK\r\n" {
			t.Fatalf("SET %s: %q", k, got)
		}
	}
	id := rvClientID(t, c, func() string { return rawDo(t, c, "CLIENT", "ID") })
	rawSend(t, c, "WAIT", "1", "0")
	blockedOn(t, r.def, 1)
	blockedOn(t, r.queue, 1)
	moved := redistest.Start(t)
	if _, err := r.p.Reload(reloaded(t, r.p, func(c *config.Config) { c.Upstream.Address = moved.Addr() })); err != nil {
		t.Fatal(err)
	}
	other := dialAddr(t, r.p.Addr)
	if got := rawDo(t, other, "CLIENT", "UNBLOCK", id); got != ":1\r\n" {
		t.Fatalf("CLIENT UNBLOCK after the reload: %q", got)
	}
	if got := rawRead(t, c); got != ":0\r\n" {
		t.Fatalf("WAIT after UNBLOCK: %q", got)
	}
	blockedOn(t, r.def, 0)
	blockedOn(t, r.queue, 0)
}

// Cluster mode: a BLPOP whose connection to its node is killed closes the
// client with no reply, after the reply to what came before it.
func TestReviewNewcodeClusterBlockedLostCloses(t *testing.T) {
	cl, p := startClusterProxy(t)
	c := dialAddr(t, p.Addr)
	var buf []byte
	buf = resp.AppendCommandStrings(buf, "ECHO", "a")
	buf = resp.AppendCommandStrings(buf, "BLPOP", "rv:{q}", "0")
	if _, err := c.Write(buf); err != nil {
		t.Fatal(err)
	}
	if got := rawRead(t, c); got != "$1\r\na\r\n" {
		t.Fatalf("ECHO: %q", got)
	}
	var node *redistest.Server
	redistest.Eventually(t, 5*time.Second, func() bool {
		for _, s := range cl.Primaries(t) {
			list, _ := s.Client(t).ClientList(ctx).Result()
			if strings.Contains(list, "cmd=blpop ") {
				node = s
				return true
			}
		}
		return false
	}, "no node has the BLPOP")
	rvKillBlocked(t, node, "blpop")
	if got, closed := readToClose(t, c, 5*time.Second); !closed || got != "" {
		t.Fatalf("cluster BLPOP, connection killed: %q closed=%v", got, closed)
	}
	upstreamLostClosed(t, p, 1)
}
