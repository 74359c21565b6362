package proxy_test

// A pinned or borrowed connection goes back to the pool only in the
// state the next client expects, and a blocked client that left is
// noticed (found by a review of transactions and blocking commands).

import (
	"fmt"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// DISCARD with an argument is a wrong-arity error inside MULTI, which goes
// on (and so EXEC aborts), as on Redis. The proxy released the pin anyway,
// and the next client to borrow a connection got the open MULTI: its
// BLPOP was answered QUEUED.
func TestDiscardWithAnArgumentKeepsTheTransaction(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	seq := [][]string{{"MULTI"}, {"SET", "victim", "from-A"}, {"DISCARD", "x"}, {"EXEC"}}
	viaProxy, direct := dialRaw(t, p.Addr), dialRaw(t, p.Redis.Addr())
	for _, cmd := range seq {
		if got, want := fmt.Sprint(viaProxy.do(cmd...)), fmt.Sprint(direct.do(cmd...)); got != want {
			t.Errorf("%v: proxy %q, Redis %q", cmd, got, want)
		}
	}
	a := dialRaw(t, p.Addr)
	a.do("MULTI")
	a.do("SET", "victim", "from-A")
	a.do("DISCARD", "x")
	if v := dialRaw(t, p.Addr).do("BLPOP", "q", "1"); v != nil {
		t.Fatalf("another client's BLPOP q 1 = %v, want nil: it got the open MULTI", v)
	}
}

// UNWATCH with an argument is refused by Redis and the WATCH stays; the
// proxy released the pin, and the next client's transaction on that
// connection was aborted by the leftover WATCH.
func TestUnwatchWithAnArgumentKeepsTheWatch(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	a := dialRaw(t, p.Addr)
	a.do("WATCH", "k")
	a.do("UNWATCH", "x")
	if err := p.Redis.Client(t).Set(ctx, "k", "touched", 0).Err(); err != nil {
		t.Fatal(err)
	}
	b := dialRaw(t, p.Addr)
	var out []any
	for _, cmd := range [][]string{{"WATCH", "other"}, {"MULTI"}, {"SET", "z", "1"}, {"EXEC"}} {
		out = append(out, b.do(cmd...))
	}
	if v := p.Redis.Client(t).Get(ctx, "z").Val(); v != "1" {
		t.Fatalf("another client's transaction was aborted by the leftover WATCH: %v", out)
	}
}

// A client blocked in BLPOP that pipelines more and then closes is gone:
// Redis reads to the end and frees it. The proxy's peek saw the pipelined
// byte before the FIN and kept the borrowed connection blocked, so the
// next push was popped for a closed socket and lost.
func TestBlockedClientThatPipelinedMoreThenLeft(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	direct := p.Redis.Client(t)
	c := dialRaw(t, p.Addr)
	c.send([]string{"BLPOP", "gone:q", "0"})
	redistest.Eventually(t, 5*time.Second, func() bool { return blockedClients(direct) == 1 }, "the BLPOP never blocked")
	c.send([]string{"PING"})
	c.nc.Close()
	redistest.Eventually(t, 5*time.Second, func() bool { return blockedClients(direct) == 0 },
		"the BLPOP of a client that left is still blocked in Redis")
	if err := direct.RPush(ctx, "gone:q", "x").Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := direct.LLen(ctx, "gone:q").Result(); err != nil || n != 1 {
		t.Fatalf("LLEN = %d, %v: the element was popped for a client that had left", n, err)
	}
}

// An element pushed right after a blocked worker left is not lost: on
// Redis the worker's close reaches Redis before the push does. The proxy,
// which saw the worker leave only at its next 50 ms check, kept its
// connection blocked meanwhile and popped the element for nobody (found
// by review: 8 pushes in 10 lost). Now it sees the leaving at once, and
// puts back what was popped in the moment before Redis read its close
// (requeue.go). The push goes through the proxy, as a producer's would,
// and straight to Redis.
func TestBlockedClientThatLeftLosesNoPush(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	direct := p.Redis.Client(t)
	producer := dialRaw(t, p.Addr)
	lost := 0
	for i := range 40 {
		key := fmt.Sprintf("gone:now:%d", i)
		c := dialRaw(t, p.Addr)
		c.send([]string{"BLPOP", key, "0"})
		redistest.Eventually(t, 5*time.Second, func() bool { return blockedClients(direct) == 1 }, "the BLPOP never blocked")
		c.nc.Close()
		if i%2 == 0 {
			wantReplies(t, producer, []string{"RPUSH", key, "job"}, int64(1))
		} else if err := direct.RPush(ctx, key, "job").Err(); err != nil {
			t.Fatal(err)
		}
		// Popped for the worker that left, it is put back a moment later.
		deadline := time.Now().Add(5 * time.Second)
		for direct.LLen(ctx, key).Val() != 1 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if v, err := direct.LRange(ctx, key, 0, -1).Result(); err != nil || len(v) != 1 || v[0] != "job" {
			t.Logf("%s: %q, %v", key, v, err)
			lost++
		}
	}
	if lost > 0 {
		t.Fatalf("%d of 40 elements pushed right after their worker left were popped for nobody", lost)
	}
}
