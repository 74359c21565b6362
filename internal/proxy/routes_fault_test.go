package proxy_test

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/redistest"
)

// upstreamFailure reports whether a reply is the proxy's error for an
// upstream that does not answer: the reply timeout itself, or the refusal
// of a connection the timeout has closed.
func upstreamFailure(reply string) bool {
	return strings.HasPrefix(reply, "-ERR redproxy: upstream")
}

// TestRoutesFrozenUpstreamFault: one named upstream frozen with SIGSTOP
// (connected, answering nothing) while clients use keys of two routes.
// The default route's clients keep being answered, each with its own
// values, while a command for the frozen upstream is still waiting; the
// frozen upstream's keys get the proxy's upstream error (no hang); a
// pipeline mixing both routes gets its replies in order, the frozen
// route's ones as errors. After SIGCONT both routes work again and every
// value read back is the one written.
func TestRoutesFrozenUpstreamFault(t *testing.T) {
	const deadline = time.Second // reply_timeout and dead_timeout of the queue upstream
	r := startRouted(t, func(c *config.Config) {
		u := c.Upstreams["queue"]
		u.ReplyTimeout = units.Duration{Duration: deadline}
		u.DeadTimeout = units.Duration{Duration: deadline}
		c.Upstreams["queue"] = u
	})
	const keys = 10
	for i := range keys {
		if err := r.c.Set(ctx, fmt.Sprint("queue:k", i), fmt.Sprint("q", i), 0).Err(); err != nil {
			t.Fatal(err)
		}
		if err := r.c.Set(ctx, fmt.Sprint("plain:k", i), fmt.Sprint("p", i), 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// A client of its own per worker; no retries, so a failure is seen as
	// the proxy sent it, and a read deadline far beyond the upstream's so
	// a hang fails the test instead of blocking it.
	client := func() *redis.Client {
		return r.p.Client(t, func(o *redis.Options) {
			o.MaxRetries = -1
			o.ReadTimeout = 20 * deadline
			o.PoolSize = 1
		})
	}

	r.queue.Freeze(t)
	thawed := false
	t.Cleanup(func() {
		if !thawed {
			r.queue.Thaw(t)
		}
	})

	// One command for the frozen upstream, answered only by the timeout.
	frozenDone := make(chan error, 1)
	var frozenWait time.Duration
	go func() {
		start := time.Now()
		_, err := client().Get(ctx, "queue:k0").Result()
		frozenWait = time.Since(start)
		frozenDone <- err
	}()

	// Default-route workers, each with its own keys and values, while the
	// frozen GET waits.
	const workers, rounds = 4, 25
	var (
		wg                 sync.WaitGroup
		whilePending, done atomic.Int64
		errs               = make(chan error, workers*rounds+workers)
	)
	frozenPending := func() bool { return len(frozenDone) == 0 }
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := client()
			for i := range rounds {
				key, val := fmt.Sprintf("plain:w%d", w), fmt.Sprintf("w%d-%d", w, i)
				if err := c.Set(ctx, key, val, 0).Err(); err != nil {
					errs <- fmt.Errorf("worker %d: SET on the default route during the freeze: %v", w, err)
					return
				}
				got, err := c.Get(ctx, key).Result()
				if err != nil || got != val {
					errs <- fmt.Errorf("worker %d: GET %s = %q, %v; want %q", w, key, got, err, val)
					return
				}
				if frozenPending() {
					whilePending.Add(1)
				}
				done.Add(1)
			}
		}()
	}
	// Frozen-route workers: each of their commands gets an error, not a
	// value and not a hang.
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := client()
			for i := range 3 {
				err := c.Get(ctx, fmt.Sprint("queue:k", i+1)).Err()
				if err == nil || err == redis.Nil || !upstreamFailure("-"+err.Error()) {
					errs <- fmt.Errorf("frozen-route worker %d: GET gave %v, want the proxy's upstream error", w, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	err := <-frozenDone
	if err == nil || !upstreamFailure("-"+err.Error()) {
		t.Fatalf("GET of a frozen upstream's key: %v, want the proxy's upstream error", err)
	}
	t.Logf("frozen GET answered %v after %v (dead_timeout %v); %d of %d default-route rounds done while it waited",
		err, frozenWait, deadline, whilePending.Load(), done.Load())
	if whilePending.Load() == 0 {
		t.Errorf("no default-route command was answered while the frozen upstream's GET waited")
	}
	if done.Load() != workers*rounds {
		t.Fatalf("%d of %d default-route rounds done", done.Load(), workers*rounds)
	}

	// A pipeline mixing both routes during the freeze: in order, the
	// frozen route's commands failed, the others answered.
	nc := dialAddr(t, r.p.Addr)
	pipeline := [][]string{
		{"SET", "plain:pipe", "v1"},
		{"GET", "queue:k1"},
		{"GET", "plain:pipe"},
		{"INCR", "queue:n"},
		{"GET", "plain:k3"},
		{"GET", "queue:k2"},
		{"APPEND", "plain:pipe", "+2"},
	}
	for _, args := range pipeline {
		rawSend(t, nc, args...)
	}
	want := []string{"+OK\r\n", "", "$2\r\nv1\r\n", "", "$2\r\np3\r\n", "", ":4\r\n"}
	for i, args := range pipeline {
		got := rawRead(t, nc)
		switch {
		case want[i] == "" && !upstreamFailure(got):
			t.Errorf("pipeline reply %d (%v) = %q, want the proxy's upstream error", i, args, got)
		case want[i] != "" && got != want[i]:
			t.Errorf("pipeline reply %d (%v) = %q, want %q", i, args, got, want[i])
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	r.queue.Thaw(t)
	thawed = true
	redistest.Eventually(t, 10*time.Second, func() bool {
		v, err := r.c.Get(ctx, "queue:k1").Result()
		return err == nil && v == "q1"
	}, "the queue upstream never answered again after SIGCONT")
	// Both routes, several clients, every value its own.
	var wg2 sync.WaitGroup
	errs2 := make(chan error, 2*workers)
	for w := range workers {
		wg2.Add(1)
		go func() {
			defer wg2.Done()
			c := client()
			for i := range rounds {
				for _, prefix := range []string{"queue:", "plain:"} {
					key, val := fmt.Sprintf("%saw%d", prefix, w), fmt.Sprintf("%s%d-%d", prefix, w, i)
					if err := c.Set(ctx, key, val, 0).Err(); err != nil {
						errs2 <- fmt.Errorf("worker %d after thaw: SET %s: %v", w, key, err)
						return
					}
					if got, err := c.Get(ctx, key).Result(); err != nil || got != val {
						errs2 <- fmt.Errorf("worker %d after thaw: GET %s = %q, %v; want %q", w, key, got, err, val)
						return
					}
				}
			}
		}()
	}
	wg2.Wait()
	close(errs2)
	for err := range errs2 {
		t.Error(err)
	}
	for i := range keys {
		if v, err := r.c.Get(ctx, fmt.Sprint("queue:k", i)).Result(); err != nil || v != fmt.Sprint("q", i) {
			t.Errorf("queue:k%d after thaw = %q, %v", i, v, err)
		}
	}
	if got := r.holds(t, "queue:aw0"); got != "queue" {
		t.Errorf("queue:aw0 is on %q after thaw, want queue", got)
	}
	// The INCR of the frozen pipeline either never ran or ran once;
	// nothing else wrote queue:n.
	if n, err := r.queue.Client(t).Get(ctx, "queue:n").Int(); err != nil && err != redis.Nil || n > 1 {
		t.Errorf("queue:n = %d, %v on the queue server", n, err)
	}
}

// TestRoutesCrossRouteMultiWhatIsSent pins down what reaches the servers
// when a transaction's keys route to two upstreams (docs/COMPATIBILITY.md,
// Routes, MULTI/EXEC): nothing. The proxy holds the transaction until
// EXEC, so whether the command routing elsewhere is the first keyed one
// or comes after others, the transaction fails (EXECABORT) before any
// upstream sees MULTI, EXEC or any of its commands.
func TestRoutesCrossRouteMultiWhatIsSent(t *testing.T) {
	r := startRouted(t, nil)
	reset := func() {
		for _, rs := range []*redistest.Server{r.def, r.queue} {
			if err := rs.Client(t).ConfigResetStat(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	nc := dialAddr(t, r.p.Addr)

	// The first keyed command spans two routes: refused before any
	// upstream is chosen.
	reset()
	for _, step := range []struct{ args []string }{
		{[]string{"MULTI"}}, {[]string{"PING"}}, {[]string{"MSETNX", "queue:a", "1", "plain:b", "2"}},
	} {
		rawSend(t, nc, step.args...)
	}
	for i, want := range []string{"+OK\r\n", "+QUEUED\r\n", "-CROSSROUTE"} {
		if got := rawRead(t, nc); !strings.HasPrefix(got, want) {
			t.Fatalf("reply %d = %q, want %q...", i, got, want)
		}
	}
	if got := rawDo(t, nc, "EXEC"); !strings.HasPrefix(got, "-EXECABORT") {
		t.Fatalf("EXEC = %q, want EXECABORT", got)
	}
	for _, rs := range []*redistest.Server{r.def, r.queue} {
		for _, name := range []string{"multi", "ping", "msetnx", "exec"} {
			if n := calls(t, rs, name); n != 0 {
				t.Errorf("first keyed command cross-route: %s reached %s %d times, want none", name, rs.Addr(), n)
			}
		}
	}

	// The other route's key comes later, after a keyed command and in
	// another write: still nothing is sent.
	reset()
	for _, args := range [][]string{{"MULTI"}, {"SET", "queue:x", "1"}, {"INCR", "queue:n"}} {
		rawSend(t, nc, args...)
	}
	for i, want := range []string{"+OK\r\n", "+QUEUED\r\n", "+QUEUED\r\n"} {
		if got := rawRead(t, nc); got != want {
			t.Fatalf("reply %d = %q, want %q", i, got, want)
		}
	}
	if got := rawDo(t, nc, "SET", "plain:y", "2"); !strings.HasPrefix(got, "-CROSSROUTE") {
		t.Fatalf("SET of the other route = %q, want CROSSROUTE", got)
	}
	if got := rawDo(t, nc, "EXEC"); !strings.HasPrefix(got, "-EXECABORT") {
		t.Fatalf("EXEC = %q, want EXECABORT", got)
	}
	for _, rs := range []*redistest.Server{r.def, r.queue} {
		for _, name := range []string{"multi", "exec", "set", "incr", "discard"} {
			if n := calls(t, rs, name); n != 0 {
				t.Errorf("later command cross-route: %s reached %s %d times, want none", name, rs.Addr(), n)
			}
		}
	}
	for _, key := range []string{"queue:x", "plain:y", "queue:a", "plain:b", "queue:n"} {
		if got := r.holds(t, key); got != "" {
			t.Errorf("%s was written on %q", key, got)
		}
	}
	// The connection is usable afterwards, for either route.
	if got := rawDo(t, nc, "SET", "queue:x", "ok"); got != "+OK\r\n" {
		t.Fatalf("SET after the aborted transaction: %q", got)
	}
	if got := rawDo(t, nc, "GET", "plain:y"); got != "$-1\r\n" {
		t.Fatalf("GET after the aborted transaction: %q", got)
	}
}
