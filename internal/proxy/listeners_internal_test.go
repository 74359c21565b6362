package proxy

import (
	"net"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/redistest"
)

// A session knows the listener it came through and carries that
// listener's namespace (for the namespace feature to apply).
func TestSessionCarriesListenerNamespace(t *testing.T) {
	rs := redistest.Start(t)
	cfg := config.Default()
	cfg.Server.Listen, cfg.Server.Admin, cfg.Upstream.Address = "127.0.0.1:0", "", rs.Addr()
	cfg.Server.Listeners = []config.Listener{{Name: "tenant", Listen: "127.0.0.1:0", Namespace: "tenant-a:"}}
	s := newTestServer(t, cfg)
	addrs := map[string]string{}
	for _, name := range []string{config.ListenerPlain, "tenant"} {
		ln := mustListen(t)
		go s.ServeListener(name, ln)
		addrs[name] = ln.Addr().String()
	}
	for name, want := range map[string]string{config.ListenerPlain: "", "tenant": "tenant-a:"} {
		nc, err := net.DialTimeout("tcp", addrs[name], 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		var got *Session
		redistest.Eventually(t, 5*time.Second, func() bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			for sess := range s.sessions {
				if sess.nc.RemoteAddr().String() == nc.LocalAddr().String() {
					got = sess
				}
			}
			return got != nil
		}, "no session for the client on %s", name)
		gotNS := ""
		// ns.listener is set before the session starts, then only read
		// (the rest of the namespace state is the session's own).
		if ns := got.ns.listener; ns != nil {
			gotNS = ns.Prefix()
		}
		if got.listenerName() != name || gotNS != want {
			t.Errorf("session on %s: listener %q, namespace %q; want %q", name, got.listenerName(), gotNS, want)
		}
	}
	if err := s.ServeListener("nosuch", mustListen(t)); err == nil {
		t.Error("ServeListener of an unknown name served")
	}
}
