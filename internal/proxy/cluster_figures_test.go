package proxy_test

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// processCPU is the CPU time (user+system) this process has used.
func processCPU(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestClusterFigures measures the proxy's CPU per request in front of a
// 3-primary cluster with redis-benchmark, next to redis-benchmark's own
// cluster mode straight to the nodes. It is a measurement, not a check,
// and runs only with REDPROXY_CLUSTER_FIGURES=1.
func TestClusterFigures(t *testing.T) {
	if os.Getenv("REDPROXY_CLUSTER_FIGURES") == "" {
		t.Skip("set REDPROXY_CLUSTER_FIGURES=1 to measure")
	}
	c := redistest.StartCluster(t, 3, 0)
	p := proxytest.Start(t, c.Nodes[0], func(cfg *config.Config) {
		cfg.Upstream.Mode = config.ModeCluster
		cfg.Upstream.Seeds = c.Seeds()
	})
	_, port, _ := strings.Cut(p.Addr, ":")
	alone := proxytest.Start(t, nil, nil)
	_, alonePort, _ := strings.Cut(alone.Addr, ":")
	const n = 100000
	for _, pipeline := range []string{"1", "16"} {
		standalone := []string{"-h", "127.0.0.1", "-p", alonePort, "-t", "set,get", "-n", strconv.Itoa(n), "-c", "20", "-P", pipeline, "-r", "100000", "-q"}
		before := processCPU(t)
		out, err := exec.Command("redis-benchmark", standalone...).CombinedOutput()
		used := processCPU(t) - before
		if err != nil {
			t.Fatalf("redis-benchmark: %v\n%s", err, out)
		}
		t.Logf("through redproxy in front of one standalone Redis, -P %s: %s; proxy CPU %.1f µs/request", pipeline, oneLine(out), float64(used.Microseconds())/float64(2*n))
		args := []string{"-p", port, "-t", "set,get", "-n", strconv.Itoa(n), "-c", "20", "-P", pipeline, "-r", "100000", "-q"}
		before = processCPU(t)
		out, err = exec.Command("redis-benchmark", append([]string{"-h", "127.0.0.1"}, args...)...).CombinedOutput()
		used = processCPU(t) - before
		if err != nil {
			t.Fatalf("redis-benchmark: %v\n%s", err, out)
		}
		t.Logf("through redproxy, -P %s: %s; proxy CPU %.1f µs/request", pipeline, oneLine(out), float64(used.Microseconds())/float64(2*n))
		direct := []string{"-h", "127.0.0.1", "-p", strconv.Itoa(c.Nodes[0].Port()), "--cluster", "-t", "set,get", "-n", strconv.Itoa(n), "-c", "20", "-P", pipeline, "-r", "100000", "-q"}
		out, err = exec.Command("redis-benchmark", direct...).CombinedOutput()
		if err != nil {
			t.Fatalf("redis-benchmark --cluster: %v\n%s", err, out)
		}
		t.Logf("redis-benchmark --cluster direct, -P %s: %s", pipeline, oneLine(out))
	}
}

func oneLine(b []byte) string {
	var parts []string
	for _, l := range strings.Split(string(b), "\n") {
		if i := strings.LastIndex(l, "\r"); i >= 0 {
			l = l[i+1:]
		}
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "Cluster") && !strings.HasPrefix(l, "Master") {
			parts = append(parts, l)
		}
	}
	return strings.Join(parts, " | ")
}
