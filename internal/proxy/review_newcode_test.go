package proxy_test

import (
	"math/rand"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/redistest"
)

// Review of c835be7, af9bd8e, d793c77, 5b98f0a (branch newcode).

// rvClientID is the proxy's id of the client on nc.
func rvClientID(t *testing.T, nc interface{ Write([]byte) (int, error) }, read func() string) string {
	t.Helper()
	got := read()
	if !strings.HasPrefix(got, ":") {
		t.Fatalf("CLIENT ID: %q", got)
	}
	return strings.TrimSpace(got[1:])
}

// CLIENT UNBLOCK of a client blocked in a WAIT on several upstreams must
// answer 1 (the client was blocked, and is unblocked), as Redis answers for
// a client blocked in WAIT. When the first upstream's WAIT has already been
// answered (its replica acknowledged) and only another upstream's WAIT is
// still blocked, the proxy sends the UNBLOCK to every connection but
// answers with the first one's reply: :0, "no such blocked client", while
// the client is in fact unblocked by it.
//
// Observed: CLIENT UNBLOCK answers :0 and the WAIT ends. Expected: :1.
func TestReviewNewcodeUnblockWaitOnSeveralAfterFirstAnswered(t *testing.T) {
	r := startRoutedAfter(t, func(r *routed) { onlineReplica(t, r.def) }, nil)
	c := dialAddr(t, r.p.Addr)
	for _, k := range []string{"plain", "queue:1"} {
		if got := rawDo(t, c, "SET", k, "v"); got != "+OK\r\n" {
			t.Fatalf("SET %s: %q", k, got)
		}
	}
	id := rvClientID(t, c, func() string { return rawDo(t, c, "CLIENT", "ID") })
	rawSend(t, c, "WAIT", "1", "0")
	// [upstream]'s replica acknowledges: its WAIT ends; queue's never does.
	blockedOn(t, r.queue, 1)
	blockedOn(t, r.def, 0)
	time.Sleep(100 * time.Millisecond)
	other := dialAddr(t, r.p.Addr)
	got := rawDo(t, other, "CLIENT", "UNBLOCK", id)
	reply := rawRead(t, c)
	if reply != ":0\r\n" {
		t.Errorf("WAIT 1 0 after the UNBLOCK: %q, want :0 (queue's share on no replica)", reply)
	}
	if got != ":1\r\n" {
		t.Fatalf("CLIENT UNBLOCK of a client blocked in WAIT on two upstreams (the first one's answered): %q, want :1 as Redis answers (the client was blocked and the UNBLOCK ended its WAIT)", got)
	}
}

// Reloads that do not touch the routes must not fail a WATCH: on Redis an
// EXEC fails only when a WATCHed key was touched. Every reload puts a new
// route table in force (reloadRoutes compiles one whatever changed), and
// watchMoved fails any WATCH older than 16 tables, so 16 reloads of an
// unrelated setting (or of the same file: SIGHUP) abort every transaction
// WATCHed before them.
//
// Observed: EXEC answers a null reply (aborted). Expected: EXEC runs.
func TestReviewNewcodeWatchSurvivesReloadsThatKeepTheRoutes(t *testing.T) {
	r := startRouted(t, nil)
	c := dialAddr(t, r.p.Addr)
	if got := rawDo(t, c, "WATCH", "queue:w"); got != "+OK\r\n" {
		t.Fatalf("WATCH: %q", got)
	}
	for i := 0; i < 17; i++ {
		if _, err := r.p.Reload(reloaded(t, r.p, func(c *config.Config) {
			c.Upstream.ReconnectMax.Duration = time.Duration(200+i) * time.Millisecond
		})); err != nil {
			t.Fatal(err)
		}
	}
	if got := rawDo(t, c, "MULTI"); got != "+OK\r\n" {
		t.Fatalf("MULTI: %q", got)
	}
	if got := rawDo(t, c, "SET", "queue:w", "v"); got != "+QUEUED\r\n" {
		t.Fatalf("SET: %q", got)
	}
	if got := rawDo(t, c, "EXEC"); got != "*1\r\n+OK\r\n" {
		t.Fatalf("EXEC after 17 reloads that left the routes as they were (no write to queue:w): %q, want *1 +OK as on Redis", got)
	}
}

