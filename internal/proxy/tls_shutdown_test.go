package proxy_test

import (
	"context"
	"crypto/tls"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// pipeListener hands the proxy the server ends of in-memory pipes. A pipe
// has no buffer: once its client stops reading, every write to it waits,
// which a TCP socket does only once both ends' buffers are full, so a
// client that stopped reading is made here at a known moment.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error { l.once.Do(func() { close(l.done) }); return nil }

func (l *pipeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

func (l *pipeListener) dial(t *testing.T) net.Conn {
	t.Helper()
	client, server := net.Pipe()
	select {
	case l.conns <- server:
	case <-time.After(5 * time.Second):
		t.Fatal("the proxy did not accept from the pipe listener")
	}
	t.Cleanup(func() { client.Close() })
	return client
}

// A shutdown past its deadline closes the clients still connected. A TLS
// client that stopped reading cannot take the close_notify alert that
// tls.Conn.Close sends first, waiting up to 5 s for it; and a second
// Close made meanwhile returns at once without closing anything. So two
// TLS clients not reading, each with a BLPOP waiting on Redis, held a
// shutdown with a 200 ms deadline for 5.05 s: their sessions, ended by the
// shutdown, were each waiting in their own Close, which the shutdown's
// forced close could not cut short. Past the deadline the proxy owes no
// one a goodbye: the sockets are closed under the TLS layer at once.
func TestShutdownPastDeadlineDoesNotWaitForTLSGoodbyes(t *testing.T) {
	certs := redistest.NewCerts(t)
	rs := redistest.Start(t)
	p := proxytest.Start(t, rs, func(c *config.Config) {
		c.Server.TLS = config.ServerTLS{Listen: "127.0.0.1:0", CertFile: certs.ServerCert, KeyFile: certs.ServerKey, MinVersion: "1.2"}
	})
	ln := newPipeListener()
	go p.ServeTLS(ln)

	const stuck = 2
	for i := range stuck {
		conf := certs.ClientConfig(t, false)
		tc := tls.Client(ln.dial(t), conf)
		tc.SetDeadline(time.Now().Add(5 * time.Second))
		if err := tc.Handshake(); err != nil {
			t.Fatalf("client %d handshake: %v", i, err)
		}
		if _, err := tc.Write([]byte("*3\r\n$5\r\nBLPOP\r\n$12\r\nnever-pushed\r\n$1\r\n0\r\n")); err != nil {
			t.Fatalf("client %d BLPOP: %v", i, err)
		}
		// From here on the client reads nothing.
	}
	rc := rs.Client(t)
	redistest.Eventually(t, 5*time.Second, func() bool {
		info, err := rc.Info(context.Background(), "clients").Result()
		return err == nil && strings.Contains(info, "\r\nblocked_clients:"+strconv.Itoa(stuck)+"\r\n")
	}, "the BLPOPs never reached Redis")

	sctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := p.Shutdown(sctx); err == nil {
		t.Fatal("Shutdown reported no error although clients outlived its deadline")
	}
	// A shutdown that waited for any close_notify took 5 s.
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("Shutdown took %v past a 200ms deadline with %d TLS clients not reading", took.Round(10*time.Millisecond), stuck)
	}
}
