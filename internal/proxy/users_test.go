package proxy_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/proxy"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

const (
	appPass = "app-pass-7f3a"
	roPass  = "ro-pass-91c2"
)

func user(name, pass, acl string) auth.UserConfig {
	return auth.UserConfig{Name: name, PasswordSHA256: auth.HashPassword(pass), ACL: acl}
}

// usersProxy starts a proxy with proxy users: app (everything), ro
// (~cache:* +@read) and variants of ro that also allow scripting,
// transactions or SORT, to show the key patterns still hold there.
func usersProxy(t *testing.T, mutate func(*config.Config)) *proxytest.Proxy {
	return proxytest.Start(t, nil, func(c *config.Config) {
		c.Users = []auth.UserConfig{
			user("app", appPass, "+@all ~*"),
			user("ro", roPass, "~cache:* +@read"),
			user("ro-script", roPass, "~cache:* +@read +@scripting"),
			user("ro-tx", roPass, "~cache:* +@read +@transaction"),
			user("ro-sort", roPass, "~cache:* +@read +sort"),
			user("default", "dflt-pass", "+@all ~*"),
		}
		if mutate != nil {
			mutate(c)
		}
	})
}

func loggedIn(t *testing.T, p *proxytest.Proxy, name, pass string) *redis.Client {
	return p.Client(t, func(o *redis.Options) { o.Username, o.Password, o.PoolSize = name, pass, 1 })
}

// Without credentials every command but AUTH, HELLO, QUIT (and RESET) is
// refused as Redis with requirepass refuses it, before anything reaches
// Redis: NOAUTH, except that Redis checks the command's existence and
// arity first, and EXEC's refusal is an EXECABORT (found by review: the
// proxy answered NOAUTH to all).
func TestUsersNoAuthForEveryCommand(t *testing.T) {
	p := usersProxy(t, nil)
	nc := p.Dial(t)
	rd := newReplyReader(nc)
	locked := redistest.Start(t)
	if err := locked.Client(t).ConfigSet(ctx, "requirepass", "locked-pass").Err(); err != nil {
		t.Fatal(err)
	}
	dnc := dialAddr(t, locked.Addr())
	drd := newReplyReader(dnc)
	for _, c := range []string{
		"PING", "GET cache:a", "SET cache:a 1", "EVAL \"return 1\" 0", "MULTI", "EXEC", "WATCH k", "SUBSCRIBE ch",
		"MONITOR", "CLIENT LIST", "CLIENT SETNAME x", "INFO", "ECHO hi", "SELECT 1", "COMMAND COUNT", "BLPOP q 1",
		"CLIENT TRACKING ON", "FLUSHALL", "NOSUCHCOMMAND", "NOSUCH with args", "ACL WHOAMI", "GET", "EXEC now",
		"CLIENT FOO", "CLIENT", "OBJECT NOPE x", "XINFO FOO", "COMMAND FOO", "CLIENT KILL",
	} {
		nc.Write([]byte(c + "\r\n"))
		dnc.Write([]byte(c + "\r\n"))
		if got, want := rd.line(t), drd.line(t); got != want {
			t.Errorf("%s: %q, Redis %q", c, got, want)
		}
	}
	if n, _ := p.Redis.Client(t).Exists(ctx, "cache:a").Result(); n != 0 {
		t.Fatal("a refused SET reached Redis")
	}
	nc.Write([]byte("AUTH nobody x\r\n"))
	if got := rd.line(t); got != "-WRONGPASS invalid username-password pair or user is disabled." {
		t.Errorf("AUTH: %q", got)
	}
	nc.Write([]byte("HELLO 3\r\n"))
	if got := rd.line(t); !strings.HasPrefix(got, "-NOAUTH HELLO must be called") {
		t.Errorf("HELLO: %q", got)
	}
	nc.Write([]byte("RESET\r\nQUIT\r\n"))
	if got := rd.line(t); got != "+RESET" {
		t.Errorf("RESET: %q", got)
	}
	if got := rd.line(t); got != "+OK" {
		t.Errorf("QUIT: %q", got)
	}
}

