package guard_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/proxy"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// holesPolicy: s:* keys need a TTL and get 24h when a write leaves them
// without one; l:* keys need one and have no default.
func holesPolicy() policy.Config {
	return policy.Config{
		Mode: "enforce",
		TTL: []policy.TTLRule{
			{Pattern: "s:*", Required: true, Default: policy.Duration{Duration: 24 * time.Hour}},
			{Pattern: "l:*", Required: true},
		},
	}
}

// dbClient is a client straight to Redis on database db.
func dbClient(t *testing.T, rs *redistest.Server, db int) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: rs.Addr(), DB: db})
	t.Cleanup(func() { c.Close() })
	return c
}

// pttl is the key's PTTL read straight from Redis: -2 when it does not
// exist, -1 when it has no TTL.
func pttl(t *testing.T, c *redis.Client, key string) time.Duration {
	t.Helper()
	d, err := c.PTTL(ctx, key).Result()
	if err != nil {
		t.Fatalf("PTTL %s: %v", key, err)
	}
	return d
}

// wantTTL checks the key's TTL, read straight from Redis, is in
// (want-5s, want].
func wantTTL(t *testing.T, c *redis.Client, key string, want time.Duration) {
	t.Helper()
	if got := pttl(t, c, key); got > want || got <= want-5*time.Second {
		t.Errorf("PTTL %s = %v, want about %v", key, got, want)
	}
}

