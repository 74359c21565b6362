package proxy_test

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// server.tls.handshake_timeout closes a client that connects to a TLS
// listener and never completes a handshake, while other TLS clients are
// served meanwhile. The client below waits 8 s, less than the former fixed
// 10 s, for the proxy to close it after the configured 1 s.
func TestTLSHandshakeTimeoutConfigurable(t *testing.T) {
	certs := redistest.NewCerts(t)
	rs := redistest.StartTLS(t, certs, "no")
	p := tlsProxy(t, certs, rs, false, func(c *config.Config) {
		c.Server.TLS.HandshakeTimeout = units.Duration{Duration: time.Second}
	})
	silent, err := net.DialTimeout("tcp", p.TLSAddr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	// Half a handshake: a ClientHello never sent whole.
	silent.Write([]byte{0x16, 0x03, 0x01, 0x02, 0x00})

	good := tlsClient(t, p.TLSAddr, certs.ClientConfig(t, false))
	if err := good.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING from another TLS client while one stalls its handshake: %v", err)
	}

	silent.SetReadDeadline(time.Now().Add(8 * time.Second))
	_, err = silent.Read(make([]byte, 64))
	if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the stalled client was not closed by the proxy: %v", err)
	}
	redistest.Eventually(t, 5*time.Second, func() bool { return tlsFailures(t, p, "timeout") == 1 }, "handshake timeout not counted")
	if err := good.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after the stalled client was closed: %v", err)
	}
}

// A negative handshake_timeout is refused with the key named.
func TestTLSHandshakeTimeoutValidated(t *testing.T) {
	_, err := config.Parse([]byte("[server.tls]\nhandshake_timeout = \"-1s\"\n"), "t.toml")
	var ce *config.Error
	if !errors.As(err, &ce) || ce.Key != "server.tls.handshake_timeout" {
		t.Fatalf("Parse: %v", err)
	}
}

// Connections over max_clients on a TLS listener are told so, which needs
// a handshake, on a goroutine each. Nothing bounded how many waited for
// one: 300 silent connections to the TLS port held 300 descriptors (and
// goroutines) for handshake_timeout, where a plain listener closes them
// at once (found by review). At most 64 now wait, for at most a second.
func TestTLSRejectsOverMaxClientsAreBounded(t *testing.T) {
	if _, err := os.ReadDir("/proc/self/fd"); err != nil {
		t.Skip("no /proc/self/fd to count descriptors")
	}
	openFDs := func() int {
		ents, _ := os.ReadDir("/proc/self/fd")
		return len(ents)
	}
	certs := redistest.NewCerts(t)
	p := proxytest.Start(t, nil, func(c *config.Config) {
		c.Server.MaxClients = 2
		c.Server.TLS = config.ServerTLS{Listen: "127.0.0.1:0", CertFile: certs.ServerCert, KeyFile: certs.ServerKey, MinVersion: "1.2"}
	})
	for i := 0; i < 2; i++ { // max_clients reached
		if got := dialRaw(t, p.Addr).do("PING"); got != "PONG" {
			t.Fatalf("PING: %v", got)
		}
	}
	fd0 := openFDs()
	const n = 300
	for i := 0; i < n; i++ {
		c, err := net.DialTimeout("tcp", p.TLSAddr, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close() // sends nothing
	}
	redistest.Eventually(t, 10*time.Second, func() bool {
		return testutil.ToFloat64(p.Metrics.ClientsRejected) == n
	}, "the proxy did not refuse the %d connections over max_clients", n)
	// Right after the last refusal, before any handshake wait is over.
	if held := openFDs() - fd0 - n; held > 64+8 {
		t.Fatalf("the proxy holds %d descriptors for connections it refused over max_clients", held)
	}
}
