package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

func TestDataTypesThroughProxy(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	c := p.Client(t)

	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// Strings
	must(c.Set(ctx, "s", "hello", time.Minute).Err())
	if v, err := c.Get(ctx, "s").Result(); err != nil || v != "hello" {
		t.Fatalf("GET: %q %v", v, err)
	}
	if _, err := c.Get(ctx, "missing").Result(); err != redis.Nil {
		t.Fatalf("GET missing: %v", err)
	}
	if n, _ := c.Incr(ctx, "n").Result(); n != 1 {
		t.Fatalf("INCR: %d", n)
	}
	if v, _ := c.IncrByFloat(ctx, "f", 1.5).Result(); v != 1.5 {
		t.Fatalf("INCRBYFLOAT: %v", v)
	}
	// Hashes
	must(c.HSet(ctx, "h", "a", "1", "b", "2").Err())
	if m, _ := c.HGetAll(ctx, "h").Result(); m["a"] != "1" || m["b"] != "2" {
		t.Fatalf("HGETALL: %v", m)
	}
	// Lists
	must(c.RPush(ctx, "l", "x", "y", "z").Err())
	if l, _ := c.LRange(ctx, "l", 0, -1).Result(); strings.Join(l, ",") != "x,y,z" {
		t.Fatalf("LRANGE: %v", l)
	}
	// Sets
	must(c.SAdd(ctx, "set", "a", "b").Err())
	if n, _ := c.SCard(ctx, "set").Result(); n != 2 {
		t.Fatalf("SCARD: %d", n)
	}
	// Sorted sets
	must(c.ZAdd(ctx, "z", redis.Z{Score: 2, Member: "two"}, redis.Z{Score: 1, Member: "one"}).Err())
	if z, _ := c.ZRangeWithScores(ctx, "z", 0, -1).Result(); len(z) != 2 || z[0].Member != "one" || z[1].Score != 2 {
		t.Fatalf("ZRANGE: %v", z)
	}
	// Streams (non-blocking)
	id, err := c.XAdd(ctx, &redis.XAddArgs{Stream: "st", Values: map[string]any{"k": "v"}}).Result()
	must(err)
	if msgs, _ := c.XRange(ctx, "st", "-", "+").Result(); len(msgs) != 1 || msgs[0].ID != id {
		t.Fatalf("XRANGE: %v", msgs)
	}
	// HyperLogLog, bitmaps, geo
	must(c.PFAdd(ctx, "hll", "a", "b", "c").Err())
	if n, _ := c.PFCount(ctx, "hll").Result(); n != 3 {
		t.Fatalf("PFCOUNT: %d", n)
	}
	must(c.SetBit(ctx, "bits", 7, 1).Err())
	if n, _ := c.BitCount(ctx, "bits", nil).Result(); n != 1 {
		t.Fatalf("BITCOUNT: %d", n)
	}
	must(c.GeoAdd(ctx, "geo", &redis.GeoLocation{Name: "p", Longitude: 13.36, Latitude: 38.11}).Err())
	if pos, _ := c.GeoPos(ctx, "geo", "p").Result(); len(pos) != 1 || pos[0] == nil {
		t.Fatalf("GEOPOS: %v", pos)
	}
	// Errors from Redis come through unchanged.
	if err := c.LPush(ctx, "s", "x").Err(); err == nil || !strings.HasPrefix(err.Error(), "WRONGTYPE") {
		t.Fatalf("WRONGTYPE: %v", err)
	}
	if err := c.Do(ctx, "NOSUCHCOMMAND").Err(); err == nil || !strings.Contains(err.Error(), "unknown command") {
		t.Fatalf("unknown command: %v", err)
	}
	// A big value crosses many reads both ways.
	big := strings.Repeat("0123456789", 300_000)
	must(c.Set(ctx, "big", big, 0).Err())
	if v, _ := c.Get(ctx, "big").Result(); v != big {
		t.Fatalf("big value mangled: %d bytes", len(v))
	}
}