// AUTH works in Redis 6's forms, and failures never say whether the user
// exists.
func TestUsersAuthForms(t *testing.T) {
	p := usersProxy(t, nil)
	nc := p.Dial(t)
	rd := newReplyReader(nc)
	send := func(cmd, want string) {
		t.Helper()
		nc.Write([]byte(cmd + "\r\n"))
		if got := rd.line(t); got != want {
			t.Fatalf("%s: %q, want %q", cmd, got, want)
		}
	}
	wrong := "-WRONGPASS invalid username-password pair or user is disabled."
	send("AUTH app wrong", wrong)
	send("AUTH ghost "+appPass, wrong)
	send("AUTH wrong", wrong) // one argument: the default user
	send("AUTH app "+appPass, "+OK")
	send("SET cache:a 1", "+OK")
	send("AUTH dflt-pass", "+OK") // now the default user
	send("CLIENT SETNAME me", "+OK")
	nc.Write([]byte("CLIENT INFO\r\n"))
	rd.line(t) // bulk header
	if info := rd.line(t); !strings.Contains(info, " user=default ") {
		t.Errorf("CLIENT INFO after AUTH as default: %s", info)
	}
	send("AUTH ro "+roPass, "+OK")
	send("SET cache:a 2", "-NOPERM User ro has no permissions to run the 'set' command")

	// HELLO 3 AUTH user pass, through go-redis, which uses it.
	c := p.Client(t, func(o *redis.Options) { o.Username, o.Password, o.Protocol = "app", appPass, 3 })
	if err := c.Set(ctx, "cache:h", "v", 0).Err(); err != nil {
		t.Fatalf("HELLO 3 AUTH: %v", err)
	}
	bad := p.Client(t, func(o *redis.Options) { o.Username, o.Password, o.Protocol = "app", "nope", 3 })
	if err := bad.Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Fatalf("HELLO 3 AUTH with a wrong password: %v", err)
	}
}

// Failed AUTH is rate-limited per client address and counted.
func TestUsersFailedAuthRateLimited(t *testing.T) {
	p := usersProxy(t, nil)
	limited := false
	for i := 0; i < 3*auth.DefaultFailBurst && !limited; i++ {
		nc := p.Dial(t) // new connections do not reset the limit
		nc.Write([]byte("AUTH app wrong\r\n"))
		got := newReplyReader(nc).line(t)
		limited = strings.Contains(got, "too many failed AUTH attempts")
		nc.Close()
	}
	if !limited {
		t.Fatal("never rate-limited")
	}
	out := gatherText(t, p.Metrics)
	if !strings.Contains(out, `redproxy_auth_failures_total{reason="wrongpass"}`) || !strings.Contains(out, `redproxy_auth_failures_total{reason="ratelimited"}`) {
		t.Fatalf("failures not counted:\n%s", grepLines(out, "auth_failures"))
	}
}

