package proxy_test

import (
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/localcache"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/resp"
)

// Inside MULTI, every command whose reply names keys answers, in EXEC's
// reply, with the names as the client wrote them, exactly as outside
// MULTI; another namespace's keys never appear, and values that merely
// look like prefixed names are left alone. (Before, these commands were
// refused inside MULTI and EXEC failed.)
func TestNamespaceMultiRepliesStripped(t *testing.T) {
	p := nsProxy(t)
	direct := p.Redis.Client(t)
	for _, proto := range []int{2, 3} {
		t.Run("RESP"+string(rune('0'+proto)), func(t *testing.T) {
			must(t, direct.FlushAll(ctx).Err())
			a := nsClient(t, p, "tenant-a", func(o *redis.Options) { o.Protocol = proto })
			b := nsClient(t, p, "tenant-b", func(o *redis.Options) { o.Protocol = proto })
			for _, c := range []*redis.Client{a, b} {
				must(t, c.Set(ctx, "k1", "a:k2", 0).Err()) // a value, not a name
				must(t, c.RPush(ctx, "l", "x").Err())
				must(t, c.RPush(ctx, "l2", "y").Err())
				must(t, c.ZAdd(ctx, "z", redis.Z{Score: 1, Member: "m"}).Err())
				must(t, c.ZAdd(ctx, "z2", redis.Z{Score: 1, Member: "m2"}).Err())
				must(t, c.XAdd(ctx, &redis.XAddArgs{Stream: "s", Values: []string{"f", "v"}}).Err())
				must(t, c.XGroupCreate(ctx, "s", "g", "0").Err())
			}
			must(t, a.Set(ctx, "aonly", "1", 0).Err())
			must(t, b.Set(ctx, "bonly", "1", 0).Err())
			sub := a.Subscribe(ctx, "news")
			defer sub.Close()
			if _, err := sub.Receive(ctx); err != nil {
				t.Fatal(err)
			}
			want, err := a.Keys(ctx, "*").Result()
			must(t, err)
			slices.Sort(want)
			if !slices.Contains(want, "aonly") || slices.Contains(want, "bonly") {
				t.Fatalf("a's keys outside MULTI: %q", want)
			}

			tx := a.TxPipeline()
			scan := tx.Scan(ctx, 0, "", 1000)
			keys := tx.Keys(ctx, "*")
			random := tx.RandomKey(ctx)
			get := tx.Get(ctx, "k1")
			lmpop := tx.LMPop(ctx, "left", 1, "nope", "l")
			zmpop := tx.ZMPop(ctx, "min", 1, "z")
			blpop := tx.BLPop(ctx, time.Second, "l2")
			bzpop := tx.BZPopMin(ctx, time.Second, "z2")
			xread := tx.XRead(ctx, &redis.XReadArgs{Streams: []string{"s", "0"}, Block: -1})
			xgroup := tx.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{"s", ">"}, Block: -1})
			numsub := tx.PubSubNumSub(ctx, "news")
			chans := tx.PubSubChannels(ctx, "*")
			if _, err := tx.Exec(ctx); err != nil {
				t.Fatalf("EXEC: %v", err)
			}

			scanned, _ := scan.Val()
			slices.Sort(scanned)
			if !slices.Equal(scanned, want) {
				t.Errorf("SCAN in MULTI: %q, want %q", scanned, want)
			}
			listed := keys.Val()
			slices.Sort(listed)
			if !slices.Equal(listed, want) {
				t.Errorf("KEYS in MULTI: %q, want %q", listed, want)
			}
			if !slices.Contains(want, random.Val()) {
				t.Errorf("RANDOMKEY in MULTI: %q, not one of a's keys as named", random.Val())
			}
			if get.Val() != "a:k2" {
				t.Errorf("GET in MULTI: %q, want the value a:k2 untouched", get.Val())
			}
			if key, vals, err := lmpop.Result(); err != nil || key != "l" || !slices.Equal(vals, []string{"x"}) {
				t.Errorf("LMPOP in MULTI: %q %q %v, want l [x]", key, vals, err)
			}
			if key, zs, err := zmpop.Result(); err != nil || key != "z" || len(zs) != 1 || zs[0].Member != "m" {
				t.Errorf("ZMPOP in MULTI: %q %v %v, want z [m]", key, zs, err)
			}
			if v := blpop.Val(); !slices.Equal(v, []string{"l2", "y"}) {
				t.Errorf("BLPOP in MULTI: %q, want [l2 y]", v)
			}
			if z := bzpop.Val(); z == nil || z.Key != "z2" || z.Member != "m2" {
				t.Errorf("BZPOPMIN in MULTI: %+v, want z2 m2", z)
			}
			for name, c := range map[string]*redis.XStreamSliceCmd{"XREAD": xread, "XREADGROUP": xgroup} {
				if s := c.Val(); len(s) != 1 || s[0].Stream != "s" || len(s[0].Messages) != 1 {
					t.Errorf("%s in MULTI: %+v, want stream s with one entry", name, s)
				}
			}
			if n := numsub.Val(); len(n) != 1 || n["news"] != 1 {
				t.Errorf("PUBSUB NUMSUB in MULTI: %v, want news: 1", n)
			}
			if c := chans.Val(); !slices.Equal(c, []string{"news"}) {
				t.Errorf("PUBSUB CHANNELS in MULTI: %q, want [news]", c)
			}
			// b's keys are where they were: a's pops reached a's only.
			for _, k := range []string{"b:l", "b:l2", "b:z", "b:z2"} {
				if n, _ := direct.Exists(ctx, k).Result(); n != 1 {
					t.Errorf("%s gone: a's transaction popped b's key", k)
				}
			}
		})
	}
}

