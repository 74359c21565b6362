package proxy_test

// Holes in tenant isolation found by a security review, each test failing
// before its fix.

import (
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// GEORADIUS ... STORE x STORE other: Redis writes the last STORE's key,
// the proxy named only the first, so a tenant wrote outside its namespace
// (here over another tenant's key) and past its ACL.
func TestGeoradiusRepeatedStoreStaysInTheNamespace(t *testing.T) {
	p := nsProxy(t)
	rc := p.Redis.Client(t)
	if err := rc.Set(ctx, "b:secret", "tenant-b-data", 0).Err(); err != nil {
		t.Fatal(err)
	}
	a := nsClient(t, p, "tenant-a")
	if err := a.GeoAdd(ctx, "src", &redis.GeoLocation{Name: "Palermo", Longitude: 13.361389, Latitude: 38.115556}).Err(); err != nil {
		t.Fatal(err)
	}
	a.Do(ctx, "georadius", "src", "15", "37", "200", "km", "STORE", "x", "STORE", "b:secret")
	a.Do(ctx, "georadiusbymember", "src", "Palermo", "10", "km", "STORE", "y", "STOREDIST", "z", "STORE", "outside")
	if typ := rc.Type(ctx, "b:secret").Val(); typ != "string" {
		t.Errorf("tenant a overwrote b:secret (now a %s)", typ)
	}
	if n := rc.Exists(ctx, "outside").Val(); n != 0 {
		t.Errorf("tenant a wrote the unprefixed key outside")
	}
}

func TestGeoradiusRepeatedStoreIsCheckedByTheACL(t *testing.T) {
	p := usersProxy(t, func(c *config.Config) { c.Users = append(c.Users, user("geo", "geo-pw", "+@all ~app:*")) })
	rc := p.Redis.Client(t)
	c := loggedIn(t, p, "geo", "geo-pw")
	if err := c.GeoAdd(ctx, "app:src", &redis.GeoLocation{Name: "P", Longitude: 13.36, Latitude: 38.11}).Err(); err != nil {
		t.Fatal(err)
	}
	err := c.Do(ctx, "georadius", "app:src", "15", "37", "200", "km", "STORE", "app:x", "STORE", "other:k").Err()
	if err == nil {
		t.Error("GEORADIUS ... STORE app:x STORE other:k was not refused")
	}
	if n := rc.Exists(ctx, "other:k").Val(); n != 0 {
		t.Errorf("a ~app:* user wrote other:k")
	}
}

// A keyspace pattern whose database part is not a number reached past the
// prefix: "__keyspace@0[__:]*" heard tenant b's keys. It is refused, and a
// pattern naming its database hears the tenant's own keys only.
func TestKeyspacePatternsStayInTheNamespace(t *testing.T) {
	p := nsProxy(t)
	if err := p.Redis.Client(t).ConfigSet(ctx, "notify-keyspace-events", "KA").Err(); err != nil {
		t.Fatal(err)
	}
	a, b := nsClient(t, p, "tenant-a"), nsClient(t, p, "tenant-b")
	for _, pattern := range []string{"__keyspace@0[__:]*", "__keyspace@*__:*"} {
		sub := a.PSubscribe(ctx, pattern)
		_, err := sub.Receive(ctx)
		sub.Close()
		if err == nil || !strings.Contains(err.Error(), "not allowed in a namespace") {
			t.Errorf("PSUBSCRIBE %s: %v, want a refusal", pattern, err)
		}
	}
	own := a.PSubscribe(ctx, "__keyspace@0__:*")
	defer own.Close()
	if _, err := own.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Set(ctx, "b-private", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := a.Set(ctx, "a-own", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-own.Channel():
		if m.Channel != "__keyspace@0__:a-own" {
			t.Fatalf("tenant a heard %q", m.Channel)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("tenant a never heard of its own key")
	}
}

// SORT BY pattern and GET read keys no key spec names; Redis 7 refuses
// them to a user without read access to every key, but the proxy's own
// credential has it, so a ~cache:* user read session:x (found by review).
// The proxy refuses them as Redis would, with Redis's error naming the
// option (TestSortByPatternRefusedAsRedisDoes); a user with ~* may use
// them.
func TestSortPatternsNeedAccessToEveryKey(t *testing.T) {
	p := usersProxy(t, nil)
	rc := p.Redis.Client(t)
	if err := rc.RPush(ctx, "cache:l", "x").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rc.Set(ctx, "session:x", "s3cr3t", 0).Err(); err != nil {
		t.Fatal(err)
	}
	ro := loggedIn(t, p, "ro-sort", roPass)
	for _, args := range [][]any{
		{"sort", "cache:l", "by", "nosort", "get", "session:*"},
		{"sort", "cache:l", "by", "session:*", "get", "#"},
		{"sort", "cache:l", "limit", "0", "1", "get", "#"},
	} {
		v, err := ro.Do(ctx, args...).Result()
		if err == nil || !strings.Contains(err.Error(), "option of SORT denied due to insufficient ACL permissions") {
			t.Errorf("%v by ~cache:* = %v, %v; want Redis's refusal of the option", args, v, err)
		}
	}
	if v, err := ro.Do(ctx, "sort", "cache:l", "by", "nosort", "alpha").StringSlice(); err != nil || len(v) != 1 {
		t.Errorf("SORT without patterns = %v, %v", v, err)
	}
	if v, err := loggedIn(t, p, "app", appPass).Do(ctx, "sort", "cache:l", "by", "nosort", "get", "session:*").StringSlice(); err != nil || len(v) != 1 || v[0] != "s3cr3t" {
		t.Errorf("SORT GET by a ~* user = %v, %v", v, err)
	}
}

// RESET on a relayed connection made Redis log it in again as its default
// user, which here needs no password and may write any key: a script run
// after it wrote outside the user's keys, past the upstream credential's
// ACL (found by review). RESET is refused there.
func TestRelayResetKeepsTheUpstreamCredential(t *testing.T) {
	rs := redistest.Start(t)
	rc := rs.Client(t)
	if err := rc.Do(ctx, "acl", "setuser", "redis-app", "on", ">redis-app-pw", "~app:*", "&*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := writeFileT(dir+"/app", "redis-app-pw\n"); err != nil {
		t.Fatal(err)
	}
	p := proxytest.Start(t, rs, func(c *config.Config) {
		u := user("app", "app-pw", "+@all ~app:* allchannels")
		u.UpstreamUser, u.UpstreamPasswordFile = "redis-app", dir+"/app"
		c.Users = []auth.UserConfig{u}
	})
	c := dialRaw(t, p.Addr)
	if v := c.do("AUTH", "app", "app-pw"); v != "OK" {
		t.Fatalf("AUTH: %v", v)
	}
	c.do("HELLO", "3")
	c.send([]string{"SUBSCRIBE", "app.x"})
	c.readReply() // the subscription's push
	if v := c.readNonPushAfter("RESET"); !strings.Contains(fmt.Sprint(v), "RESET is not supported") {
		t.Fatalf("RESET on a relay = %v, want a refusal", v)
	}
	c.readNonPushAfter("EVAL", "return redis.call('set','other:k','pwned')", "0")
	if v := rc.Get(ctx, "other:k").Val(); v != "" {
		t.Fatalf("other:k = %q: the relay ran as Redis's default user", v)
	}
	if v := c.readNonPushAfter("PING"); v != "PONG" {
		t.Fatalf("PING after the refusal = %v", v)
	}
}

// A client that has not authenticated gets Redis's limits for such
// clients (found by a bad-input campaign: ten connections each sending 40
// MB before AUTH took the proxy's RSS to 660 MB): a protocol error, and
// the connection closed. A client that pipelines AUTH with a command
// beyond those limits is served, as by Redis.
func TestUnauthenticatedClientsGetRedisLimits(t *testing.T) {
	p := usersProxy(t, nil)
	for _, in := range []string{"*2\r\n$4\r\nECHO\r\n$100000000\r\n", "*1048576\r\n"} {
		nc := p.Dial(t)
		nc.Write([]byte(in))
		nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		got, err := io.ReadAll(nc)
		if !strings.HasPrefix(string(got), "-ERR Protocol error: unauthenticated ") || err != nil {
			t.Errorf("%.30q before AUTH: %q, %v; want the protocol error and the connection closed", in, got, err)
		}
	}
	c := dialRaw(t, p.Addr)
	args := []string{"MSET"}
	for i := range 12 {
		args = append(args, fmt.Sprintf("k%d", i), strings.Repeat("v", 20000))
	}
	c.send([]string{"AUTH", "app", appPass}, args) // one write
	if v, _ := c.readReply(); v != "OK" {
		t.Fatalf("AUTH = %v", v)
	}
	if v, _ := c.readReply(); v != "OK" {
		t.Fatalf("MSET of 25 arguments of 20 KB after AUTH in the same pipeline = %v", v)
	}
}

// CLIENT LIST, answered by the proxy, showed a tenant every client:
// the others' names, addresses, users and last commands (found by
// review). A client in a namespace sees the clients of its namespace;
// one in none still sees every client.
func TestClientListStaysInTheNamespace(t *testing.T) {
	p := nsProxy(t)
	pool1 := func(o *redis.Options) { o.PoolSize = 1 }
	a, cacheUser := nsClient(t, p, "tenant-a", pool1), nsClient(t, p, "tenant-cache", pool1)
	b, admin := nsClient(t, p, "tenant-b", pool1), nsClient(t, p, "admin", pool1)
	for c, name := range map[*redis.Client]string{a: "alice", cacheUser: "carol", b: "bob", admin: "root"} {
		if err := c.Do(ctx, "CLIENT", "SETNAME", name).Err(); err != nil {
			t.Fatal(err)
		}
	}
	list := a.ClientList(ctx).Val()
	if !strings.Contains(list, "name=alice ") || !strings.Contains(list, "name=carol ") {
		t.Errorf("tenant a's CLIENT LIST lacks its namespace's clients:\n%s", list)
	}
	if strings.Contains(list, "name=bob ") || strings.Contains(list, "name=root ") {
		t.Errorf("tenant a's CLIENT LIST shows clients of other namespaces:\n%s", list)
	}
	if all := admin.ClientList(ctx).Val(); !strings.Contains(all, "name=bob ") || !strings.Contains(all, "name=alice ") {
		t.Errorf("the admin's CLIENT LIST lacks clients:\n%s", all)
	}
}

// Inside MULTI (run by EXEC) and on a relayed connection, CLIENT LIST was
// sent to Redis, whose answer is every connection of the proxy's, with
// other namespaces' client names and last commands (found by review).
// Inside MULTI, and on a relay where Redis runs scripts (RESP3
// subscribed, tracking), the proxy's own answer, the namespace's clients,
// is sent as a script (appendProxyAnswer), as everywhere else.
func TestClientListInMultiOrRelayStaysInTheNamespace(t *testing.T) {
	p := nsProxy(t)
	const secret = "b-secret-client-name"
	b := dialRaw(t, p.Addr)
	for _, cmd := range [][]string{{"AUTH", "tenant-b", nsPass}, {"CLIENT", "SETNAME", secret}, {"WATCH", "k"}} {
		if got := b.do(cmd...); got != "OK" {
			t.Fatalf("%v: %v", cmd, got)
		}
	}
	a := dialRaw(t, p.Addr)
	a.send([]string{"AUTH", "tenant-a", nsPass}, []string{"MULTI"}, []string{"CLIENT", "LIST"}, []string{"EXEC"})
	var got []any
	for range 4 {
		r, _ := a.readReply()
		got = append(got, r)
	}
	if s := fmt.Sprint(got[3]); got[2] != "QUEUED" || strings.Contains(s, secret) || !strings.Contains(s, " user=tenant-a ") || strings.Contains(s, "name=redproxy") {
		t.Errorf("CLIENT LIST in tenant-a's MULTI: %.300v", got)
	}

	sub := dialRaw(t, p.Addr)
	sub.do("AUTH", "tenant-a", nsPass)
	sub.do("HELLO", "3")
	sub.do("SUBSCRIBE", "x")
	if got := fmt.Sprint(sub.do("CLIENT", "LIST")); strings.Contains(got, secret) || !strings.Contains(got, " flags=P ") || strings.Contains(got, "name=redproxy") {
		t.Errorf("CLIENT LIST on tenant-a's RESP3 subscribed connection: %.200s", got)
	}

	// Outside a namespace the proxy's clients, not its connections to
	// Redis (TestClientIdentityInsideMulti).
	admin := dialRaw(t, p.Addr)
	admin.send([]string{"AUTH", "admin", nsPass}, []string{"MULTI"}, []string{"CLIENT", "LIST"}, []string{"EXEC"})
	got = got[:0]
	for range 4 {
		r, _ := admin.readReply()
		got = append(got, r)
	}
	if s := fmt.Sprint(got[3]); !strings.Contains(s, secret) || strings.Contains(s, "name=redproxy") {
		t.Errorf("CLIENT LIST in admin's MULTI: %.300v", got)
	}
}
