package upstream

import (
	"crypto/x509"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/resp"
)

// tlsOpts dials rs's TLS port trusting certs' CA, presenting the client
// certificate, with no server name: DialConn derives it from the address.
func tlsOpts(t *testing.T, certs *redistest.Certs, addr string) Options {
	opt := testOpts(addr)
	opt.TLS = certs.ClientConfig(t, true)
	opt.TLS.ServerName = ""
	opt.Password = "s3cret"
	return opt
}

// TestDialTLS: every kind of connection the backend opens (a one-off
// round trip, a shared pipe, a dedicated pipe, the health probe) speaks
// TLS to a Redis that requires client certificates; and each mismatch
// fails the dial with ErrTLSHandshake and a message that says what.
func TestDialTLS(t *testing.T) {
	certs := redistest.NewCerts(t)
	rs := redistest.StartTLS(t, certs, "yes")
	// With a password, so the handshake's AUTH also travels over TLS.
	if err := rs.Client(t).ConfigSet(t.Context(), "requirepass", "s3cret").Err(); err != nil {
		t.Fatal(err)
	}
	opt := tlsOpts(t, certs, rs.TLSAddr())

	reply, err := RoundTrip(opt, resp.Ping)
	if err != nil || string(reply) != "+PONG\r\n" {
		t.Fatalf("RoundTrip over TLS: %q, %v", reply, err)
	}
	p := startedPipe(t, opt)
	c := sendCall(t, p, cmd("SET", "k", "v"), cmd("GET", "k"))
	c.Wait()
	wantReply(t, c, 1, bulk("v"))
	ded, err := DialPipe(opt)
	if err != nil {
		t.Fatalf("DialPipe over TLS: %v", err)
	}
	defer ded.Close()
	c = sendCall(t, ded, cmd("GET", "k"))
	c.Wait()
	wantReply(t, c, 0, bulk("v"))

	// The probe must use TLS too: on the TLS port a plaintext PING is
	// never answered, which would read as an unresponsive Redis.
	popt := opt
	popt.defaults()
	never := make(chan struct{})
	if v := probe(popt, time.Now().Add(2*time.Second), never); v != probeAnswered {
		t.Fatalf("probe over TLS: verdict %d, want answered", v)
	}

	for name, tc := range map[string]struct {
		mutate func(*Options)
		want   string
	}{
		"wrong CA": {func(o *Options) {
			o.TLS = o.TLS.Clone()
			o.TLS.RootCAs = poolFrom(t, certs.OtherCAFile)
		}, "certificate signed by unknown authority"},
		"wrong server name": {func(o *Options) {
			o.TLS = o.TLS.Clone()
			o.TLS.ServerName = "redis.example"
		}, "not redis.example"},
		"no client certificate": {func(o *Options) {
			o.TLS = o.TLS.Clone()
			o.TLS.Certificates = nil
		}, "set upstream.tls.cert_file"},
		"plaintext port": {func(o *Options) { o.Addr = rs.Addr() }, "does that port speak TLS?"},
		// The opposite mistake: plaintext to the TLS port.
		"TLS port without TLS": {func(o *Options) { o.TLS = nil }, "if that port speaks TLS, set [upstream.tls]"},
	} {
		t.Run(name, func(t *testing.T) {
			o := opt
			tc.mutate(&o)
			_, err := Dial(o)
			if err == nil {
				t.Fatal("dial succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("dial error %q, want one mentioning %q", err, tc.want)
			}
			t.Logf("%s: %v", name, err)
		})
	}

	// A replica refused for WantPrimary (Sentinel mode) is just that: the
	// client-certificate hint was added to it too (found by a probe).
	replica := redistest.StartTLS(t, certs, "yes", "--replicaof", "127.0.0.1", strconv.Itoa(rs.Port()), "--masterauth", "s3cret")
	ro := tlsOpts(t, certs, replica.TLSAddr())
	ro.Password, ro.WantPrimary = "", true
	ro.TLS = ro.TLS.Clone()
	ro.TLS.Certificates = nil // as when Redis asks for none: the hint's condition
	if err := replica.Client(t).ConfigSet(t.Context(), "tls-auth-clients", "no").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := Dial(ro); !errors.Is(err, ErrNotPrimary) || strings.Contains(err.Error(), "client certificates") {
		t.Fatalf("dial to a TLS replica with WantPrimary: %v; want ErrNotPrimary without the client-certificate hint", err)
	}

	// insecure_skip_verify dials whatever certificate Redis has.
	o := opt
	o.TLS = o.TLS.Clone()
	o.TLS.RootCAs = poolFrom(t, certs.OtherCAFile)
	o.TLS.InsecureSkipVerify = true
	if reply, err := RoundTrip(o, resp.Ping); err != nil || string(reply) != "+PONG\r\n" {
		t.Fatalf("insecure RoundTrip: %q, %v", reply, err)
	}
}

func poolFrom(t *testing.T, file string) *x509.CertPool {
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
