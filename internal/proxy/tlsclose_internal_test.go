package proxy

import (
	"crypto/tls"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/redistest"
)

// countingConn counts the writes made to it.
type countingConn struct {
	net.Conn
	writes atomic.Int64
}

func (c *countingConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

// Closing a TLS client whose write failed (it stopped reading) sends it
// nothing more: tls.Conn.Close would first try to write a close_notify
// alert, and wait up to 5 s for a peer that takes nothing.
func TestTLSCloseAfterFailedWriteSendsNothing(t *testing.T) {
	certs := redistest.NewCerts(t)
	cert, err := tls.LoadX509KeyPair(certs.ServerCert, certs.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	srvRaw, cliRaw := net.Pipe()
	defer cliRaw.Close()
	counted := &countingConn{Conn: srvRaw}
	stc := tls.Server(counted, &tls.Config{Certificates: []tls.Certificate{cert}})
	ctc := tls.Client(cliRaw, certs.ClientConfig(t, false))
	done := make(chan error, 1)
	go func() { done <- ctc.Handshake() }()
	if err := stc.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// The client reads nothing from here on: the write times out.
	cc := &clientConn{Conn: stc}
	stc.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := cc.Write([]byte(strings.Repeat("x", 64<<10))); err == nil {
		t.Fatal("a write to a client that reads nothing succeeded")
	}
	before := counted.writes.Load()
	cc.Close()
	if n := counted.writes.Load() - before; n != 0 {
		t.Errorf("Close wrote %d more times to a client that stopped reading", n)
	}
}
