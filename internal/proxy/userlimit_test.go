package proxy_test

import (
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/redistest"
)

// TestUserMaxConnections: a user's max_connections caps the connections
// authenticated as it. AUTH and HELLO AUTH past the cap fail with the
// proxy's error and leave the connection as it was; a connection that
// closes, RESETs or becomes another user frees its place; other users are
// not affected.
func TestUserMaxConnections(t *testing.T) {
	p := usersProxy(t, func(c *config.Config) {
		app := user("app", appPass, "+@all ~*")
		app.MaxConnections = 2
		c.Users = []auth.UserConfig{app, user("other", roPass, "+@all ~*")}
	})
	const limitErr = "-ERR max number of connections for user 'app' reached"
	login := func(nc net.Conn, rd *replyReader) string {
		nc.Write([]byte("AUTH app " + appPass + "\r\n"))
		return rd.line(t)
	}
	dial := func() (net.Conn, *replyReader) {
		nc := p.Dial(t)
		return nc, newReplyReader(nc)
	}

	c1, r1 := dial()
	c2, r2 := dial()
	for _, c := range []struct {
		nc net.Conn
		rd *replyReader
	}{{c1, r1}, {c2, r2}} {
		if got := login(c.nc, c.rd); got != "+OK" {
			t.Fatalf("AUTH within the limit: %q", got)
		}
	}
	// Authenticating again as the same user takes no second place.
	if got := login(c1, r1); got != "+OK" {
		t.Fatalf("AUTH again as the same user: %q", got)
	}

	c3, r3 := dial()
	if got := login(c3, r3); got != limitErr {
		t.Fatalf("AUTH past max_connections: %q, want %q", got, limitErr)
	}
	c3.Write([]byte("PING\r\nHELLO 3 AUTH app " + appPass + "\r\n"))
	if got := r3.line(t); got != "-NOAUTH Authentication required." {
		t.Fatalf("after the refused AUTH the connection is not unauthenticated: PING = %q", got)
	}
	if got := r3.line(t); got != limitErr {
		t.Fatalf("HELLO AUTH past max_connections: %q, want %q", got, limitErr)
	}
	// Another user is not limited by app's count, and a refused AUTH as
	// app leaves the client that other user.
	c3.Write([]byte("AUTH other " + roPass + "\r\n"))
	if got := r3.line(t); got != "+OK" {
		t.Fatalf("AUTH as another user: %q", got)
	}
	if got := login(c3, r3); got != limitErr {
		t.Fatalf("AUTH as app from other's connection: %q", got)
	}
	c3.Write([]byte("CLIENT INFO\r\n"))
	r3.line(t)
	if info := r3.line(t); !containsField(info, "user=other") {
		t.Fatalf("after a refused AUTH the client changed user: %q", info)
	}

	// A closed connection gives its place back.
	c1.Close()
	// The connection that gets it (c6) stays open, holding the place.
	redistest.Eventually(t, 5*time.Second, func() bool {
		nc, rd := dial()
		if login(nc, rd) == "+OK" {
			return true
		}
		nc.Close()
		return false
	}, "the place of a closed connection was never given back")
	// RESET gives it back too, and so does becoming another user.
	c2.Write([]byte("RESET\r\n"))
	if got := r2.line(t); got != "+RESET" {
		t.Fatalf("RESET: %q", got)
	}
	c4, r4 := dial()
	if got := login(c4, r4); got != "+OK" {
		t.Fatalf("AUTH after another connection's RESET: %q", got)
	}
	c4.Write([]byte("AUTH other " + roPass + "\r\n"))
	if got := r4.line(t); got != "+OK" {
		t.Fatalf("AUTH as other: %q", got)
	}
	if got := login(c3, r3); got != "+OK" {
		t.Fatalf("AUTH after a connection left app for another user: %q", got)
	}
	// Now at the limit again (c6 and c3).
	c5, r5 := dial()
	if got := login(c5, r5); got != limitErr {
		t.Fatalf("AUTH at the limit again: %q, want %q", got, limitErr)
	}
}

func containsField(line, field string) bool {
	return slices.Contains(strings.Fields(line), field)
}

// CLIENT KILL answers once the clients it killed have ended, as Redis
// frees a killed client before it answers: a client that reconnects on
// the kill's reply finds its user's max_connections place free. Before,
// a client blocked in BLPOP ended at its next look at its connection (up
// to 50 ms later), and the reconnecting AUTH was refused meanwhile. Each
// kind of client: idle, blocked (its Redis connection closed, so Redis
// drops the block) and blocked in a WAIT.
func TestClientKillFreesThePlaceBeforeItAnswers(t *testing.T) {
	p := usersProxy(t, func(c *config.Config) {
		app := user("app", appPass, "+@all ~*")
		app.MaxConnections = 1
		c.Users = []auth.UserConfig{app, user("admin", roPass, "+@all ~*")}
	})
	admin := p.Dial(t)
	ar := newReplyReader(admin)
	admin.Write([]byte("AUTH admin " + roPass + "\r\n"))
	if got := ar.line(t); got != "+OK" {
		t.Fatalf("AUTH admin: %q", got)
	}
	direct := p.Redis.Client(t)
	for _, tc := range []struct {
		name  string
		start string // sent after AUTH; "" stays idle
		cmd   string // what Redis shows the blocked command as
	}{
		{"idle", "", ""},
		{"blocked", "BLPOP kill:nothing 0\r\n", "blpop"},
		{"blocked in WAIT", "SET kill:k v\r\nWAIT 1 0\r\n", "wait"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			victim := p.Dial(t)
			vr := newReplyReader(victim)
			victim.Write([]byte("AUTH app " + appPass + "\r\nCLIENT ID\r\n"))
			if got := vr.line(t); got != "+OK" {
				t.Fatalf("AUTH app: %q", got)
			}
			id := strings.TrimPrefix(vr.line(t), ":")
			if tc.start != "" {
				victim.Write([]byte(tc.start))
				redistest.Eventually(t, 5*time.Second, func() bool {
					list, _ := direct.Do(ctx, "CLIENT", "LIST").Text()
					return strings.Contains(list, "cmd="+tc.cmd+" ")
				}, "%s never reached Redis", tc.cmd)
			}
			admin.Write([]byte("CLIENT KILL ID " + id + "\r\n"))
			if got := ar.line(t); got != ":1" {
				t.Fatalf("CLIENT KILL: %q", got)
			}
			again := p.Dial(t)
			again.Write([]byte("AUTH app " + appPass + "\r\n"))
			if got := newReplyReader(again).line(t); got != "+OK" {
				t.Fatalf("AUTH right after CLIENT KILL's reply: %q", got)
			}
			again.Close()
			redistest.Eventually(t, 5*time.Second, func() bool {
				list, _ := direct.Do(ctx, "CLIENT", "LIST").Text()
				return tc.cmd == "" || !strings.Contains(list, "cmd="+tc.cmd+" ")
			}, "Redis still holds the killed client's %s", tc.cmd)
		})
	}
}
