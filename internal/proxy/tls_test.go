package proxy_test

// TLS on both sides ([server.tls], [upstream.tls]) against a real
// redis-server started with --tls-port, through go-redis and redis-cli.

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// tlsProxy starts a proxy with a TLS listener (server certificate from
// certs, mutual TLS when mutual) in front of rs, dialling rs's TLS port
// with the client certificate when rs has one (tls-auth-clients yes).
func tlsProxy(t *testing.T, certs *redistest.Certs, rs *redistest.Server, mutual bool, mutate func(*config.Config)) *proxytest.Proxy {
	t.Helper()
	return proxytest.Start(t, rs, func(c *config.Config) {
		c.Upstream.Address = rs.TLSAddr()
		c.Upstream.TLS = &config.UpstreamTLS{CAFile: certs.CAFile, CertFile: certs.ClientCert, KeyFile: certs.ClientKey}
		c.Server.TLS = config.ServerTLS{Listen: "127.0.0.1:0", CertFile: certs.ServerCert, KeyFile: certs.ServerKey, MinVersion: "1.2"}
		if mutual {
			c.Server.TLS.ClientCAFile = certs.CAFile
		}
		if mutate != nil {
			mutate(c)
		}
	})
}

func tlsClient(t *testing.T, addr string, conf *tls.Config) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, TLSConfig: conf, MaxRetries: -1, DialTimeout: 2 * time.Second, ReadTimeout: 10 * time.Second, PoolSize: 4})
	t.Cleanup(func() { c.Close() })
	return c
}

