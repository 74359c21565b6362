package proxy_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// TestSentinelFollowsAReloadedUpstreamTLS: a Sentinel group reached over
// TLS moves its servers to certificates of a new CA, and the operator adds
// that CA to [upstream.tls]'s file and reloads. The reload was taken, but
// only the data path read the file again: the Sentinel side (its role
// checks of the primary and of failover candidates) kept the files read at
// start, so it soon found no primary it could verify, /readyz went 503,
// and the next failover was never followed: writes went on to the demoted
// primary, then every command failed until a restart (found by a probe).
func TestSentinelFollowsAReloadedUpstreamTLS(t *testing.T) {
	certs := redistest.NewCerts(t)
	dir := t.TempDir()
	readCA := func(f string) []byte {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	// The servers trust both CAs from the start, so that replication and
	// the Sentinels' checks survive the rotation.
	both := append(readCA(certs.CAFile), readCA(certs.OtherCAFile)...)
	bundle := filepath.Join(dir, "both.crt")
	if err := os.WriteFile(bundle, both, 0o600); err != nil {
		t.Fatal(err)
	}
	g := redistest.StartSentinelGroup(t, redistest.SentinelOptions{Replicas: 1, TLS: certs, TLSCAFile: bundle})
	sentinels := make([]string, len(g.Sentinels))
	for i, s := range g.Sentinels {
		sentinels[i] = s.TLSAddr()
	}
	proxyCA := filepath.Join(dir, "proxy-ca.crt")
	if err := os.WriteFile(proxyCA, readCA(certs.CAFile), 0o600); err != nil {
		t.Fatal(err)
	}
	old := g.Nodes[0]
	p := proxytest.Start(t, old, func(c *config.Config) {
		sentinelConfig(g, sentinels)(c)
		c.Upstream.TLS = &config.UpstreamTLS{CAFile: proxyCA, ServerName: "localhost"}
	})
	if got := p.SentinelPrimary(); got != old.TLSAddr() {
		t.Fatalf("primary at start = %q, want %s", got, old.TLSAddr())
	}
	rc := p.Client(t)
	if err := rc.Set(ctx, "before", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}

	// The data servers present certificates of the other CA; the proxy's
	// file gets that CA beside the old one (the Sentinels' certificates
	// are still the old CA's), and the proxy reloads.
	for _, n := range g.Nodes {
		// Both in one CONFIG SET: the pair must match at every moment.
		if err := n.Client(t).Do(ctx, "CONFIG", "SET", "tls-cert-file", certs.OtherServerCert, "tls-key-file", certs.OtherServerKey).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// The new CA alone verifies the data servers but not the Sentinels:
	// refused, as the proxy could not follow a failover with it.
	if err := os.WriteFile(proxyCA, readCA(certs.OtherCAFile), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Reload(reloaded(t, p, func(*config.Config) {})); err == nil || !strings.Contains(err.Error(), "Sentinel") {
		t.Fatalf("reload with a CA file that verifies no Sentinel: %v, want it refused", err)
	}
	if err := os.WriteFile(proxyCA, both, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Reload(reloaded(t, p, func(*config.Config) {})); err != nil {
		t.Fatalf("reload with the new CA: %v", err)
	}

	g.Failover(t)
	next := g.WaitNewPrimary(t, old, 30*time.Second)
	var has string
	redistest.Eventually(t, 20*time.Second, func() bool {
		has = p.SentinelPrimary()
		return has == next.TLSAddr() && rc.Set(ctx, "after", "2", 0).Err() == nil
	}, "the proxy did not follow the failover to %s after the reload (it has %q)", next.TLSAddr(), lazyString{&has})
	if v, err := next.Client(t).Get(ctx, "after").Result(); err != nil || v != "2" {
		t.Fatalf("the write after the failover on the new primary: %q, %v", v, err)
	}
	redistest.Eventually(t, 10*time.Second, p.Ready, "the proxy is not ready on the new primary")
}