func TestPipelineOf1000(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	c := p.Client(t)
	pipe := c.Pipeline()
	for i := 0; i < 1000; i++ {
		pipe.Set(ctx, "k"+strconv.Itoa(i), i, 0)
		pipe.Get(ctx, "k"+strconv.Itoa(i))
		pipe.Incr(ctx, "counter")
	}
	cmds, err := pipe.Exec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 1000; i++ {
		if v := cmds[3*i+1].(*redis.StringCmd).Val(); v != strconv.Itoa(i) {
			t.Fatalf("GET k%d = %q", i, v)
		}
		if n := cmds[3*i+2].(*redis.IntCmd).Val(); n != int64(i+1) {
			t.Fatalf("INCR #%d = %d: reordered", i, n)
		}
	}
}

// 200 clients at once, each checking that every reply answers its own
// request: a reply handed to the wrong client shows up as a foreign value.
func TestNoCrossTalk200Clients(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	for _, err := range crossTalkClients(p.Addr, "client", 200, 30) {
		t.Fatal(err)
	}
}

// crossTalkClients runs clients concurrently, each pipelining SET, GET,
// ECHO and INCR of its own key for rounds, and returns every reply that
// does not answer its own request (another client's value, a reordered
// INCR).
func crossTalkClients(addr, prefix string, clients, rounds int) []error {
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1, MaxRetries: -1})
			defer c.Close()
			key := fmt.Sprintf("%s:%d", prefix, i)
			for r := 0; r < rounds; r++ {
				val := fmt.Sprintf("%d-%d", i, r)
				pipe := c.Pipeline()
				set := pipe.Set(ctx, key, val, 0)
				get := pipe.Get(ctx, key)
				echo := pipe.Echo(ctx, val)
				incr := pipe.Incr(ctx, key+":n")
				if _, err := pipe.Exec(ctx); err != nil {
					errs <- err
					return
				}
				if set.Val() != "OK" || get.Val() != val || echo.Val() != val || incr.Val() != int64(r+1) {
					errs <- fmt.Errorf("client %d round %d: set=%q get=%q echo=%q incr=%d", i, r, set.Val(), get.Val(), echo.Val(), incr.Val())
					return
				}
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	var out []error
	for err := range errs {
		out = append(out, err)
	}
	return out
}

// A deep pipeline written in one go, larger than any read buffer, must be
// answered in exactly the order it was sent.
func TestDeepPipelineOrderAcrossReadBoundaries(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	nc := p.Dial(t)
	const n = 20000
	var req bytes.Buffer
	for i := 0; i < n; i++ {
		v := strconv.Itoa(i) + strings.Repeat("x", rand.Intn(200))
		fmt.Fprintf(&req, "*2\r\n$4\r\nECHO\r\n$%d\r\n%s\r\n", len(v), v)
		if i%7 == 0 {
			req.WriteString("*2\r\n$4\r\nINCR\r\n$3\r\nseq\r\n")
		}
	}
	go func() { nc.Write(req.Bytes()) }()
	rd := bufio.NewReader(nc)
	seq := 0
	for i := 0; i < n; i++ {
		hdr, _ := rd.ReadString('\n')
		if !strings.HasPrefix(hdr, "$") {
			t.Fatalf("reply %d: %q", i, hdr)
		}
		body, _ := rd.ReadString('\n')
		if !strings.HasPrefix(body, strconv.Itoa(i)+"x") && strings.TrimRight(body, "\r\n") != strconv.Itoa(i) {
			t.Fatalf("reply %d out of order: %q", i, body)
		}
		if i%7 == 0 {
			seq++
			line, _ := rd.ReadString('\n')
			if line != ":"+strconv.Itoa(seq)+"\r\n" {
				t.Fatalf("INCR after %d: %q want %d", i, line, seq)
			}
		}
	}
}

// Redis dies mid-run: clients get prompt errors, never a hang; when Redis
// comes back the proxy recovers on its own and no goroutine leaks.
func TestRedisKilledAndRestarted(t *testing.T) {
	rs := redistest.Start(t)
	p := proxytest.Start(t, rs, func(c *config.Config) {
		c.Upstream.DialTimeout.Duration = 500 * time.Millisecond
	})
	before := settledGoroutines(t)
	c := p.Client(t, func(o *redis.Options) { o.ReadTimeout = 3 * time.Second })
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	rs.Kill(t)
	redistest.Eventually(t, 5*time.Second, func() bool {
		start := time.Now()
		err := c.Get(ctx, "k").Err()
		if time.Since(start) > 2*time.Second {
			t.Fatalf("error took %v: clients must not hang", time.Since(start))
		}
		return err != nil && strings.Contains(err.Error(), "redproxy: upstream")
	}, "no upstream error while Redis is down")
	redistest.Eventually(t, 2*time.Second, func() bool { return !p.Ready() }, "proxy still says ready while Redis is down")
	rs.Restart(t)
	redistest.Eventually(t, 5*time.Second, func() bool {
		return c.Set(ctx, "k", "again", 0).Err() == nil
	}, "proxy did not recover after Redis restarted")
	if v, _ := c.Get(ctx, "k").Result(); v != "again" {
		t.Fatalf("after restart: %q", v)
	}
	c.Close()
	redistest.Eventually(t, 5*time.Second, func() bool { return runtime.NumGoroutine() <= before+2 },
		"goroutines grew from %d to %d", before, runtime.NumGoroutine())
}

