package proxy_test

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/cluster"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// A WATCH Redis refuses leaves no state there, and leaves the client
// unpinned here. The proxy kept the dedicated connection it had taken for
// the WATCH for as long as the client stayed (found by the cluster soak:
// after -CLUSTERDOWN, every later command of the client on another slot
// got -CROSSSLOT, and max_pinned turned other clients away). Here Redis
// refuses the WATCH with -NOPERM (the user's Redis ACL); with max_pinned
// 1, another client's transaction needs the connection.
func TestRefusedWatchLeavesNoPin(t *testing.T) {
	rs := redistest.Start(t)
	if err := rs.Client(t).Do(ctx, "ACL", "SETUSER", "redis-nowatch", "on", ">nw-pw", "~*", "&*", "+@all", "-watch").Err(); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "nw")
	if err := writeFileT(file, "nw-pw\n"); err != nil {
		t.Fatal(err)
	}
	p := proxytest.Start(t, rs, func(c *config.Config) {
		c.Upstream.MaxPinned = 1
		u := user("nowatch", appPass, "+@all ~* &*")
		u.UpstreamUser, u.UpstreamPasswordFile = "redis-nowatch", file
		c.Users = []auth.UserConfig{u, user("app", roPass, "+@all ~* &*")}
	})
	refused := dialRaw(t, p.Addr)
	wantReplies(t, refused, []string{"AUTH", "nowatch", appPass}, "OK")
	// As go-redis's Watch sends it: WATCH, then the read it guards.
	refused.send([]string{"WATCH", "wr:k"}, []string{"GET", "wr:k"})
	if got, _ := refused.readReply(); !isNoPerm(got) {
		t.Fatalf("WATCH answered %#v, want Redis's NOPERM", got)
	}
	if got, _ := refused.readReply(); got != nil {
		t.Fatalf("GET after the refused WATCH answered %#v", got)
	}
	other := dialRaw(t, p.Addr)
	wantReplies(t, other, []string{"AUTH", "app", roPass}, "OK")
	wantReplies(t, other, []string{"MULTI"}, []string{"SET", "wr:k", "1"}, []string{"EXEC"}, "OK", "QUEUED", []any{"OK"})
	// The refused client goes on as a client with nothing watched.
	wantReplies(t, refused, []string{"SET", "wr:k", "2"}, []string{"GET", "wr:k"}, "OK", "2")
}

func isNoPerm(reply any) bool {
	e, ok := reply.(respError)
	return ok && strings.HasPrefix(string(e), "NOPERM")
}

// In cluster mode: a WATCH its node answers -CLUSTERDOWN (as during a
// failover) bound the client's connection to the WATCH's slot, and every
// later command of it on a key of another slot got -CROSSSLOT, long after
// the cluster was healthy again (go-redis sends no UNWATCH after a WATCH
// that failed). Found by the cluster soak: 100-357 such errors after each
// unplanned failover.
func TestClusterRefusedWatchLeavesNoPin(t *testing.T) {
	c, p := startPubSubClusterProxy(t, 0)
	m := p.Router().Map()
	watched := "wr:a"
	owner := m.Owner(cluster.Slot([]byte(watched)))
	other := ""
	for i := 0; other == ""; i++ {
		if k := "wr:" + strconv.Itoa(i); m.Owner(cluster.Slot([]byte(k))) != owner {
			other = k
		}
	}
	var node *redistest.Server
	for _, n := range c.Nodes {
		if n.Addr() == owner {
			node = n
		}
	}
	// Another slot of the node, unassigned for a moment: its
	// cluster_state turns fail and it answers -CLUSTERDOWN.
	spare := -1
	for s := 0; spare < 0; s++ {
		if m.Owner(s) == owner && s != cluster.Slot([]byte(watched)) {
			spare = s
		}
	}
	nc := node.Client(t)
	if err := nc.Do(ctx, "CLUSTER", "DELSLOTS", spare).Err(); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 10*time.Second, func() bool {
		return strings.Contains(nc.ClusterInfo(ctx).Val(), "cluster_state:fail")
	}, "the node never failed")
	cl := redis.NewClient(&redis.Options{Addr: p.Addr, PoolSize: 1, MaxRetries: -1})
	defer cl.Close()
	err := cl.Watch(ctx, func(tx *redis.Tx) error { return nil }, watched)
	if err == nil || !strings.Contains(err.Error(), "CLUSTERDOWN") {
		t.Fatalf("WATCH on a failed node: %v, want CLUSTERDOWN", err)
	}
	// Pipelined behind the refused WATCH: a read of another node's key,
	// and a transaction on the failed node's. Redis refused the WATCH, so
	// what follows runs as it would on Redis: the read is answered, and
	// the transaction's SET is refused by the node in turn, aborting EXEC.
	// Taken for a lost WATCH, every command behind it failed with "its
	// upstream connection was lost" (found by a probe).
	raw := dialRaw(t, p.Addr)
	raw.send([]string{"WATCH", watched}, []string{"GET", other}, []string{"MULTI"},
		[]string{"SET", watched, "unguarded"}, []string{"EXEC"})
	replies := make([]any, 5)
	for i := range replies {
		replies[i], _ = raw.readReply()
	}
	if e, ok := replies[0].(respError); !ok || !strings.HasPrefix(string(e), "CLUSTERDOWN") {
		t.Fatalf("pipelined WATCH on the failed node answered %#v, want CLUSTERDOWN", replies[0])
	}
	if replies[1] != nil || replies[2] != "OK" {
		t.Fatalf("GET and MULTI behind the refused WATCH answered %#v, %#v; want nil, OK", replies[1], replies[2])
	}
	if e, ok := replies[3].(respError); ok && strings.Contains(string(e), "connection was lost") {
		t.Fatalf("SET queued behind the refused WATCH answered %q", e)
	}
	if _, ok := replies[4].(respError); !ok {
		t.Fatalf("EXEC of a transaction whose SET the failed node refuses answered %#v", replies[4])
	}
	if err := nc.Do(ctx, "CLUSTER", "ADDSLOTS", spare).Err(); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 10*time.Second, func() bool {
		return strings.Contains(nc.ClusterInfo(ctx).Val(), "cluster_state:ok")
	}, "the node never recovered")
	if err := cl.Set(ctx, other, "v", 0).Err(); err != nil {
		t.Fatalf("SET %s (another node's slot) after the refused WATCH: %v", other, err)
	}
	if v, err := nc.Get(ctx, watched).Result(); err != redis.Nil {
		t.Fatalf("the aborted transaction's SET ran: %q, %v", v, err)
	}
	if err := cl.Set(ctx, watched, "v", 0).Err(); err != nil {
		t.Fatalf("SET %s after the node recovered: %v", watched, err)
	}
}
