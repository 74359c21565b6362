package config

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/redproxy/redproxy/internal/config/units"
)

// ServerTLS configures the TLS listener clients may connect to
// ([server.tls]). It is on when Listen is set; the plaintext server.listen
// keeps running beside it unless that is set to "", so clients can move
// over one at a time.
type ServerTLS struct {
	Listen   string `toml:"listen"`
	CertFile string `toml:"cert_file"`
	KeyFile  string `toml:"key_file"`
	// ClientCAFile, when set, makes the listener require a client
	// certificate signed by one of its CAs (mutual TLS).
	ClientCAFile string `toml:"client_ca_file"`
	MinVersion   string `toml:"min_version"` // "1.2" or "1.3"
	// HandshakeTimeout bounds a client's TLS handshake on every TLS
	// listener: a client that connects and never completes one is closed
	// after it. 0 is DefaultHandshakeTimeout.
	HandshakeTimeout units.Duration `toml:"handshake_timeout"`
}

// DefaultHandshakeTimeout is server.tls.handshake_timeout's default.
const DefaultHandshakeTimeout = 10 * time.Second

// Handshake returns the handshake timeout in force.
func (t ServerTLS) Handshake() time.Duration {
	if t.HandshakeTimeout.Duration <= 0 {
		return DefaultHandshakeTimeout
	}
	return t.HandshakeTimeout.Duration
}

// Enabled reports whether the TLS listener is configured.
func (t ServerTLS) Enabled() bool { return t.Listen != "" }

// UpstreamTLS configures TLS on every connection to Redis ([upstream.tls]).
// The section's presence turns it on; an empty section verifies Redis
// against the system's roots with the upstream host as server name.
type UpstreamTLS struct {
	CAFile     string `toml:"ca_file"`
	ServerName string `toml:"server_name"`
	// CertFile and KeyFile are the proxy's client certificate, for a Redis
	// started with tls-auth-clients yes.
	CertFile string `toml:"cert_file"`
	KeyFile  string `toml:"key_file"`
	// InsecureSkipVerify accepts any certificate Redis presents. It exists
	// for tests and emergencies; the proxy logs a warning at start and on
	// every reload while it is set.
	InsecureSkipVerify bool `toml:"insecure_skip_verify"`
}

var tlsVersions = map[string]uint16{"1.2": tls.VersionTLS12, "1.3": tls.VersionTLS13}

// ServerConfig reads the certificate, key and client CAs from their files
// and returns the listener's TLS configuration. It reads the files on every
// call, which is how a reload picks up rotated certificates. Errors are
// *Error values naming the key whose file is at fault.
func (t ServerTLS) ServerConfig() (*tls.Config, error) { return t.serverConfig(false) }

// serverConfig is ServerConfig; shared says a [[server.listeners]] entry
// uses the files even if server.tls.listen is off.
func (t ServerTLS) serverConfig(shared bool) (*tls.Config, error) {
	if errs := t.check(shared); len(errs) > 0 {
		return nil, join(errs)
	}
	cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return nil, &Error{Key: "server.tls.cert_file", Msg: fmt.Sprintf("cannot load the certificate %q with key %q: %v", t.CertFile, t.KeyFile, err)}
	}
	c := &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   tlsVersions[t.MinVersion],
	}
	if t.ClientCAFile != "" {
		pool, err := loadCAs(t.ClientCAFile)
		if err != nil {
			return nil, &Error{Key: "server.tls.client_ca_file", Msg: err.Error()}
		}
		c.ClientCAs = pool
		c.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return c, nil
}

// check finds what can be wrong without reading a certificate.
func (t ServerTLS) check(shared bool) []*Error {
	var errs []*Error
	bad := func(key, format string, args ...any) {
		errs = append(errs, &Error{Key: "server.tls." + key, Msg: fmt.Sprintf(format, args...)})
	}
	if t.HandshakeTimeout.Duration < 0 {
		bad("handshake_timeout", "must be > 0 (or 0 for the default, %v), got %v", DefaultHandshakeTimeout, t.HandshakeTimeout)
	}
	if _, ok := tlsVersions[t.MinVersion]; !ok {
		bad("min_version", "invalid version %q (use \"1.2\" or \"1.3\"; older versions are not offered)", t.MinVersion)
	}
	if !t.Enabled() && !shared {
		for _, f := range []struct{ key, path string }{{"cert_file", t.CertFile}, {"key_file", t.KeyFile}, {"client_ca_file", t.ClientCAFile}} {
			if f.path != "" {
				bad(f.key, "is set but server.tls.listen is empty and no [[server.listeners]] entry with tls = true uses it (set listen to turn the TLS listener on)")
			}
		}
		return errs
	}
	if t.Enabled() {
		if err := checkHostPort(t.Listen, false); err != nil {
			bad("listen", "%v", err)
		}
	}
	for _, f := range []struct{ key, path string }{{"cert_file", t.CertFile}, {"key_file", t.KeyFile}} {
		if f.path == "" {
			bad(f.key, "is required when server.tls.listen is set")
		} else if err := readable(f.path); err != nil {
			bad(f.key, "%v", err)
		}
	}
	if t.ClientCAFile != "" {
		if err := readable(t.ClientCAFile); err != nil {
			bad("client_ca_file", "%v", err)
		}
	}
	return errs
}