// settledGoroutines is the number of goroutines once it has held still
// for 200 ms: the proxy starts some in the background (client parking),
// and a count read while they start was taken for a leak later (CI, under
// load: "grew from 17 to 22", every one of them the proxy's own).
func settledGoroutines(t *testing.T) int {
	t.Helper()
	last, since := runtime.NumGoroutine(), time.Now()
	redistest.Eventually(t, 10*time.Second, func() bool {
		if n := runtime.NumGoroutine(); n != last {
			last, since = n, time.Now()
		}
		return time.Since(since) >= 200*time.Millisecond
	}, "the goroutine count never held still (last %v)", lazyInt(func() int { return last }))
	return last
}

// Malformed and oversized input gets a protocol error and its connection is
// closed; the proxy and other clients carry on.
func TestBadInputIsContained(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) {
		c.Server.MaxBulkBytes = 2 << 20
		c.Server.MaxRequestBytes = 4 << 20
	})
	good := p.Client(t)
	if err := good.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	cases := []struct{ in, want string }{
		{"*1\r\n$999999999999\r\n", "-ERR Protocol error: invalid bulk length"},
		{"*1\r\n$3000000\r\n", "-ERR Protocol error: invalid bulk length"},
		{"*4\r\n$3\r\nSET\r\n$2000000\r\n" + strings.Repeat("k", 2000000) + "\r\n$2000000\r\n" + strings.Repeat("v", 2000000) + "\r\n$2000000\r\n", "-ERR Protocol error: request exceeds 4194304 bytes"},
		{"*99999999\r\n", "-ERR Protocol error: invalid multibulk length"},
		{"*1\r\n+PING\r\n", "-ERR Protocol error: expected '$', got '+'"},
		// Not malformed to Redis, which skips the two bytes after a bulk
		// unread: GET k, answered.
		{"*2\r\n$3\r\nGET\r\n$1\r\nkXX", "$1\r\n"},
		{"SET a \"unbalanced\n", "-ERR Protocol error: unbalanced quotes in request"},
		{"GET a\x00\r\n", "-ERR Protocol error: NUL in inline request"}, // Redis would wait for 64 KB
		{"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1500000\r\n" + strings.Repeat("v", 1500000) + "\r\n*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1500000\r\n", "+OK"},
	}
	for _, c := range cases {
		nc := p.Dial(t)
		nc.SetDeadline(time.Now().Add(5 * time.Second))
		go nc.Write([]byte(c.in))
		line, err := bufio.NewReader(nc).ReadString('\n')
		if !strings.HasPrefix(line, c.want) {
			t.Fatalf("%.40q: got %q %v, want %q", c.in, line, err, c.want)
		}
	}
	// The last case sent a valid 1.5 MB SET, then started a second one and
	// stopped: the proxy answers the first and waits for the rest of the
	// second, while other clients are unaffected.
	if v, err := good.Get(ctx, "k").Result(); err != nil || v != strings.Repeat("v", 1500000) {
		t.Fatalf("good client after bad input: %d bytes, %v", len(v), err)
	}
	// Unknown commands and wrong arity are Redis errors, not disconnects.
	if err := good.Do(ctx, "FOO", "bar").Err(); err == nil || !strings.Contains(err.Error(), "unknown command") {
		t.Fatalf("unknown: %v", err)
	}
	if err := good.Do(ctx, "ECHO").Err(); err == nil || !strings.Contains(err.Error(), "wrong number of arguments") {
		t.Fatalf("arity: %v", err)
	}
	if err := good.Ping(ctx).Err(); err != nil {
		t.Fatalf("client broken after errors: %v", err)
	}
}

