package proxy_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// proxyV2 builds a version 2 PROXY header for TCP from src to dst, with
// one TLV (as AWS's load balancers add one).
func proxyV2(src, dst *net.TCPAddr) []byte {
	b := []byte("\r\n\r\n\x00\r\nQUIT\n\x21")
	var addrs []byte
	if ip := src.IP.To4(); ip != nil {
		b = append(b, 0x11)
		addrs = append(append(addrs, ip...), dst.IP.To4()...)
	} else {
		b = append(b, 0x21)
		addrs = append(append(addrs, src.IP.To16()...), dst.IP.To16()...)
	}
	addrs = binary.BigEndian.AppendUint16(addrs, uint16(src.Port))
	addrs = binary.BigEndian.AppendUint16(addrs, uint16(dst.Port))
	addrs = append(addrs, 0xEA, 0, 4, 'v', 'p', 'c', 'e')
	b = binary.BigEndian.AppendUint16(b, uint16(len(addrs)))
	return append(b, addrs...)
}

func proxyProtocolProxy(t *testing.T) *proxytest.Proxy {
	return proxytest.Start(t, nil, func(c *config.Config) {
		c.Server.ProxyProtocol = true
		c.Server.SlowlogThreshold.Duration = 0 // every batch, to see its client address
		c.Users = []auth.UserConfig{user("app", appPass, "+@all ~*")}
	})
}