// ClientTLS returns the TLS configuration for connections to Redis, read
// from the files [upstream.tls] names, or nil when the section is absent.
// Like ServerConfig, it reads the files on every call.
func (u Upstream) ClientTLS() (*tls.Config, error) {
	t := u.TLS
	if t == nil {
		return nil, nil
	}
	if errs := t.check(); len(errs) > 0 {
		return nil, join(errs)
	}
	c := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         t.ServerName,
		InsecureSkipVerify: t.InsecureSkipVerify,
		// Reconnects and dedicated connections resume a session instead of
		// paying a full handshake each.
		ClientSessionCache: tls.NewLRUClientSessionCache(64),
	}
	if t.CAFile != "" {
		pool, err := loadCAs(t.CAFile)
		if err != nil {
			return nil, &Error{Key: "upstream.tls.ca_file", Msg: err.Error()}
		}
		c.RootCAs = pool
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, &Error{Key: "upstream.tls.cert_file", Msg: fmt.Sprintf("cannot load the certificate %q with key %q: %v", t.CertFile, t.KeyFile, err)}
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

func (t *UpstreamTLS) check() []*Error {
	var errs []*Error
	bad := func(key, format string, args ...any) {
		errs = append(errs, &Error{Key: "upstream.tls." + key, Msg: fmt.Sprintf(format, args...)})
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		if t.CertFile == "" {
			bad("cert_file", "is required when upstream.tls.key_file is set")
		} else {
			bad("key_file", "is required when upstream.tls.cert_file is set")
		}
	}
	for _, f := range []struct{ key, path string }{{"ca_file", t.CAFile}, {"cert_file", t.CertFile}, {"key_file", t.KeyFile}} {
		if f.path != "" {
			if err := readable(f.path); err != nil {
				bad(f.key, "%v", err)
			}
		}
	}
	return errs
}

// checkTLS validates both TLS sections, loading their files so that a
// certificate that does not parse is reported by `redproxy check` and at
// start rather than at the first handshake.
func (c *Config) checkTLS() []*Error {
	var errs []*Error
	add := func(err error) {
		if err == nil {
			return
		}
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				errs = append(errs, e.(*Error))
			}
			return
		}
		errs = append(errs, err.(*Error))
	}
	st := c.Server.TLS
	// (A listener that inherits files [server.tls] does not set is
	// checkListeners' error.)
	if shared := c.inheritsTLSFiles() && (st.CertFile != "" || st.KeyFile != ""); st.Enabled() || shared {
		_, err := st.serverConfig(shared)
		add(err)
		if st.Enabled() && st.Listen == c.Server.Listen && !strings.HasSuffix(c.Server.Listen, ":0") {
			errs = append(errs, &Error{Key: "server.tls.listen", Msg: "must differ from server.listen (one port cannot serve both plaintext and TLS)"})
		}
	} else {
		add(join(st.check(false)))
	}
	if c.Upstream.TLS != nil {
		if c.Upstream.Address == EmbeddedAddress {
			errs = append(errs, &Error{Key: "upstream.tls", Msg: "the embedded store speaks no TLS; remove [upstream.tls] or set upstream.address to a Redis"})
		} else {
			_, err := c.Upstream.ClientTLS()
			add(err)
		}
	}
	return errs
}

// readable checks that path names a regular file the proxy can open,
// which gives a clearer message than a failed certificate parse.
func readable(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("cannot open %q: %v", path, unwrapPath(err))
	}
	defer f.Close()
	st, err := f.Stat()
	switch {
	case err != nil:
		return fmt.Errorf("cannot stat %q: %v", path, unwrapPath(err))
	case st.IsDir():
		return fmt.Errorf("%q is a directory, not a file", path)
	case !st.Mode().IsRegular():
		// A device or a pipe (/dev/zero, /dev/stdin) could be read forever.
		return fmt.Errorf("%q is not a regular file", path)
	case st.Size() > maxPEMFile:
		return fmt.Errorf("%q is %d bytes; a certificate, key or CA file of more than %d is refused", path, st.Size(), maxPEMFile)
	}
	return nil
}

// maxPEMFile caps what a certificate, key or CA file may hold: a bundle of
// a few hundred CAs is well under it.
const maxPEMFile = 4 << 20

func unwrapPath(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	return err
}

// loadCAs reads a PEM bundle of CA certificates.
func loadCAs(path string) (*x509.CertPool, error) {
	if err := readable(path); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read %q: %v", path, unwrapPath(err))
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("%q holds no PEM certificate", path)
	}
	return pool, nil
}

// CertificateExpiry returns when the first certificate of c expires, for
// logs; zero if it cannot be parsed.
func CertificateExpiry(c *tls.Config) time.Time {
	if c == nil || len(c.Certificates) == 0 {
		return time.Time{}
	}
	leaf := c.Certificates[0].Leaf
	if leaf == nil {
		var err error
		if leaf, err = x509.ParseCertificate(c.Certificates[0].Certificate[0]); err != nil {
			return time.Time{}
		}
	}
	return leaf.NotAfter
}
