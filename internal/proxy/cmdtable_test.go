package proxy_test

import (
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/cluster"
	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// TestReloadReadsTheNewUpstreamsCommandTable: after a reload that points
// the proxy at another Redis, the command table is that server's, read
// from it in the background, not the one read at start. old stands for an
// older Redis: GETDEL is missing from its COMMAND reply (disabled with
// rename-command); cur has it. A client confined to a namespace shows
// which table is in force: a command the table does not know cannot have
// its keys prefixed and is refused by the proxy, while one it knows runs
// on the prefixed key. Before, the table read at start stayed until a
// restart: after the move to cur, GETDEL stayed refused; after the move
// back, it was forwarded with its prefixed key and Redis's error named
// the key outside the client's namespace.
func TestReloadReadsTheNewUpstreamsCommandTable(t *testing.T) {
	old := redistest.Start(t, "--rename-command", "GETDEL", "")
	cur := redistest.Start(t)
	oldTable, err := commands.Load(ctx, old.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	if oldTable.Get("getdel") != nil {
		t.Fatal("the server with GETDEL disabled still lists it in COMMAND")
	}
	app := user("app", nsPass, "+@all ~* allchannels")
	app.Namespace = "app:"
	p := proxytest.StartWithTable(t, old, oldTable, func(c *config.Config) { c.Users = []auth.UserConfig{app} })
	c := nsClient(t, p, "app", func(o *redis.Options) { o.PoolSize = 1 })

	const refused = "cannot be confined to a namespace"
	if _, err := c.GetDel(ctx, "k").Result(); err == nil || !strings.Contains(err.Error(), refused) {
		t.Fatalf("GETDEL through a table without it: %v, want the proxy's refusal (%q)", err, refused)
	}

	if err := cur.Client(t).Set(ctx, "app:k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// Another client pipelines while the tables are swapped, for -race:
	// its batches take the table in force as they start.
	load := nsClient(t, p, "app")
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			pipe := load.Pipeline()
			pipe.Set(ctx, "load", "x", 0)
			pipe.Get(ctx, "load")
			pipe.GetDel(ctx, "load")
			pipe.Exec(ctx) // GETDEL's answer depends on the table in force
		}
	}()
	defer func() { close(stop); <-done }()
	if _, err := p.Reload(reloaded(t, p, func(c *config.Config) { c.Upstream.Address = cur.Addr() })); err != nil {
		t.Fatal(err)
	}
	var got string
	redistest.Eventually(t, 10*time.Second, func() bool {
		got, err = c.GetDel(ctx, "k").Result()
		return err == nil
	}, "GETDEL was never taken for a command once the upstream was a server that has it (last answer: %v)", lazyErr{&err})
	if got != "v" {
		t.Fatalf("GETDEL k after the reload: %q, want %q (the namespaced key app:k)", got, "v")
	}
	if n, err := cur.Client(t).Exists(ctx, "app:k").Result(); err != nil || n != 0 {
		t.Fatalf("app:k on the new upstream after GETDEL: exists=%d (%v), want gone", n, err)
	}

	// And back: a server that lacks a command has it refused again, by
	// the proxy, rather than forwarded with the prefixed key.
	if _, err := p.Reload(reloaded(t, p, func(c *config.Config) { c.Upstream.Address = old.Addr() })); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 10*time.Second, func() bool {
		_, err = c.GetDel(ctx, "k").Result()
		return err != nil && strings.Contains(err.Error(), refused)
	}, "GETDEL was still taken for a command once the upstream was a server without it (last answer: %v)", lazyErr{&err})
	if _, err := c.Set(ctx, "k", "w", 0).Result(); err != nil {
		t.Fatalf("SET after the move back: %v", err)
	}
	if v, err := old.Client(t).Get(ctx, "app:k").Result(); err != nil || v != "w" {
		t.Fatalf("app:k on the old server: %q (%v), want %q", v, err, "w")
	}
}