// TestLookaheadHolesThroughProxy sends each batch in one write through the
// proxy and reads the key's TTL from Redis at the end: a later command in
// the batch that does not certainly set the TTL must not stand in for it.
func TestLookaheadHolesThroughProxy(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Policy = holesPolicy() })
	db0, db1 := dbClient(t, p.Redis, 0), dbClient(t, p.Redis, 1)
	const day = 24 * time.Hour
	cases := []struct {
		name    string
		batch   [][]string
		replies []string
		db      *redis.Client // where the key ends up
		want    time.Duration // its TTL; 0: the key is gone
	}{
		{"select between", [][]string{{"HSET", "s:sel", "f", "v"}, {"SELECT", "1"}, {"EXPIRE", "s:sel", "100"}},
			[]string{":1", "+OK", ":0"}, db0, day},
		{"expire not a number", [][]string{{"HSET", "s:nan", "f", "v"}, {"EXPIRE", "s:nan", "abc"}},
			[]string{":1", "-ERR value is not an integer or out of range"}, db0, day},
		{"expire nx lt refused", [][]string{{"HSET", "s:nxlt", "f", "v"}, {"EXPIRE", "s:nxlt", "100", "NX", "LT"}},
			[]string{":1", "-ERR NX and XX, GT or LT options at the same time are not compatible"}, db0, day},
		{"expire xx", [][]string{{"HSET", "s:xx", "f", "v"}, {"EXPIRE", "s:xx", "100", "XX"}},
			[]string{":1", ":1"}, db0, 100 * time.Second}, // the fix-up's TTL, then XX replaces it
		{"expire gt", [][]string{{"HSET", "s:gt", "f", "v"}, {"EXPIRE", "s:gt", "100", "GT"}},
			[]string{":1", ":0"}, db0, day},
		{"expire nx is certain", [][]string{{"HSET", "s:nx", "f", "v"}, {"EXPIRE", "s:nx", "100", "NX"}},
			[]string{":1", ":1"}, db0, 100 * time.Second},
		// Documented divergence: the fix-up runs first, so an NX behind a
		// boundary finds a TTL and leaves the default.
		{"expire nx behind a boundary", [][]string{{"HSET", "s:nxsel", "f", "v"}, {"SELECT", "0"}, {"EXPIRE", "s:nxsel", "100", "NX"}},
			[]string{":1", "+OK", ":0"}, db0, day},
		{"expire lt is certain", [][]string{{"HSET", "s:lt", "f", "v"}, {"EXPIRE", "s:lt", "100", "LT"}},
			[]string{":1", ":1"}, db0, 100 * time.Second},
		{"set nx on an existing key", [][]string{{"HSET", "s:setnx", "f", "v"}, {"SET", "s:setnx", "v2", "NX", "EX", "100"}},
			[]string{":1", "$(nil)"}, db0, day},
		{"set ex zero", [][]string{{"HSET", "s:ex0", "f", "v"}, {"SET", "s:ex0", "v2", "EX", "0"}},
			[]string{":1", "-ERR invalid expire time in 'set' command"}, db0, day},
		{"set get on a hash", [][]string{{"HSET", "s:get", "f", "v"}, {"SET", "s:get", "v2", "GET", "EX", "100"}},
			[]string{":1", "-WRONGTYPE Operation against a key holding the wrong kind of value"}, db0, day},
		{"discarded transaction", [][]string{{"HSET", "s:disc", "f", "v"}, {"MULTI"}, {"EXPIRE", "s:disc", "100"}, {"DISCARD"}},
			[]string{":1", "+OK", "+QUEUED", "+OK"}, db0, day},
		{"transaction aborted at queue time", [][]string{{"HSET", "s:abort", "f", "v"}, {"MULTI"}, {"EXPIRE", "s:abort", "100"}, {"EXPIRE"}, {"EXEC"}},
			[]string{":1", "+OK", "+QUEUED", "-ERR wrong number of arguments for 'expire' command", "-EXECABORT Transaction discarded because of previous errors."}, db0, day},
		{"transaction aborted by watch", [][]string{{"WATCH", "w"}, {"HSET", "s:watch", "f", "v"}, {"SET", "w", "1"}, {"MULTI"}, {"EXPIRE", "s:watch", "100"}, {"EXEC"}},
			[]string{"+OK", ":1", "+OK", "+OK", "+QUEUED", "*(nil)"}, db0, day},
		{"swapdb between", [][]string{{"HSET", "s:swap", "f", "v"}, {"SWAPDB", "0", "1"}, {"EXPIRE", "s:swap", "100"}, {"SWAPDB", "0", "1"}},
			[]string{":1", "+OK", ":0", "+OK"}, db0, day},
		{"move between", [][]string{{"HSET", "s:move", "f", "v"}, {"MOVE", "s:move", "1"}, {"EXPIRE", "s:move", "100"}},
			[]string{":1", ":1", ":0"}, db1, day},
		{"refusal between is no boundary", [][]string{{"HSET", "s:refused", "f", "v"}, {"KEYS", "*"}, {"EXPIRE", "s:refused", "100"}},
			[]string{":1", "-ERR redproxy policy: KEYS is disabled; use SCAN 0 MATCH pattern COUNT 100", ":1"}, db0, 100 * time.Second},
		{"expire negative deletes", [][]string{{"HSET", "s:neg", "f", "v"}, {"EXPIRE", "s:neg", "-1"}},
			[]string{":1", ":1"}, db0, 0},
		{"pexpireat in the past deletes", [][]string{{"HSET", "s:past", "f", "v"}, {"PEXPIREAT", "s:past", "1000"}},
			[]string{":1", ":1"}, db0, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			nc := p.Dial(t)
			equalReplies(t, roundTrip(t, nc, c.batch...), c.replies)
			key := c.batch[0][1]
			if c.batch[0][0] == "WATCH" {
				key = c.batch[1][1]
			}
			if c.want == 0 {
				if n := c.db.Exists(ctx, key).Val(); n != 0 {
					t.Errorf("%s still exists with PTTL %v", key, pttl(t, c.db, key))
				}
				return
			}
			wantTTL(t, c.db, key, c.want)
		})
	}

	// Documented divergence (docs/COMPATIBILITY.md, "Policy TTL fix-ups"):
	// the look-ahead does not span round trips outside a transaction, so
	// an EXPIRE NX a round trip later finds the fix-up's TTL and sets
	// nothing. (Inside a MULTI sent command by command the fix-up waits
	// for the transaction's end: TestTransactionByStepDefaults.)
	t.Run("expire nx a round trip later", func(t *testing.T) {
		nc := p.Dial(t)
		equalReplies(t, roundTrip(t, nc, []string{"INCR", "s:later"}), []string{":1"})
		equalReplies(t, roundTrip(t, nc, []string{"EXPIRE", "s:later", "60", "NX"}), []string{":0"})
		wantTTL(t, db0, "s:later", day)
	})

	t.Run("quit before the expire", func(t *testing.T) {
		nc := p.Dial(t)
		nc.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := nc.Write([]byte("*4\r\n$4\r\nHSET\r\n$6\r\ns:quit\r\n$1\r\nf\r\n$1\r\nv\r\n*1\r\n$4\r\nQUIT\r\n*3\r\n$6\r\nEXPIRE\r\n$6\r\ns:quit\r\n$3\r\n100\r\n")); err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(nc) // the proxy closes after QUIT's reply
		if string(got) != ":1\r\n+OK\r\n" {
			t.Fatalf("replies %q", got)
		}
		wantTTL(t, db0, "s:quit", day)
	})

	t.Run("client gone while blocked before the expire", func(t *testing.T) {
		nc := p.Dial(t)
		if _, err := nc.Write([]byte("*4\r\n$4\r\nHSET\r\n$7\r\ns:block\r\n$1\r\nf\r\n$1\r\nv\r\n*3\r\n$5\r\nBLPOP\r\n$7\r\nq:empty\r\n$1\r\n0\r\n*3\r\n$6\r\nEXPIRE\r\n$7\r\ns:block\r\n$3\r\n100\r\n")); err != nil {
			t.Fatal(err)
		}
		redistest.Eventually(t, 5*time.Second, func() bool { return db0.Exists(ctx, "s:block").Val() == 1 }, "HSET never ran")
		nc.Close() // the EXPIRE behind BLPOP is never sent
		wantTTL(t, db0, "s:block", day)
	})

	t.Run("no default: refused", func(t *testing.T) {
		got := roundTrip(t, p.Dial(t), []string{"HSET", "l:k", "f", "v"}, []string{"SELECT", "0"}, []string{"EXPIRE", "l:k", "100"})
		if !strings.HasPrefix(got[0], `-ERR redproxy policy: key "l:k" needs a TTL`) {
			t.Errorf("HSET: %q", got[0])
		}
		if n := db0.Exists(ctx, "l:k").Val(); n != 0 {
			t.Errorf("l:k written")
		}
	})
}

