package redistest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// Certs is a throwaway PKI written to a test's temp dir as PEM files: a CA,
// certificates it signed for a server (127.0.0.1, ::1 and localhost) and a
// client, an expired server certificate, and a second CA that signed
// nothing here, for "wrong CA" cases.
type Certs struct {
	Dir string

	CAFile                           string // the CA that signed the rest
	ServerCert, ServerKey            string // valid for 127.0.0.1 and localhost
	ClientCert, ClientKey            string // a client certificate (CN "redproxy-test-client")
	ExpiredCert, ExpiredKey          string // a server certificate that expired yesterday
	OtherCAFile                      string // a CA that signed none of these
	OtherServerCert, OtherServerKey  string // a server certificate signed by OtherCAFile
	ca, other                        *x509.Certificate
	caKey, otherKey                  *ecdsa.PrivateKey
	serial                           int64
	serverNames                      []string
	serverIPs                        []net.IP
	notBeforeValid, notAfterValid    time.Time
	notBeforeExpired, notAfterExpire time.Time
}

// NewCerts generates the PKI; nothing outlives the test.
func NewCerts(t testing.TB) *Certs {
	t.Helper()
	now := time.Now()
	c := &Certs{
		Dir:              t.TempDir(),
		serverNames:      []string{"localhost"},
		serverIPs:        []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		notBeforeValid:   now.Add(-time.Hour),
		notAfterValid:    now.Add(24 * time.Hour),
		notBeforeExpired: now.Add(-48 * time.Hour),
		notAfterExpire:   now.Add(-24 * time.Hour),
	}
	c.ca, c.caKey = c.newCA(t, "redproxy test CA")
	c.CAFile = c.writeCert(t, "ca.crt", c.ca.Raw)
	c.other, c.otherKey = c.newCA(t, "some other CA")
	c.OtherCAFile = c.writeCert(t, "other-ca.crt", c.other.Raw)
	c.ServerCert, c.ServerKey = c.Issue(t, "server", false, c.notBeforeValid, c.notAfterValid)
	c.ClientCert, c.ClientKey = c.Issue(t, "client", true, c.notBeforeValid, c.notAfterValid)
	c.ExpiredCert, c.ExpiredKey = c.Issue(t, "expired", false, c.notBeforeExpired, c.notAfterExpire)
	c.OtherServerCert, c.OtherServerKey = c.issue(t, "other-server", false, c.notBeforeValid, c.notAfterValid, c.other, c.otherKey)
	return c
}

// Issue writes a new certificate signed by the CA, valid from notBefore to
// notAfter, as name.crt and name.key, and returns their paths. A server
// certificate names 127.0.0.1, ::1 and localhost; a client one is for
// client authentication only.
func (c *Certs) Issue(t testing.TB, name string, client bool, notBefore, notAfter time.Time) (certFile, keyFile string) {
	t.Helper()
	return c.issue(t, name, client, notBefore, notAfter, c.ca, c.caKey)
}

// IssueServer is Issue for a server certificate valid for a day.
func (c *Certs) IssueServer(t testing.TB, name string) (certFile, keyFile string) {
	t.Helper()
	return c.Issue(t, name, false, c.notBeforeValid, c.notAfterValid)
}

func (c *Certs) issue(t testing.TB, name string, client bool, notBefore, notAfter time.Time, ca *x509.Certificate, caKey *ecdsa.PrivateKey) (string, string) {
	t.Helper()
	key := newKey(t)
	c.serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(c.serial + 100),
		Subject:      pkix.Name{CommonName: "redproxy-test-" + name},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     c.serverNames,
		IPAddresses:  c.serverIPs,
	}
	if client {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
		tmpl.DNSNames, tmpl.IPAddresses = nil, nil
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatalf("redistest: issuing %s: %v", name, err)
	}
	return c.writeCert(t, name+".crt", der), c.writeKey(t, name+".key", key)
}

func (c *Certs) newCA(t testing.TB, cn string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key := newKey(t)
	c.serial++
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(c.serial),
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             c.notBeforeExpired.Add(-time.Hour),
		NotAfter:              c.notAfterValid.Add(time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("redistest: creating CA: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func (c *Certs) writeCert(t testing.TB, name string, der []byte) string {
	t.Helper()
	return c.write(t, name, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

func (c *Certs) writeKey(t testing.TB, name string, key *ecdsa.PrivateKey) string {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return c.write(t, name, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
}

func (c *Certs) write(t testing.TB, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(c.Dir, name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// ClientConfig is a TLS client configuration that trusts the CA and, with
// withCert, presents the client certificate.
func (c *Certs) ClientConfig(t testing.TB, withCert bool) *tls.Config {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(c.ca)
	cfg := &tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12}
	if withCert {
		cert, err := tls.LoadX509KeyPair(c.ClientCert, c.ClientKey)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg
}

// StartTLS starts redis-server with a TLS port (TLSAddr) beside its
// plaintext one (Addr, which the test may use to look behind the proxy's
// back). Redis presents certs' server certificate; authClients is
// redis-server's tls-auth-clients: "no", "yes" (client certificates signed
// by the CA required) or "optional".
func StartTLS(t testing.TB, certs *Certs, authClients string, extra ...string) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redistest: redis-server not found in PATH: %v", err)
	}
	s := &Server{bin: bin, dir: t.TempDir(), extra: extra, tlsArgs: certs.serverArgs(authClients, certs.CAFile)}
	if !s.start(t) {
		return nil
	}
	return s
}

// serverArgs are redis-server's arguments for a TLS port presenting the
// server certificate and trusting caFile.
func (c *Certs) serverArgs(authClients, caFile string) func(port int) []string {
	return func(port int) []string {
		return []string{
			"--tls-port", strconv.Itoa(port),
			"--tls-cert-file", c.ServerCert,
			"--tls-key-file", c.ServerKey,
			"--tls-ca-cert-file", caFile,
			"--tls-auth-clients", authClients,
		}
	}
}

// TLSPort is a StartTLS server's TLS port, 0 for a plaintext server.
func (s *Server) TLSPort() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tlsPort
}

// TLSAddr is the "127.0.0.1:PORT" of a StartTLS server's TLS port.
func (s *Server) TLSAddr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.tlsPort))
}