// A WAIT on several upstreams whose answer is already decided, because one
// upstream answered it with an error (here queue, which is a replica:
// "WAIT cannot be used with replica instances"), must not wait on the
// others: the error is the answer whatever they count (waitEveryUpstream
// answers the first upstream's error), so with WAIT n 0 on an upstream
// with too few replicas the client hangs forever for a count that is then
// thrown away. On Redis the WAIT is answered at once with the error. The
// write to queue was refused (-READONLY), yet it counts as written: the
// upstream is noted before the reply (routedDo).
//
// Observed: no reply within 5 s (forever). Expected: the error at once.
func TestReviewNewcodeWaitOnSeveralErrorDoesNotWaitForever(t *testing.T) {
	r := startRoutedAfter(t, func(r *routed) {
		primary := redistest.Start(t)
		if err := r.queue.Client(t).Do(ctx, "REPLICAOF", "127.0.0.1", strconv.Itoa(primary.Port())).Err(); err != nil {
			t.Fatal(err)
		}
	}, nil)
	c := dialAddr(t, r.p.Addr)
	if got := rawDo(t, c, "SET", "plain", "v"); got != "+OK\r\n" {
		t.Fatalf("SET plain: %q", got)
	}
	if got := rawDo(t, c, "SET", "queue:1", "v"); !strings.HasPrefix(got, "-READONLY") {
		t.Fatalf("SET queue:1 on a replica: %q", got)
	}
	rawSend(t, c, "WAIT", "1", "0")
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 512)
	n, err := c.Read(buf)
	if err != nil || !strings.HasPrefix(string(buf[:n]), "-") {
		t.Fatalf("WAIT 1 0 after writes to [upstream] (no replica) and queue (a replica, which refuses WAIT): got %q %v within 5 s; want queue's error at once, the answer whatever [upstream] counts", buf[:n], err)
	}
}

// A WATCH placed by one route table and recorded (noteWatch) with the next:
// routePlacer.target loads the table to choose the WATCH's upstream, then
// pinWatch acquires (maybe dials) the connection, and only then noteWatch
// loads the table again for pin.watchRoutes. A reload in between moves the
// WATCHed key to another upstream: the WATCH is on the old one, but
// watchMoved sees pin.watchRoutes == the table in force and lets EXEC run,
// although another client's acknowledged write of the key went to the new
// upstream. On Redis, EXEC after a write of a WATCHed key answers null.
//
// Observed: EXEC answers [PONG] in some rounds. Expected: always null.
func TestReviewNewcodeWatchPlacedAcrossAReload(t *testing.T) {
	r := startRouted(t, nil)
	routesTo := func(up string) func(*config.Config) {
		return func(c *config.Config) {
			c.Routes = []config.Route{{Pattern: "queue:x*", Upstream: up}, {Pattern: "queue:*", Upstream: "queue"}, {Pattern: "cache:*", Upstream: "cache"}}
		}
	}
	writer := r.p.Client(t)
	bad := 0
	const rounds = 150
	for i := 0; i < rounds; i++ {
		if _, err := r.p.Reload(reloaded(t, r.p, routesTo("queue"))); err != nil {
			t.Fatal(err)
		}
		next := reloaded(t, r.p, routesTo("cache"))
		c := dialAddr(t, r.p.Addr)
		reloadDone := make(chan error, 1)
		go func() {
			time.Sleep(time.Duration(rand.Intn(400)) * time.Microsecond)
			_, err := r.p.Reload(next)
			reloadDone <- err
		}()
		if got := rawDo(t, c, "WATCH", "queue:x"); got != "+OK\r\n" {
			t.Fatalf("WATCH: %q", got)
		}
		if err := <-reloadDone; err != nil {
			t.Fatal(err)
		}
		// An acknowledged write of the WATCHed key, after the WATCH.
		if err := writer.Set(ctx, "queue:x", i, 0).Err(); err != nil {
			t.Fatal(err)
		}
		rawSend(t, c, "MULTI")
		rawSend(t, c, "PING")
		rawSend(t, c, "EXEC")
		rawRead(t, c)
		rawRead(t, c)
		if got := rawRead(t, c); got != "*-1\r\n" {
			bad++
			t.Logf("round %d: EXEC after another client's write of the WATCHed key: %q", i, got)
		}
		c.Close()
	}
	if bad > 0 {
		t.Fatalf("%d of %d rounds: EXEC ran although the WATCHed key was written after the WATCH, want a null reply every time", bad, rounds)
	}
}
