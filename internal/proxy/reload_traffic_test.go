package proxy_test

// Reload while traffic flows: defects a review found (each test says what
// was found and why it matters), and stress tests that held up.

import (
	"strconv"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/redistest"
)

// Found: every reload, even one that changes nothing, stored the upstream
// TLS configuration again (Server.reloadTLS's apply) under reloadMu, while
// the replica poller read it without that lock whenever it found a
// replica (replicaSet.sync -> nodeOptions -> backendOptions), as did a
// session's first replica read with its own credential
// (replicaNode.backendFor) and the route and cluster replica pollers. A
// SIGHUP landing while a replica joins was a data race (run with -race):
// undefined behaviour in the process every client goes through.
func TestReloadDoesNotRaceReplicaDiscovery(t *testing.T) {
	g := startReplicated(t, 0)
	p := g.proxy(t, config.ReadReplicaPreferred, nil)
	stop, done := make(chan struct{}), make(chan int)
	go func() {
		reloads := 0
		defer func() { done <- reloads }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			next := *p.Config()
			if _, err := p.Reload(&next); err != nil {
				t.Error(err)
				return
			}
			reloads++
			time.Sleep(100 * time.Microsecond)
		}
	}()
	// A replica joins while reloads run.
	g.replicas = append(g.replicas, redistest.Start(t, "--replicaof", "127.0.0.1", strconv.Itoa(g.primary.Port())))
	redistest.Eventually(t, 20*time.Second, func() bool { return p.UsableReplicas() == 1 }, "the proxy never found the replica")
	close(stop)
	t.Logf("%d reloads while the replica joined", <-done)
}