// nsConn is a raw RESP connection to the proxy, authenticated as user.
type nsConn struct {
	t   *testing.T
	nc  net.Conn
	buf []byte
}

func nsDial(t *testing.T, nc net.Conn, hello string) *nsConn {
	c := &nsConn{t: t, nc: nc}
	c.send(hello)
	if r := c.reply(); resp.IsError([]byte(r)) {
		t.Fatalf("%s: %q", hello, r)
	}
	return c
}

func (c *nsConn) send(lines ...string) {
	c.t.Helper()
	if _, err := c.nc.Write([]byte(strings.Join(lines, "\r\n") + "\r\n")); err != nil {
		c.t.Fatal(err)
	}
}

// reply reads one whole reply.
func (c *nsConn) reply() string {
	c.t.Helper()
	c.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		if n, err := resp.ScanReply(c.buf); err != nil {
			c.t.Fatalf("bad reply %q: %v", c.buf, err)
		} else if n > 0 {
			r := string(c.buf[:n])
			c.buf = c.buf[n:]
			return r
		}
		b := make([]byte, 4096)
		n, err := c.nc.Read(b)
		c.buf = append(c.buf, b[:n]...)
		if err != nil && n == 0 {
			c.t.Fatalf("read: %v (have %q)", err, c.buf)
		}
	}
}

// expect sends lines and checks the replies, in order.
func (c *nsConn) expect(lines []string, want ...string) {
	c.t.Helper()
	c.send(lines...)
	for i, w := range want {
		if got := c.reply(); got != w {
			c.t.Fatalf("%q: reply %d is %q, want %q", lines, i, got, w)
		}
	}
}

