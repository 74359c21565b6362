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