// A client that never finishes a huge request holds no more memory than it
// sent, and one that is over the cap is refused before sending it.
func TestSlowHugeRequestDoesNotHarmOthers(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	slow := p.Dial(t)
	slow.Write([]byte("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$400000000\r\n" + strings.Repeat("x", 1<<16)))
	good := p.Client(t)
	for i := 0; i < 100; i++ {
		if err := good.Incr(ctx, "ctr").Err(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestInlineCommands(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	nc := p.Dial(t)
	nc.Write([]byte("PING\r\nSET greeting \"hello world\"\r\nGET greeting\r\nECHO 'it\\'s'\r\n"))
	rd := bufio.NewReader(nc)
	want := []string{"+PONG\r\n", "+OK\r\n", "$11\r\n", "hello world\r\n", "$4\r\n", "it's\r\n"}
	for _, w := range want {
		line, err := rd.ReadString('\n')
		if err != nil || line != w {
			t.Fatalf("got %q %v, want %q", line, err, w)
		}
	}
}

func TestSelectRoutesToDatabase(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	direct := p.Redis.Client(t)
	c := p.Client(t, func(o *redis.Options) { o.DB = 5 })
	if err := c.Set(ctx, "where", "five", 0).Err(); err != nil {
		t.Fatal(err)
	}
	d5 := direct.Conn()
	defer d5.Close()
	if err := d5.Select(ctx, 5).Err(); err != nil {
		t.Fatal(err)
	}
	if v, _ := d5.Get(ctx, "where").Result(); v != "five" {
		t.Fatalf("key not in DB 5: %q", v)
	}
	if n, _ := direct.Exists(ctx, "where").Result(); n != 0 {
		t.Fatal("key leaked into DB 0")
	}
	// SELECT in the middle of a pipeline applies from that point on.
	nc := p.Dial(t)
	nc.Write([]byte("SET x zero\r\nSELECT 3\r\nSET x three\r\nSELECT 99\r\nGET x\r\n"))
	rd := bufio.NewReader(nc)
	for _, w := range []string{"+OK\r\n", "+OK\r\n", "+OK\r\n", "-ERR DB index is out of range\r\n", "$5\r\n", "three\r\n"} {
		if line, _ := rd.ReadString('\n'); line != w {
			t.Fatalf("got %q want %q", line, w)
		}
	}
	if v, _ := direct.Get(ctx, "x").Result(); v != "zero" {
		t.Fatalf("DB 0 x = %q", v)
	}
}

func TestConnectionCommandsAnsweredByProxy(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	c := p.Client(t, func(o *redis.Options) { o.PoolSize = 1 })
	if err := c.Do(ctx, "CLIENT", "SETNAME", "worker-1").Err(); err != nil {
		t.Fatal(err)
	}
	if n, _ := c.Do(ctx, "CLIENT", "GETNAME").Text(); n != "worker-1" {
		t.Fatalf("GETNAME %q", n)
	}
	id, err := c.ClientID(ctx).Result()
	if err != nil || id <= 0 {
		t.Fatalf("CLIENT ID %d %v", id, err)
	}
	list, _ := c.ClientList(ctx).Result()
	if !strings.Contains(list, "name=worker-1") || !strings.Contains(list, "id="+strconv.FormatInt(id, 10)) {
		t.Fatalf("CLIENT LIST does not show this client: %q", list)
	}
	// Setting a name on one client must not rename the shared connections.
	names, _ := p.Redis.Client(t).ClientList(ctx).Result()
	if strings.Contains(names, "worker-1") {
		t.Fatal("client name leaked to a shared upstream connection")
	}
	if err := c.Do(ctx, "CLIENT", "SETNAME", "bad name").Err(); err == nil {
		t.Fatal("name with a space accepted")
	}
	if err := c.Do(ctx, "AUTH", "x").Err(); err == nil || !strings.Contains(err.Error(), "without any password configured") {
		t.Fatalf("AUTH without password: %v", err)
	}
	nc := p.Dial(t)
	nc.Write([]byte("PING hi\r\nQUIT\r\nPING\r\n"))
	got, _ := io.ReadAll(nc)
	if string(got) != "$2\r\nhi\r\n+OK\r\n" {
		t.Fatalf("QUIT: %q", got)
	}
}

func TestUpstreamPasswordRequiresClientAuth(t *testing.T) {
	rs := redistest.Start(t)
	if err := rs.Client(t).ConfigSet(ctx, "requirepass", "pw").Err(); err != nil {
		t.Fatal(err)
	}
	p := proxytest.Start(t, rs, func(c *config.Config) { c.Upstream.Password = "pw" })
	anon := p.Client(t)
	if err := anon.Get(ctx, "k").Err(); err == nil || !strings.HasPrefix(err.Error(), "NOAUTH") {
		t.Fatalf("unauthenticated GET: %v", err)
	}
	wrong := p.Client(t, func(o *redis.Options) { o.Password = "nope" })
	if err := wrong.Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Fatalf("wrong password: %v", err)
	}
	right := p.Client(t, func(o *redis.Options) { o.Password = "pw" })
	if err := right.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("right password: %v", err)
	}
}

func TestRedisBenchmarkDefaultSuite(t *testing.T) {
	if _, err := exec.LookPath("redis-benchmark"); err != nil {
		t.Fatal("redis-benchmark not installed (the README's test command installs redis-tools)")
	}
	p := proxytest.Start(t, nil, nil)
	host, port, _ := strings.Cut(p.Addr, ":")
	out, err := exec.Command("redis-benchmark", "-h", host, "-p", port, "-q", "-n", "20000", "-r", "100000").CombinedOutput()
	if err != nil {
		t.Fatalf("redis-benchmark: %v\n%s", err, out)
	}
	// Every test of the default suite must report a rate; an error reply
	// or a missing line means the proxy broke that command.
	want := []string{"PING_INLINE", "PING_MBULK", "SET", "GET", "INCR", "LPUSH", "RPUSH", "LPOP", "RPOP", "SADD", "HSET", "SPOP", "ZADD", "ZPOPMIN", "LPUSH (needed to benchmark LRANGE)", "LRANGE_100 (first 100 elements)", "LRANGE_300 (first 300 elements)", "LRANGE_500 (first 500 elements)", "LRANGE_600 (first 600 elements)", "MSET (10 keys)"}
	text := string(out)
	for _, w := range want {
		if !strings.Contains(text, w+": ") {
			t.Errorf("redis-benchmark did not complete %s\n%s", w, text)
		}
	}
	if strings.Contains(strings.ToLower(text), "error") {
		t.Errorf("redis-benchmark reported errors:\n%s", text)
	}
}

func TestGracefulShutdownFinishesInFlight(t *testing.T) {
	rs := redistest.Start(t, "--enable-debug-command", "local")
	p := proxytest.Start(t, rs, nil)
	// c's connection is set up first (go-redis's HELLO and CLIENT SETINFO
	// also go upstream): the only command pending at shutdown must be the
	// DEBUG SLEEP, not a handshake whose batch ends before it is sent.
	c := p.Client(t, func(o *redis.Options) { o.PoolSize = 1 })
	idle := p.Client(t)
	for _, cl := range []*redis.Client{c, idle} {
		if err := cl.Ping(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	res := make(chan error, 1)
	// A second's sleep, so that the poll below sees it pending even on a
	// loaded machine.
	go func() { res <- c.Do(ctx, "DEBUG", "SLEEP", "1").Err() }()
	waitPending(t, p, "DEBUG SLEEP never reached Redis")
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.Shutdown(sctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if err := <-res; err != nil {
		t.Fatalf("request in flight at shutdown failed: %v", err)
	}
	if err := idle.Ping(ctx).Err(); err == nil {
		t.Fatal("proxy still answering after shutdown")
	}
}

var ctx = context.Background()

// SYNC, PSYNC and REPLCONF are a replica's handshake: forwarded on a
// shared connection, Redis turned it into a replication stream the pipe
// could not frame (found by a bad-input campaign: the proxy then hung for
// every client). They are refused, and the proxy keeps serving.
func TestReplicationHandshakeRefused(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	c := dialRaw(t, p.Addr)
	for _, args := range [][]string{{"SYNC"}, {"PSYNC", "?", "-1"}, {"REPLCONF", "listening-port", "1"}} {
		v := c.do(args...)
		if e, ok := v.(respError); !ok || !strings.HasPrefix(string(e), "ERR redproxy: ") || !strings.Contains(string(e), "replicas") {
			t.Fatalf("%v = %v, want an error naming replicas", args, v)
		}
	}
	if v := c.do("PING"); v != "PONG" {
		t.Fatalf("PING after the refusals = %v", v)
	}
	if err := p.Client(t).Set(ctx, "after-sync", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
}

// A length with a leading zero ("$04") is a protocol error for Redis,
// which then drops the connection; the proxy forwarded it on a shared
// connection, and every client on it lost its replies in flight (found by
// a bad-input campaign). Now the proxy answers it as Redis would and
// closes only that client, while another client's pipelines go on.
func TestLeadingZeroLengthsStayWithTheirClient(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Upstream.Connections = 1 })
	victim := p.Client(t, func(o *redis.Options) { o.PoolSize = 1 })
	stop := make(chan struct{})
	failed := make(chan error, 1)
	var wg sync.WaitGroup
	var stopOnce sync.Once
	end := func() { stopOnce.Do(func() { close(stop) }); wg.Wait() }
	defer end()
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			cmds, err := victim.Pipelined(ctx, func(pp redis.Pipeliner) error {
				for i := range 50 {
					pp.Set(ctx, "victim", i, 0)
				}
				return nil
			})
			if err != nil {
				failed <- fmt.Errorf("victim's pipeline of %d: %v", len(cmds), err)
				return
			}
		}
	})
	for _, bad := range []string{"*1\r\n$04\r\nPING\r\n", "*01\r\n$4\r\nPING\r\n", "*1\r\n$-0\r\n\r\n"} {
		for range 20 {
			nc := p.Dial(t)
			nc.Write([]byte(bad))
			nc.SetReadDeadline(time.Now().Add(5 * time.Second))
			got, _ := io.ReadAll(nc)
			if !strings.HasPrefix(string(got), "-ERR Protocol error: invalid ") {
				t.Fatalf("%q: got %q, want a protocol error and the connection closed", bad, got)
			}
			nc.Close()
		}
	}
	end()
	select {
	case err := <-failed:
		t.Fatal(err)
	default:
	}
}