// EXEC's nil (a WATCHed key changed), EXECABORT and error elements come
// back as Redis sent them, in RESP2 and RESP3; a transaction's strips end
// with it, so the next transaction's values are never cut.
func TestNamespaceMultiExecShapes(t *testing.T) {
	p := nsProxy(t)
	direct := p.Redis.Client(t)
	must(t, direct.Set(ctx, "a:k", "a:k", 0).Err())
	must(t, direct.Set(ctx, "b:k", "b:k", 0).Err())
	must(t, direct.XAdd(ctx, &redis.XAddArgs{Stream: "a:s", ID: "1-1", Values: []string{"f", "v"}}).Err())
	for _, c := range []struct {
		hello, nilExec, xread string
	}{
		{"AUTH tenant-a " + nsPass, "*-1\r\n", "*1\r\n*1\r\n*2\r\n$1\r\ns\r\n*1\r\n*2\r\n$3\r\n1-1\r\n*2\r\n$1\r\nf\r\n$1\r\nv\r\n"},
		{"HELLO 3 AUTH tenant-a " + nsPass, "_\r\n", "*1\r\n%1\r\n$1\r\ns\r\n*1\r\n*2\r\n$3\r\n1-1\r\n*2\r\n$1\r\nf\r\n$1\r\nv\r\n"},
	} {
		t.Run(c.hello[:5], func(t *testing.T) {
			a := nsDial(t, p.Dial(t), c.hello)
			a.expect([]string{"MULTI", "XREAD STREAMS s 0", "EXEC"}, "+OK\r\n", "+QUEUED\r\n", c.xread)
			// An element that is an error stays as it is; the next one is
			// still its own command's.
			a.expect([]string{"MULTI", "LMPOP 1 k LEFT", "KEYS k*", "EXEC"}, "+OK\r\n", "+QUEUED\r\n", "+QUEUED\r\n",
				"*2\r\n-WRONGTYPE Operation against a key holding the wrong kind of value\r\n*1\r\n$1\r\nk\r\n")
			// Every way a transaction ends forgets its strips: on a fresh
			// connection each, a RANDOMKEY's strip must not reach the next
			// transaction's GET, whose value looks like a name.
			getK := []string{"MULTI", "GET k", "EXEC"}
			getKReply := []string{"+OK\r\n", "+QUEUED\r\n", "*1\r\n$3\r\na:k\r\n"}
			for _, end := range []struct {
				name string
				run  func(a *nsConn)
			}{
				{"EXEC", func(a *nsConn) {
					a.send("MULTI", "RANDOMKEY", "EXEC")
					a.reply()
					a.reply()
					if got := a.reply(); !strings.HasPrefix(got, "*1\r\n$") || strings.Contains(got, "a:") {
						t.Fatalf("EXEC of RANDOMKEY: %q", got)
					}
				}},
				{"WATCH failed", func(a *nsConn) {
					a.expect([]string{"WATCH k"}, "+OK\r\n")
					must(t, direct.Set(ctx, "a:k", "a:k", 0).Err())
					a.expect([]string{"MULTI", "RANDOMKEY", "SCAN 0", "EXEC"}, "+OK\r\n", "+QUEUED\r\n", "+QUEUED\r\n", c.nilExec)
				}},
				{"DISCARD", func(a *nsConn) {
					a.expect([]string{"MULTI", "RANDOMKEY", "DISCARD"}, "+OK\r\n", "+QUEUED\r\n", "+OK\r\n")
				}},
				{"EXECABORT", func(a *nsConn) {
					a.send("MULTI", "RANDOMKEY", "NOSUCHCOMMAND", "EXEC")
					for i, want := range []string{"+OK", "+QUEUED", "-", "-EXECABORT"} {
						if got := a.reply(); !strings.HasPrefix(got, want) {
							t.Fatalf("reply %d to MULTI RANDOMKEY NOSUCHCOMMAND EXEC: %q, want %s...", i, got, want)
						}
					}
				}},
				{"RESET", func(a *nsConn) {
					a.expect([]string{"MULTI", "RANDOMKEY", "RESET"}, "+OK\r\n", "+QUEUED\r\n", "+RESET\r\n")
					a.send(c.hello)
					if got := a.reply(); resp.IsError([]byte(got)) {
						t.Fatalf("%s after RESET: %q", c.hello, got)
					}
				}},
			} {
				a := nsDial(t, p.Dial(t), c.hello)
				end.run(a)
				a.expect(getK, getKReply...)
			}
		})
	}
	if v, _ := direct.Get(ctx, "b:k").Result(); v != "b:k" {
		t.Fatalf("b:k is %q", v)
	}
}

