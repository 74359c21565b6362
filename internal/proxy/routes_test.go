package proxy_test

import (
	"bytes"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// routed is a proxy in front of three redis-servers: [upstream] (def),
// [upstreams.queue] for queue:* keys and jobs.* channels, and
// [upstreams.cache] for cache:* keys.
type routed struct {
	p                *proxytest.Proxy
	def, queue, cach *redistest.Server
	c                *redis.Client
}

func namedUpstream(addr string) config.Upstream {
	u := config.Default().Upstream
	u.Address = addr
	u.Connections = 2
	u.ReconnectMin = units.Duration{Duration: 10 * time.Millisecond}
	u.ReconnectMax = units.Duration{Duration: 100 * time.Millisecond}
	return u
}

// routeBigToCluster routes the keys big:* to a named upstream "big" that
// is cluster cl.
func routeBigToCluster(c *config.Config, cl *redistest.Cluster) {
	u := namedUpstream("")
	u.Mode, u.Address, u.Seeds = config.ModeCluster, "", cl.Seeds()
	c.Upstreams = map[string]config.Upstream{"big": u}
	c.Routes = []config.Route{{Pattern: "big:*", Upstream: "big"}}
}

func startRouted(t testing.TB, mutate func(*config.Config)) *routed {
	t.Helper()
	return startRoutedAfter(t, nil, mutate)
}

// startRoutedAfter is startRouted with setup run on the servers before
// the proxy starts.
func startRoutedAfter(t testing.TB, setup func(*routed), mutate func(*config.Config)) *routed {
	t.Helper()
	r := &routed{def: redistest.Start(t), queue: redistest.Start(t), cach: redistest.Start(t)}
	if setup != nil {
		setup(r)
	}
	r.p = proxytest.Start(t, r.def, func(c *config.Config) {
		c.Upstreams = map[string]config.Upstream{
			"queue": namedUpstream(r.queue.Addr()),
			"cache": namedUpstream(r.cach.Addr()),
		}
		c.Routes = []config.Route{{Pattern: "queue:*", Upstream: "queue"}, {Pattern: "cache:*", Upstream: "cache"}}
		c.ChannelRoutes = []config.Route{{Pattern: "jobs.*", Upstream: "queue"}}
		if mutate != nil {
			mutate(c)
		}
	})
	r.c = r.p.Client(t)
	return r
}

// holds reports which of the three servers hold key.
func (r *routed) holds(t *testing.T, key string) string {
	t.Helper()
	var where []string
	for _, s := range []struct {
		name string
		rs   *redistest.Server
	}{{"default", r.def}, {"queue", r.queue}, {"cache", r.cach}} {
		n, err := s.rs.Client(t).Exists(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			where = append(where, s.name)
		}
	}
	return strings.Join(where, ",")
}

// TestRoutesKeysLandOnTheirUpstream: each key is written to the server of
// the first route matching it, and only there; unmatched keys go to
// [upstream]; reads come back from the same server.
func TestRoutesKeysLandOnTheirUpstream(t *testing.T) {
	r := startRouted(t, nil)
	for key, want := range map[string]string{"queue:1": "queue", "cache:1": "cache", "plain:1": "default", "queue": "default"} {
		if err := r.c.Set(ctx, key, "v-"+key, 0).Err(); err != nil {
			t.Fatal(err)
		}
		if got := r.holds(t, key); got != want {
			t.Errorf("%s is on %q, want %q", key, got, want)
		}
		if v, err := r.c.Get(ctx, key).Result(); err != nil || v != "v-"+key {
			t.Errorf("GET %s = %q, %v", key, v, err)
		}
	}
	// A pipeline mixing routes is answered in order.
	pipe := r.c.Pipeline()
	g1 := pipe.Get(ctx, "cache:1")
	g2 := pipe.Incr(ctx, "queue:n")
	g3 := pipe.Get(ctx, "plain:1")
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	if g1.Val() != "v-cache:1" || g2.Val() != 1 || g3.Val() != "v-plain:1" {
		t.Fatalf("pipeline replies out of order: %q %d %q", g1.Val(), g2.Val(), g3.Val())
	}
	// SELECT applies on every upstream.
	db3 := r.p.Client(t, func(o *redis.Options) { o.DB = 3 })
	if err := db3.Set(ctx, "queue:db3", "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	direct := redis.NewClient(&redis.Options{Addr: r.queue.Addr(), DB: 3})
	defer direct.Close()
	if v, err := direct.Get(ctx, "queue:db3").Result(); err != nil || v != "x" {
		t.Fatalf("queue:db3 in DB 3 of the queue server: %q %v", v, err)
	}
}

// TestRoutesSplitMultiKey: MSET, MGET, DEL, EXISTS, TOUCH and UNLINK
// whose keys route to different upstreams are split per upstream and
// their replies merged in the client's key order.
func TestRoutesSplitMultiKey(t *testing.T) {
	r := startRouted(t, nil)
	if err := r.c.MSet(ctx, "queue:a", "1", "plain:b", "2", "cache:c", "3", "queue:d", "4").Err(); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{"queue:a": "queue", "plain:b": "default", "cache:c": "cache", "queue:d": "queue"} {
		if got := r.holds(t, key); got != want {
			t.Errorf("%s is on %q, want %q", key, got, want)
		}
	}
	vals, err := r.c.MGet(ctx, "cache:c", "queue:d", "nope", "plain:b", "queue:a", "cache:missing").Result()
	if err != nil {
		t.Fatal(err)
	}
	want := []any{"3", "4", nil, "2", "1", nil}
	if fmt.Sprint(vals) != fmt.Sprint(want) {
		t.Fatalf("MGET = %v, want %v", vals, want)
	}
	if n, err := r.c.Exists(ctx, "queue:a", "plain:b", "cache:c", "cache:none", "queue:a").Result(); err != nil || n != 4 {
		t.Fatalf("EXISTS = %d, %v; want 4", n, err)
	}
	if n, err := r.c.Touch(ctx, "queue:a", "cache:c").Result(); err != nil || n != 2 {
		t.Fatalf("TOUCH = %d, %v; want 2", n, err)
	}
	if n, err := r.c.Del(ctx, "queue:a", "plain:b", "nope").Result(); err != nil || n != 2 {
		t.Fatalf("DEL = %d, %v; want 2", n, err)
	}
	if n, err := r.c.Unlink(ctx, "cache:c", "queue:d").Result(); err != nil || n != 2 {
		t.Fatalf("UNLINK = %d, %v; want 2", n, err)
	}
	for _, key := range []string{"queue:a", "plain:b", "cache:c", "queue:d"} {
		if got := r.holds(t, key); got != "" {
			t.Errorf("%s still on %q", key, got)
		}
	}
}

// TestRoutesCrossRouteRefusedBeforeSending: a command that cannot be
// split (MSETNX, EVAL, BLPOP) or a transaction whose keys route to two
// upstreams fails with an error naming both routes, and none of it runs
// on either server.
func TestRoutesCrossRouteRefusedBeforeSending(t *testing.T) {
	r := startRouted(t, nil)
	for _, rs := range []*redistest.Server{r.def, r.queue} {
		if err := rs.Client(t).ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	err := r.c.MSetNX(ctx, "queue:x", "1", "plain:y", "2").Err()
	if err == nil || !strings.Contains(err.Error(), "CROSSROUTE") || !strings.Contains(err.Error(), `"queue:*" -> queue`) || !strings.Contains(err.Error(), "default") {
		t.Fatalf("cross-route MSETNX: %v", err)
	}
	err = r.c.Eval(ctx, "redis.call('set', KEYS[1], 1); redis.call('set', KEYS[2], 1)", []string{"plain:y", "queue:x"}).Err()
	if err == nil || !strings.Contains(err.Error(), "CROSSROUTE") {
		t.Fatalf("cross-route EVAL: %v", err)
	}
	start := time.Now()
	err = r.c.BLPop(ctx, 5*time.Second, "queue:l", "plain:l").Err()
	if err == nil || !strings.Contains(err.Error(), "CROSSROUTE") {
		t.Fatalf("cross-route BLPOP: %v", err)
	}
	if time.Since(start) >= 5*time.Second {
		t.Fatal("cross-route BLPOP blocked instead of failing at once")
	}

	// A transaction: the second route's key makes EXEC fail.
	var queued []redis.Cmder
	_, err = r.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		queued = append(queued, p.Set(ctx, "queue:x", "1", 0), p.Set(ctx, "plain:y", "2", 0))
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "EXECABORT") {
		t.Fatalf("cross-route transaction: EXEC gave %v, want EXECABORT", err)
	}
	if e := queued[1].Err(); e == nil || !strings.Contains(e.Error(), "CROSSROUTE") {
		t.Fatalf("the cross-route command inside MULTI: %v", e)
	}
	for _, key := range []string{"queue:x", "plain:y"} {
		if got := r.holds(t, key); got != "" {
			t.Errorf("%s was written on %q", key, got)
		}
	}
	for _, rs := range []*redistest.Server{r.def, r.queue} {
		// (The transaction is held until EXEC: none of it is sent.)
		for _, name := range []string{"msetnx", "eval", "blpop", "set", "multi", "exec"} {
			if n := calls(t, rs, name); n != 0 {
				t.Errorf("%s ran %d times on %s", name, n, rs.Addr())
			}
		}
	}
	// The client is fine afterwards.
	if err := r.c.Set(ctx, "queue:ok", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
}

// TestRoutesSingleUpstreamStateful: a transaction, WATCH, a script and a
// blocking command whose keys all route to one upstream run there.
func TestRoutesSingleUpstreamStateful(t *testing.T) {
	r := startRouted(t, nil)
	cmds, err := r.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Ping(ctx) // keyless: queued until the first key decides
		p.Set(ctx, "queue:t1", "a", 0)
		p.Incr(ctx, "queue:t2")
		return nil
	})
	if err != nil || cmds[2].(*redis.IntCmd).Val() != 1 {
		t.Fatalf("single-route transaction: %v %v", cmds, err)
	}
	if r.holds(t, "queue:t1") != "queue" || r.holds(t, "queue:t2") != "queue" {
		t.Fatal("transaction's keys not on the queue server")
	}
	// WATCH on the cache upstream, a conflicting write makes EXEC fail.
	err = r.c.Watch(ctx, func(tx *redis.Tx) error {
		if err := r.p.Client(t).Set(ctx, "cache:w", "other", 0).Err(); err != nil {
			return err
		}
		_, err := tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, "cache:w", "mine", 0)
			return nil
		})
		return err
	}, "cache:w")
	if err != redis.TxFailedErr {
		t.Fatalf("WATCH on a route: %v, want the transaction to fail", err)
	}
	if v, _ := r.cach.Client(t).Get(ctx, "cache:w").Result(); v != "other" {
		t.Fatalf("cache:w = %q on the cache server", v)
	}
	if v, err := r.c.Eval(ctx, "return redis.call('incr', KEYS[1])", []string{"cache:s"}).Int(); err != nil || v != 1 {
		t.Fatalf("EVAL on one route: %d %v", v, err)
	}
	if r.holds(t, "cache:s") != "cache" {
		t.Fatal("EVAL's key not on the cache server")
	}
	done := make(chan []string, 1)
	go func() {
		v, _ := r.p.Client(t).BLPop(ctx, 10*time.Second, "queue:jobs").Result()
		done <- v
	}()
	redistest.Eventually(t, 5*time.Second, func() bool {
		n, _ := r.queue.Client(t).ClientList(ctx).Result()
		return strings.Contains(n, "cmd=blpop")
	}, "BLPOP never reached the queue server")
	if err := r.c.RPush(ctx, "queue:jobs", "j1").Err(); err != nil {
		t.Fatal(err)
	}
	if v := <-done; fmt.Sprint(v) != "[queue:jobs j1]" {
		t.Fatalf("BLPOP = %v", v)
	}
}

