package proxy_test

import (
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
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

// listenersProxy serves "plain" (server.listen), "tls" ([server.tls]),
// and three [[server.listeners]]: "internal" (plaintext), "secure" (TLS
// with [server.tls]'s certificate) and "own" (TLS with a certificate of
// its own, from another CA).
func listenersProxy(t *testing.T, certs *redistest.Certs, mutate func(*config.Config)) *proxytest.Proxy {
	return proxytest.Start(t, nil, func(c *config.Config) {
		c.Server.TLS = config.ServerTLS{Listen: "127.0.0.1:0", CertFile: certs.ServerCert, KeyFile: certs.ServerKey, MinVersion: "1.2"}
		c.Server.Listeners = []config.Listener{
			{Name: "internal", Listen: "127.0.0.1:0", Namespace: "tenant-a:"},
			{Name: "secure", Listen: "127.0.0.1:0", TLS: true},
			{Name: "own", Listen: "127.0.0.1:0", TLS: true, CertFile: certs.OtherServerCert, KeyFile: certs.OtherServerKey},
		}
		if mutate != nil {
			mutate(c)
		}
	})
}

func clientOn(t *testing.T, p *proxytest.Proxy, name string, tc *tls.Config, mutate ...func(*redis.Options)) *redis.Client {
	t.Helper()
	addr := p.Addrs[name]
	if addr == "" {
		t.Fatalf("no listener %q: %v", name, p.Addrs)
	}
	return p.Client(t, append([]func(*redis.Options){func(o *redis.Options) { o.Addr, o.TLSConfig = addr, tc }}, mutate...)...)
}

// Every listener serves, with its own TLS or none; CLIENT INFO's laddr is
// the address of the listener the client came through; the accepted
// connections are counted by listener name.
func TestListenersServeEach(t *testing.T) {
	certs := redistest.NewCerts(t)
	p := listenersProxy(t, certs, nil)
	own := certs.ClientConfig(t, false)
	own.RootCAs = poolOf(t, certs.OtherCAFile)
	for _, c := range []struct {
		name string
		tls  *tls.Config
	}{
		{"plain", nil}, {"tls", certs.ClientConfig(t, false)}, {"internal", nil},
		{"secure", certs.ClientConfig(t, false)}, {"own", own},
	} {
		cl := clientOn(t, p, c.name, c.tls, func(o *redis.Options) { o.PoolSize = 1 })
		if err := cl.Set(ctx, "via:"+c.name, c.name, 0).Err(); err != nil {
			t.Fatalf("SET through %s: %v", c.name, err)
		}
		info, err := cl.Do(ctx, "client", "info").Text()
		if err != nil {
			t.Fatal(err)
		}
		if want := "laddr=" + p.Addrs[c.name] + " "; !strings.Contains(info, want) {
			t.Errorf("CLIENT INFO through %s: %q, want %s", c.name, info, want)
		}
		v, _, err := metrics.CounterSum(p.Metrics.Registry, "redproxy_listener_connections_total", "listener", c.name)
		if err != nil || v < 1 {
			t.Errorf("redproxy_listener_connections_total{listener=%q} = %v, %v", c.name, v, err)
		}
	}
	// A plaintext client on a TLS listener is told so, as on [server.tls].
	nc, err := net.DialTimeout("tcp", p.Addrs["secure"], 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.Write([]byte("PING\r\n"))
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 256)
	n, _ := nc.Read(buf)
	if !strings.Contains(string(buf[:n]), "this port speaks TLS") {
		t.Errorf("plaintext to a TLS listener: %q", buf[:n])
	}
}

// A policy scope applies to the listener it names and not another, and to
// the user it names and not another.
func TestListenerScopes(t *testing.T) {
	certs := redistest.NewCerts(t)
	parsed, err := config.Parse([]byte(`
[server]
listen = "127.0.0.1:0"

[[server.listeners]]
name = "internal"
listen = "127.0.0.1:0"

[[users]]
name = "batch"
password_sha256 = "`+auth.HashPassword("batch-pw")+`"
acl = "+@all ~*"

[[users]]
name = "app"
password_sha256 = "`+auth.HashPassword(appPass)+`"
acl = "+@all ~*"

[[policy.scope]]
name = "ops-listener"
listeners = ["internal"]
[policy.scope.commands]
allow = ["flushdb"]

[[policy.scope]]
name = "batch-user"
users = ["batch"]
[policy.scope.commands]
allow = ["flushdb"]
`), "scopes.toml")
	if err != nil {
		t.Fatal(err)
	}
	p := listenersProxy(t, certs, func(c *config.Config) {
		c.Users, c.Policy = parsed.Users, parsed.Policy
		c.Server.Listeners = parsed.Server.Listeners
	})
	as := func(name, pass string) func(*redis.Options) {
		return func(o *redis.Options) { o.Username, o.Password, o.PoolSize = name, pass, 1 }
	}
	for _, c := range []struct {
		listener, user, pass string
		allowed              bool
	}{
		{"internal", "app", appPass, true},   // the listener's scope
		{"plain", "app", appPass, false},     // neither scope
		{"tls", "app", appPass, false},       // neither scope
		{"plain", "batch", "batch-pw", true}, // the user's scope
		{"internal", "batch", "batch-pw", true},
	} {
		var tc *tls.Config
		if c.listener == "tls" {
			tc = certs.ClientConfig(t, false)
		}
		err := clientOn(t, p, c.listener, tc, as(c.user, c.pass)).Do(ctx, "flushdb").Err()
		if c.allowed && err != nil {
			t.Errorf("FLUSHDB as %s through %s: %v, want allowed", c.user, c.listener, err)
		}
		if !c.allowed && (err == nil || !strings.Contains(err.Error(), "FLUSHDB is disabled")) {
			t.Errorf("FLUSHDB as %s through %s: %v, want the policy's refusal", c.user, c.listener, err)
		}
	}
}

// max_clients counts the clients of every listener together.
func TestMaxClientsAcrossListeners(t *testing.T) {
	certs := redistest.NewCerts(t)
	p := listenersProxy(t, certs, func(c *config.Config) { c.Server.MaxClients = 2 })
	one := clientOn(t, p, "plain", nil, func(o *redis.Options) { o.PoolSize = 1 })
	two := clientOn(t, p, "internal", nil, func(o *redis.Options) { o.PoolSize = 1 })
	for _, c := range []*redis.Client{one, two} {
		if err := c.Ping(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"plain", "internal"} {
		nc, err := net.DialTimeout("tcp", p.Addrs[name], 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		if got := newReplyReader(nc).line(t); got != "-ERR max number of clients reached" {
			t.Errorf("third client, on %s: %q", name, got)
		}
	}
}

// The exposure check covers [[server.listeners]]: one that is not
// loopback refuses to start without authentication, unless it is TLS with
// client certificates or allow_unauthenticated is set.
func TestListenerExposure(t *testing.T) {
	rs := redistest.Start(t)
	certs := redistest.NewCerts(t)
	start := func(mutate func(*config.Config)) error {
		cfg := config.Default()
		cfg.Server.Listen, cfg.Server.Admin, cfg.Upstream.Address = "127.0.0.1:0", "", rs.Addr()
		mutate(cfg)
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		srv, err := proxy.NewServer(proxy.Options{Config: cfg, Table: commands.Builtin(), Metrics: metrics.New()})
		if err == nil {
			srv.Shutdown(ctx)
		}
		return err
	}
	exposed := func(c *config.Config) {
		c.Server.Listeners = []config.Listener{{Name: "public", Listen: "0.0.0.0:0"}}
	}
	err := start(exposed)
	var ce *config.Error
	if !errors.As(err, &ce) || ce.Key != "server.listeners[0].listen" || !strings.Contains(err.Error(), `"public"`) {
		t.Fatalf("NewServer with an open public listener: %v", err)
	}
	if err := start(func(c *config.Config) { exposed(c); c.Server.AllowUnauthenticated = true }); err != nil {
		t.Errorf("with allow_unauthenticated: %v", err)
	}
	if err := start(func(c *config.Config) {
		c.Server.Listeners = []config.Listener{{Name: "public", Listen: "0.0.0.0:0", TLS: true,
			CertFile: certs.ServerCert, KeyFile: certs.ServerKey, ClientCAFile: certs.CAFile}}
	}); err != nil {
		t.Errorf("a public mutual-TLS listener: %v", err)
	}
}

// proxy_protocol is per listener: a [[server.listeners]] entry may expect
// the PROXY header while server.listen does not.
func TestListenerProxyProtocol(t *testing.T) {
	on := true
	p := proxytest.Start(t, nil, func(c *config.Config) {
		c.Server.Listeners = []config.Listener{{Name: "lb", Listen: "127.0.0.1:0", ProxyProtocol: &on}}
	})
	if err := p.Client(t).Ping(ctx).Err(); err != nil {
		t.Fatalf("PING on plain, without a header: %v", err)
	}
	nc, err := net.DialTimeout("tcp", p.Addrs["lb"], 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.Write([]byte("PROXY TCP4 203.0.113.7 127.0.0.1 40000 6380\r\nCLIENT INFO\r\n"))
	rd := newReplyReader(nc)
	rd.line(t) // the bulk's length
	if got := rd.line(t); !strings.Contains(got, "addr=203.0.113.7:40000 ") {
		t.Errorf("CLIENT INFO through lb: %q, want the header's address", got)
	}
	bare, err := net.DialTimeout("tcp", p.Addrs["lb"], 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer bare.Close()
	bare.Write([]byte("PING\r\n"))
	if !connClosed(bare) {
		t.Error("a connection without a PROXY header was served on lb")
	}
}

// Connections waiting for their PROXY header count against max_clients
// on every listener, not only on their own: two silent ones on lb left
// the plain listener serving two more clients at max_clients 2 (found by
// a probe: 40 pending and 40 served at 40).
func TestProxyHeaderWaitersCountOnEveryListener(t *testing.T) {
	on := true
	p := proxytest.Start(t, nil, func(c *config.Config) {
		c.Server.MaxClients = 2
		c.Server.Listeners = []config.Listener{{Name: "lb", Listen: "127.0.0.1:0", ProxyProtocol: &on}}
	})
	var silent []net.Conn
	for range 2 {
		nc, err := net.DialTimeout("tcp", p.Addrs["lb"], 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		silent = append(silent, nc)
	}
	// Both waiting before any plain client is tried: a plain client
	// served before the second was accepted had that one refused, and
	// then, once it left, every later one was served (CI, under -race).
	redistest.Eventually(t, 5*time.Second, func() bool {
		return counterSum(t, p, "redproxy_listener_connections_total", "listener", "lb") == 2
	}, "the two connections were not accepted on lb")
	if n := metricSum(t, p, "redproxy_client_connections_rejected_total"); n != 0 {
		t.Fatalf("%v connections refused before the test began", n)
	}
	// The refusal is written at accept; nothing is sent, since a command
	// reaching the closed socket draws a reset that can discard the
	// refusal before it is read (CI, under -race). A served client says
	// nothing, and the short read wait ends that try.
	plainRefused := func() bool {
		c := dialRaw(t, p.Addr)
		defer c.nc.Close()
		c.wait = 500 * time.Millisecond
		v, err := c.next(nil)
		return err == nil && v == respError("ERR max number of clients reached")
	}
	redistest.Eventually(t, 5*time.Second, plainRefused, "a plain client was served beside two connections waiting for their PROXY header, at max_clients 2")
	for _, nc := range silent {
		nc.Close()
	}
	redistest.Eventually(t, 5*time.Second, func() bool { return p.Client(t).Ping(ctx).Err() == nil },
		"no plain client was served once the waiting connections left")
}

// A reload re-reads the certificate of every TLS listener: the one it
// shares with [server.tls] and one of its own.
func TestListenerCertReload(t *testing.T) {
	certs := redistest.NewCerts(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "own.crt"), filepath.Join(dir, "own.key")
	copyFile(t, certs.ServerCert, certFile)
	copyFile(t, certs.ServerKey, keyFile)
	p := listenersProxy(t, certs, func(c *config.Config) {
		c.Server.Listeners[2].CertFile, c.Server.Listeners[2].KeyFile = certFile, keyFile
	})
	servedCN := func(listener string) string {
		t.Helper()
		nc, err := tls.Dial("tcp", p.Addrs[listener], certs.ClientConfig(t, false))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		return nc.ConnectionState().PeerCertificates[0].Subject.CommonName
	}
	if cn := servedCN("own"); cn != "redproxy-test-server" {
		t.Fatalf("own served %q before the rotation", cn)
	}
	newCert, newKey := certs.IssueServer(t, "rotated")
	copyFile(t, newCert, certFile)
	copyFile(t, newKey, keyFile)
	if changed, err := p.Reload(p.Config()); err != nil {
		t.Fatalf("Reload: %v", err)
	} else if want := []string{`the certificate of listener "own" (the files it names)`}; !slices.Equal(changed, want) {
		t.Errorf("Reload changed %q; want %q", changed, want)
	}
	if cn := servedCN("own"); cn != "redproxy-test-rotated" {
		t.Errorf("own served %q after the rotation", cn)
	}
	if cn := servedCN("secure"); cn != "redproxy-test-server" {
		t.Errorf("secure (with [server.tls]'s files) served %q", cn)
	}
	if err := os.WriteFile(certFile, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Reload(p.Config()); err == nil || !strings.Contains(err.Error(), `listener "own"`) {
		t.Errorf("Reload with a garbage certificate for own: %v", err)
	}
}

// A listener's namespace confines its clients' keys: what a client of
// "internal" (namespace "tenant-a:") writes lands under the prefix on
// Redis and reads back under the client's own name; a client of "plain"
// writes the bare key and does not see the other's.
func TestListenerNamespaceConfinesKeys(t *testing.T) {
	certs := redistest.NewCerts(t)
	p := listenersProxy(t, certs, nil)
	direct := p.Redis.Client(t)
	tenant := clientOn(t, p, "internal", nil)
	plain := clientOn(t, p, "plain", nil)
	if err := tenant.Set(ctx, "ns:k", "tenant", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := plain.Set(ctx, "ns:k", "plain", 0).Err(); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{"tenant-a:ns:k": "tenant", "ns:k": "plain"} {
		if got, err := direct.Get(ctx, key).Result(); err != nil || got != want {
			t.Errorf("on Redis, %s = %q, %v; want %q", key, got, err, want)
		}
	}
	if got, err := tenant.Get(ctx, "ns:k").Result(); err != nil || got != "tenant" {
		t.Errorf("tenant reads ns:k = %q, %v", got, err)
	}
	keys, err := tenant.Keys(ctx, "ns:*").Result()
	if err == nil && (len(keys) != 1 || keys[0] != "ns:k") {
		t.Errorf("tenant's KEYS ns:* = %q, want its own key without the prefix", keys)
	}
}