// TestAuthLimitExemptAndOff: behind a sidecar every client comes from
// 127.0.0.1, so one worker with a wrong password locked the others' right
// ones out. An exempt address is never limited, auth_failure_limit = 0
// turns the limit off, and a reload to either unlocks an address already
// limited, at its next AUTH; failures are still counted.
func TestAuthLimitExemptAndOff(t *testing.T) {
	authAfterFailures := func(t *testing.T, p *proxytest.Proxy, failures int) string {
		t.Helper()
		nc := p.Dial(t)
		rd := newReplyReader(nc)
		for range failures {
			nc.Write([]byte("AUTH app wrong\r\n"))
			rd.line(t)
		}
		nc.Write([]byte("AUTH app " + appPass + "\r\n"))
		return rd.line(t)
	}
	for _, tt := range []struct {
		name   string
		mutate func(*config.Config)
	}{
		{"exempt address", func(c *config.Config) { c.Server.AuthLimitExempt = []string{"10.0.0.0/8", "127.0.0.1"} }},
		{"exempt prefix", func(c *config.Config) { c.Server.AuthLimitExempt = []string{"127.0.0.0/8"} }},
		{"limit off", func(c *config.Config) { c.Server.AuthFailureLimit = 0 }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := usersProxy(t, tt.mutate)
			if got := authAfterFailures(t, p, 3*auth.DefaultFailBurst); got != "+OK" {
				t.Fatalf("right password after %d wrong ones: %q, want +OK", 3*auth.DefaultFailBurst, got)
			}
			if n := counterSum(t, p, "redproxy_auth_failures_total", "reason", "wrongpass"); n != 3*auth.DefaultFailBurst {
				t.Errorf("redproxy_auth_failures_total = %v, want %d", n, 3*auth.DefaultFailBurst)
			}
		})
	}
	for name, unlock := range map[string]func(*config.Config){
		"reload exempts": func(c *config.Config) { c.Server.AuthLimitExempt = []string{"::1", "127.0.0.1"} },
		"reload to 0":    func(c *config.Config) { c.Server.AuthFailureLimit = 0 },
	} {
		t.Run(name, func(t *testing.T) {
			p := usersProxy(t, func(c *config.Config) { c.Server.AuthFailureLimit = 2 })
			if got := authAfterFailures(t, p, 2); !strings.Contains(got, "too many failed AUTH") {
				t.Fatalf("right password after 2 wrong ones with a limit of 2: %q, want the rate-limit error", got)
			}
			if _, err := p.Reload(reloaded(t, p, unlock)); err != nil {
				t.Fatal(err)
			}
			if got := authAfterFailures(t, p, 0); got != "+OK" {
				t.Fatalf("right password after the reload: %q, want +OK", got)
			}
		})
	}
}

func TestReadOnlyUserCannotWrite(t *testing.T) {
	p := usersProxy(t, nil)
	p.Redis.Client(t).Set(ctx, "cache:a", "orig", 0)
	c := loggedIn(t, p, "ro", roPass)
	if v, err := c.Get(ctx, "cache:a").Result(); err != nil || v != "orig" {
		t.Fatalf("GET cache:a: %q %v", v, err)
	}
	for _, cmd := range [][]any{{"set", "cache:a", "x"}, {"del", "cache:a"}, {"incr", "cache:n"}, {"flushall"}, {"expire", "cache:a", "1"}} {
		err := c.Do(ctx, cmd...).Err()
		want := "NOPERM User ro has no permissions to run the '" + cmd[0].(string) + "' command"
		if err == nil || err.Error() != want {
			t.Errorf("%v: %v, want %s", cmd, err, want)
		}
	}
	if v, _ := p.Redis.Client(t).Get(ctx, "cache:a").Result(); v != "orig" {
		t.Fatalf("cache:a changed to %q", v)
	}
}

func TestReadOnlyUserCannotReadOtherKeys(t *testing.T) {
	p := usersProxy(t, nil)
	p.Redis.Client(t).Set(ctx, "session:1", "secret", 0)
	c := loggedIn(t, p, "ro", roPass)
	for _, cmd := range [][]any{{"get", "session:1"}, {"mget", "cache:a", "session:1"}, {"strlen", "session:1"}, {"exists", "session:1"}} {
		if err := c.Do(ctx, cmd...).Err(); err == nil || err.Error() != "NOPERM No permissions to access a key" {
			t.Errorf("%v: %v", cmd, err)
		}
	}
}

