package proxy_test

import (
	"bufio"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// twemDo sends one command through nutcracker on a raw connection
// (nutcracker closes a connection on go-redis's HELLO) and returns the
// reply's first line (a bulk's value for $).
func twemDo(t *testing.T, addr string, args ...string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(c, "$%d\r\n%s\r\n", len(a), a)
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(line, "$") && line != "$-1\r\n" {
		v, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSuffix(v, "\r\n")
	}
	return strings.TrimSuffix(line, "\r\n")
}

// ringKey is key i of the pool: varied throughout, since fnv1a_64 (as
// twemproxy has it, folded to 32 bits) spreads keys that differ only in
// a short suffix over a narrow range, often one server.
func ringKey(i int) string {
	return fmt.Sprintf("k:%08x:%d", uint32(i)*2654435761, i)
}

// TestRingRouteReplacesATwemproxyPool is the migration a twemproxy user
// makes: three Redis servers behind nutcracker (ketama, fnv1a_64, hash
// tag "{}"), filled through it; redproxy with the same servers in one
// [[route]] then finds every key, and what it writes nutcracker finds.
// Multi-key commands split over the shards, transactions stay on one.
func TestRingRouteReplacesATwemproxyPool(t *testing.T) {
	shards := []*redistest.Server{redistest.Start(t), redistest.Start(t), redistest.Start(t)}
	var lines []string
	for _, s := range shards {
		lines = append(lines, s.Addr()+":1")
	}
	twem := redistest.StartNutcracker(t, redistest.NutcrackerPool{Servers: lines, Hash: "fnv1a_64", Distribution: "ketama", HashTag: "{}"})
	const n = 300
	for i := range n {
		if got := twemDo(t, twem, "SET", ringKey(i), "v"+strconv.Itoa(i)); got != "+OK" {
			t.Fatalf("SET through nutcracker: %s", got)
		}
	}
	per := make([]int64, len(shards))
	for i, s := range shards {
		per[i] = s.Client(t).DBSize(ctx).Val()
		if per[i] == 0 {
			t.Fatalf("shard %d holds no key (per shard %v): nothing to check", i, per)
		}
	}

	p := proxytest.Start(t, shards[0], func(c *config.Config) {
		c.Upstreams = map[string]config.Upstream{
			"s1": namedUpstream(shards[1].Addr()),
			"s2": namedUpstream(shards[2].Addr()),
		}
		c.Routes = []config.Route{{Pattern: "*", Upstreams: []string{config.DefaultUpstream, "s1", "s2"}, HashTag: "{}"}}
	})
	rc := p.Client(t)

	t.Run("FindsEveryKey", func(t *testing.T) {
		for i := range n {
			k := ringKey(i)
			if v, err := rc.Get(ctx, k).Result(); err != nil || v != "v"+strconv.Itoa(i) {
				t.Fatalf("GET %s through redproxy = %q, %v", k, v, err)
			}
		}
		keys := make([]string, 40)
		for i := range keys {
			keys[i] = ringKey(i * 7)
		}
		vals, err := rc.MGet(ctx, keys...).Result()
		if err != nil {
			t.Fatal(err)
		}
		for i, v := range vals {
			if v != "v"+strconv.Itoa(i*7) {
				t.Fatalf("MGET over the shards: value %d = %v", i, v)
			}
		}
		if got := rc.DBSize(ctx).Val(); got != n {
			t.Fatalf("DBSIZE over the shards = %d, want %d", got, n)
		}
		var scanned int
		iter := rc.Scan(ctx, 0, "k:*", 50).Iterator()
		for iter.Next(ctx) {
			scanned++
		}
		if err := iter.Err(); err != nil || scanned != n {
			t.Fatalf("SCAN over the shards: %d keys, %v", scanned, err)
		}
	})

	t.Run("NutcrackerFindsWhatItWrites", func(t *testing.T) {
		for i := range 100 {
			k := "new:" + strconv.Itoa(i)
			if err := rc.Set(ctx, k, "w"+strconv.Itoa(i), 0).Err(); err != nil {
				t.Fatal(err)
			}
			if got := twemDo(t, twem, "GET", k); got != "w"+strconv.Itoa(i) {
				t.Fatalf("GET %s through nutcracker after SET through redproxy = %q", k, got)
			}
		}
		if got := rc.Del(ctx, "new:1", "new:2", "new:3", "new:4", "nokey").Val(); got != 4 {
			t.Fatalf("DEL over the shards = %d, want 4", got)
		}
	})

	t.Run("HashTagKeepsATransactionOnOneShard", func(t *testing.T) {
		_, err := rc.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
			pipe.Set(ctx, "{user42}:name", "ada", 0)
			pipe.Incr(ctx, "{user42}:visits")
			return nil
		})
		if err != nil {
			t.Fatalf("MULTI on keys of one hash tag: %v", err)
		}
		if got := twemDo(t, twem, "GET", "{user42}:visits"); got != "1" {
			t.Fatalf("nutcracker reads {user42}:visits = %q", got)
		}
		// Two keys on different shards cannot be in one transaction.
		var a, b string
		for i := 0; a == "" || b == ""; i++ {
			k := "t:" + strconv.Itoa(i)
			if twemDo(t, twem, "SET", k, "x") != "+OK" {
				t.Fatal("SET through nutcracker")
			}
			on0 := shards[0].Client(t).Exists(ctx, k).Val() == 1
			switch {
			case a == "" && on0:
				a = k
			case b == "" && !on0:
				b = k
			}
		}
		err = rc.Watch(ctx, func(tx *redis.Tx) error {
			_, err := tx.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
				pipe.Get(ctx, a)
				pipe.Get(ctx, b)
				return nil
			})
			return err
		}, a, b)
		if err == nil || !strings.Contains(err.Error(), "CROSSROUTE") {
			t.Fatalf("WATCH %s %s on two shards: %v, want CROSSROUTE", a, b, err)
		}
	})
}

