package proxy_test

import (
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/cluster"
	"github.com/redproxy/redproxy/internal/redistest"
)

// In cluster mode the WATCH that starts a transaction is sent alone, so a
// WATCH whose connection is lost before its reply leaves the rest of the
// client's write undispatched: it fails there, and a MULTI in it (answered
// +OK) keeps the transaction aborted until EXEC, as on a standalone upstream
// (TestWatchLostBeforeItsReplyLeavesNoTransaction). Found by review: the
// pin dropped, a MULTI, INCR, EXEC behind the lost WATCH committed
// unguarded. The next write is served as usual. The slot's owner
// announces a forwarder's port, which cuts the connection carrying WATCH.
func TestClusterWatchLostBeforeItsReply(t *testing.T) {
	c, p := startPubSubClusterProxy(t, 0)
	key := "{wl}k"
	slot := cluster.Slot([]byte(key))
	owner := p.Router().Map().Owner(slot)
	var node *redistest.Server
	for _, n := range c.Nodes {
		if n.Addr() == owner {
			node = n
		}
	}
	if node == nil {
		t.Fatalf("no node at %s", owner)
	}
	var armed atomic.Bool
	fwd := cutOnWatch(t, owner, &armed)
	_, port, _ := net.SplitHostPort(fwd)
	if err := node.Client(t).ConfigSet(ctx, "cluster-announce-port", port).Err(); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 30*time.Second, func() bool {
		p.Router().RefreshSoon()
		return p.Router().Map().Owner(slot) == fwd
	}, "the proxy never learnt the announced port")
	if err := node.Client(t).Set(ctx, key, "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	lost := respError("ERR redproxy: upstream connection lost")
	aborted := respError("ERR redproxy: transaction aborted")
	raw := dialRaw(t, p.Addr)
	wantReplies(t, raw, []string{"GET", key}, "1") // the node's shared connections are up
	armed.Store(true)
	wantReplies(t, raw, []string{"WATCH", key}, []string{"MULTI"}, []string{"INCR", key}, []string{"EXEC"},
		lost, "OK", aborted, respError("EXECABORT"))
	wantReplies(t, raw, []string{"WATCH", key}, lost)
	wantReplies(t, raw, []string{"GET", key}, []string{"PING"}, "1", "PONG")
	if v := node.Client(t).Get(ctx, key).Val(); v != "1" {
		t.Fatalf("%s = %q: the transaction behind the lost WATCH ran", key, v)
	}
}