func TestReadOnlyUserCannotEscapeThroughEval(t *testing.T) {
	p := usersProxy(t, nil)
	rc := p.Redis.Client(t)
	rc.Set(ctx, "session:1", "secret", 0)
	ro := loggedIn(t, p, "ro", roPass)
	if err := ro.Eval(ctx, "return 1", nil).Err(); err == nil || !strings.Contains(err.Error(), "no permissions to run the 'eval' command") {
		t.Fatalf("EVAL without @scripting: %v", err)
	}
	sc := loggedIn(t, p, "ro-script", roPass)
	script := "redis.call('set', KEYS[1], 'pwned'); return 1"
	for _, keys := range [][]string{{"session:1"}, {"cache:a", "session:1"}} {
		if err := sc.Eval(ctx, script, keys).Err(); err == nil || err.Error() != "NOPERM No permissions to access a key" {
			t.Errorf("EVAL on %v: %v", keys, err)
		}
	}
	sha, err := rc.ScriptLoad(ctx, script).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := sc.EvalSha(ctx, sha, []string{"session:1"}).Err(); err == nil || err.Error() != "NOPERM No permissions to access a key" {
		t.Errorf("EVALSHA: %v", err)
	}
	if v, _ := rc.Get(ctx, "session:1").Result(); v != "secret" {
		t.Fatalf("session:1 = %q", v)
	}
}