// With routes, a MULTI is placed on the upstream of its first keyed
// command (placeHeld) and the rest queued there: PUBSUB NUMSUB's result is
// stripped in EXEC's reply too. RANDOMKEY and FLUSHDB, which fan out over
// the upstreams, are refused inside MULTI as routes refuse them; before,
// the namespace ran their scripts at once, outside the transaction.
func TestNamespaceMultiHeldWithRoutes(t *testing.T) {
	r := startRouted(t, func(c *config.Config) {
		a := user("tenant-a", nsPass, "+@all ~* allchannels")
		a.Namespace = "a:"
		c.Users = []auth.UserConfig{a}
		c.Policy.Commands.Allow = []string{"flushdb"}
	})
	must(t, r.def.Client(t).Set(ctx, "a:x", "1", 0).Err())
	a := nsDial(t, r.p.Dial(t), "AUTH tenant-a "+nsPass)
	a.expect([]string{"MULTI", "SET k v", "PUBSUB NUMSUB news", "EXEC"}, "+OK\r\n", "+QUEUED\r\n", "+QUEUED\r\n",
		"*2\r\n+OK\r\n*2\r\n$4\r\nnews\r\n:0\r\n")
	for _, cmd := range []string{"RANDOMKEY", "FLUSHDB"} {
		a.send("MULTI", cmd, "EXEC")
		for i, want := range []string{"+OK", "-ERR", "-EXECABORT"} {
			if got := a.reply(); !strings.HasPrefix(got, want) {
				t.Fatalf("reply %d to MULTI %s EXEC: %q, want %s...", i, cmd, got, want)
			}
		}
	}
	if n, _ := r.def.Client(t).Exists(ctx, "a:x", "a:k").Result(); n != 2 {
		t.Fatalf("after the refused FLUSHDB in MULTI, %d of a:x and a:k are left; want both", n)
	}
}

// The guard's TTL fix-ups queued behind a write inside MULTI take places
// in EXEC's reply that the client never sees; the strips count them, so
// each stripped result is still its own command's.
func TestNamespaceMultiWithFixups(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) {
		a := user("tenant-a", nsPass, "+@all ~* allchannels")
		a.Namespace = "a:"
		c.Users = []auth.UserConfig{a}
		c.Policy.Commands.Allow = []string{"keys"}
		// The policy sees the real, prefixed names.
		c.Policy.TTL = []policy.TTLRule{{Pattern: "a:h:*", Required: true, Default: policy.Duration{Duration: time.Hour}}}
	})
	direct := p.Redis.Client(t)
	must(t, direct.RPush(ctx, "a:l", "x").Err())
	a := nsDial(t, p.Dial(t), "AUTH tenant-a "+nsPass)
	a.expect([]string{"MULTI", "HSET h:1 f v", "KEYS h:*", "HSET h:2 f v", "LMPOP 1 l LEFT", "EXEC"},
		"+OK\r\n", "+QUEUED\r\n", "+QUEUED\r\n", "+QUEUED\r\n", "+QUEUED\r\n",
		"*4\r\n:1\r\n*1\r\n$3\r\nh:1\r\n:1\r\n*2\r\n$1\r\nl\r\n*1\r\n$1\r\nx\r\n")
	for _, k := range []string{"a:h:1", "a:h:2"} {
		if ttl, _ := direct.TTL(ctx, k).Result(); ttl <= 0 {
			t.Fatalf("%s has TTL %v: the fix-up did not run", k, ttl)
		}
	}
}

// FLUSHDB queued in a namespace's MULTI takes effect at EXEC, and that is
// when the local tier hears of it: with Redis's invalidations slowed
// down, a read right after EXEC's OK never returns a flushed value. (The
// tier used to be told when FLUSHDB was queued, and filled the key again
// before EXEC deleted it.)
func TestNamespaceMultiFlushDBSeenByTheLocalTier(t *testing.T) {
	prev := localcache.SetTestHooks(&localcache.TestHooks{BeforePush: func() { time.Sleep(300 * time.Millisecond) }})
	t.Cleanup(func() { localcache.SetTestHooks(prev) })
	p := proxytest.Start(t, nil, func(c *config.Config) {
		a := user("tenant-a", nsPass, "+@all ~* allchannels")
		a.Namespace = "a:"
		c.Users = []auth.UserConfig{a}
		c.Policy.Commands.Allow = []string{"flushdb"}
		c.LocalCache.Enabled = true
		c.LocalCache.AdmitMinReads = 0
		c.LocalCache.WriteRatio = 1000
		c.LocalCache.Staleness = units.Duration{Duration: 200 * time.Millisecond}
		c.LocalCache.MaxTTL = units.Duration{Duration: time.Minute}
	})
	redistest.Eventually(t, 10*time.Second, func() bool { return p.LocalTier().Live(0) }, "local tier never became live")
	must(t, p.Redis.Client(t).Set(ctx, "a:k", "old", 0).Err())
	reader := nsClient(t, p, "tenant-a")
	hit := func() bool {
		before := metricSum(t, p, "redproxy_localcache_hits_total")
		reader.Get(ctx, "k")
		return metricSum(t, p, "redproxy_localcache_hits_total") > before
	}
	redistest.Eventually(t, 5*time.Second, hit, "k never became a hit")
	a := nsDial(t, p.Dial(t), "AUTH tenant-a "+nsPass)
	a.expect([]string{"MULTI", "FLUSHDB"}, "+OK\r\n", "+QUEUED\r\n")
	redistest.Eventually(t, 5*time.Second, hit, "k not in the tier while FLUSHDB is queued")
	a.expect([]string{"EXEC"}, "*1\r\n+OK\r\n")
	if v, err := reader.Get(ctx, "k").Result(); err != redis.Nil {
		t.Fatalf("GET k right after EXEC of FLUSHDB answered: %q %v, want nil", v, err)
	}
}