// A proxy started before its Redis stands in the built-in table for the
// one Redis did not give (cmd/redproxy). Once a dial reaches Redis, that
// server's table is read: before, the stand-in was taken for its own, and
// a command the built-in table lacks (here GETDEL, as for a command of a
// newer Redis or a module) stayed unknown for good.
func TestStandInTableReplacedByTheUpstreamsOnceItAnswers(t *testing.T) {
	standIn := tableWithoutGETDEL(t)
	rs := redistest.Start(t)
	app := user("app", nsPass, "+@all ~* allchannels")
	app.Namespace = "app:"
	p := proxytest.StartStandIn(t, rs, standIn, func(c *config.Config) { c.Users = []auth.UserConfig{app} })
	c := nsClient(t, p, "app")
	if err := rs.Client(t).Set(ctx, "app:k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	getDelOnceKnown(t, c, "upstream")
	if n, err := rs.Client(t).Exists(ctx, "app:k").Result(); err != nil || n != 0 {
		t.Fatalf("app:k after GETDEL: exists=%d (%v), want gone", n, err)
	}
}

// lazyErr prints the error *e holds when the message is made.
type lazyErr struct{ e *error }

func (l lazyErr) String() string {
	if *l.e == nil {
		return "<nil>"
	}
	return (*l.e).Error()
}

// TestSentinelFailoverReadsTheNewPrimarysCommandTable: after a failover
// the command table is the new primary's. The replica promoted stands for
// a server of another version: GETDEL is missing from its COMMAND reply.
// Before, the proxy kept the old primary's table, which has GETDEL: a
// namespaced client's GETDEL was forwarded with its prefixed key, and
// Redis's "unknown command" error named the key outside its namespace.
func TestSentinelFailoverReadsTheNewPrimarysCommandTable(t *testing.T) {
	g := redistest.StartSentinelGroup(t, redistest.SentinelOptions{Replicas: 1, ReplicaArgs: []string{"--rename-command", "GETDEL", ""}})
	old := g.Nodes[0]
	app := user("app", nsPass, "+@all ~* allchannels")
	app.Namespace = "app:"
	p := proxytest.Start(t, old, func(c *config.Config) {
		sentinelConfig(g, g.SentinelAddrs())(c)
		c.Users = []auth.UserConfig{app}
	})
	c := nsClient(t, p, "app", func(o *redis.Options) { o.PoolSize = 1 })
	if err := c.GetDel(ctx, "k").Err(); err != redis.Nil {
		t.Fatalf("GETDEL of a missing key on the first primary: %v, want a nil reply", err)
	}

	g.Failover(t)
	next := g.WaitNewPrimary(t, old, 30*time.Second)
	redistest.Eventually(t, 10*time.Second, func() bool { return p.SentinelPrimary() == next.Addr() },
		"the proxy did not follow to %s", next.Addr())
	const refused = "cannot be confined to a namespace"
	var err error
	redistest.Eventually(t, 10*time.Second, func() bool {
		err = c.GetDel(ctx, "k").Err()
		return err != nil && strings.Contains(err.Error(), refused)
	}, "GETDEL was still taken for a command on a primary without it (last answer: %v)", lazyErr{&err})
}

// TestUnreadableCommandTableKeepsTheOldOne: a new upstream whose table
// cannot be read (COMMAND disabled, as an ACL may deny it) leaves the
// table in force as it was, and says so once, however many connections
// to it are dialled. The old table (which has GETDEL) still classifies: a
// namespaced client's GETDEL goes on to Redis, which does not know it.
func TestUnreadableCommandTableKeepsTheOldOne(t *testing.T) {
	var logs redistest.LogBuffer
	a := redistest.Start(t)
	b := redistest.Start(t, "--rename-command", "COMMAND", "", "--rename-command", "GETDEL", "")
	cfg := config.Default()
	cfg.Server.Listen, cfg.Server.Admin, cfg.Upstream.Address = "127.0.0.1:0", "", a.Addr()
	cfg.Upstream.Connections = 4
	app := user("app", nsPass, "+@all ~* allchannels")
	app.Namespace = "app:"
	cfg.Users = []auth.UserConfig{app}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	srv, ln := serveLogged(t, cfg, metrics.New(), slog.NewTextHandler(&logs, nil))
	redistest.Eventually(t, 5*time.Second, srv.Ready, "the proxy never reached %s", a.Addr())
	next := *cfg
	next.Upstream.Address = b.Addr()
	if _, err := srv.Reload(&next); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), Username: "app", Password: nsPass, MaxRetries: -1, PoolSize: 1})
	defer c.Close()
	// Connections of both protocols and two databases: more dials of b.
	c3 := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), Username: "app", Password: nsPass, MaxRetries: -1, PoolSize: 1, Protocol: 3, DB: 1})
	defer c3.Close()
	if err := c3.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	const warning = "cannot read the upstream's command table"
	redistest.Eventually(t, 10*time.Second, func() bool { return strings.Contains(logs.String(), warning) },
		"no warning that the new upstream's table could not be read; log:\n%s", &logs)
	err := c.GetDel(ctx, "k").Err()
	if err == nil || !strings.Contains(err.Error(), "unknown command 'getdel'") {
		t.Fatalf("GETDEL with the old table kept: %v, want Redis's unknown command error", err)
	}
	if v, err := c3.Get(ctx, "k").Result(); err != nil || v != "v" {
		t.Fatalf("GET after the failed read: %q, %v", v, err)
	}
	if n := strings.Count(logs.String(), warning); n != 1 {
		t.Fatalf("%d warnings that the table could not be read, want 1; log:\n%s", n, &logs)
	}
}