func TestReadOnlyUserCannotEscapeThroughMulti(t *testing.T) {
	p := usersProxy(t, nil)
	rc := p.Redis.Client(t)
	rc.Set(ctx, "cache:a", "orig", 0)
	// Without @transaction, MULTI itself is refused.
	if err := loggedIn(t, p, "ro", roPass).Do(ctx, "multi").Err(); err == nil || !strings.Contains(err.Error(), "'multi' command") {
		t.Fatalf("MULTI for ro: %v", err)
	}
	c := loggedIn(t, p, "ro-tx", roPass)
	cmds, err := c.TxPipelined(ctx, func(pl redis.Pipeliner) error {
		pl.Get(ctx, "cache:a")
		pl.Set(ctx, "cache:a", "pwned", 0)
		pl.Get(ctx, "session:1")
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "EXECABORT") {
		t.Fatalf("EXEC: %v (%v)", err, cmds)
	}
	if v, _ := rc.Get(ctx, "cache:a").Result(); v != "orig" {
		t.Fatalf("cache:a = %q after the refused transaction", v)
	}
	// The raw replies: NOPERM at queue time, EXECABORT at EXEC.
	nc := p.Dial(t)
	rd := newReplyReader(nc)
	nc.Write([]byte("AUTH ro-tx " + roPass + "\r\nMULTI\r\nSET cache:a x\r\nGET session:1\r\nGET cache:a\r\nEXEC\r\n"))
	for _, want := range []string{"+OK", "+OK", "-NOPERM User ro-tx has no permissions to run the 'set' command", "-NOPERM No permissions to access a key", "+QUEUED", "-EXECABORT Transaction discarded because of previous errors."} {
		if got := rd.line(t); got != want {
			t.Fatalf("%q, want %q", got, want)
		}
	}
}

func TestReadOnlyUserCannotEscapeThroughSortStore(t *testing.T) {
	p := usersProxy(t, nil)
	rc := p.Redis.Client(t)
	rc.RPush(ctx, "cache:l", 3, 1, 2)
	if err := loggedIn(t, p, "ro", roPass).Do(ctx, "sort", "cache:l", "store", "cache:out").Err(); err == nil || !strings.Contains(err.Error(), "'sort' command") {
		t.Fatalf("SORT for ro: %v", err)
	}
	c := loggedIn(t, p, "ro-sort", roPass)
	if v, err := c.Sort(ctx, "cache:l", &redis.Sort{}).Result(); err != nil || len(v) != 3 {
		t.Fatalf("SORT without STORE: %v %v", v, err)
	}
	if err := c.Do(ctx, "sort", "cache:l", "store", "session:x").Err(); err == nil || err.Error() != "NOPERM No permissions to access a key" {
		t.Fatalf("SORT STORE session:x: %v", err)
	}
	if n, _ := rc.Exists(ctx, "session:x").Result(); n != 0 {
		t.Fatal("SORT ... STORE wrote session:x")
	}
}

func TestReadOnlyUserCannotEscapeThroughPipeline(t *testing.T) {
	p := usersProxy(t, nil)
	rc := p.Redis.Client(t)
	rc.Set(ctx, "cache:a", "orig", 0)
	rc.Set(ctx, "session:1", "secret", 0)
	c := loggedIn(t, p, "ro", roPass)
	cmds, _ := c.Pipelined(ctx, func(pl redis.Pipeliner) error {
		pl.Get(ctx, "cache:a")
		pl.Set(ctx, "cache:a", "pwned", 0)
		pl.Get(ctx, "session:1")
		pl.Del(ctx, "session:1")
		pl.Get(ctx, "cache:a")
		return nil
	})
	want := []string{"orig", "NOPERM User ro has no permissions to run the 'set' command", "NOPERM No permissions to access a key", "NOPERM User ro has no permissions to run the 'del' command", "orig"}
	for i, cmd := range cmds {
		got := ""
		if sc, ok := cmd.(*redis.StringCmd); ok && sc.Err() == nil {
			got = sc.Val()
		} else if cmd.Err() != nil {
			got = cmd.Err().Error()
		}
		if got != want[i] {
			t.Errorf("pipeline[%d] %v: %q, want %q", i, cmd.Args(), got, want[i])
		}
	}
	if v, _ := rc.Get(ctx, "session:1").Result(); v != "secret" {
		t.Fatalf("session:1 = %q", v)
	}
}

// A relayed client (subscribed) is checked too, and cannot re-AUTH its
// upstream connection.
func TestUserACLOnRelay(t *testing.T) {
	p := usersProxy(t, func(c *config.Config) {
		c.Users = append(c.Users, user("sub", "sub-pass", "~cache:* +@read +@pubsub +@connection &ch"))
	})
	nc := p.Dial(t)
	rd := newReplyReader(nc)
	nc.Write([]byte("HELLO 3 AUTH sub sub-pass\r\n"))
	rd.skipReply(t)
	nc.Write([]byte("SUBSCRIBE ch\r\n"))
	rd.skipReply(t)
	nc.Write([]byte("SET cache:a 1\r\nGET session:1\r\nAUTH app " + appPass + "\r\nGET cache:a\r\n"))
	for _, want := range []string{"-NOPERM User sub has no permissions to run the 'set' command", "-NOPERM No permissions to access a key", "-ERR redproxy: auth is not supported on a connection in subscribed, tracking or MONITOR mode", "_"} {
		if got := rd.line(t); got != want {
			t.Fatalf("%q, want %q", got, want)
		}
	}
}

// replyReader reads RESP replies line by line from a raw connection.
type replyReader struct {
	nc  net.Conn
	buf []byte
}

func newReplyReader(nc net.Conn) *replyReader { return &replyReader{nc: nc} }

func (r *replyReader) line(t *testing.T) string {
	t.Helper()
	r.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		if i := bytes.Index(r.buf, []byte("\r\n")); i >= 0 {
			l := string(r.buf[:i])
			r.buf = r.buf[i+2:]
			return l
		}
		b := make([]byte, 4096)
		n, err := r.nc.Read(b)
		r.buf = append(r.buf, b[:n]...)
		if err != nil && n == 0 {
			t.Fatalf("read: %v (have %q)", err, r.buf)
		}
	}
}

// skipReply skips one reply of the aggregate kinds used here (flat maps,
// arrays and pushes of simple elements).
func (r *replyReader) skipReply(t *testing.T) {
	t.Helper()
	l := r.line(t)
	n := 0
	switch l[0] {
	case '%':
		n = 2 * atoi(l[1:])
	case '*', '>':
		n = atoi(l[1:])
	case '$':
		r.line(t)
	}
	for ; n > 0; n-- {
		r.skipReply(t)
	}
}

