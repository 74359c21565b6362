package main

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/redistest"
)

// TestTLSBinary runs the binary TLS-only on both sides (server.listen = "",
// a Redis that requires client certificates): go-redis and redis-cli reach
// Redis through it; main's own connections to Redis (command table,
// version) use [upstream.tls] too; insecure_skip_verify is logged loudly;
// a certificate rotated in place is served after POST /reload and after
// SIGHUP, while a connection from before keeps working.
func TestTLSBinary(t *testing.T) {
	certs := redistest.NewCerts(t)
	rs := redistest.StartTLS(t, certs, "yes")
	bin := binary(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
	install := func(cert, key string) {
		t.Helper()
		for from, to := range map[string]string{cert: certFile, key: keyFile} {
			data, err := os.ReadFile(from)
			check(t, err)
			check(t, os.WriteFile(to, data, 0o600))
		}
	}
	install(certs.ServerCert, certs.ServerKey)
	tlsListen := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	adminAddr := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	conf := fmt.Sprintf(`[server]
listen = ""
admin = %q

[server.tls]
listen = %q
cert_file = %q
key_file = %q
client_ca_file = %q

[upstream]
address = %q

[upstream.tls]
ca_file = %q
cert_file = %q
key_file = %q
insecure_skip_verify = true
`, adminAddr, tlsListen, certFile, keyFile, certs.CAFile, rs.TLSAddr(), certs.CAFile, certs.ClientCert, certs.ClientKey)
	path := filepath.Join(dir, "redproxy.toml")
	check(t, os.WriteFile(path, []byte(conf), 0o600))

	logs := &redistest.LogBuffer{}
	cmd := exec.Command(bin, "--config", path)
	cmd.Stderr = logs
	check(t, cmd.Start())
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	c := redis.NewClient(&redis.Options{Addr: tlsListen, TLSConfig: certs.ClientConfig(t, true), MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	redistest.Eventually(t, 10*time.Second, func() bool { return c.Ping(ctx).Err() == nil }, "proxy never answered over TLS; log:\n%s", logs)
	check(t, c.Set(ctx, "bin:k", "v", 0).Err())
	if v := rs.Client(t).Get(ctx, "bin:k").Val(); v != "v" {
		t.Fatalf("Redis has %q", v)
	}
	for _, want := range []string{"INSECURE: upstream.tls.insecure_skip_verify is set", "redproxy listening for TLS clients"} {
		if !strings.Contains(logs.String(), want) {
			t.Fatalf("log lacks %q:\n%s", want, logs.String())
		}
	}
	if strings.Contains(logs.String(), "using the built-in command table") {
		t.Fatalf("main could not read Redis's command table over TLS:\n%s", logs.String())
	}

	host, port, _ := strings.Cut(tlsListen, ":")
	out, err := exec.Command("redis-cli", "-h", host, "-p", port, "--tls", "--cacert", certs.CAFile,
		"--cert", certs.ClientCert, "--key", certs.ClientKey, "GET", "bin:k").CombinedOutput()
	if strings.TrimSpace(string(out)) != "v" {
		t.Fatalf("redis-cli --tls through the proxy: %q, %v", out, err)
	}

	served := func() string {
		t.Helper()
		nc, err := tls.Dial("tcp", tlsListen, certs.ClientConfig(t, true))
		check(t, err)
		defer nc.Close()
		return nc.ConnectionState().PeerCertificates[0].Subject.CommonName
	}
	old, err := tls.Dial("tcp", tlsListen, certs.ClientConfig(t, true))
	check(t, err)
	defer old.Close()
	oldRd := bufio.NewReader(old)
	ping := func() {
		t.Helper()
		old.SetDeadline(time.Now().Add(5 * time.Second))
		old.Write([]byte("PING\r\n"))
		if line, err := oldRd.ReadString('\n'); line != "+PONG\r\n" {
			t.Fatalf("connection from before the rotation: %q, %v", line, err)
		}
	}
	ping()

	install(certs.IssueServer(t, "rotated-by-post"))
	code, body := postReload(t, adminAddr, "/reload")
	if code != http.StatusOK || !strings.Contains(body, `changed:
the certificate of listener "tls"`) {
		t.Fatalf("POST /reload = %d %q", code, body)
	}
	// Again with the same files: nothing changed, and the reply says the
	// files were read.
	if code, body := postReload(t, adminAddr, "/reload"); code != http.StatusOK || !strings.Contains(body, "certificate files were read again") {
		t.Fatalf("POST /reload of the same files = %d %q", code, body)
	}
	if cn := served(); cn != "redproxy-test-rotated-by-post" {
		t.Fatalf("after POST /reload the proxy serves %q", cn)
	}
	ping()

	install(certs.IssueServer(t, "rotated-by-hup"))
	check(t, cmd.Process.Signal(syscall.SIGHUP))
	redistest.Eventually(t, 5*time.Second, func() bool { return served() == "redproxy-test-rotated-by-hup" },
		"SIGHUP did not rotate the certificate; log:\n%s", logs.String())
	ping()
	// The SIGHUP's line names the rotation (a probe: changed=nothing).
	redistest.Eventually(t, 5*time.Second, func() bool {
		return strings.Contains(logs.String(), `via=SIGHUP changed="the certificate of listener \"tls\" (the files it names)"`)
	}, "the SIGHUP's reload line does not name the certificate; log:\n%s", logs.String())
}