// TestClusterStandInTableReplacedOnceTheClusterAnswers: in cluster mode the
// table stayed the one the proxy started with, for the sessions and for
// the router: a proxy started while the cluster could not be asked kept the
// built-in table for good (found by review). The stand-in here lacks
// GETDEL, as an older Redis's would; the cluster has it.
func TestClusterStandInTableReplacedOnceTheClusterAnswers(t *testing.T) {
	standIn := tableWithoutGETDEL(t)
	cl := redistest.StartCluster(t, 3, 0)
	app := user("app", nsPass, "+@all ~* allchannels")
	app.Namespace = "app:"
	p := proxytest.StartStandIn(t, cl.Nodes[0], standIn, func(c *config.Config) {
		c.Upstream.Mode = config.ModeCluster
		c.Upstream.Seeds = cl.Seeds()
		c.Users = []auth.UserConfig{app}
	})
	c := nsClient(t, p, "app")
	direct := cl.ClusterClient(t)
	if err := direct.Set(ctx, "app:k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	getDelOnceKnown(t, c, "cluster")
	if n, err := direct.Exists(ctx, "app:k").Result(); err != nil || n != 0 {
		t.Fatalf("app:k after GETDEL: exists=%d (%v), want gone", n, err)
	}
	// The router plans with the new table too: a command it does not know
	// goes to any node and is redirected (MOVED) wherever its key lives
	// elsewhere; one it knows goes to its key's node.
	for i := range 30 {
		if err := direct.Set(ctx, fmt.Sprintf("app:k%d", i), "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if n := redirectedGetDels(t, p.Router(), c, "k"); n != 0 {
		t.Errorf("%d GETDELs were redirected: the router plans with the stand-in table, which lacks GETDEL", n)
	}
}

// TestRoutesStandInTableReachesANamedCluster: a named cluster upstream's
// router plans with the table the sessions classify with, the one read
// from [upstream] once it answers, not the one in force when the router
// was built.
func TestRoutesStandInTableReachesANamedCluster(t *testing.T) {
	standIn := tableWithoutGETDEL(t)
	cl := redistest.StartCluster(t, 3, 0)
	def := redistest.Start(t)
	p := proxytest.StartStandIn(t, def, standIn, func(c *config.Config) {
		routeBigToCluster(c, cl)
	})
	c := p.Client(t)
	direct := cl.ClusterClient(t)
	for i := range 30 {
		if err := direct.Set(ctx, fmt.Sprintf("big:k%d", i), "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	redistest.Eventually(t, 10*time.Second, func() bool { return p.CommandTable().Get("getdel") != nil },
		"the table of [upstream] was never read")
	if n := redirectedGetDels(t, p.UpstreamRouter("big"), c, "big:k"); n != 0 {
		t.Errorf("%d GETDELs were redirected: the named cluster's router plans with the stand-in table, which lacks GETDEL", n)
	}
}

// TestClusterStartedWithoutItsFirstSeedFollowsTheCluster: every node down
// at the start (here frozen) points the proxy's own connections at the
// first seed, which here never comes up; once the rest of the cluster
// answers, they move to a primary of its map, whose command table is then
// read. Before, they dialled the dead seed for good and the stand-in table
// stayed (found by review, 2026-12-06).
func TestClusterStartedWithoutItsFirstSeedFollowsTheCluster(t *testing.T) {
	standIn := tableWithoutGETDEL(t)
	cl := redistest.StartCluster(t, 3, 0)
	dead := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	thaw := redistest.FreezeAll(t, cl.Nodes...)
	app := user("app", nsPass, "+@all ~* allchannels")
	app.Namespace = "app:"
	p := proxytest.StartUnreadyStandIn(t, standIn, func(c *config.Config) {
		c.Upstream.Mode = config.ModeCluster
		c.Upstream.Seeds = append([]string{dead}, cl.Seeds()...)
		c.Upstream.ReplyTimeout = units.Duration{Duration: 200 * time.Millisecond}
		c.Upstream.DialTimeout = units.Duration{Duration: 200 * time.Millisecond}
		c.Users = []auth.UserConfig{app}
	})
	if got := p.Backend().Addr(); got != dead {
		t.Fatalf("with no map at the start the proxy's own connections went to %s, want the first seed %s", got, dead)
	}
	thaw()
	redistest.Eventually(t, 30*time.Second, func() bool { return p.Backend().Addr() != dead },
		"the proxy's own connections stayed on the first seed, which never came up")
	c := nsClient(t, p, "app")
	if err := cl.ClusterClient(t).Set(ctx, "app:k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	getDelOnceKnown(t, c, "cluster")
}

// tableWithoutGETDEL is the command table of a Redis with GETDEL disabled,
// standing for an older Redis's: a table that stands in for the upstream's
// at the start and lacks one of its commands.
func tableWithoutGETDEL(t *testing.T) *commands.Table {
	t.Helper()
	without := redistest.Start(t, "--rename-command", "GETDEL", "")
	table, err := commands.Load(ctx, without.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	if table.Get("getdel") != nil {
		t.Fatal("the server with GETDEL disabled still lists it in COMMAND")
	}
	return table
}

// redirectedGetDels counts the MOVED redirections r followed for a GETDEL
// of each key (prefix0 .. prefix29, holding "v" on the cluster): none when
// r plans GETDEL with a table that knows it, one for each key of another
// node than the one a command it does not know is sent to.
func redirectedGetDels(t *testing.T, r *cluster.Router, c *redis.Client, prefix string) uint64 {
	t.Helper()
	moved0, _, _ := r.Stats()
	for i := range 30 {
		if v, err := c.GetDel(ctx, prefix+strconv.Itoa(i)).Result(); err != nil || v != "v" {
			t.Fatalf("GETDEL %s%d: %q, %v", prefix, i, v, err)
		}
	}
	moved, _, _ := r.Stats()
	return moved - moved0
}

// getDelOnceKnown waits until the namespaced client c's GETDEL k is taken
// for a command (the table in force has it, as the upstream does) and
// checks that it returned app:k's "v".
func getDelOnceKnown(t *testing.T, c *redis.Client, upstream string) {
	t.Helper()
	var (
		got string
		err error
	)
	redistest.Eventually(t, 10*time.Second, func() bool {
		got, err = c.GetDel(ctx, "k").Result()
		return err == nil
	}, "GETDEL was never taken for a command although the %s has it (last answer: %v)", upstream, lazyErr{&err})
	if got != "v" {
		t.Fatalf("GETDEL k: %q, want %q (the namespaced key app:k)", got, "v")
	}
}
