package proxy_test

import (
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// TestRingReviewEmptyKeyLikeTwemproxy: SET "" through nutcracker, then
// GET "" through redproxy over the same servers. nutcracker does not hash
// a key of length 0 (server_pool_hash returns 0), the ring hashes it.
func TestRingReviewEmptyKeyLikeTwemproxy(t *testing.T) {
	for _, h := range []string{"fnv1a_64", "md5", "fnv1_64", "fnv1a_32"} {
		t.Run(h, func(t *testing.T) { emptyKeyLikeTwemproxy(t, h) })
	}
}

func emptyKeyLikeTwemproxy(t *testing.T, hash string) {
	shards := []*redistest.Server{redistest.Start(t), redistest.Start(t), redistest.Start(t)}
	var lines []string
	for _, s := range shards {
		lines = append(lines, s.Addr()+":1")
	}
	twem := redistest.StartNutcracker(t, redistest.NutcrackerPool{Servers: lines, Hash: hash, Distribution: "ketama"})
	if got := twemDo(t, twem, "SET", "", "empty"); got != "+OK" {
		t.Fatalf("SET \"\" through nutcracker: %s", got)
	}
	p := proxytest.Start(t, shards[0], func(c *config.Config) {
		c.Upstreams = map[string]config.Upstream{"s1": namedUpstream(shards[1].Addr()), "s2": namedUpstream(shards[2].Addr())}
		c.Routes = []config.Route{{Pattern: "*", Upstreams: []string{config.DefaultUpstream, "s1", "s2"}, Hash: hash}}
	})
	on := -1
	for i, s := range shards {
		if s.Client(t).Exists(ctx, "").Val() == 1 {
			on = i
		}
	}
	if v, err := p.Client(t).Get(ctx, "").Result(); v != "empty" {
		t.Errorf("GET \"\" through redproxy = %q, %v; nutcracker put it on shard %d", v, err, on)
	}
}

// TestRingReviewPort11211: twemproxy hashes a server with no name under
// its host only when its port is 11211 (libmemcached compatibility,
// nc_conf.c conf_add_server); redproxy hashes "host:port".
func TestRingReviewPort11211(t *testing.T) {
	cmd := exec.Command("redis-server", "--port", "11211", "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", t.TempDir())
	if err := cmd.Start(); err != nil {
		t.Skip(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
	// Ready when it answers PING, as redistest waits; gone when the port
	// was taken (the test needs this port: it is what it is about).
	ready := redis.NewClient(&redis.Options{Addr: "127.0.0.1:11211", MaxRetries: -1})
	defer ready.Close()
	redistest.Eventually(t, 10*time.Second, func() bool {
		select {
		case <-done:
			t.Skip("redis-server on 11211 exited (port taken?)")
		default:
		}
		return ready.Ping(ctx).Err() == nil
	}, "redis-server on 11211 never answered PING")
	other := redistest.Start(t)
	twem := redistest.StartNutcracker(t, redistest.NutcrackerPool{Servers: []string{"127.0.0.1:11211:1", other.Addr() + ":1"}, Hash: "fnv1a_64", Distribution: "ketama"})
	const n = 100
	for i := range n {
		if got := twemDo(t, twem, "SET", ringKey(i), strconv.Itoa(i)); got != "+OK" {
			t.Fatalf("SET through nutcracker: %s", got)
		}
	}
	rs := redistest.Start(t) // the proxy's [upstream]; unused by the route
	p := proxytest.Start(t, rs, func(c *config.Config) {
		c.Upstreams = map[string]config.Upstream{"m": namedUpstream("127.0.0.1:11211"), "o": namedUpstream(other.Addr())}
		c.Routes = []config.Route{{Pattern: "*", Upstreams: []string{"m", "o"}}}
	})
	c := p.Client(t)
	missed := 0
	for i := range n {
		if v := c.Get(ctx, ringKey(i)).Val(); v != strconv.Itoa(i) {
			missed++
		}
	}
	if missed > 0 {
		t.Errorf("%d of %d keys written through nutcracker not found through redproxy (server on port 11211 without a name)", missed, n)
	}
}

// TestRingReviewNamedWeightedModulaEndToEnd: a nutcracker pool with named,
// weighted servers (modula, crc32a, hash tag "::") listed in another order
// than redproxy's upstreams.
func TestRingReviewNamedWeightedModulaEndToEnd(t *testing.T) {
	shards := []*redistest.Server{redistest.Start(t), redistest.Start(t), redistest.Start(t)}
	twem := redistest.StartNutcracker(t, redistest.NutcrackerPool{
		Servers: []string{shards[2].Addr() + ":2 zeta", shards[0].Addr() + ":1 a", shards[1].Addr() + ":3 mm"},
		Hash:    "crc32a", Distribution: "modula", HashTag: "::",
	})
	const n = 200
	for i := range n {
		k := ringKey(i)
		if i%4 == 0 {
			k = "x:" + strconv.Itoa(i/8) + ":" + k
		}
		if got := twemDo(t, twem, "SET", k, strconv.Itoa(i)); got != "+OK" {
			t.Fatal(got)
		}
	}
	for i, s := range shards {
		if s.Client(t).DBSize(ctx).Val() == 0 {
			t.Fatalf("shard %d empty", i)
		}
	}
	p := proxytest.Start(t, shards[0], func(c *config.Config) {
		c.Upstreams = map[string]config.Upstream{"s1": namedUpstream(shards[1].Addr()), "s2": namedUpstream(shards[2].Addr())}
		c.Routes = []config.Route{{Pattern: "*", Upstreams: []string{config.DefaultUpstream, "s1", "s2"}, ServerNames: []string{"a", "mm", "zeta"}, Weights: []int{1, 3, 2}, Hash: "crc32a", Distribution: "modula", HashTag: "::"}}
	})
	c := p.Client(t)
	missed := 0
	for i := range n {
		k := ringKey(i)
		if i%4 == 0 {
			k = "x:" + strconv.Itoa(i/8) + ":" + k
		}
		if v := c.Get(ctx, k).Val(); v != strconv.Itoa(i) {
			missed++
		}
	}
	if missed > 0 {
		t.Errorf("%d of %d keys not found through redproxy", missed, n)
	}
}
