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
	if err := nc.Do(ctx, "CLUSTER", "ADDSLOTS", spare).Err(); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 10*time.Second, func() bool {
		return strings.Contains(nc.ClusterInfo(ctx).Val(), "cluster_state:ok")
	}, "the node never recovered")
	if err := cl.Set(ctx, other, "v", 0).Err(); err != nil {
		t.Fatalf("SET %s (another node's slot) after the refused WATCH: %v", other, err)
	}
	if err := cl.Set(ctx, watched, "v", 0).Err(); err != nil {
		t.Fatalf("SET %s after the node recovered: %v", watched, err)
	}
}
