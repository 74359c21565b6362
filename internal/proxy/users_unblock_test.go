package proxy_test

import (
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxy"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// CLIENT UNBLOCK runs with the Redis rights of the client that sends it,
// as on Redis, whatever credential the client it names is on. It ran with
// the named client's (found by review): hank, whose Redis user may not
// run CLIENT UNBLOCK, unblocked root's BLPOP, and root, on the proxy's
// own credential, got NOPERM unblocking bob, whose Redis user may not.
// Both for a client blocked on a connection the proxy lent it and for a
// relayed one (CLIENT TRACKING), blocked on its relay's.
func TestClientUnblockRunsWithTheCallersRights(t *testing.T) {
	rs := redistest.Start(t)
	direct := rs.Client(t)
	dir := t.TempDir()
	var users []auth.UserConfig
	for _, name := range []string{"hank", "bob"} {
		if err := direct.Do(ctx, "ACL", "SETUSER", "redis-"+name, "on", ">"+name+"-pw", "~*", "&*", "+@all", "-client|unblock").Err(); err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(dir, name)
		if err := writeFileT(file, name+"-pw\n"); err != nil {
			t.Fatal(err)
		}
		u := user(name, appPass, "+@all ~* &*") // the proxy allows it; Redis's ACL backs it up
		u.UpstreamUser, u.UpstreamPasswordFile = "redis-"+name, file
		users = append(users, u)
	}
	p := proxytest.Start(t, rs, func(c *config.Config) {
		c.Users = append(users, user("root", roPass, "+@all ~* &*"))
	})
	login := func(name, pass string) *rawConn {
		c := dialRaw(t, p.Addr)
		wantReplies(t, c, []string{"AUTH", name, pass}, "OK")
		return c
	}
	hank, root := login("hank", appPass), login("root", roPass)
	for _, relayed := range []bool{false, true} {
		blockOn := func(c *rawConn, q string) int64 {
			if relayed {
				wantReplies(t, c, []string{"CLIENT", "TRACKING", "ON"}, "OK")
			}
			id := c.do("CLIENT", "ID").(int64)
			c.send([]string{"BLPOP", q, "0"})
			redistest.Eventually(t, 5*time.Second, func() bool { return blockedClients(direct) == 1 }, "BLPOP never blocked")
			return id
		}
		// hank may not unblock root: Redis's NOPERM, and root stays blocked.
		blocked := login("root", roPass)
		id := blockOn(blocked, "cu:root")
		got := hank.do("CLIENT", "UNBLOCK", itoa64(id))
		if e, ok := got.(respError); !ok || !strings.HasPrefix(string(e), "NOPERM") {
			t.Fatalf("relayed=%v: hank's CLIENT UNBLOCK of root answered %#v, want Redis's NOPERM for redis-hank", relayed, got)
		}
		if n := blockedClients(direct); n != 1 {
			t.Fatalf("relayed=%v: %d clients blocked after hank's refused UNBLOCK, want root's", relayed, n)
		}
		wantReplies(t, root, []string{"LPUSH", "cu:root", "job"}, int64(1))
		if got, _ := blocked.readReply(); !reflect.DeepEqual(got, []any{"cu:root", "job"}) {
			t.Fatalf("relayed=%v: root's BLPOP answered %#v", relayed, got)
		}
		blocked.nc.Close()
		// root may unblock bob, though bob's own Redis user may not.
		blocked = login("bob", appPass)
		id = blockOn(blocked, "cu:bob")
		wantReplies(t, root, []string{"CLIENT", "UNBLOCK", itoa64(id)}, int64(1))
		if got, _ := blocked.readReply(); got != nil {
			t.Fatalf("relayed=%v: bob's BLPOP answered %#v after root's UNBLOCK, want nil", relayed, got)
		}
		blocked.nc.Close()
		redistest.Eventually(t, 5*time.Second, func() bool { return blockedClients(direct) == 0 }, "a client stayed blocked")
	}
}

// A reload after an upstream_password_file was rotated is refused, as a
// change of upstream.password is: it cannot apply (a user's upstream
// connections are set up at start), and it reported success while the
// proxy went on with the old password, which failed with WRONGPASS once
// Redis dropped it (found by review). The file back as it was, the reload
// goes through.
func TestReloadRefusesARotatedPasswordFile(t *testing.T) {
	rs := redistest.Start(t)
	if err := rs.Client(t).Do(ctx, "ACL", "SETUSER", "redis-rot", "on", ">old-pw", ">new-pw", "~*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "rot")
	if err := writeFileT(file, "old-pw\n"); err != nil {
		t.Fatal(err)
	}
	p := proxytest.Start(t, rs, func(c *config.Config) {
		u := user("rot", appPass, "+@all ~*")
		u.UpstreamUser, u.UpstreamPasswordFile = "redis-rot", file
		c.Users = []auth.UserConfig{u}
	})
	if err := writeFileT(file, "new-pw\n"); err != nil {
		t.Fatal(err)
	}
	_, err := p.Reload(p.Config())
	if !errors.Is(err, proxy.ErrRestartRequired) || !strings.Contains(err.Error(), "users[0].upstream_password_file") {
		t.Fatalf("Reload after the password file changed: %v; want ErrRestartRequired naming the file", err)
	}
	if err := writeFileT(file, "old-pw"); err != nil { // no newline: the same password
		t.Fatal(err)
	}
	if _, err := p.Reload(p.Config()); err != nil {
		t.Fatalf("Reload with the file as at start: %v", err)
	}
}
