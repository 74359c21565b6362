package main

// What TLS would take on an event loop. gnet has no TLS, and crypto/tls
// wants a blocking net.Conn. The way in, measured here: give each tls.Conn
// an in-memory transport that the loop feeds with the ciphertext gnet read
// and drains into gnet's output. The handshake needs a blocking transport
// (a failed read during it is final), so it would run on a goroutine the
// loop feeds, like a stateful session; after it, the transport answers
// "would block" when it is empty, and crypto/tls keeps a partial record and
// lets Read be called again, because it treats a net.Error whose
// Temporary() is true as not fatal. Then Read and Write run inline on the
// loop: no goroutine per TLS connection, and a partial record is only a
// buffered byte count, as with plain RESP.

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"
)

// errWouldBlock is what the transport answers when the loop has fed it
// nothing new; crypto/tls leaves its state intact for a temporary error.
var errWouldBlock net.Error = wouldBlock{}

type wouldBlock struct{}

func (wouldBlock) Error() string   { return "would block" }
func (wouldBlock) Timeout() bool   { return true }
func (wouldBlock) Temporary() bool { return true }

// memTransport is one side of an in-memory connection: in holds the
// ciphertext the loop read from the socket, and writes go to peer.in (on a
// real loop: to the gnet connection's output).
type memTransport struct {
	mu       sync.Mutex
	cond     *sync.Cond
	in       []byte
	peer     *memTransport
	blocking bool // during the handshake only
}

func newMemPair() (*memTransport, *memTransport) {
	a, b := &memTransport{blocking: true}, &memTransport{blocking: true}
	a.cond, b.cond = sync.NewCond(&a.mu), sync.NewCond(&b.mu)
	a.peer, b.peer = b, a
	return a, b
}

func (t *memTransport) Read(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for len(t.in) == 0 {
		if !t.blocking {
			return 0, errWouldBlock
		}
		t.cond.Wait()
	}
	n := copy(p, t.in)
	rest := copy(t.in, t.in[n:])
	t.in = t.in[:rest]
	if rest == 0 && cap(t.in) > 4096 {
		t.in = nil // idle transports hold no buffer
	}
	return n, nil
}

func (t *memTransport) Write(p []byte) (int, error) {
	q := t.peer
	q.mu.Lock()
	q.in = append(q.in, p...)
	q.cond.Signal()
	q.mu.Unlock()
	return len(p), nil
}

func (t *memTransport) nonBlocking() {
	t.mu.Lock()
	t.blocking = false
	t.mu.Unlock()
}

func (t *memTransport) Close() error                     { return nil }
func (t *memTransport) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (t *memTransport) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (t *memTransport) SetDeadline(time.Time) error      { return nil }
func (t *memTransport) SetReadDeadline(time.Time) error  { return nil }
func (t *memTransport) SetWriteDeadline(time.Time) error { return nil }

func testTLSConfigs(tb testing.TB) (client, server *tls.Config) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "redis.test"},
		DNSNames:     []string{"redis.test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	server = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
	client = &tls.Config{RootCAs: pool, ServerName: "redis.test"}
	return client, server
}

// tlsPair hands back a client and a server tls.Conn whose handshake ran on
// goroutines over a blocking transport, then switched to non-blocking.
func tlsPair(tb testing.TB, clientCfg, serverCfg *tls.Config) (*tls.Conn, *tls.Conn) {
	tb.Helper()
	ct, st := newMemPair()
	cc, sc := tls.Client(ct, clientCfg), tls.Server(st, serverCfg)
	errs := make(chan error, 2)
	go func() { errs <- cc.Handshake() }()
	go func() { errs <- sc.Handshake() }()
	for i := 0; i < 2; i++ {
		if err := <-errs; err != nil {
			tb.Fatal(err)
		}
	}
	ct.nonBlocking()
	st.nonBlocking()
	return cc, sc
}

// readAll reads what is decryptable now, as a loop would on each readable
// event, until errWouldBlock.
func readAll(c *tls.Conn, buf []byte, dst []byte) ([]byte, error) {
	for {
		n, err := c.Read(buf)
		dst = append(dst, buf[:n]...)
		if errors.Is(err, errWouldBlock) {
			return dst, nil
		}
		if err != nil {
			return dst, err
		}
	}
}