// TestCopyToAnotherDatabaseThroughProxy: COPY ... DB n gets its fix-up in
// database n, and the client's connection stays on its own database, in a
// pipeline, inside the client's MULTI (after a SELECT queued in it) and
// under WATCH.
func TestCopyToAnotherDatabaseThroughProxy(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Policy = holesPolicy() })
	db := func(n int) *redis.Client { return dbClient(t, p.Redis, n) }
	check(t, "seed", db(0).Set(ctx, "s:src", "v", 0).Err())
	check(t, "seed", db(2).Set(ctx, "s:src", "v2", 0).Err())
	const day = 24 * time.Hour

	t.Run("pipeline", func(t *testing.T) {
		nc := p.Dial(t)
		got := roundTrip(t, nc, []string{"COPY", "s:src", "s:dst", "DB", "3"}, []string{"SET", "p:after", "1"})
		equalReplies(t, got, []string{":1", "+OK"})
		wantTTL(t, db(3), "s:dst", day)
		if db(0).Exists(ctx, "s:dst").Val() != 0 {
			t.Error("s:dst created in database 0")
		}
		if db(0).Get(ctx, "p:after").Val() != "1" {
			t.Error("the next command did not run in database 0")
		}
	})
	t.Run("inside MULTI after SELECT", func(t *testing.T) {
		nc := p.Dial(t)
		got := roundTrip(t, nc, []string{"MULTI"}, []string{"SELECT", "2"}, []string{"COPY", "s:src", "s:dst2", "DB", "4"},
			[]string{"SET", "p:tx", "1"}, []string{"EXEC"}, []string{"GET", "s:src"})
		equalReplies(t, got, []string{"+OK", "+QUEUED", "+QUEUED", "+QUEUED", "*[+OK :1 +OK]", "$v2"})
		wantTTL(t, db(4), "s:dst2", day)
		if db(4).Get(ctx, "s:dst2").Val() != "v2" {
			t.Error("copied from the wrong database")
		}
		if db(2).Get(ctx, "p:tx").Val() != "1" {
			t.Error("the command after COPY did not run in database 2")
		}
	})
	t.Run("under WATCH", func(t *testing.T) {
		nc := p.Dial(t)
		got := roundTrip(t, nc, []string{"WATCH", "x"}, []string{"COPY", "s:src", "s:dst3", "DB", "5"},
			[]string{"SET", "p:watch", "1"}, []string{"UNWATCH"})
		equalReplies(t, got, []string{"+OK", ":1", "+OK", "+OK"})
		wantTTL(t, db(5), "s:dst3", day)
		if db(0).Get(ctx, "p:watch").Val() != "1" {
			t.Error("the command after COPY did not run in database 0")
		}
	})
	if got := metricValue(t, p.Metrics.Registry, "redproxy_policy_fixup_failures_total"); got != 0 {
		t.Errorf("fix-up failures: %v", got)
	}
}

