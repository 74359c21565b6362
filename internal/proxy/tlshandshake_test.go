package proxy_test

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
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