// TestRoutesScanDBSizeKeys: SCAN walks every upstream once, no key twice
// and none missed; DBSIZE sums the upstreams; KEYS (when the policy
// allows it) concatenates them.
func TestRoutesScanDBSizeKeys(t *testing.T) {
	r := startRouted(t, func(c *config.Config) { c.Policy.Commands.Allow = []string{"keys"} })
	want := map[string]bool{}
	for i := range 90 {
		prefix := [...]string{"queue:", "cache:", "plain:"}[i%3]
		key := prefix + strconv.Itoa(i)
		want[key] = true
		if err := r.c.Set(ctx, key, "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]int{}
	var cursor uint64
	for rounds := 0; ; rounds++ {
		if rounds > 1000 {
			t.Fatal("SCAN never ended")
		}
		keys, next, err := r.c.Scan(ctx, cursor, "", 7).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			seen[k]++
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	for k := range want {
		if seen[k] != 1 {
			t.Errorf("SCAN returned %s %d times", k, seen[k])
		}
	}
	if len(seen) != len(want) {
		t.Errorf("SCAN returned %d keys, want %d", len(seen), len(want))
	}
	// MATCH goes to every upstream too.
	var matched []string
	iter := r.c.Scan(ctx, 0, "cache:1*", 5).Iterator()
	for iter.Next(ctx) {
		matched = append(matched, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	wantMatched := 0
	for k := range want {
		if strings.HasPrefix(k, "cache:1") {
			wantMatched++
		}
	}
	if len(matched) != wantMatched {
		t.Fatalf("SCAN MATCH cache:1* = %v, want %d keys", matched, wantMatched)
	}
	if n, err := r.c.DBSize(ctx).Result(); err != nil || n != 90 {
		t.Fatalf("DBSIZE = %d, %v; want 90", n, err)
	}
	keys, err := r.c.Keys(ctx, "*").Result()
	if err != nil || len(keys) != 90 {
		t.Fatalf("KEYS * = %d keys, %v", len(keys), err)
	}
	// Redis answers any integer cursor with a page (SCAN -1 reads as
	// 2^64-1); one naming no upstream ends the walk.
	for _, c := range []string{"63", "-1"} {
		page, err := r.c.Do(ctx, "SCAN", c).Slice()
		if err != nil || len(page) != 2 || page[0] != "0" {
			t.Fatalf("SCAN %s = %v, %v; want cursor 0", c, page, err)
		}
		if keys, ok := page[1].([]any); !ok || len(keys) != 0 {
			t.Fatalf("SCAN %s keys = %#v; want none", c, page[1])
		}
	}
	if _, err := r.c.Do(ctx, "SCAN", " 1").Result(); err == nil || err.Error() != "ERR invalid cursor" {
		t.Fatalf("SCAN ' 1': %v; want Redis's ERR invalid cursor", err)
	}
}

// TestRoutesChannels: PUBLISH and SUBSCRIBE go to the upstream of the
// channel's route, [upstream] when none matches; one SUBSCRIBE over two
// upstreams is refused.
func TestRoutesChannels(t *testing.T) {
	r := startRouted(t, nil)
	direct := r.queue.Client(t).Subscribe(ctx, "jobs.new")
	t.Cleanup(func() { direct.Close() })
	if _, err := direct.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	sub := r.p.Client(t).Subscribe(ctx, "jobs.new")
	t.Cleanup(func() { sub.Close() })
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	// Two subscribers on the queue server: the proxy's and the direct one.
	if n, err := r.c.Publish(ctx, "jobs.new", "hello").Result(); err != nil || n != 2 {
		t.Fatalf("PUBLISH jobs.new reached %d subscribers, %v; want 2 (on the queue server)", n, err)
	}
	for _, s := range []*redis.PubSub{direct, sub} {
		m, err := s.ReceiveMessage(ctx)
		if err != nil || m.Payload != "hello" {
			t.Fatalf("message: %v %v", m, err)
		}
	}
	if n, err := r.c.Publish(ctx, "news", "x").Result(); err != nil || n != 0 {
		t.Fatalf("PUBLISH news (default upstream, no subscriber) = %d, %v", n, err)
	}
	if n, _ := r.def.Client(t).PubSubNumSub(ctx, "jobs.new").Result(); n["jobs.new"] != 0 {
		t.Fatal("the proxy's subscription is on the default server")
	}
	nc := r.p.Dial(t)
	fmt.Fprint(nc, "*3\r\n$9\r\nSUBSCRIBE\r\n$8\r\njobs.new\r\n$4\r\nnews\r\n")
	line := readLine(t, nc)
	if !strings.Contains(line, "different upstreams") {
		t.Fatalf("SUBSCRIBE over two upstreams: %q", line)
	}
	// A subscriber cannot add a channel of another upstream later.
	err := sub.Subscribe(ctx, "news")
	if err == nil {
		_, err = sub.Receive(ctx)
	}
	if err == nil || !strings.Contains(err.Error(), "goes to upstream 'default'") {
		t.Fatalf("SUBSCRIBE of another upstream's channel on a subscribed connection: %v", err)
	}
}

func readLine(t *testing.T, nc interface{ Read([]byte) (int, error) }) string {
	t.Helper()
	var out []byte
	buf := make([]byte, 1)
	for !strings.HasSuffix(string(out), "\r\n") {
		if _, err := nc.Read(buf); err != nil {
			t.Fatalf("read: %v (after %q)", err, out)
		}
		out = append(out, buf[0])
	}
	return string(out)
}

// TestRoutesUpstreamDownFault: with one upstream's server gone, its keys
// get an error while the other routes keep working, split commands
// touching it fail, and it serves again once back.
func TestRoutesUpstreamDownFault(t *testing.T) {
	r := startRouted(t, func(c *config.Config) {
		u := c.Upstreams["cache"]
		u.DialTimeout = units.Duration{Duration: 200 * time.Millisecond}
		c.Upstreams["cache"] = u
	})
	if err := r.c.Set(ctx, "cache:k", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	r.cach.Kill(t)
	redistest.Eventually(t, 5*time.Second, func() bool { return r.c.Get(ctx, "cache:k").Err() != nil }, "GET of a key on the dead upstream kept succeeding")
	for i := range 20 {
		k := strconv.Itoa(i)
		if err := r.c.Set(ctx, "queue:"+k, k, 0).Err(); err != nil {
			t.Fatalf("queue route while cache is down: %v", err)
		}
		if err := r.c.Set(ctx, "plain:"+k, k, 0).Err(); err != nil {
			t.Fatalf("default route while cache is down: %v", err)
		}
		if err := r.c.Get(ctx, "cache:k").Err(); err == nil || err == redis.Nil {
			t.Fatalf("GET on the dead upstream: %v", err)
		}
	}
	if v, err := r.c.MGet(ctx, "queue:1", "plain:2").Result(); err != nil || fmt.Sprint(v) != "[1 2]" {
		t.Fatalf("MGET over live upstreams: %v %v", v, err)
	}
	if err := r.c.MGet(ctx, "queue:1", "cache:k").Err(); err == nil {
		t.Fatal("MGET touching the dead upstream succeeded")
	}
	if !r.p.Ready() {
		t.Error("the proxy says not ready with only a named upstream down: load balancers would withdraw every instance")
	}
	r.cach.Restart(t)
	redistest.Eventually(t, 10*time.Second, func() bool { return r.c.Set(ctx, "cache:k", "2", 0).Err() == nil }, "the cache upstream never came back")
	if r.holds(t, "cache:k") != "cache" {
		t.Fatal("cache:k not on the restarted cache server")
	}
}

// TestRoutesReloadSwapsRoutes: a reload changing [[route]] applies to
// commands sent after it; changing a named upstream needs a restart.
func TestRoutesReloadSwapsRoutes(t *testing.T) {
	r := startRouted(t, nil)
	if err := r.c.Set(ctx, "queue:before", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	next := reloaded(t, r.p, func(c *config.Config) {
		c.Routes = []config.Route{{Pattern: "queue:*", Upstream: "cache"}}
	})
	if _, err := r.p.Reload(next); err != nil {
		t.Fatal(err)
	}
	if err := r.c.Set(ctx, "queue:after", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if r.holds(t, "queue:before") != "queue" || r.holds(t, "queue:after") != "cache" {
		t.Fatalf("after the reload: queue:before on %q, queue:after on %q", r.holds(t, "queue:before"), r.holds(t, "queue:after"))
	}
	bad := reloaded(t, r.p, func(c *config.Config) {
		ups := map[string]config.Upstream{}
		for k, v := range c.Upstreams {
			ups[k] = v
		}
		ups["extra"] = namedUpstream(r.def.Addr())
		c.Upstreams = ups
	})
	if _, err := r.p.Reload(bad); err == nil || !strings.Contains(err.Error(), "upstreams") {
		t.Fatalf("reload adding an upstream: %v, want a restart-only refusal", err)
	}
}

// TestRoutesUserCredential: a proxy user with an upstream credential of
// its own runs on a named upstream with that credential too.
func TestRoutesUserCredential(t *testing.T) {
	var r *routed
	dir := t.TempDir()
	if err := writeFileT(dir+"/app", "redis-app-pw\n"); err != nil {
		t.Fatal(err)
	}
	r = startRoutedAfter(t, func(r *routed) {
		for _, rs := range []*redistest.Server{r.def, r.queue} {
			if err := rs.Client(t).Do(ctx, "acl", "setuser", "redis-app", "on", ">redis-app-pw", "~*", "+@all").Err(); err != nil {
				t.Fatal(err)
			}
		}
	}, func(c *config.Config) {
		a := user("app", appPass, "+@all ~*")
		a.UpstreamUser, a.UpstreamPasswordFile = "redis-app", dir+"/app"
		c.Users = []auth.UserConfig{a}
	})
	app := loggedIn(t, r.p, "app", appPass)
	if err := app.Set(ctx, "queue:u", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if r.holds(t, "queue:u") != "queue" {
		t.Fatal("queue:u not on the queue server")
	}
	list, _ := r.queue.Client(t).ClientList(ctx).Result()
	if !strings.Contains(list, "user=redis-app") {
		t.Fatalf("the queue server has no connection as redis-app:\n%s", list)
	}
}

// TestRoutesGuard: the policy applies before routing: FLUSHALL is refused
// on every upstream by default and fanned out to all when allowed; a TTL
// fix-up (MULTI/SET/EXPIRE/EXEC the proxy adds) goes whole to the key's
// upstream, and an MSET needing fix-ups on keys of several upstreams is
// split, each part with its fix-ups (docs/COMPATIBILITY.md).
func TestRoutesGuard(t *testing.T) {
	for _, allow := range []bool{false, true} {
		t.Run(fmt.Sprint("allow=", allow), func(t *testing.T) {
			r := startRouted(t, func(c *config.Config) {
				if allow {
					c.Policy.Commands.Allow = []string{"flushall"}
				}
				c.Policy.TTL = []policy.TTLRule{{Pattern: "queue:ttl*", Required: true, Default: policy.Duration{Duration: time.Hour}}}
			})
			if err := r.c.MSet(ctx, "queue:f", "1", "cache:f", "2", "plain:f", "3").Err(); err != nil {
				t.Fatal(err)
			}
			if err := r.c.Set(ctx, "queue:ttl", "1", 0).Err(); err != nil {
				t.Fatal(err)
			}
			if ttl := r.queue.Client(t).TTL(ctx, "queue:ttl").Val(); ttl <= 0 {
				t.Fatalf("queue:ttl on the queue server has TTL %v, want the policy's default", ttl)
			}
			// Split by upstream, each part in a MULTI of its own with its
			// keys' fix-ups (refused CROSSROUTE before, nothing written).
			if err := r.c.MSet(ctx, "queue:ttl2", "1", "plain:ttl2", "2").Err(); err != nil {
				t.Fatalf("MSET with fix-ups over two upstreams: %v", err)
			}
			if w := r.holds(t, "queue:ttl2") + "," + r.holds(t, "plain:ttl2"); w != "queue,default" {
				t.Fatalf("the MSET's keys are on %q, want queue,default", w)
			}
			if ttl := r.queue.Client(t).TTL(ctx, "queue:ttl2").Val(); ttl <= 0 {
				t.Fatalf("queue:ttl2 has TTL %v, want the policy's default", ttl)
			}
			if err := r.c.Del(ctx, "queue:ttl2", "plain:ttl2").Err(); err != nil {
				t.Fatal(err)
			}
			err := r.c.FlushAll(ctx).Err()
			left := r.holds(t, "queue:f") + r.holds(t, "cache:f") + r.holds(t, "plain:f")
			switch {
			case !allow && (err == nil || left != "queuecachedefault"):
				t.Fatalf("refused FLUSHALL: %v, keys left on %q", err, left)
			case allow && (err != nil || left != ""):
				t.Fatalf("allowed FLUSHALL: %v, keys left on %q", err, left)
			}
		})
	}
}

// TestRoutesMetrics: every upstream's metrics carry its name.
func TestRoutesMetrics(t *testing.T) {
	r := startRouted(t, nil)
	if err := r.c.Set(ctx, "queue:m", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	families, err := r.p.Metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "upstream" {
					found[f.GetName()+"/"+l.GetValue()] = true
					if f.GetName() == "redproxy_route_commands_total" && l.GetValue() == "queue" && m.GetCounter().GetValue() < 1 {
						t.Errorf("no command counted for the queue upstream")
					}
				}
			}
		}
	}
	for _, want := range []string{"redproxy_route_commands_total/queue", "redproxy_upstream_connections_up/queue", "redproxy_upstream_connections_up/default", "redproxy_upstream_dedicated_connections/cache"} {
		if !found[want] {
			t.Errorf("missing metric %s (have %v)", want, found)
		}
	}
}

// TestRoutesSentinelUpstream: a named upstream in Sentinel mode is found
// through its Sentinels, and its keys follow a failover while the other
// routes stay where they are.
func TestRoutesSentinelUpstream(t *testing.T) {
	g := redistest.StartSentinelGroup(t, redistest.SentinelOptions{Replicas: 1, Sentinels: 1})
	def := redistest.Start(t)
	p := proxytest.Start(t, def, func(c *config.Config) {
		u := namedUpstream("")
		u.Mode, u.Address = config.ModeSentinel, ""
		u.Sentinels, u.MasterName = g.SentinelAddrs(), g.Name
		c.Upstreams = map[string]config.Upstream{"queue": u}
		c.Routes = []config.Route{{Pattern: "queue:*", Upstream: "queue"}}
	})
	c := p.Client(t)
	old := g.Nodes[0]
	if err := c.Set(ctx, "queue:1", "a", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if v, _ := old.Client(t).Get(ctx, "queue:1").Result(); v != "a" {
		t.Fatalf("queue:1 not on the Sentinel group's primary: %q", v)
	}
	g.Failover(t)
	next := g.WaitNewPrimary(t, old, 30*time.Second)
	redistest.Eventually(t, 10*time.Second, func() bool {
		if c.Set(ctx, "queue:2", "b", 0).Err() != nil {
			return false
		}
		v, _ := next.Client(t).Get(ctx, "queue:2").Result()
		return v == "b"
	}, "writes of the queue route never reached the new primary %s", next.Addr())
	if err := c.Set(ctx, "plain:1", "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if v, _ := def.Client(t).Get(ctx, "plain:1").Result(); v != "x" {
		t.Fatal("the default route moved")
	}
}

// TestRoutesClusterUpstream: a named upstream may be a Redis Cluster: its
// keys go through the cluster router (split by slot within it), split
// commands and SCAN cover it with the default upstream, and what would need
// a dedicated connection on it is refused.
func TestRoutesClusterUpstream(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	def := redistest.Start(t)
	p := proxytest.Start(t, def, func(c *config.Config) {
		routeBigToCluster(c, cl)
	})
	c := p.Client(t)
	var keys []string
	for i := range 30 {
		keys = append(keys, "big:"+strconv.Itoa(i), "plain:"+strconv.Itoa(i))
	}
	pairs := make([]any, 0, 2*len(keys))
	for _, k := range keys {
		pairs = append(pairs, k, "v"+k)
	}
	if err := c.MSet(ctx, pairs...).Err(); err != nil {
		t.Fatal(err)
	}
	cc := cl.ClusterClient(t)
	for _, k := range keys {
		inCluster := cc.Exists(ctx, k).Val() == 1
		inDefault := def.Client(t).Exists(ctx, k).Val() == 1
		if inCluster != strings.HasPrefix(k, "big:") || inDefault == inCluster {
			t.Fatalf("%s: in the cluster %v, on the default server %v", k, inCluster, inDefault)
		}
	}
	vals, err := c.MGet(ctx, keys...).Result()
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		if vals[i] != "v"+k {
			t.Fatalf("MGET[%d] = %v, want v%s", i, vals[i], k)
		}
	}
	seen := map[string]int{}
	iter := c.Scan(ctx, 0, "", 10).Iterator()
	for iter.Next(ctx) {
		seen[iter.Val()]++
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if seen[k] != 1 {
			t.Errorf("SCAN returned %s %d times", k, seen[k])
		}
	}
	if n, err := c.DBSize(ctx).Result(); err != nil || n != int64(len(keys)) {
		t.Fatalf("DBSIZE = %d, %v; want %d", n, err, len(keys))
	}
	var set *redis.StatusCmd
	_, err = c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		set = p.Set(ctx, "big:tx", "1", 0)
		return nil
	})
	if err == nil || set.Err() == nil || !strings.Contains(set.Err().Error(), "is a cluster") {
		t.Fatalf("MULTI on the cluster upstream: EXEC %v, SET %v", err, set.Err())
	}
	if cc.Exists(ctx, "big:tx").Val() != 0 {
		t.Fatal("the refused transaction wrote")
	}
}

// BenchmarkRoutedPipeline16 is BenchmarkForwardPipeline16 with routes: a
// 16-GET pipeline over two upstreams (8 keys each), for the routing's own
// allocations.
func BenchmarkRoutedPipeline16(b *testing.B) {
	r := startRouted(b, nil)
	nc := r.p.Dial(b)
	var req bytes.Buffer
	value := bytes.Repeat([]byte("v"), 64)
	for i := range 16 {
		key := "key:00000001234" + strconv.Itoa(i%2)
		if i%2 == 1 {
			key = "queue:0000001234"
		}
		req.WriteString("*2\r\n$3\r\nGET\r\n$16\r\n" + key + "\r\n")
		if err := r.c.Set(ctx, key, value, 0).Err(); err != nil {
			b.Fatal(err)
		}
	}
	reply := "$64\r\n" + string(value) + "\r\n"
	buf := make([]byte, len(reply)*16)
	round := func() {
		if _, err := nc.Write(req.Bytes()); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(nc, buf); err != nil {
			b.Fatal(err)
		}
	}
	for range 100 {
		round()
	}
	if string(buf[len(buf)-len(reply):]) != reply {
		b.Fatalf("unexpected reply %q", buf[len(buf)-len(reply):])
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		round()
	}
}

// TestRoutesInfoProxyListsEachUpstream: INFO proxy showed upstream_0 only,
// [upstream]'s server, so a named upstream down showed nowhere (found by
// review, 2026-12-06). Each upstream has a line that names it.
func TestRoutesInfoProxyListsEachUpstream(t *testing.T) {
	r := startRouted(t, nil)
	r.queue.Kill(t)
	redistest.Eventually(t, 10*time.Second, func() bool {
		info, err := r.c.Info(ctx, "proxy").Result()
		return err == nil && strings.Contains(info, ":addr="+r.queue.Addr()+",state=down,")
	}, "INFO proxy never said the queue upstream is down")
	info, err := r.c.Info(ctx, "proxy").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"upstream_0:addr=" + r.def.Addr() + ",state=up,",
		":addr=" + r.queue.Addr() + ",state=down,",
		":addr=" + r.cach.Addr() + ",state=up,",
		",upstream=" + config.DefaultUpstream + "\r\n", ",upstream=queue\r\n", ",upstream=cache\r\n",
	} {
		if !strings.Contains(info, want) {
			t.Errorf("INFO proxy lacks %q:\n%s", want, info)
		}
	}
}