func tlsFailures(t *testing.T, p *proxytest.Proxy, reason string) float64 {
	t.Helper()
	v, _, err := metrics.CounterSum(p.Metrics.Registry, "redproxy_client_tls_handshake_failures_total", "reason", reason)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestTLSBothSides: a go-redis client with TLS (and a client certificate)
// reaches a TLS-only Redis port through the proxy, on shared connections,
// a transaction, a blocking command and pub/sub (each a different kind of
// upstream connection), while a plaintext client keeps working on the
// plaintext listener beside it.
func TestTLSBothSides(t *testing.T) {
	certs := redistest.NewCerts(t)
	rs := redistest.StartTLS(t, certs, "yes")
	p := tlsProxy(t, certs, rs, true, nil)
	ctx := context.Background()

	sc := tlsClient(t, p.TLSAddr, certs.ClientConfig(t, true))
	plain := p.Client(t)
	if err := sc.Set(ctx, "tls:k", "v1", 0).Err(); err != nil {
		t.Fatalf("SET over TLS: %v", err)
	}
	if got, err := plain.Get(ctx, "tls:k").Result(); err != nil || got != "v1" {
		t.Fatalf("plaintext GET = %q, %v; want v1", got, err)
	}
	// Shared connections, pipelined.
	cmds, err := sc.Pipelined(ctx, func(pl redis.Pipeliner) error {
		for i := range 50 {
			pl.Set(ctx, "tls:p:"+strconv.Itoa(i), i, 0)
			pl.Get(ctx, "tls:p:"+strconv.Itoa(i))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("pipeline over TLS: %v", err)
	}
	for i := range 50 {
		if got := cmds[2*i+1].(*redis.StringCmd).Val(); got != strconv.Itoa(i) {
			t.Fatalf("pipelined GET %d = %q", i, got)
		}
	}
	// A transaction: a dedicated connection.
	if _, err := sc.TxPipelined(ctx, func(pl redis.Pipeliner) error {
		pl.Incr(ctx, "tls:n")
		pl.Incr(ctx, "tls:n")
		return nil
	}); err != nil {
		t.Fatalf("MULTI/EXEC over TLS: %v", err)
	}
	if n, _ := plain.Get(ctx, "tls:n").Int(); n != 2 {
		t.Fatalf("tls:n = %d after the transaction, want 2", n)
	}
	// A blocking command: a borrowed dedicated connection.
	popped := make(chan []string, 1)
	go func() {
		v, _ := sc.BLPop(ctx, 5*time.Second, "tls:q").Result()
		popped <- v
	}()
	redistest.Eventually(t, 5*time.Second, func() bool {
		n, _ := plain.LPush(ctx, "tls:q", "x").Result()
		if n == 1 {
			return true
		}
		plain.Del(ctx, "tls:q")
		return false
	}, "push for BLPOP")
	if v := <-popped; len(v) != 2 || v[1] != "x" {
		t.Fatalf("BLPOP over TLS = %v", v)
	}
	// Pub/sub: a relayed raw connection.
	sub := sc.Subscribe(ctx, "tls:ch")
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatalf("SUBSCRIBE over TLS: %v", err)
	}
	redistest.Eventually(t, 5*time.Second, func() bool { return plain.Publish(ctx, "tls:ch", "hello").Val() == 1 }, "subscriber registered")
	msg, err := sub.ReceiveMessage(ctx)
	if err != nil || msg.Payload != "hello" {
		t.Fatalf("message over TLS = %v, %v", msg, err)
	}
}

// TestTLSClientInfo: CLIENT INFO of a TLS client names its address and a
// real descriptor (the socket under the TLS connection).
func TestTLSClientInfo(t *testing.T) {
	certs := redistest.NewCerts(t)
	rs := redistest.StartTLS(t, certs, "no")
	p := tlsProxy(t, certs, rs, false, nil)
	nc, err := tls.Dial("tcp", p.TLSAddr, certs.ClientConfig(t, false))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c := &rawTLS{nc: nc, rd: bufio.NewReader(nc)}
	info := c.bulk(t, "CLIENT", "INFO")
	if !strings.Contains(info, "addr="+nc.LocalAddr().String()+" ") || !strings.Contains(info, "laddr="+p.TLSAddr+" ") {
		t.Fatalf("CLIENT INFO = %q; want addr=%s laddr=%s", info, nc.LocalAddr(), p.TLSAddr)
	}
	if strings.Contains(info, " fd=-1 ") {
		t.Fatalf("CLIENT INFO has no descriptor for a TLS client: %q", info)
	}
}

type rawTLS struct {
	nc net.Conn
	rd *bufio.Reader
}

func (c *rawTLS) send(t *testing.T, args ...string) {
	t.Helper()
	var b strings.Builder
	b.WriteString("*" + strconv.Itoa(len(args)) + "\r\n")
	for _, a := range args {
		b.WriteString("$" + strconv.Itoa(len(a)) + "\r\n" + a + "\r\n")
	}
	c.nc.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.nc.Write([]byte(b.String())); err != nil {
		t.Fatal(err)
	}
}

func (c *rawTLS) line(t *testing.T) string {
	t.Helper()
	l, err := c.rd.ReadString('\n')
	if err != nil {
		t.Fatalf("reading a reply: %v", err)
	}
	return strings.TrimRight(l, "\r\n")
}

func (c *rawTLS) bulk(t *testing.T, args ...string) string {
	t.Helper()
	c.send(t, args...)
	l := c.line(t)
	n, err := strconv.Atoi(strings.TrimPrefix(l, "$"))
	if !strings.HasPrefix(l, "$") || err != nil {
		t.Fatalf("%v: reply %q, want a bulk string", args, l)
	}
	b := make([]byte, n+2)
	if _, err := io.ReadFull(c.rd, b); err != nil {
		t.Fatal(err)
	}
	return string(b[:n])
}

// TestTLSRedisCLI: redis-cli --tls --cacert through the proxy, and
// redis-cli without --tls on the TLS port gets told why it fails.
func TestTLSRedisCLI(t *testing.T) {
	if _, err := exec.LookPath("redis-cli"); err != nil {
		t.Skip("redis-cli not installed")
	}
	certs := redistest.NewCerts(t)
	rs := redistest.StartTLS(t, certs, "no")
	p := tlsProxy(t, certs, rs, false, nil)
	host, port, _ := net.SplitHostPort(p.TLSAddr)
	cli := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		out, _ := exec.CommandContext(ctx, "redis-cli", append([]string{"-h", host, "-p", port}, args...)...).CombinedOutput()
		return strings.TrimSpace(string(out))
	}
	if out := cli("--tls", "--cacert", certs.CAFile, "SET", "cli:k", "over-tls"); out != "OK" {
		t.Fatalf("redis-cli --tls SET: %q", out)
	}
	if out := cli("--tls", "--cacert", certs.CAFile, "GET", "cli:k"); out != "over-tls" {
		t.Fatalf("redis-cli --tls GET: %q", out)
	}
	if out := cli("GET", "cli:k"); !strings.Contains(out, "this port speaks TLS") {
		t.Fatalf("redis-cli without --tls on the TLS port: %q; want the not-TLS error", out)
	}
	if out := cli("--tls", "--cacert", certs.OtherCAFile, "GET", "cli:k"); !strings.Contains(strings.ToLower(out), "certificate verify failed") {
		t.Fatalf("redis-cli --tls trusting another CA: %q; want a verification failure", out)
	}
}

// TestTLSClientFailures: each way a client can get TLS wrong fails that
// client with a clear message, is counted, and harms no other client: a
// TLS and a plaintext client connected before keep working.
func TestTLSClientFailures(t *testing.T) {
	certs := redistest.NewCerts(t)
	rs := redistest.StartTLS(t, certs, "no")
	mutual := tlsProxy(t, certs, rs, true, nil)
	expired := tlsProxy(t, certs, rs, false, func(c *config.Config) {
		c.Server.TLS.CertFile, c.Server.TLS.KeyFile = certs.ExpiredCert, certs.ExpiredKey
	})
	ctx := context.Background()
	good := tlsClient(t, mutual.TLSAddr, certs.ClientConfig(t, true))
	plain := mutual.Client(t)
	for _, c := range []*redis.Client{good, plain} {
		if err := c.Set(ctx, "fail:k", "kept", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	stillFine := func(what string) {
		t.Helper()
		for name, c := range map[string]*redis.Client{"TLS": good, "plaintext": plain} {
			if v, err := c.Get(ctx, "fail:k").Result(); err != nil || v != "kept" {
				t.Fatalf("after %s, the connected %s client got %q, %v", what, name, v, err)
			}
		}
	}
	wantErr := func(what string, err error, substrs ...string) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s: no error", what)
		}
		for _, s := range substrs {
			if strings.Contains(err.Error(), s) {
				t.Logf("%s: %v", what, err)
				return
			}
		}
		t.Fatalf("%s: error %q, want one of %q", what, err, substrs)
	}

	// A client that trusts another CA refuses the proxy's certificate.
	wrongCA := certs.ClientConfig(t, true)
	wrongCA.RootCAs = poolOf(t, certs.OtherCAFile)
	err := tlsClient(t, mutual.TLSAddr, wrongCA).Ping(ctx).Err()
	wantErr("wrong CA", err, "certificate signed by unknown authority")
	stillFine("a client with the wrong CA")

	// A proxy serving an expired certificate is refused by its clients.
	err = tlsClient(t, expired.TLSAddr, certs.ClientConfig(t, false)).Ping(ctx).Err()
	wantErr("expired certificate", err, "certificate has expired")
	stillFine("a client refusing an expired certificate")

	// Mutual TLS: a client without a certificate is refused by the proxy.
	err = tlsClient(t, mutual.TLSAddr, certs.ClientConfig(t, false)).Ping(ctx).Err()
	wantErr("no client certificate", err, "certificate required", "bad certificate")
	redistest.Eventually(t, 5*time.Second, func() bool { return tlsFailures(t, mutual, "handshake") >= 1 }, "refused handshake counted")
	stillFine("a client without a certificate")

	// Mutual TLS: a certificate from another CA is refused too.
	other := certs.ClientConfig(t, false)
	otherCert, err := tls.LoadX509KeyPair(certs.OtherServerCert, certs.OtherServerKey)
	if err != nil {
		t.Fatal(err)
	}
	// Offered whatever CAs the proxy names, as a misconfigured client would.
	other.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &otherCert, nil }
	err = tlsClient(t, mutual.TLSAddr, other).Ping(ctx).Err()
	wantErr("client certificate from another CA", err, "unknown certificate authority", "bad certificate")
	stillFine("a client certificate from another CA")

	// Plaintext RESP to the TLS port: told in plaintext, then closed.
	nc, err := net.DialTimeout("tcp", mutual.TLSAddr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	nc.Write([]byte("*1\r\n$4\r\nPING\r\n"))
	reply, err := io.ReadAll(nc)
	if err != nil || !strings.HasPrefix(string(reply), "-ERR this port speaks TLS") {
		t.Fatalf("plaintext to the TLS port: %q, %v", reply, err)
	}
	if n := tlsFailures(t, mutual, "not_tls"); n != 1 {
		t.Fatalf("not_tls failures = %v, want 1", n)
	}
	stillFine("plaintext sent to the TLS port")

	// Connected and closed with nothing sent (a TCP health check): no
	// refused handshake, counted apart.
	refusedBefore := tlsFailures(t, mutual, "handshake")
	probeConn, err := net.DialTimeout("tcp", mutual.TLSAddr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	probeConn.Close()
	redistest.Eventually(t, 5*time.Second, func() bool { return tlsFailures(t, mutual, "closed") == 1 }, "a connection closed at once was not counted as closed")
	if n := tlsFailures(t, mutual, "handshake"); n != refusedBefore {
		t.Fatalf("a connection closed at once counted as a refused handshake (%v -> %v)", refusedBefore, n)
	}

	// TLS to the plaintext port: the client cannot mistake it for TLS.
	err = tlsClient(t, mutual.Addr, certs.ClientConfig(t, true)).Ping(ctx).Err()
	wantErr("TLS to the plaintext port", err, "first record does not look like a TLS handshake")
	stillFine("TLS sent to the plaintext port")
}

func poolOf(t *testing.T, file string) *x509.CertPool {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		t.Fatalf("no certificate in %s", file)
	}
	return pool
}

// TestTLSCertReload: a certificate rotated in place is served to
// connections made after Reload, without a setting changing; a connection
// made before keeps working. A reload that finds an unreadable certificate
// is refused whole and the certificate in force stays.
func TestTLSCertReload(t *testing.T) {
	certs := redistest.NewCerts(t)
	rs := redistest.StartTLS(t, certs, "no")
	certFile, keyFile := copiedPair(t, certs.ServerCert, certs.ServerKey)
	p := tlsProxy(t, certs, rs, false, func(c *config.Config) {
		c.Server.TLS.CertFile, c.Server.TLS.KeyFile = certFile, keyFile
	})
	servedCN := func() string {
		t.Helper()
		nc, err := tls.Dial("tcp", p.TLSAddr, certs.ClientConfig(t, false))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		return nc.ConnectionState().PeerCertificates[0].Subject.CommonName
	}
	if cn := servedCN(); cn != "redproxy-test-server" {
		t.Fatalf("served %q before the rotation", cn)
	}
	nc, err := tls.Dial("tcp", p.TLSAddr, certs.ClientConfig(t, false))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	before := &rawTLS{nc: nc, rd: bufio.NewReader(nc)}
	before.send(t, "SET", "reload:k", "v")
	if r := before.line(t); r != "+OK" {
		t.Fatalf("SET: %q", r)
	}

	newCert, newKey := certs.IssueServer(t, "rotated")
	copyFile(t, newCert, certFile)
	copyFile(t, newKey, keyFile)
	changed, err := p.Reload(p.Config())
	if err != nil {
		t.Fatalf("Reload: %v", err)
	}
	// No setting changed, but the reload did: said, or its log line read
	// changed=nothing (found by a probe).
	if want := []string{`the certificate of listener "tls" (the files it names)`}; !slices.Equal(changed, want) {
		t.Fatalf("Reload changed %q; want %q", changed, want)
	}
	if changed, err := p.Reload(p.Config()); err != nil || len(changed) != 0 {
		t.Fatalf("a second reload of the same files: %q, %v; want nothing changed", changed, err)
	}
	if cn := servedCN(); cn != "redproxy-test-rotated" {
		t.Fatalf("served %q after the rotation, want the rotated certificate", cn)
	}
	if cn := nc.ConnectionState().PeerCertificates[0].Subject.CommonName; cn != "redproxy-test-server" {
		t.Fatalf("the connection from before has %q", cn)
	}
	for range 3 {
		if v := before.bulk(t, "GET", "reload:k"); v != "v" {
			t.Fatalf("connection from before the rotation: GET = %q", v)
		}
	}

	// A half-written rotation (garbage in the certificate file) is refused.
	if err := os.WriteFile(certFile, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Reload(p.Config()); err == nil || !strings.Contains(err.Error(), "server.tls.cert_file") {
		t.Fatalf("Reload with a garbage certificate: %v; want an error naming server.tls.cert_file", err)
	}
	if cn := servedCN(); cn != "redproxy-test-rotated" {
		t.Fatalf("served %q after a refused reload, want the certificate in force", cn)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestTLSUpstreamFailures: a proxy whose [upstream.tls] does not match
// Redis never sends it a command, and its clients get an error instead of
// a hang; pointing TLS at Redis's plaintext port fails the same way.
func TestTLSUpstreamFailures(t *testing.T) {
	certs := redistest.NewCerts(t)
	rs := redistest.StartTLS(t, certs, "no")
	ctx := context.Background()
	for name, mutate := range map[string]func(*config.Config){
		"wrong CA": func(c *config.Config) {
			c.Upstream.Address = rs.TLSAddr()
			c.Upstream.TLS = &config.UpstreamTLS{CAFile: certs.OtherCAFile}
		},
		"plaintext port": func(c *config.Config) {
			c.Upstream.Address = rs.Addr()
			c.Upstream.TLS = &config.UpstreamTLS{CAFile: certs.CAFile}
		},
		"no TLS to the TLS port": func(c *config.Config) {
			c.Upstream.Address = rs.TLSAddr()
			c.Upstream.DialTimeout.Duration = 300 * time.Millisecond
		},
	} {
		t.Run(name, func(t *testing.T) {
			p := startUnready(t, rs, mutate)
			if p.Ready() {
				t.Fatal("proxy ready with a mismatched upstream TLS")
			}
			err := p.Client(t).Set(ctx, "never", "sent", 0).Err()
			if err == nil {
				t.Fatal("SET succeeded through a mismatched upstream TLS")
			}
			t.Logf("client sees: %v", err)
			if n, _ := rs.Client(t).Exists(ctx, "never").Result(); n != 0 {
				t.Fatal("the command reached Redis")
			}
		})
	}
}

// startUnready starts a proxy in front of rs without waiting for it to
// reach Redis, which it may never do.
func startUnready(t *testing.T, rs *redistest.Server, mutate func(*config.Config)) *proxytest.Proxy {
	t.Helper()
	return proxytest.StartUnready(t, rs, func(cfg *config.Config) {
		cfg.Upstream.Connections = 1
		cfg.Upstream.DialTimeout.Duration = 300 * time.Millisecond
		mutate(cfg)
	})
}

// TestTLSClientGoneWhileBlocked: a TLS client that closes while blocked in
// BLPOP releases its blocked pop in Redis, as a plaintext client does
// (TestBlockedPops), although the last bytes it sends before its FIN are a
// close_notify record; one that stays connected stays blocked and gets its
// element.
func TestTLSClientGoneWhileBlocked(t *testing.T) {
	certs := redistest.NewCerts(t)
	rs := redistest.StartTLS(t, certs, "no")
	p := tlsProxy(t, certs, rs, false, nil)
	direct := rs.Client(t)
	dial := func() *rawTLS {
		nc, err := tls.Dial("tcp", p.TLSAddr, certs.ClientConfig(t, false))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		return &rawTLS{nc: nc, rd: bufio.NewReader(nc)}
	}
	leaving, staying := dial(), dial()
	leaving.send(t, "BLPOP", "gone:q", "0")
	staying.send(t, "BLPOP", "stay:q", "0")
	redistest.Eventually(t, 10*time.Second, func() bool { return blockedClients(direct) == 2 }, "clients never blocked")
	leaving.nc.Close()
	redistest.Eventually(t, 10*time.Second, func() bool { return blockedClients(direct) == 1 },
		"Redis still blocks %d pops; the TLS client that left should have been noticed", blockedClients(direct))
	// Several of the proxy's 50 ms checks pass with the other one blocked.
	time.Sleep(300 * time.Millisecond)
	if n := blockedClients(direct); n != 1 {
		t.Fatalf("%d blocked pops; the connected TLS client must stay blocked", n)
	}
	if err := direct.LPush(context.Background(), "stay:q", "e").Err(); err != nil {
		t.Fatal(err)
	}
	if r := staying.line(t); r != "*2" {
		t.Fatalf("BLPOP reply %q", r)
	}
}

// TestTLSClientThatStopsReadingIsClosedAtWriteTimeout: the write deadline
// on every write to a client holds through TLS, so a TLS client that never
// reads is closed at client_write_timeout like a plaintext one
// (TestClientThatStopsReadingIsClosedAtWriteTimeout), and others go on.
func TestTLSClientThatStopsReadingIsClosedAtWriteTimeout(t *testing.T) {
	certs := redistest.NewCerts(t)
	rs := redistest.StartTLS(t, certs, "no")
	p := tlsProxy(t, certs, rs, false, func(c *config.Config) {
		c.Server.ClientWriteTimeout = units.Duration{Duration: 300 * time.Millisecond}
	})
	if err := rs.Client(t).Set(ctx, "big", strings.Repeat("b", 256<<10), 0).Err(); err != nil {
		t.Fatal(err)
	}
	bad := tls.Client(dialSmallBuffer(t, p.TLSAddr), certs.ClientConfig(t, false))
	if err := bad.Handshake(); err != nil {
		t.Fatal(err)
	}
	get := []byte("*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n")
	redistest.Eventually(t, 30*time.Second, func() bool {
		// A timed-out TLS write breaks the client's side for good; by then
		// the proxy is blocked on writing to it, which is the point.
		bad.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
		bad.Write(get)
		return closedFor(p, metrics.CloseWriteTimeout) == 1
	}, "a TLS client that never reads was never closed at the write timeout")
	waitClients(t, p, 0)
	good := tlsClient(t, p.TLSAddr, certs.ClientConfig(t, false))
	if n, err := good.StrLen(ctx, "big").Result(); err != nil || n != 256<<10 {
		t.Fatalf("another TLS client after the cut-off: %d, %v", n, err)
	}
}

// TestTLSLocalTier: the local tier's tracking connections dial Redis with
// [upstream.tls] like the pools do: the tier becomes live on a TLS-only
// Redis port, serves hits, and a write made behind the proxy's back (on
// Redis directly) reaches it as an invalidation over TLS.
func TestTLSLocalTier(t *testing.T) {
	certs := redistest.NewCerts(t)
	rs := redistest.StartTLS(t, certs, "yes")
	p := tlsProxy(t, certs, rs, false, func(c *config.Config) {
		c.LocalCache.Enabled = true
		c.LocalCache.AdmitMinReads = 0
		c.LocalCache.MaxTTL = units.Duration{Duration: time.Minute}
	})
	redistest.Eventually(t, 10*time.Second, func() bool { return p.LocalTier().Live(0) }, "local tier never became live over TLS")
	direct := rs.Client(t)
	if err := direct.Set(ctx, "tier:k", "old", 0).Err(); err != nil {
		t.Fatal(err)
	}
	reader := tlsClient(t, p.TLSAddr, certs.ClientConfig(t, false))
	hits := func() float64 { return metricSum(t, p, "redproxy_localcache_hits_total") }
	redistest.Eventually(t, 5*time.Second, func() bool {
		before := hits()
		reader.Get(ctx, "tier:k")
		return hits() > before
	}, "tier:k never became a local tier hit")
	if err := direct.Set(ctx, "tier:k", "new", 0).Err(); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 5*time.Second, func() bool { return reader.Get(ctx, "tier:k").Val() == "new" },
		"the tier kept serving the old value: no invalidation arrived over TLS")
}

// TestTLSUpstreamReload: a reload reads [upstream.tls]'s files again; the
// same files change nothing (no new connections), a CA file rotated in
// place switches the upstream so new connections use it (here a wrong CA:
// the proxy stops being ready), and putting the right one back recovers.
func TestTLSUpstreamReload(t *testing.T) {
	certs := redistest.NewCerts(t)
	rs := redistest.StartTLS(t, certs, "no")
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	copyFile(t, certs.CAFile, caFile)
	p := tlsProxy(t, certs, rs, false, func(c *config.Config) {
		c.Upstream.TLS = &config.UpstreamTLS{CAFile: caFile}
	})
	direct := rs.Client(t)
	dials := func() string {
		info := direct.Info(ctx, "stats").Val()
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "total_connections_received:"); ok {
				return v
			}
		}
		t.Fatalf("no total_connections_received in %q", info)
		return ""
	}
	before := dials()
	// A snapshot parsed again from the same file: an equal section, not
	// the same pointer.
	same := *p.Config()
	sameTLS := *same.Upstream.TLS
	same.Upstream.TLS = &sameTLS
	if changed, err := p.Reload(&same); err != nil || len(changed) != 0 {
		t.Fatalf("Reload with the same files: %v, %v", changed, err)
	}
	if err := p.Client(t).Set(ctx, "up:k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if d := dials(); d != before {
		t.Fatalf("a reload with the same TLS files dialled Redis again (%s -> %s connections received)", before, d)
	}

	// A CA that does not sign Redis's certificate is refused, and the
	// configuration in force stays: applied, it failed every request
	// until the next reload (found by a probe).
	copyFile(t, certs.OtherCAFile, caFile)
	if changed, err := p.Reload(p.Config()); err == nil || !strings.Contains(err.Error(), "do not verify") {
		t.Fatalf("Reload with a CA that does not sign Redis's certificate: changed %q, %v; want it refused", changed, err)
	}
	if v, err := p.Client(t).Get(ctx, "up:k").Result(); err != nil || v != "v" {
		t.Fatalf("GET after the refused reload: %q, %v", v, err)
	}

	// One that does (here the same CA, and the other, in one file) is
	// applied: the upstream is switched, and the reload says what changed,
	// the files rather than the settings (it said nothing while switching
	// the upstream, found by a probe).
	both := append(readFile(t, certs.CAFile), readFile(t, certs.OtherCAFile)...)
	if err := os.WriteFile(caFile, both, 0o600); err != nil {
		t.Fatal(err)
	}
	before = dials()
	if changed, err := p.Reload(p.Config()); err != nil || !slices.Contains(changed, "upstream.tls (the files it names)") {
		t.Fatalf("Reload with the CA file rotated: changed %q, %v", changed, err)
	}
	if v, err := p.Client(t).Get(ctx, "up:k").Result(); err != nil || v != "v" {
		t.Fatalf("GET after the CA was rotated: %q, %v", v, err)
	}
	if d := dials(); d == before {
		t.Fatalf("the rotated CA file did not switch the upstream: no new connection (%s)", d)
	}
}

// TestTLSUpstreamReloadRefusesAClientCertRedisRefuses: a client
// certificate rotated in place to one Redis does not accept (tls-auth-clients
// yes; signed by a CA Redis does not trust) is refused by the reload, and
// the files in force stay. Under TLS 1.3 the client's handshake ends before
// Redis checks its certificate, so the reload's dial took such files and
// every connection then failed.
func TestTLSUpstreamReloadRefusesAClientCertRedisRefuses(t *testing.T) {
	certs := redistest.NewCerts(t)
	rs := redistest.StartTLS(t, certs, "yes")
	certFile, keyFile := copiedPair(t, certs.ClientCert, certs.ClientKey)
	p := tlsProxy(t, certs, rs, false, func(c *config.Config) {
		c.Upstream.TLS = &config.UpstreamTLS{CAFile: certs.CAFile, CertFile: certFile, KeyFile: keyFile}
	})
	if err := p.Client(t).Set(ctx, "up:k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// A certificate of the other CA, which Redis does not trust.
	copyFile(t, certs.OtherServerCert, certFile)
	copyFile(t, certs.OtherServerKey, keyFile)
	if changed, err := p.Reload(p.Config()); err == nil || !strings.Contains(err.Error(), "refuses the client certificate") {
		t.Fatalf("Reload with a client certificate Redis refuses: changed %q, %v; want it refused", changed, err)
	}
	if v, err := p.Client(t).Get(ctx, "up:k").Result(); err != nil || v != "v" {
		t.Fatalf("GET after the refused reload: %q, %v", v, err)
	}
	// Back to one it accepts: nothing to refuse.
	copyFile(t, certs.ClientCert, certFile)
	copyFile(t, certs.ClientKey, keyFile)
	if _, err := p.Reload(p.Config()); err != nil {
		t.Fatalf("Reload with the client certificate Redis accepts: %v", err)
	}
}

// copiedPair copies a certificate and its key into files of the test's
// own, for a test to rotate in place.
func copiedPair(t *testing.T, cert, key string) (certFile, keyFile string) {
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	copyFile(t, cert, certFile)
	copyFile(t, key, keyFile)
	return certFile, keyFile
}

func readFile(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestTLSMaxClients: a TLS client over server.max_clients is told why, over
// TLS, rather than getting bytes it cannot decode.
func TestTLSMaxClients(t *testing.T) {
	certs := redistest.NewCerts(t)
	rs := redistest.StartTLS(t, certs, "no")
	p := tlsProxy(t, certs, rs, false, func(c *config.Config) { c.Server.MaxClients = 1 })
	first := tlsClient(t, p.TLSAddr, certs.ClientConfig(t, false))
	if err := first.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	nc, err := tls.Dial("tcp", p.TLSAddr, certs.ClientConfig(t, false))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	line, _ := bufio.NewReader(nc).ReadString('\n')
	if line != "-ERR max number of clients reached\r\n" {
		t.Fatalf("second TLS client got %q", line)
	}
	if err := first.Ping(ctx).Err(); err != nil {
		t.Fatalf("the first client after the refusal: %v", err)
	}
}