func atoi(s string) int {
	n := 0
	for _, c := range s {
		n = n*10 + int(c-'0')
	}
	return n
}

func gatherText(t *testing.T, m *metrics.Metrics) string {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		for _, mm := range mf.GetMetric() {
			b.WriteString(mf.GetName() + "{")
			for _, l := range mm.GetLabel() {
				b.WriteString(l.GetName() + "=\"" + l.GetValue() + "\"")
			}
			b.WriteString("} " + mm.String() + "\n")
		}
	}
	return b.String()
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// Each user's traffic runs with its own upstream credential: Redis sees
// the right ACL user on shared, pinned (WATCH) and relayed connections,
// and its own ACL refuses what that credential may not do.
func TestUserUpstreamCredential(t *testing.T) {
	rs := redistest.Start(t)
	rc := rs.Client(t)
	for _, c := range [][]any{
		{"acl", "setuser", "redis-app", "on", ">redis-app-pw", "~*", "+@all"},
		{"acl", "setuser", "redis-ro", "on", ">redis-ro-pw", "~*", "+@read", "+@connection", "+@transaction", "+acl|whoami", "+client|setname", "+watch"},
	} {
		if err := rc.Do(ctx, c...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	for name, pw := range map[string]string{"app": "redis-app-pw", "ro": "redis-ro-pw"} {
		if err := writeFileT(dir+"/"+name, pw+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	p := proxytest.Start(t, rs, func(c *config.Config) {
		a := user("app", appPass, "+@all ~*")
		a.UpstreamUser, a.UpstreamPasswordFile = "redis-app", dir+"/app"
		r := user("ro", roPass, "+@all ~*") // the proxy allows; Redis's own ACL is the backstop
		r.UpstreamUser, r.UpstreamPasswordFile = "redis-ro", dir+"/ro"
		c.Users = []auth.UserConfig{a, r}
	})
	app, ro := loggedIn(t, p, "app", appPass), loggedIn(t, p, "ro", roPass)
	for _, c := range []struct {
		cl   *redis.Client
		want string
	}{{app, "redis-app"}, {ro, "redis-ro"}} {
		if who, err := c.cl.Do(ctx, "acl", "whoami").Text(); err != nil || who != c.want {
			t.Errorf("ACL WHOAMI: %q %v, want %s", who, err, c.want)
		}
		// Pinned: WATCH keeps the client on a dedicated connection.
		nc := p.Dial(t)
		rd := newReplyReader(nc)
		name := strings.TrimPrefix(c.want, "redis-")
		pass := appPass
		if name == "ro" {
			pass = roPass
		}
		nc.Write([]byte("AUTH " + name + " " + pass + "\r\nWATCH k\r\nACL WHOAMI\r\nUNWATCH\r\n"))
		rd.line(t)
		rd.line(t)
		rd.line(t)
		if got := rd.line(t); got != c.want {
			t.Errorf("ACL WHOAMI while pinned: %q, want %s", got, c.want)
		}
	}
	if err := ro.Set(ctx, "k", "v", 0).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("Redis's ACL let redis-ro write: %v", err)
	}
	if err := app.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Errorf("app: %v", err)
	}
	// Redis's CLIENT LIST shows the users' connections under their names.
	list, _ := rc.ClientList(ctx).Result()
	if !strings.Contains(list, "user=redis-app") || !strings.Contains(list, "user=redis-ro") {
		t.Errorf("Redis's CLIENT LIST does not show both users:\n%s", list)
	}
}

// Passwords never appear in logs, metrics, the policy report, CLIENT LIST
// or SLOWLOG passed through.
func TestPasswordsNeverShown(t *testing.T) {
	var logs redistest.LogBuffer
	rs := redistest.Start(t)
	cfg := config.Default()
	cfg.Server.Listen, cfg.Server.Admin, cfg.Upstream.Address = "127.0.0.1:0", "", rs.Addr()
	cfg.Users = []auth.UserConfig{user("app", appPass, "+@all -keys ~*")}
	reg := metrics.New()
	srv, ln := serveLogged(t, cfg, reg, slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	rs.Client(t).ConfigSet(ctx, "slowlog-log-slower-than", "0")
	c := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), Username: "app", Password: appPass, MaxRetries: -1})
	defer c.Close()
	bad := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), Username: "app", Password: "wrong-" + appPass, MaxRetries: -1})
	defer bad.Close()
	bad.Ping(ctx)
	c.Do(ctx, "auth", "app", appPass)
	c.Set(ctx, "k", "v", 0)
	c.Do(ctx, "flushall") // a policy violation, for the report
	var seen []string
	list, _ := c.ClientList(ctx).Result()
	seen = append(seen, "CLIENT LIST: "+list)
	slow, _ := c.Do(ctx, "slowlog", "get", "128").Slice()
	seen = append(seen, "SLOWLOG: "+strings.TrimSpace(strings.ReplaceAll(fmtAny(slow), "\n", " ")))
	seen = append(seen, "metrics: "+gatherText(t, reg))
	rep := httptest.NewRecorder()
	srv.Guard().ReportHandler().ServeHTTP(rep, httptest.NewRequest("GET", "/policy/report", nil))
	seen = append(seen, "report: "+rep.Body.String())
	seen = append(seen, "logs: "+logs.String())
	for _, s := range seen {
		if strings.Contains(s, appPass) {
			t.Errorf("the password appears in %s", s[:strings.Index(s, ":")])
		}
	}
	if !strings.Contains(list, "user=app") {
		t.Errorf("CLIENT LIST does not name the user: %s", list)
	}
}