var (
	getRequest = command("GET", "key:000000012345")
	getReply   = append([]byte("$64\r\n"), append(bytes.Repeat([]byte("x"), 64), "\r\n"...)...)
)

// A record that arrives in pieces is decrypted once its last byte is fed,
// and a Read in between answers "would block" without breaking the conn.
func TestTLSOnLoopPartialRecords(t *testing.T) {
	clientCfg, serverCfg := testTLSConfigs(t)
	cc, sc := tlsPair(t, clientCfg, serverCfg)
	st := sc.NetConn().(*memTransport)

	// Take the client's records back and feed them one byte at a time.
	if _, err := cc.Write(getRequest); err != nil {
		t.Fatal(err)
	}
	st.mu.Lock()
	records := append([]byte(nil), st.in...)
	st.in = nil
	st.mu.Unlock()

	buf := make([]byte, 16<<10)
	var got []byte
	for i := 0; i < len(records); i++ {
		st.mu.Lock()
		st.in = append(st.in, records[i])
		st.mu.Unlock()
		var err error
		if got, err = readAll(sc, buf, got); err != nil {
			t.Fatalf("after %d of %d bytes: %v", i+1, len(records), err)
		}
		if i < len(records)-1 && len(got) != 0 {
			t.Fatalf("decrypted %d bytes before the record was complete", len(got))
		}
	}
	if !bytes.Equal(got, getRequest) {
		t.Fatalf("server read %q, want %q", got, getRequest)
	}
	// And the conn still works both ways.
	if _, err := sc.Write(getReply); err != nil {
		t.Fatal(err)
	}
	reply, err := readAll(cc, buf, nil)
	if err != nil || !bytes.Equal(reply, getReply) {
		t.Fatalf("client read %q, %v", reply, err)
	}
}

// BenchmarkTLSOnLoopRoundTrip is the CPU TLS adds to one GET through a
// proxy on one side: per op, the client seals the request, the proxy side
// opens it, seals a 64-byte value's reply, and the client opens that. A
// proxy pays half of an op's work per TLS side and per request (one open,
// one seal), so TLS on both sides costs it about one op per request.
func BenchmarkTLSOnLoopRoundTrip(b *testing.B) {
	clientCfg, serverCfg := testTLSConfigs(b)
	cc, sc := tlsPair(b, clientCfg, serverCfg)
	buf := make([]byte, 16<<10)
	var got []byte
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := cc.Write(getRequest); err != nil {
			b.Fatal(err)
		}
		got, _ = readAll(sc, buf, got[:0])
		if _, err := sc.Write(getReply); err != nil {
			b.Fatal(err)
		}
		got, _ = readAll(cc, buf, got[:0])
		if len(got) != len(getReply) {
			b.Fatalf("client read %d bytes, want %d", len(got), len(getReply))
		}
	}
}

// BenchmarkTLSIdleConnHeap reports the Go heap one idle server-side TLS
// connection keeps after its handshake and one request (B/idle-conn):
// crypto/tls holds its record buffers and cipher state per connection.
func BenchmarkTLSIdleConnHeap(b *testing.B) {
	clientCfg, serverCfg := testTLSConfigs(b)
	serverCfg.SessionTicketsDisabled = true
	const conns = 1000
	buf := make([]byte, 16<<10)
	for i := 0; i < b.N; i++ {
		clients := make([]*tls.Conn, 0, conns)
		servers := make([]*tls.Conn, 0, conns)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for j := 0; j < conns; j++ {
			cc, sc := tlsPair(b, clientCfg, serverCfg)
			_, _ = cc.Write(getRequest)
			_, _ = readAll(sc, buf, nil)
			_, _ = sc.Write(getReply)
			_, _ = readAll(cc, buf, nil)
			clients, servers = append(clients, cc), append(servers, sc)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		// Both ends are alike; half the growth is the server side's.
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/2/conns, "B/idle-conn")
		runtime.KeepAlive(clients)
		runtime.KeepAlive(servers)
	}
}