// With no password anywhere, AUTH answers as Redis with no requirepass
// does: the default user takes any password, another user is WRONGPASS,
// and AUTH <password> alone is the configuration error. (The proxy
// answered the last for all three, found by a bad-input campaign.)
// Compared with the same commands sent to Redis itself.
func TestAuthWithoutPasswordsAnswersAsRedis(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	viaProxy, direct := dialRaw(t, p.Addr), dialRaw(t, p.Redis.Addr())
	for _, args := range [][]string{{"AUTH", "default", "x"}, {"AUTH", "bob", "x"}, {"AUTH", "x"}, {"HELLO", "2", "AUTH", "default", "x"}} {
		got, want := fmt.Sprint(viaProxy.do(args...)), fmt.Sprint(direct.do(args...))
		if args[0] == "HELLO" {
			got, want = got[:min(len(got), 10)], want[:min(len(want), 10)] // the maps differ (server, version)
		}
		if got != want {
			t.Errorf("%v: proxy %q, Redis %q", args, got, want)
		}
	}
}

// Integer arguments the proxy reads itself (SELECT, HELLO's version) are
// parsed as Redis's string2ll parses them: "01", "+1" and "-0" are
// refused. The proxy took them with Atoi: SELECT 01 answered OK where
// Redis refuses it, and under WATCH (forwarded, refused by Redis) it still
// moved the session to database 1 for the commands after the UNWATCH.
func TestIntegerArgumentsParsedAsRedis(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	viaProxy, direct := dialRaw(t, p.Addr), dialRaw(t, p.Redis.Addr())
	for _, args := range [][]string{{"SELECT", "01"}, {"SELECT", "+1"}, {"SELECT", "-0"}, {"SELECT", "1"}, {"SELECT", "0"}, {"HELLO", "02"}} {
		got, want := fmt.Sprint(viaProxy.do(args...)), fmt.Sprint(direct.do(args...))
		if got != want {
			t.Errorf("%v: proxy %q, Redis %q", args, got, want)
		}
	}
	c := dialRaw(t, p.Addr)
	for _, args := range [][]string{{"WATCH", "w"}, {"SELECT", "01"}, {"UNWATCH"}, {"SET", "after-select-01", "v"}} {
		c.do(args...)
	}
	if n, err := p.Redis.Client(t).Exists(ctx, "after-select-01").Result(); err != nil || n != 1 {
		t.Fatalf("SET after a refused SELECT 01 under WATCH: in database 0 %d, %v; want it there", n, err)
	}
}

