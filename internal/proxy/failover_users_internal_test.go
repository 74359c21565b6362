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
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/upstream"
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
// must have moved long before that. Both for [upstream] and for a named
// upstream under routes, whose failover was still serial (found by
// reading back the first fix).
func TestFailoverCutsEveryCredentialBeforeWaiting(t *testing.T) {
	t.Run("upstream", func(t *testing.T) {
		s := newCredentialServer(t, nil)
		if len(s.users.backends) != 3 {
			t.Fatalf("%d credential backends, want 3", len(s.users.backends))
		}
		pools := []*upstream.Backend{s.backend}
		for _, b := range s.users.backends {
			pools = append(pools, b)
		}
		failoverToSilent(t, pools, s.failover)
	})
	t.Run("named upstream", func(t *testing.T) {
		s := newCredentialServer(t, func(cfg *config.Config, addr string) {
			u := config.Default().Upstream
			u.Address = addr
			u.DialTimeout = cfg.Upstream.DialTimeout
			cfg.Upstreams = map[string]config.Upstream{"other": u}
			cfg.Routes = []config.Route{{Pattern: "o:*", Upstream: "other"}}
		})
		var target *routeTarget
		for _, rt := range s.routes.targets {
			if rt.name == "other" {
				target = rt
			}
		}
		if target == nil || len(target.users) != 3 {
			t.Fatalf("named upstream %v, want one with 3 credential backends", target)
		}
		pools := []*upstream.Backend{target.backend}
		for _, b := range target.users {
			pools = append(pools, b)
		}
		// What the upstream's Sentinel watcher calls (startTarget's
		// OnSwitch); the upstream here is a plain server, which the
		// switch itself does not look at.
		failoverToSilent(t, pools, func(addr string) { s.targetFailover(target, addr, target.opts) })
	})
}

// newCredentialServer is a Server in front of one Redis with three proxy
// users, each with an upstream credential of its own; mutate, if set,
// adjusts the configuration given the Redis's address.
func newCredentialServer(t *testing.T, mutate func(cfg *config.Config, addr string)) *Server {
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
	if mutate != nil {
		mutate(cfg, rs.Addr())
	}
	return newTestServer(t, cfg)
}

// failoverToSilent runs failover to a new primary that accepts connections
// and answers nothing, and fails unless every pool of pools points there
// within 5 s, well inside the 15 s dial timeout one wait for a first dial
// takes. It returns once the failover has.
func failoverToSilent(t *testing.T, pools []*upstream.Backend, failover func(addr string)) {
	t.Helper()
	ln := mustListen(t)
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
		failover(silent)
	}()
	var left int
	redistest.Eventually(t, 5*time.Second, func() bool {
		left = 0
		for _, b := range pools {
			if b.Addr() != silent {
				left++
			}
		}
		return left == 0
	}, "pools still on the old primary while the failover waits for new dials (dial timeout 15 s)")
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