// TestRingRouteConfigErrors: a bad ring is refused at start with the
// key's place, as every configuration error is.
func TestRingRouteConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		route config.Route
		want  string
	}{
		{config.Route{Pattern: "*", Upstreams: []string{"default"}}, "at least two upstreams"},
		{config.Route{Pattern: "*", Upstreams: []string{"default", "s1"}, Upstream: "s1"}, "not both"},
		{config.Route{Pattern: "*", Upstreams: []string{"default", "nope"}}, "no [upstreams.nope]"},
		{config.Route{Pattern: "*", Upstreams: []string{"default", "s1"}, Hash: "sha1"}, "unknown hash"},
		{config.Route{Pattern: "*", Upstreams: []string{"default", "s1"}, Distribution: "random"}, "unknown distribution"},
		{config.Route{Pattern: "*", Upstreams: []string{"default", "s1"}, Weights: []int{1}}, "1 weights for 2 upstreams"},
		{config.Route{Pattern: "*", Upstreams: []string{"default", "s1"}, ServerNames: []string{"a", "a"}}, "distinct"},
		{config.Route{Pattern: "*", Upstreams: []string{"default", "s1"}, HashTag: "{"}, "two characters"},
		{config.Route{Pattern: "*", Upstreams: []string{"default", "s1"}, HashTag: "\x00}"}, "NUL byte"},
		{config.Route{Pattern: "*", Upstreams: []string{"default", "s1"}, HashTag: "{\x00"}, "NUL byte"},
		{config.Route{Pattern: "*", Upstreams: []string{"default", "s1"}, ServerNames: []string{"a", strings.Repeat("b", 256)}}, "at most 255"},
	} {
		c := config.Default()
		c.Upstream.Address = "127.0.0.1:1"
		c.Upstreams = map[string]config.Upstream{"s1": namedUpstream("127.0.0.1:2")}
		c.Routes = []config.Route{tc.route}
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "route[0]") {
			t.Errorf("%+v: %v, want an error at route[0] saying %q", tc.route, err, tc.want)
		}
	}
	c := config.Default()
	c.Upstreams = map[string]config.Upstream{"s1": namedUpstream("127.0.0.1:2")}
	c.ChannelRoutes = []config.Route{{Pattern: "*", Upstreams: []string{"default", "s1"}}}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "channel_route[0]") {
		t.Errorf("a channel route over several upstreams: %v", err)
	}
}