// A frozen Redis (SIGSTOP) does not hold the exit past shutdown_timeout:
// the clients still waiting at the timeout are closed, and so are the
// upstream connections their commands wait on. (Found by a user's trial:
// the clients were closed at the timeout, but the process exited only at
// the upstream's dead_timeout, 30 s by default, when their Calls failed.)
func TestShutdownTimeoutBoundsAFrozenRedis(t *testing.T) {
	rs := redistest.Start(t)
	p := proxytest.Start(t, rs, func(c *config.Config) {
		c.Upstream.ReplyTimeout = units.Duration{Duration: 50 * time.Second}
		c.Upstream.DeadTimeout = units.Duration{Duration: 60 * time.Second}
	})
	c := p.Client(t, func(o *redis.Options) { o.PoolSize = 1; o.MaxRetries = -1 })
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	rs.Freeze(t)
	t.Cleanup(func() { rs.Thaw(t) })
	res := make(chan error, 1)
	go func() { res <- c.Get(ctx, "k").Err() }()
	waitPending(t, p, "the GET never reached the upstream connection")
	sctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := p.Shutdown(sctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("shutdown with a client waiting on a frozen Redis: %v; want the timeout", err)
	}
	// Anything far below the 60 s dead timeout shows the upstream was not
	// waited for.
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("shutdown took %v with shutdown_timeout 500ms: it waited for the frozen Redis", took)
	}
	if err := <-res; err == nil {
		t.Fatal("the GET to a frozen Redis succeeded")
	}
}

