package proxy

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/redistest"
)

// TestFailoverCutsEveryCredentialBeforeWaiting: a failover cuts every
// upstream credential's pools from the old primary before waiting for any
// new dial. The proxy's own pools were failed over and their first dials
// waited for, then each user's with an upstream credential in turn, so
// the k-th credential's clients wrote on to the demoted primary for k dial
// times, and those acknowledged writes were lost (found by a probe: 70 to
// 225 ms late, 75 writes lost where the proxy's credential lost 6). Here
// the new primary accepts connections and answers nothing, so every wait
// for a first dial lasts the dial timeout (15 s): the credentials' pools
// must have moved long before that.
func TestFailoverCutsEveryCredentialBeforeWaiting(t *testing.T) {
	rs := redistest.Start(t)
	dir := t.TempDir()
	var users []auth.UserConfig
	for _, name := range []string{"ua", "ub", "uc"} {
		if err := rs.Client(t).Do(context.Background(), "acl", "setuser", name, "on", ">"+name+"-pw", "~*", "+@all").Err(); err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, []byte(name+"-pw\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		users = append(users, auth.UserConfig{Name: "p" + name, PasswordSHA256: auth.HashPassword("proxy-" + name), ACL: "+@all ~*",
			UpstreamUser: name, UpstreamPasswordFile: f})
	}
	cfg := config.Default()
	cfg.Server.Listen, cfg.Server.Admin, cfg.Upstream.Address = "127.0.0.1:0", "", rs.Addr()
	cfg.Upstream.DialTimeout = units.Duration{Duration: 15 * time.Second}
	cfg.Users = users
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s, err := NewServer(Options{Config: cfg, Table: commands.Builtin(), Metrics: metrics.New()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.Shutdown(ctx)
	}()
	if len(s.users.backends) != 3 {
		t.Fatalf("%d credential backends, want 3", len(s.users.backends))
	}

	// The new primary: accepts and answers nothing.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	unstall := func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		conns = nil
		mu.Unlock()
	}
	defer unstall()
	silent := ln.Addr().String()

	done := make(chan struct{})
	go func() {
		defer close(done)
		s.failover(silent)
	}()
	var left int
	redistest.Eventually(t, 5*time.Second, func() bool {
		left = 0
		for _, b := range s.users.backends {
			if b.Addr() != silent {
				left++
			}
		}
		return left == 0 && s.backend.Addr() == silent
	}, "credentials' pools still on the old primary while the failover waits for new dials (dial timeout 15 s)")
	// Let the waits end: the failover then returns.
	for {
		unstall()
		select {
		case <-done:
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}