// startWithTable is proxytest.Start with a command table of the test's.
func startWithTable(t *testing.T, rs *redistest.Server, table *commands.Table, pol policy.Config) (addr string, reg *metrics.Metrics, srv *proxy.Server) {
	t.Helper()
	cfg := config.Default()
	cfg.Server.Listen = "127.0.0.1:0"
	cfg.Server.Admin = ""
	cfg.Upstream.Address = rs.Addr()
	cfg.Upstream.Connections = 2
	cfg.Policy = pol
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	reg = metrics.New()
	srv, err := proxy.NewServer(proxy.Options{Config: cfg, Table: table, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Metrics: reg})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", cfg.Server.Listen)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	redistest.Eventually(t, 5*time.Second, srv.Ready, "proxy never connected")
	return ln.Addr().String(), reg, srv
}

// TestUnclassifiedWriteThroughProxy: a write command the policy's
// classification does not list, as a module's would be, known to the
// proxy only from the upstream's COMMAND reply. Redis runs HSET under
// another name (rename-command), and the table the proxy loads from that
// Redis's COMMAND reply carries HSET's real key specs under that name: the
// TTL rule applies through the key-spec fallback. A command nobody knows is
// reported as unclassified.
func TestUnclassifiedWriteThroughProxy(t *testing.T) {
	// Redis's HSET answers like HMSET unless its name's second letter is
	// 's', hence the name.
	rs := redistest.Start(t, "--rename-command", "hset", "js.hset")
	direct := rs.Client(t)
	reply, err := direct.Do(ctx, "COMMAND").Result()
	check(t, "COMMAND", err)
	cmds, err := commands.Parse(reply)
	check(t, "parse", err)
	found := false
	for _, c := range cmds {
		if c.Name == "hset" { // Redis reports a renamed command by its own name
			c.Name = "js.hset"
			found = true
		}
	}
	if !found {
		t.Fatal("no hset in COMMAND")
	}
	addr, reg, srv := startWithTable(t, rs, commands.NewTable(cmds), holesPolicy())
	nc, err := net.DialTimeout("tcp", addr, 2*time.Second)
	check(t, "dial", err)
	defer nc.Close()

	equalReplies(t, roundTrip(t, nc, []string{"JS.HSET", "s:js", "f", "v"}), []string{":1"})
	wantTTL(t, direct, "s:js", 24*time.Hour)
	got := roundTrip(t, nc, []string{"JS.HSET", "l:js", "f", "v"})
	if !strings.HasPrefix(got[0], `-ERR redproxy policy: key "l:js" needs a TTL`) {
		t.Errorf("no default: %q", got[0])
	}

	got = roundTrip(t, nc, []string{"MOD.NOBODY", "s:x"})
	if !strings.HasPrefix(got[0], "-ERR unknown command") {
		t.Errorf("unknown command: %q", got[0])
	}
	if v := metricValue(t, reg.Registry, "redproxy_policy_unclassified_total"); v != 1 {
		t.Errorf("redproxy_policy_unclassified_total = %v, want 1", v)
	}
	rep := reportJSON(t, srv.Guard())
	if row := findRow(rep, "unclassified", "mod.nobody"); row == nil || row.Reported != 1 {
		t.Errorf("report row %+v in %+v", row, rep.Rows)
	}
	if row := findRow(rep, "unclassified", "js.hset"); row != nil {
		t.Errorf("a fully classified command reported: %+v", row)
	}
}