// Closing the upstreams at the shutdown timeout happens while sessions
// still run: clients in every kind of session (plain reads and writes
// through the local tier, coalesced reads, blocked BLPOP, subscribers,
// MULTI) are cut mid-command without a panic or a hang, and each ends
// with an error or its reply, never another's.
func TestShutdownTimeoutClosesUpstreamsUnderTraffic(t *testing.T) {
	rs := redistest.Start(t, "--enable-debug-command", "local")
	p := proxytest.Start(t, rs, func(c *config.Config) { c.LocalCache.Enabled = true })
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var wrong sync.Map
	for i := range 12 {
		c := p.Client(t, func(o *redis.Options) { o.MaxRetries = -1; o.PoolSize = 2 })
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprint("k", i%3)
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				var err error
				switch i % 6 {
				case 0:
					want := fmt.Sprint("v", i, "-", n)
					if err = c.Set(ctx, fmt.Sprint("own", i), want, 0).Err(); err == nil {
						if got, gerr := c.Get(ctx, fmt.Sprint("own", i)).Result(); gerr == nil && got != want {
							wrong.Store(i, got)
						}
					}
				case 1:
					err = c.Get(ctx, key).Err()
				case 2:
					err = c.BLPop(ctx, 0, fmt.Sprint("list", i)).Err()
				case 3:
					ps := c.Subscribe(ctx, "ch")
					_, err = ps.Receive(ctx)
					ps.Close()
				case 4:
					_, err = c.TxPipelined(ctx, func(tx redis.Pipeliner) error {
						tx.Incr(ctx, key)
						tx.Get(ctx, key)
						return nil
					})
				case 5:
					err = c.Do(ctx, "DEBUG", "SLEEP", "0.2").Err()
				}
				if err != nil && err != redis.Nil {
					return // the proxy is going
				}
			}
		}()
	}
	time.Sleep(500 * time.Millisecond)
	sctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	p.Shutdown(sctx)
	close(stop)
	wg.Wait()
	wrong.Range(func(k, v any) bool {
		t.Errorf("client %v read %v, not its own last write", k, v)
		return true
	})
}

// waitPending waits until a command waits for Redis's reply on database
// 0's shared connections (either protocol).
func waitPending(t *testing.T, p *proxytest.Proxy, msg string) {
	t.Helper()
	redistest.Eventually(t, 5*time.Second, func() bool {
		s2, _ := p.Backend().Pool(0, false).Stats()
		s3, _ := p.Backend().Pool(0, true).Stats()
		return s2.Pending+s3.Pending > 0
	}, "%s", msg)
}
