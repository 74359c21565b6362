package proxy_test

import (
	"bufio"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/resp"
)

// TestReviewRelayedWriteNotReadYourWrites: a RESP3 client may write while
// subscribed (the proxy relays its commands on the subscription's
// connection, to the primary). After it unsubscribes from everything the
// proxy hands it back to the shared path, where its reads go to replicas
// again, but the write it made on the relay was never noted for
// read-your-writes (relayhooks.go tells the local tier and the miss holds
// of relayed writes, not the replica reads): its GET right after is served
// by a replica that lacks its own acknowledged SET.
func TestReviewRelayedWriteNotReadYourWrites(t *testing.T) {
	r := startRoutedReplicas(t, 10*time.Second)
	nc := r.p.Dial(t)
	roundTrip := rawRoundTrip(t, nc)
	roundTrip(1, []string{"HELLO", "3"})
	for _, k := range []string{"a:rw", "b:rw"} {
		roundTrip(1, []string{"SET", k, "old"})
	}
	r.seed(t, 1) // the replicas have caught up with everything so far
	// This client reads from the replicas once its poll has passed.
	for _, rt := range r.ownRoutes("rw") {
		before := calls(t, rt.replica, "get")
		redistest.Eventually(t, 10*time.Second, func() bool {
			roundTrip(1, []string{"GET", rt.key})
			return calls(t, rt.replica, "get") > before
		}, "%s's replica never served this client", rt.key)
	}
	for _, rt := range r.ownRoutes("rw") {
		release := holdReplication(t, rt.replica, rt.primary)
		defer release()
	}
	// Subscribed on [upstream] (no channel routes): the relay runs on it,
	// so a:rw (default route) may be written there.
	out := roundTrip(3, []string{"SUBSCRIBE", "news"}, []string{"SET", "a:rw", "new"}, []string{"UNSUBSCRIBE", "news"})
	if !strings.Contains(out[1], "OK") {
		t.Fatalf("SET on the relay: %q", out)
	}
	if v, _ := r.def.primary.Client(t).Get(ctx, "a:rw").Result(); v != "new" {
		t.Fatalf("primary has a:rw = %q", v)
	}
	stale, reads := 0, 0
	first := ""
	for until := time.Now().Add(300 * time.Millisecond); time.Now().Before(until); {
		got := roundTrip(1, []string{"GET", "a:rw"})[0]
		reads++
		if !strings.Contains(got, "new") {
			if stale++; stale == 1 {
				first = strings.ReplaceAll(got, "\r\n", " ")
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	if stale > 0 {
		t.Fatalf("%d of %d GET a:rw after the client's own acknowledged SET a:rw new (made while subscribed) answered the old value (first: %s)", stale, reads, first)
	}
}

// TestReviewRelayedWriteNotReadYourWritesNoRoutes: the same without
// routes, [upstream] reading from its replica.
func TestReviewRelayedWriteNotReadYourWritesNoRoutes(t *testing.T) {
	g := startReplicated(t, 1)
	p := g.proxy(t, config.ReadReplicaPreferred, func(c *config.Config) {
		c.Upstream.MaxReplicaLag = units.Duration{Duration: 10 * time.Second}
	})
	redistest.Eventually(t, 10*time.Second, func() bool { return p.UsableReplicas() == 1 }, "replica never usable")
	nc := p.Dial(t)
	roundTrip := rawRoundTrip(t, nc)
	roundTrip(1, []string{"HELLO", "3"})
	roundTrip(1, []string{"SET", "k", "old"})
	before := calls(t, g.replicas[0], "get")
	redistest.Eventually(t, 10*time.Second, func() bool {
		got := roundTrip(1, []string{"GET", "k"})[0]
		return strings.Contains(got, "old") && calls(t, g.replicas[0], "get") > before
	}, "the replica never served this client")
	release := holdReplication(t, g.replicas[0], g.primary)
	defer release()
	out := roundTrip(3, []string{"SUBSCRIBE", "news"}, []string{"SET", "k", "new"}, []string{"UNSUBSCRIBE", "news"})
	if !strings.Contains(out[1], "OK") {
		t.Fatalf("SET on the relay: %q", out)
	}
	stale, reads := 0, 0
	for until := time.Now().Add(300 * time.Millisecond); time.Now().Before(until); {
		reads++
		if got := roundTrip(1, []string{"GET", "k"})[0]; !strings.Contains(got, "new") {
			stale++
		}
		time.Sleep(2 * time.Millisecond)
	}
	if stale > 0 {
		t.Fatalf("%d of %d GET k after the client's own acknowledged SET k new (made while subscribed) answered the old value", stale, reads)
	}
}

// rawCmds encodes cmds as one pipelined write.
func rawCmds(cmds ...[]string) []byte {
	var b []byte
	for _, c := range cmds {
		b = resp.AppendCommandStrings(b, c...)
	}
	return b
}

// rawRoundTrip returns a function that writes cmds on nc in one write and
// reads want replies, as raw frames.
func rawRoundTrip(t *testing.T, nc net.Conn) func(want int, cmds ...[]string) []string {
	br := bufio.NewReader(nc)
	return func(want int, cmds ...[]string) []string {
		t.Helper()
		nc.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := nc.Write(rawCmds(cmds...)); err != nil {
			t.Fatal(err)
		}
		var out []string
		for range want {
			f, err := readDiffFrame(br, nil)
			if err != nil {
				t.Fatalf("%v: read: %v (so far %q)", cmds, err, out)
			}
			out = append(out, string(f))
		}
		return out
	}
}
