package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/redproxy/redproxy/internal/redistest"
)

// TestTLSErrors: every way the TLS sections can be wrong is reported with
// the key and the line, and the message says what is wrong with the file.
func TestTLSErrors(t *testing.T) {
	certs := redistest.NewCerts(t)
	garbage := filepath.Join(t.TempDir(), "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not PEM\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "missing.crt")
	r := strings.NewReplacer("CERT", certs.ServerCert, "KEY", certs.ServerKey, "CA", certs.CAFile, "GARBAGE", garbage, "MISSING", missing)
	tests := []struct {
		name string
		doc  string
		want []wantErr
	}{
		{"listener without certificate", "[server.tls]\nlisten = \"127.0.0.1:6390\"\nkey_file = \"KEY\"\n",
			[]wantErr{{1, "server.tls.cert_file", "is required when server.tls.listen is set"}}},
		{"missing certificate file", "[server.tls]\nlisten = \"127.0.0.1:6390\"\ncert_file = \"MISSING\"\nkey_file = \"KEY\"\n",
			[]wantErr{{3, "server.tls.cert_file", "cannot open \"" + missing + "\": no such file or directory"}}},
		{"certificate that does not parse", "[server.tls]\nlisten = \"127.0.0.1:6390\"\ncert_file = \"GARBAGE\"\nkey_file = \"KEY\"\n",
			[]wantErr{{3, "server.tls.cert_file", "cannot load the certificate \"" + garbage + "\""}}},
		{"key that does not match", "[server.tls]\nlisten = \"127.0.0.1:6390\"\ncert_file = \"CERT\"\nkey_file = \"" + certs.ClientKey + "\"\n",
			[]wantErr{{3, "server.tls.cert_file", "private key does not match public key"}}},
		{"client CA without certificates", "[server.tls]\nlisten = \"127.0.0.1:6390\"\ncert_file = \"CERT\"\nkey_file = \"KEY\"\nclient_ca_file = \"GARBAGE\"\n",
			[]wantErr{{5, "server.tls.client_ca_file", "holds no PEM certificate"}}},
		{"old TLS version", "[server.tls]\nmin_version = \"1.1\"\n",
			[]wantErr{{2, "server.tls.min_version", `invalid version "1.1" (use "1.2" or "1.3"`}}},
		{"certificate without listener", "[server.tls]\ncert_file = \"CERT\"\n",
			[]wantErr{{2, "server.tls.cert_file", "is set but server.tls.listen is empty"}}},
		{"no listener at all", "[server]\nlisten = \"\"\n",
			[]wantErr{{2, "server.listen", "is empty and neither server.tls.listen nor [[server.listeners]] is set"}}},
		{"same port twice", "[server]\nlisten = \"127.0.0.1:7000\"\n[server.tls]\nlisten = \"127.0.0.1:7000\"\ncert_file = \"CERT\"\nkey_file = \"KEY\"\n",
			[]wantErr{{4, "server.tls.listen", "must differ from server.listen"}}},
		{"upstream CA missing", "[upstream.tls]\nca_file = \"MISSING\"\n",
			[]wantErr{{2, "upstream.tls.ca_file", "no such file or directory"}}},
		{"upstream CA garbage", "[upstream.tls]\nca_file = \"GARBAGE\"\n",
			[]wantErr{{2, "upstream.tls.ca_file", "holds no PEM certificate"}}},
		{"upstream key without certificate", "[upstream.tls]\nkey_file = \"KEY\"\n",
			[]wantErr{{1, "upstream.tls.cert_file", "is required when upstream.tls.key_file is set"}}},
		{"upstream TLS to the embedded store", "[upstream]\naddress = \"embedded\"\n[upstream.tls]\n",
			[]wantErr{{3, "upstream.tls", "the embedded store speaks no TLS"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte(r.Replace(tt.doc)), "config.toml")
			if err == nil {
				t.Fatalf("Parse succeeded: %+v", c)
			}
			got := configErrors(t, err)
			if len(got) != len(tt.want) {
				t.Fatalf("got %d errors, want %d:\n%v", len(got), len(tt.want), err)
			}
			for i, w := range tt.want {
				g := got[i]
				if g.Line != w.line || g.Key != w.key || !strings.Contains(g.Msg, w.msg) {
					t.Errorf("error %d = {%d %q %q}, want {%d %q containing %q}", i, g.Line, g.Key, g.Msg, w.line, w.key, w.msg)
				}
			}
		})
	}
}

// TestTLSSections: valid sections parse into what the proxy dials and
// listens with; an empty [upstream.tls] turns TLS on with the system's
// roots; [upstream.tls] changes are reported by Changed.
func TestTLSSections(t *testing.T) {
	certs := redistest.NewCerts(t)
	doc := "[server]\nlisten = \"\"\n[server.tls]\nlisten = \"127.0.0.1:6390\"\ncert_file = \"" + certs.ServerCert +
		"\"\nkey_file = \"" + certs.ServerKey + "\"\nclient_ca_file = \"" + certs.CAFile + "\"\nmin_version = \"1.3\"\n[upstream]\naddress = \"redis.internal:6390\"\n[upstream.tls]\n"
	c, err := Parse([]byte(doc), "tls.toml")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := c.Server.TLS.ServerConfig()
	if err != nil {
		t.Fatal(err)
	}
	if srv.MinVersion != 0x0304 || srv.ClientCAs == nil || srv.ClientAuth.String() != "RequireAndVerifyClientCert" || len(srv.Certificates) != 1 {
		t.Fatalf("server TLS = min %x, client auth %v, %d certificates", srv.MinVersion, srv.ClientAuth, len(srv.Certificates))
	}
	up, err := c.Upstream.ClientTLS()
	if err != nil || up == nil {
		t.Fatalf("empty [upstream.tls]: %v, %v", up, err)
	}
	if up.RootCAs != nil || up.InsecureSkipVerify || up.MinVersion != 0x0303 {
		t.Fatalf("empty [upstream.tls] = %+v; want the system roots, verified, TLS 1.2+", up)
	}
	if off, _ := Default().Upstream.ClientTLS(); off != nil {
		t.Fatal("no [upstream.tls] must mean no TLS")
	}
	d, err := Parse([]byte(doc+"server_name = \"redis.example\"\n"), "tls.toml")
	if err != nil {
		t.Fatal(err)
	}
	if got := Changed(c, d); len(got) != 1 || got[0] != "upstream.tls" {
		t.Fatalf("Changed = %v, want [upstream.tls]", got)
	}
	// What `redproxy check` prints keeps both sections.
	out, err := d.Effective()
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse(out, "effective.toml")
	if err != nil {
		t.Fatalf("effective output does not parse: %v\n%s", err, out)
	}
	if got := Changed(d, back); len(got) != 0 {
		t.Fatalf("effective round trip changed %v:\n%s", got, out)
	}
	if why := RestartOnly("server.tls.listen"); why == "" {
		t.Fatal("server.tls.listen must need a restart")
	}
	if why := RestartOnly("server.tls.cert_file"); why != "" {
		t.Fatalf("server.tls.cert_file must reload, got %q", why)
	}
}