func proxyHeaderFailures(t *testing.T, p *proxytest.Proxy, reason string) float64 {
	t.Helper()
	v, _, err := metrics.CounterSum(p.Metrics.Registry, "redproxy_client_proxy_header_failures_total", "reason", reason)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestProxyProtocolClientAddress: with server.proxy_protocol on, the
// address in a client's v1 or v2 header is the one CLIENT LIST and CLIENT
// INFO and the slow log show, whether the client's first commands arrive in the same
// segment as the header or after it; laddr stays the proxy's.
func TestProxyProtocolClientAddress(t *testing.T) {
	p := proxyProtocolProxy(t)
	login := "AUTH app " + appPass + "\r\n"

	// v1, with the first commands in the same write as the header: the
	// bytes read past the header must reach the session.
	a := p.Dial(t)
	a.Write([]byte("PROXY TCP4 203.0.113.7 198.51.100.1 40001 6380\r\n" + login + "CLIENT SETNAME via-v1\r\n"))
	ra := newReplyReader(a)
	for _, want := range []string{"+OK", "+OK"} {
		if got := ra.line(t); got != want {
			t.Fatalf("v1 client: %q, want %q", got, want)
		}
	}

	// v2 over IPv6, header alone first, then the commands.
	b := p.Dial(t)
	b.Write(proxyV2(&net.TCPAddr{IP: net.ParseIP("2001:db8::7"), Port: 40002}, &net.TCPAddr{IP: net.ParseIP("2001:db8::1"), Port: 6380}))
	rb := newReplyReader(b)
	b.Write([]byte(login + "CLIENT INFO\r\n"))
	if got := rb.line(t); got != "+OK" {
		t.Fatalf("v2 client AUTH: %q", got)
	}
	rb.line(t) // $len
	info := rb.line(t)
	if !strings.Contains(info, "addr=[2001:db8::7]:40002 ") || !strings.Contains(info, "laddr="+p.Addr+" ") {
		t.Fatalf("v2 client's CLIENT INFO = %q; want addr=[2001:db8::7]:40002 laddr=%s", info, p.Addr)
	}

	a.Write([]byte("CLIENT LIST\r\n"))
	ra.line(t)
	list := ra.line(t)
	if !strings.Contains(list, "addr=203.0.113.7:40001 ") || !strings.Contains(list, "name=via-v1 ") {
		t.Fatalf("CLIENT LIST = %q; want the v1 client at 203.0.113.7:40001", list)
	}
	if !strings.Contains(list, "addr=[2001:db8::7]:40002 ") {
		t.Fatalf("CLIENT LIST = %q; want the v2 client at [2001:db8::7]:40002", list)
	}
	if strings.Contains(list, " addr=127.0.0.1:") {
		t.Fatalf("CLIENT LIST shows a socket address instead of the header's: %q", list)
	}
	// The slow log names the client by the header's address too.
	found := false
	for _, e := range p.Slowlog().Entries() {
		found = found || e.Client == "203.0.113.7:40001"
		if strings.HasPrefix(e.Client, "127.0.0.1:") {
			t.Fatalf("slow log entry with the socket's address: %+v", e)
		}
	}
	if !found {
		t.Fatalf("no slow log entry for 203.0.113.7:40001: %+v", p.Slowlog().Entries())
	}
	// CLIENT KILL ADDR finds a client by the header's address.
	a.Write([]byte("CLIENT KILL ADDR [2001:db8::7]:40002\r\n"))
	if got := ra.line(t); got != ":1" {
		t.Fatalf("CLIENT KILL ADDR of the v2 client: %q, want :1", got)
	}
}

// TestProxyProtocolRefusesConnectionWithoutHeader: a client that speaks
// RESP at once, with the option on, is closed without an answer, counted
// and logged; a client with a header next to it is unharmed.
func TestProxyProtocolRefusesConnectionWithoutHeader(t *testing.T) {
	p := proxyProtocolProxy(t)
	good := p.Dial(t)
	good.Write([]byte("PROXY TCP4 192.0.2.1 192.0.2.2 5000 6380\r\nAUTH app " + appPass + "\r\n"))
	rg := newReplyReader(good)
	if got := rg.line(t); got != "+OK" {
		t.Fatalf("AUTH: %q", got)
	}

	for _, tt := range []struct{ reason, send string }{
		{"missing", "PING\r\n"},
		{"missing", "*1\r\n$4\r\nPING\r\n"},
		{"invalid", "PROXY TCP4 192.0.2.1 192.0.2.2 5000\r\nPING\r\n"},
		{"invalid", "PROXY UNKNOWN " + strings.Repeat("x", 200)},
	} {
		before := proxyHeaderFailures(t, p, tt.reason)
		bad := p.Dial(t)
		bad.Write([]byte(tt.send))
		bad.SetReadDeadline(time.Now().Add(5 * time.Second))
		got, err := io.ReadAll(bad)
		// A reset is a close too: the proxy may close before reading all
		// that was sent.
		if err != nil && !errors.Is(err, syscall.ECONNRESET) || len(got) != 0 {
			t.Fatalf("%q: read %q, %v; want the connection closed without a reply", tt.send, got, err)
		}
		redistest.Eventually(t, 5*time.Second, func() bool { return proxyHeaderFailures(t, p, tt.reason) == before+1 },
			"%q not counted as %s", tt.send, tt.reason)
	}

	good.Write([]byte("PING\r\n"))
	if got := rg.line(t); got != "+PONG" {
		t.Fatalf("client with a header after the refusals: %q", got)
	}
}

// TestProxyProtocolAuthLimitPerClientAddress: failed AUTH is limited by
// the address in the header, so one client behind the load balancer that
// guesses passwords does not lock out the others, which share the load
// balancer's socket address.
func TestProxyProtocolAuthLimitPerClientAddress(t *testing.T) {
	p := proxyProtocolProxy(t)
	guesser := p.Dial(t)
	guesser.Write([]byte("PROXY TCP4 203.0.113.66 198.51.100.1 40001 6380\r\n"))
	rg := newReplyReader(guesser)
	limited := false
	for i := 0; i < 2*auth.DefaultFailBurst && !limited; i++ {
		guesser.Write([]byte("AUTH app wrong\r\n"))
		limited = strings.Contains(rg.line(t), "too many failed AUTH")
	}
	if !limited {
		t.Fatal("wrong passwords from one header address were never rate-limited")
	}
	other := p.Dial(t)
	other.Write([]byte("PROXY TCP4 203.0.113.67 198.51.100.1 40002 6380\r\nAUTH app " + appPass + "\r\n"))
	if got := newReplyReader(other).line(t); got != "+OK" {
		t.Fatalf("another client behind the same load balancer: %q, want +OK", got)
	}
	// The limited address stays limited on a new connection.
	again := p.Dial(t)
	again.Write([]byte("PROXY TCP4 203.0.113.66 198.51.100.1 40003 6380\r\nAUTH app " + appPass + "\r\n"))
	if got := newReplyReader(again).line(t); !strings.Contains(got, "too many failed AUTH") {
		t.Fatalf("new connection from the limited address: %q, want the rate-limit error", got)
	}
}

// TestProxyProtocolBeforeTLS: on the TLS listener the header comes first,
// in plaintext, then the TLS handshake.
func TestProxyProtocolBeforeTLS(t *testing.T) {
	certs := redistest.NewCerts(t)
	rs := redistest.StartTLS(t, certs, "no")
	p := tlsProxy(t, certs, rs, false, func(c *config.Config) { c.Server.ProxyProtocol = true })
	raw, err := net.DialTimeout("tcp", p.TLSAddr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	raw.Write(proxyV2(&net.TCPAddr{IP: net.IPv4(203, 0, 113, 9), Port: 41000}, &net.TCPAddr{IP: net.IPv4(198, 51, 100, 1), Port: 6390}))
	nc := tls.Client(raw, certs.ClientConfig(t, false))
	c := &rawTLS{nc: nc, rd: bufio.NewReader(nc)}
	info := c.bulk(t, "CLIENT", "INFO")
	if !strings.Contains(info, "addr=203.0.113.9:41000 ") {
		t.Fatalf("CLIENT INFO over TLS after a PROXY header = %q; want addr=203.0.113.9:41000", info)
	}

	// A TLS client that sends no header is refused before any handshake.
	before := proxyHeaderFailures(t, p, "missing")
	if _, err := tls.Dial("tcp", p.TLSAddr, certs.ClientConfig(t, false)); err == nil {
		t.Fatal("TLS handshake without a PROXY header succeeded")
	}
	redistest.Eventually(t, 5*time.Second, func() bool { return proxyHeaderFailures(t, p, "missing") == before+1 },
		"TLS client without a header not counted")
}

// TestProxyProtocolHeaderTimeout: a connection that sends no header, or
// only part of one, is closed once proxyHeaderTimeout (5 s) has passed,
// and counted; it holds up no other client meanwhile.
func TestProxyProtocolHeaderTimeout(t *testing.T) {
	p := proxyProtocolProxy(t)
	silent := p.Dial(t)
	partial := p.Dial(t)
	partial.Write([]byte("PROXY TCP4 192.0.2.1 "))

	good := p.Dial(t)
	good.Write([]byte("PROXY TCP4 192.0.2.1 192.0.2.2 5000 6380\r\nAUTH app " + appPass + "\r\n"))
	if got := newReplyReader(good).line(t); got != "+OK" {
		t.Fatalf("client with a header beside two waiting ones: %q", got)
	}
	for _, nc := range []net.Conn{silent, partial} {
		nc.SetReadDeadline(time.Now().Add(15 * time.Second))
		got, err := io.ReadAll(nc)
		if err != nil && !errors.Is(err, syscall.ECONNRESET) || len(got) != 0 {
			t.Fatalf("read %q, %v; want the connection closed without a reply", got, err)
		}
	}
	redistest.Eventually(t, 5*time.Second, func() bool { return proxyHeaderFailures(t, p, "timeout") == 2 },
		"timeouts not counted")
}

// TestProxyProtocolShutdownClosesWaitingConnections: Shutdown does not
// wait out the header timeout of connections that sent nothing yet.
func TestProxyProtocolShutdownClosesWaitingConnections(t *testing.T) {
	p := proxyProtocolProxy(t)
	silent := p.Dial(t)
	// Wait until the proxy has accepted it and waits for its header.
	redistest.Eventually(t, 5*time.Second, func() bool {
		return testutil.ToFloat64(p.Metrics.ClientsTotal) >= 1
	}, "connection never accepted")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown with a connection waiting for its PROXY header: %v", err)
	}
	silent.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := io.ReadAll(silent); err != nil && !errors.Is(err, syscall.ECONNRESET) || len(got) != 0 {
		t.Fatalf("waiting connection after Shutdown: read %q, %v; want it closed", got, err)
	}
}