// What docs/COMPATIBILITY.md says of scripts in a namespace: only KEYS
// are prefixed, the script itself runs unconfined (names it builds, and
// the commands it calls, reach every namespace), and its reply is not
// stripped. None of this is refused: a script without keys is legitimate.
func TestNamespaceScriptsNotConfined(t *testing.T) {
	p := nsProxy(t)
	direct := p.Redis.Client(t)
	must(t, direct.Set(ctx, "b:secret", "b's", 0).Err())
	a := nsClient(t, p, "tenant-a")
	if v, err := a.Eval(ctx, "return KEYS[1]", []string{"k"}).Result(); err != nil || v != "a:k" {
		t.Errorf("EVAL return KEYS[1]: %v %v, want the prefixed a:k", v, err)
	}
	if v, err := a.Eval(ctx, "return redis.call('GET', ARGV[1])", nil, "b:secret").Result(); err != nil || v != "b's" {
		t.Errorf("EVAL GET of a name built from ARGV: %v %v, want b's value", v, err)
	}
	v, err := a.Eval(ctx, "return redis.call('KEYS', '*')", nil).StringSlice()
	if err != nil || !slices.Contains(v, "b:secret") {
		t.Errorf("EVAL KEYS *: %q %v, want every namespace's keys", v, err)
	}
	sha, err := a.ScriptLoad(ctx, "return redis.call('DBSIZE')").Result()
	must(t, err)
	if n, err := a.EvalSha(ctx, sha, nil).Int(); err != nil || n != 1 {
		t.Errorf("EVALSHA DBSIZE: %d %v, want the whole database's 1", n, err)
	}
}

// In cluster mode a MULTI holds its keyless commands until its first
// keyed one and replays them on that key's node (queueHeld, placeHeld):
// the replayed commands keep their places in EXEC's reply, and the
// stripped results are still their own commands'.
func TestNamespaceMultiClusterHeld(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	p := proxytest.Start(t, c.Nodes[0], func(cfg *config.Config) {
		cfg.Upstream.Mode = config.ModeCluster
		cfg.Upstream.Seeds = c.Seeds()
		a := user("tenant-a", nsPass, "+@all ~* allchannels")
		a.Namespace = "a:"
		cfg.Users = []auth.UserConfig{a}
	})
	seed := nsClient(t, p, "tenant-a")
	must(t, seed.RPush(ctx, "{t}l", "x").Err())
	must(t, seed.XAdd(ctx, &redis.XAddArgs{Stream: "{t}s", ID: "1-1", Values: []string{"f", "v"}}).Err())
	a := nsDial(t, p.Dial(t), "AUTH tenant-a "+nsPass)
	a.expect([]string{"MULTI", "PING", "LMPOP 1 {t}l LEFT", "XREAD STREAMS {t}s 0", "EXEC"},
		"+OK\r\n", "+QUEUED\r\n", "+QUEUED\r\n", "+QUEUED\r\n",
		"*3\r\n+PONG\r\n*2\r\n$4\r\n{t}l\r\n*1\r\n$1\r\nx\r\n*1\r\n*2\r\n$4\r\n{t}s\r\n*1\r\n*2\r\n$3\r\n1-1\r\n*2\r\n$1\r\nf\r\n$1\r\nv\r\n")
}
