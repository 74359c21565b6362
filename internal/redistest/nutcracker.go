package redistest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// NutcrackerPool is a twemproxy pool: its servers ("host:port:weight" or
// "host:port:weight name", as nutcracker.yml writes them) and how keys
// are spread over them.
type NutcrackerPool struct {
	Servers      []string
	Hash         string // e.g. fnv1a_64
	Distribution string // ketama or modula
	HashTag      string // "" or e.g. "{}"
}

// StartNutcracker runs twemproxy (Debian's nutcracker) with one Redis pool
// on a free loopback port and returns its address; t.Cleanup kills it.
// The tests that compare redproxy's key distribution with twemproxy's
// need the real thing: the ring's hash and continuum are only right if
// the keys land where nutcracker puts them.
func StartNutcracker(t testing.TB, pool NutcrackerPool) string {
	t.Helper()
	bin, err := exec.LookPath("nutcracker")
	if err != nil {
		if _, statErr := os.Stat("/usr/sbin/nutcracker"); statErr != nil {
			t.Fatalf("redistest: nutcracker not found (apt-get install nutcracker): %v", err)
		}
		bin = "/usr/sbin/nutcracker"
	}
	dir := t.TempDir()
	for attempt := 1; ; attempt++ {
		addr, log, ok := startNutcrackerOnce(t, bin, dir, pool)
		if ok {
			return addr
		}
		if attempt == startAttempts { // else a port taken meanwhile: another pair
			t.Fatalf("redistest: nutcracker exited:\n%s", log)
		}
	}
}

// startNutcrackerOnce starts nutcracker on a fresh pair of free ports; ok
// is false, with its log, if it exited before answering PING.
func startNutcrackerOnce(t testing.TB, bin, dir string, pool NutcrackerPool) (addr string, log []byte, ok bool) {
	t.Helper()
	port, stats := FreePort(t), FreePort(t)
	var b strings.Builder
	fmt.Fprintf(&b, "pool:\n  listen: 127.0.0.1:%d\n  redis: true\n  hash: %s\n  distribution: %s\n  auto_eject_hosts: false\n  preconnect: false\n", port, pool.Hash, pool.Distribution)
	if pool.HashTag != "" {
		fmt.Fprintf(&b, "  hash_tag: %q\n", pool.HashTag)
	}
	b.WriteString("  servers:\n")
	for _, s := range pool.Servers {
		fmt.Fprintf(&b, "   - %s\n", s)
	}
	conf := filepath.Join(dir, "nutcracker.yml")
	if err := os.WriteFile(conf, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	logf := filepath.Join(dir, "nutcracker.log")
	cmd := exec.Command(bin, "-c", conf, "-s", fmt.Sprint(stats), "-a", "127.0.0.1",
		"-p", filepath.Join(dir, "nutcracker.pid"), "-o", logf, "-v", "4")
	if err := cmd.Start(); err != nil {
		t.Fatalf("redistest: nutcracker: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	addr = fmt.Sprintf("127.0.0.1:%d", port)
	deadline := time.Now().Add(readyTimeout)
	for !ping(addr) {
		select {
		case <-exited:
			out, _ := os.ReadFile(logf)
			return "", append(tail(out), "\nconfig:\n"+b.String()...), false
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: nutcracker not answering PING on %s within %v", addr, readyTimeout)
		}
		time.Sleep(pollInterval)
	}
	return addr, nil, true
}

func tail(b []byte) []byte {
	if len(b) > logTail {
		return b[len(b)-logTail:]
	}
	return b
}
