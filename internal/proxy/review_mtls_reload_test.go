package proxy_test

import (
	"bufio"
	"crypto/tls"
	"net"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// A listener that is not loopback may start without [[users]] or an
// upstream password only when it requires client certificates
// (config.ExposureError: "a TLS listener that requires client certificates
// is not open to anyone"). client_ca_file reloads at run time, but the
// exposure check runs only at start: a reload that drops client_ca_file is
// accepted, and the listener then serves anyone who connects, with no
// authentication at all, a configuration that would be refused at start.
func TestReviewReloadDroppingClientCAOpensExposedListener(t *testing.T) {
	certs := redistest.NewCerts(t)
	p := proxytest.Start(t, nil, func(c *config.Config) {
		c.Server.Listen = ""
		c.Server.TLS = config.ServerTLS{Listen: "0.0.0.0:0", CertFile: certs.ServerCert, KeyFile: certs.ServerKey,
			ClientCAFile: certs.CAFile, MinVersion: "1.2"}
	})
	_, port, _ := net.SplitHostPort(p.TLSAddr)
	addr := net.JoinHostPort("127.0.0.1", port)

	// What the same file would get at start.
	cold := *p.Config()
	cold.Server.TLS.ClientCAFile = ""
	if err := config.ExposureError(&cold); err == nil {
		t.Fatal("the configuration without client_ca_file passes the exposure check; the test's premise is wrong")
	}

	next := *p.Config()
	next.Server.TLS.ClientCAFile = ""
	_, rerr := p.Reload(&next)

	// Whatever Reload said, a client without a certificate must not get
	// in without authenticating.
	conf := certs.ClientConfig(t, false)
	nc, err := tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", addr, conf)
	if err == nil {
		defer nc.Close()
		c := &rawTLS{nc: nc, rd: bufio.NewReader(nc)}
		c.send(t, "SET", "exposed:k", "pwned")
		nc.SetReadDeadline(time.Now().Add(3 * time.Second))
		if l, lerr := c.rd.ReadString('\n'); lerr == nil && l == "+OK\r\n" {
			t.Errorf("after a reload dropping client_ca_file (Reload err = %v), a client without a certificate on the non-loopback listener ran SET unauthenticated", rerr)
		}
	}
	if rerr == nil {
		t.Errorf("Reload dropping client_ca_file on a non-loopback listener with no users and no password was accepted; at start the same configuration is refused (%v)", config.ExposureError(&cold))
	}
}