// TestFixupFailuresCounted: a fix-up that Redis queues but fails when EXEC
// runs it is counted, whether the proxy wrapped the command in MULTI/EXEC
// itself or the fix-up sits in the client's transaction; a command the
// policy refuses inside MULTI is not a fix-up failure. The failing fix-up is
// a COPY ... DB n where the proxy believes in more databases than Redis
// has: SELECT n fails at EXEC.
func TestFixupFailuresCounted(t *testing.T) {
	rs := redistest.Start(t, "--databases", "4")
	p := proxytest.Start(t, rs, func(c *config.Config) { c.Policy = holesPolicy() }) // upstream.databases = 16
	failures := func() float64 {
		return metricValue(t, p.Metrics.Registry, "redproxy_policy_fixup_failures_total")
	}
	check(t, "seed", rs.Client(t).Set(ctx, "s:src", "v", 0).Err())
	nc := p.Dial(t)

	before := failures()
	equalReplies(t, roundTrip(t, nc, []string{"MULTI"}, []string{"KEYS", "*"}, []string{"EXEC"}),
		[]string{"+OK", "-ERR redproxy policy: KEYS is disabled; use SCAN 0 MATCH pattern COUNT 100", "-EXECABORT Transaction discarded because of previous errors."})
	if got := failures() - before; got != 0 {
		t.Errorf("a refusal inside MULTI counted as %v fix-up failures", got)
	}

	before = failures()
	equalReplies(t, roundTrip(t, nc, []string{"COPY", "s:src", "s:dst", "DB", "9"}, []string{"PING"}),
		[]string{"-ERR DB index is out of range", "+PONG"})
	if got := failures() - before; got != 1 {
		t.Errorf("wrapped by the proxy: %v fix-up failures, want 1", got)
	}

	before = failures()
	equalReplies(t, roundTrip(t, nc, []string{"MULTI"}, []string{"COPY", "s:src", "s:dst", "DB", "9"}, []string{"EXEC"}, []string{"PING"}),
		[]string{"+OK", "+QUEUED", "*[-ERR DB index is out of range]", "+PONG"})
	if got := failures() - before; got != 1 {
		t.Errorf("in the client's MULTI: %v fix-up failures, want 1", got)
	}

	// The fix-up's own EXPIRE failing: Redis checks ACLs again when EXEC
	// runs, and the transaction takes EXPIRE from the proxy's user before
	// the fix-up runs. (Last: it leaves the user without EXPIRE.)
	before = failures()
	equalReplies(t, roundTrip(t, nc, []string{"MULTI"}, []string{"ACL", "SETUSER", "default", "-expire"},
		[]string{"HSET", "s:acl", "f", "v"}, []string{"EXEC"}),
		[]string{"+OK", "+QUEUED", "+QUEUED", "*[+OK :1]"})
	if got := failures() - before; got != 1 {
		t.Errorf("EXPIRE refused at EXEC: %v fix-up failures, want 1", got)
	}
}

// TestInheritedTTLHeldToMax: RENAME, RENAMENX and COPY give the new key the
// source's TTL, which the policy cannot see; under a rule with a max, a TTL
// above it is lowered to the max, one below it is kept, and a key that took
// no TTL gets the default, in a pipeline, inside MULTI and in another
// database. (Before, a key renamed from one with a 30-day TTL kept 30
// days under a 7-day max.)
func TestInheritedTTLHeldToMax(t *testing.T) {
	const day = 24 * time.Hour
	p := proxytest.Start(t, nil, func(c *config.Config) {
		c.Policy = policy.Config{Mode: "enforce", TTL: []policy.TTLRule{{Pattern: "s:*", Required: true,
			Default: policy.Duration{Duration: day}, Max: policy.Duration{Duration: 7 * day}}}}
	})
	db0, db3 := dbClient(t, p.Redis, 0), dbClient(t, p.Redis, 3)
	seed := func() {
		t.Helper()
		check(t, "seed", db0.Set(ctx, "p:long", "v", 30*day).Err())
		check(t, "seed", db0.Set(ctx, "p:long2", "v", 30*day).Err())
		check(t, "seed", db0.Set(ctx, "p:short", "v", time.Hour).Err())
		check(t, "seed", db0.Set(ctx, "p:none", "v", 0).Err())
	}
	seed()
	nc := p.Dial(t)
	got := roundTrip(t, nc, []string{"RENAME", "p:long", "s:long"}, []string{"RENAMENX", "p:short", "s:short"},
		[]string{"COPY", "p:none", "s:none"}, []string{"COPY", "p:long2", "s:db3", "DB", "3"})
	equalReplies(t, got, []string{"+OK", ":1", ":1", ":1"})
	wantTTL(t, db0, "s:long", 7*day)
	wantTTL(t, db0, "s:short", time.Hour)
	wantTTL(t, db0, "s:none", day)
	wantTTL(t, db3, "s:db3", 7*day)

	check(t, "clean", db0.Del(ctx, "s:long", "s:short", "s:none").Err())
	seed()
	got = roundTrip(t, nc, []string{"MULTI"}, []string{"RENAME", "p:long", "s:long"}, []string{"COPY", "p:short", "s:short"},
		[]string{"EXEC"})
	equalReplies(t, got, []string{"+OK", "+QUEUED", "+QUEUED", "*[+OK :1]"})
	wantTTL(t, db0, "s:long", 7*day)
	wantTTL(t, db0, "s:short", time.Hour)
	if got := metricValue(t, p.Metrics.Registry, "redproxy_policy_fixup_failures_total"); got != 0 {
		t.Errorf("fix-up failures: %v", got)
	}
}