func fmtAny(v any) string { return fmt.Sprint(v) }

func writeFileT(name, s string) error { return os.WriteFile(name, []byte(s), 0o600) }

// A policy scope bound to a user (users[].scope) applies to that user and
// not another.
func TestUserScope(t *testing.T) {
	parsed, err := config.Parse([]byte(`
[[users]]
name = "batch"
password_sha256 = "`+auth.HashPassword("batch-pw")+`"
acl = "+@all ~*"
scope = "batch-jobs"

[[users]]
name = "app"
password_sha256 = "`+auth.HashPassword(appPass)+`"
acl = "+@all ~*"

[[policy.scope]]
name = "batch-jobs"
[policy.scope.commands]
allow = ["flushdb"]
`), "scope.toml")
	if err != nil {
		t.Fatal(err)
	}
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Users, c.Policy = parsed.Users, parsed.Policy })
	if err := loggedIn(t, p, "batch", "batch-pw").Do(ctx, "flushdb").Err(); err != nil {
		t.Errorf("FLUSHDB in the batch user's scope: %v", err)
	}
	if err := loggedIn(t, p, "app", appPass).Do(ctx, "flushdb").Err(); err == nil {
		t.Error("FLUSHDB allowed for app, which the scope does not cover")
	}
}

// Without users or an upstream password, a listener that is not loopback
// refuses to start, unless allow_unauthenticated says otherwise.
func TestOpenListenerRefused(t *testing.T) {
	rs := redistest.Start(t)
	cfg := config.Default()
	cfg.Server.Listen, cfg.Server.Admin, cfg.Upstream.Address = "0.0.0.0:0", "", rs.Addr()
	_, err := proxy.NewServer(proxy.Options{Config: cfg, Table: commands.Builtin(), Metrics: metrics.New()})
	if err == nil || !strings.Contains(err.Error(), "allow_unauthenticated") {
		t.Fatalf("NewServer: %v", err)
	}
	cfg.Server.AllowUnauthenticated = true
	srv, err := proxy.NewServer(proxy.Options{Config: cfg, Table: commands.Builtin(), Metrics: metrics.New()})
	if err != nil {
		t.Fatal(err)
	}
	srv.Shutdown(ctx)
}
