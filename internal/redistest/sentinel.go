package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelOptions shape a Sentinel group. Zero values pick settings that
// make a failover take a few seconds, so a suite of failover tests stays
// short.
type SentinelOptions struct {
	Name      string // the primary's name as the Sentinels monitor it; "mymaster" if empty
	Replicas  int    // 2 if 0
	Sentinels int    // 3 if 0; the quorum is a majority of them
	// DownAfter is Sentinel's down-after-milliseconds: how long the primary
	// must be silent before a Sentinel thinks it down (1s if 0).
	DownAfter time.Duration
	// FailoverTimeout is Sentinel's failover-timeout (3s if 0); it also
	// spaces out two failovers of the same primary (twice this).
	FailoverTimeout time.Duration
	// ReplicaArgs are extra redis-server arguments for the replicas (a
	// rename-command, so that a failover lands on a server whose command
	// table differs from the primary's).
	ReplicaArgs []string
	// TLS, if set, runs the group on TLS as well: every data server and
	// Sentinel also listens on a TLS port presenting TLS's server
	// certificate, and with tls-replication the Sentinels monitor, and
	// name, the data servers by their TLS addresses, as in a group
	// reached only through TLS (Node finds a server by either address).
	// TLSCAFile is the CA file the servers trust (replication, the
	// Sentinels' checks); TLS.CAFile if empty.
	TLS       *Certs
	TLSCAFile string
}

// SentinelGroup is a primary, its replicas and the Sentinels monitoring it,
// all real processes on free loopback ports, killed by t.Cleanup. After a
// failover the roles move: Nodes keeps every data server, and Primary asks
// the Sentinels which one is the primary now.
type SentinelGroup struct {
	Name      string
	Nodes     []*Server // Nodes[0] was the primary at start
	Sentinels []*Server
	quorum    int
	// failoverAsked is set by Failover: WaitNewPrimary may then ask again
	// for a failover the Sentinels gave up (see there).
	failoverAsked bool
}

// StartSentinelGroup starts the primary, the replicas (synced), then the
// Sentinels, and returns once every Sentinel sees every replica and every
// other Sentinel, so a failover can be authorized from the first moment.
func StartSentinelGroup(t testing.TB, o SentinelOptions) *SentinelGroup {
	t.Helper()
	o.defaults()
	g := &SentinelGroup{Name: o.Name, quorum: o.Sentinels/2 + 1}
	startNode := func(extra ...string) *Server {
		if o.TLS == nil {
			return Start(t, extra...)
		}
		return StartTLS(t, o.TLS, "no", append([]string{"--tls-replication", "yes", "--tls-ca-cert-file", o.tlsCA()}, extra...)...)
	}
	primary := startNode()
	g.Nodes = append(g.Nodes, primary)
	for range o.Replicas {
		r := startNode(append([]string{"--replicaof", "127.0.0.1", strconv.Itoa(o.monitoredPort(primary))}, o.ReplicaArgs...)...)
		g.Nodes = append(g.Nodes, r)
	}
	ctx := context.Background()
	pc := primary.Client(t)
	Eventually(t, 20*time.Second, func() bool {
		info, err := pc.Info(ctx, "replication").Result()
		return err == nil && strings.Count(info, "state=online") == o.Replicas
	}, "%d replicas never came online on %s", o.Replicas, primary.Addr())

	for range o.Sentinels {
		g.Sentinels = append(g.Sentinels, StartSentinel(t, o, o.monitoredPort(primary), g.quorum))
	}
	for _, s := range g.Sentinels {
		sc := s.sentinelClient(t)
		Eventually(t, 30*time.Second, func() bool {
			m, err := sc.Master(ctx, o.Name).Result()
			return err == nil && m["num-slaves"] == strconv.Itoa(o.Replicas) &&
				m["num-other-sentinels"] == strconv.Itoa(o.Sentinels-1)
		}, "sentinel %s never saw %d replicas and %d other sentinels", s.Addr(), o.Replicas, o.Sentinels-1)
	}
	return g
}

// StartSentinel starts one Sentinel (redis-server --sentinel with a
// generated config file) monitoring the primary at 127.0.0.1:primaryPort
// as o.Name with the given quorum; o's zero fields are defaulted as in
// StartSentinelGroup. The primary need not be up.
func StartSentinel(t testing.TB, o SentinelOptions, primaryPort, quorum int) *Server {
	t.Helper()
	o.defaults()
	conf := filepath.Join(t.TempDir(), "sentinel.conf")
	text := fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d %d\n"+
		"sentinel down-after-milliseconds %s %d\n"+
		"sentinel failover-timeout %s %d\n"+
		"sentinel parallel-syncs %s %d\n",
		o.Name, primaryPort, quorum,
		o.Name, o.DownAfter.Milliseconds(),
		o.Name, o.FailoverTimeout.Milliseconds(),
		o.Name, o.Replicas)
	if o.TLS != nil {
		text += "tls-replication yes\n"
	}
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if o.TLS == nil {
		return start(t, conf, []string{"--sentinel"})
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redistest: redis-server not found in PATH: %v", err)
	}
	s := &Server{bin: bin, dir: t.TempDir(), conf: conf, extra: []string{"--sentinel"}, tlsArgs: o.TLS.serverArgs("no", o.tlsCA())}
	if !s.start(t) {
		return nil
	}
	return s
}

// monitoredPort is the port the Sentinels and replicas reach n on: its
// TLS port in a TLS group.
func (o *SentinelOptions) monitoredPort(n *Server) int {
	if o.TLS != nil {
		return n.TLSPort()
	}
	return n.Port()
}

func (o *SentinelOptions) tlsCA() string {
	if o.TLSCAFile != "" {
		return o.TLSCAFile
	}
	return o.TLS.CAFile
}

func (o *SentinelOptions) defaults() {
	if o.Name == "" {
		o.Name = "mymaster"
	}
	if o.Replicas == 0 {
		o.Replicas = 2
	}
	if o.Sentinels == 0 {
		o.Sentinels = 3
	}
	if o.DownAfter == 0 {
		o.DownAfter = time.Second
	}
	if o.FailoverTimeout == 0 {
		o.FailoverTimeout = 3 * time.Second
	}
}

func (s *Server) sentinelClient(t testing.TB) *redis.SentinelClient {
	c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: 2 * time.Second})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// SentinelAddrs are the Sentinels' addresses, in start order.
func (g *SentinelGroup) SentinelAddrs() []string {
	addrs := make([]string, len(g.Sentinels))
	for i, s := range g.Sentinels {
		addrs[i] = s.Addr()
	}
	return addrs
}

// Node returns the data server listening on addr, or nil.
func (g *SentinelGroup) Node(addr string) *Server {
	for _, n := range g.Nodes {
		if n.Addr() == addr || n.TLSPort() != 0 && n.TLSAddr() == addr {
			return n
		}
	}
	return nil
}

// Primary returns the server a majority of the live Sentinels name as the
// primary and which says so itself (ROLE), or nil if there is none right
// now (during a failover).
func (g *SentinelGroup) Primary(t testing.TB) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	votes := map[string]int{}
	for _, s := range g.Sentinels {
		if s.Port() == 0 || !s.running() {
			continue
		}
		sc := redis.NewSentinelClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
		a, err := sc.GetMasterAddrByName(ctx, g.Name).Result()
		_ = sc.Close()
		if err == nil && len(a) == 2 {
			votes[net.JoinHostPort(a[0], a[1])]++
		}
	}
	for addr, n := range votes {
		if n < g.quorum {
			continue
		}
		node := g.Node(addr)
		if node == nil || !node.running() {
			continue
		}
		// The plaintext address: in a TLS group the Sentinels name the
		// TLS one.
		c := redis.NewClient(&redis.Options{Addr: node.Addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
		role, err := c.Do(ctx, "ROLE").Slice()
		_ = c.Close()
		if err == nil && len(role) > 0 && role[0] == "master" {
			return node
		}
	}
	return nil
}

// WaitNewPrimary waits until a majority of the Sentinels agree on a primary
// other than old, which says it is one, and returns it.
//
// After Failover, a forced failover that the Sentinels gave up (its
// failover-timeout of 3 s passed before the promoted replica reported
// itself primary: seen once in CI on a loaded machine, which then waited
// the whole timeout for a failover no Sentinel was running any more) is
// asked for again, as an operator would: once no Sentinel reports a
// failover in progress and none has for two seconds.
func (g *SentinelGroup) WaitNewPrimary(t testing.TB, old *Server, timeout time.Duration) *Server {
	t.Helper()
	var p *Server
	lastBusy := time.Now()
	Eventually(t, timeout, func() bool {
		p = g.Primary(t)
		if p != nil && p != old {
			return true
		}
		if g.failoverAsked {
			if g.failoverInProgress() {
				lastBusy = time.Now()
			} else if time.Since(lastBusy) > 2*time.Second {
				t.Logf("redistest: no Sentinel is failing over %s any more; asking again", g.Name)
				g.askFailover()
				lastBusy = time.Now()
			}
		}
		return false
	}, "no new primary after %s", old.Addr())
	return p
}

// failoverInProgress reports whether a live Sentinel says it is failing
// over the group's primary, or cannot be asked.
func (g *SentinelGroup) failoverInProgress() bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, s := range g.Sentinels {
		if !s.running() {
			continue
		}
		sc := redis.NewSentinelClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
		m, err := sc.Master(ctx, g.Name).Result()
		_ = sc.Close()
		if err != nil || strings.Contains(m["flags"], "failover_in_progress") {
			return true
		}
	}
	return false
}

// askFailover asks each live Sentinel for a failover until one accepts,
// and reports whether one did.
func (g *SentinelGroup) askFailover() bool {
	ctx := context.Background()
	for _, s := range g.Sentinels {
		if !s.running() {
			continue
		}
		sc := redis.NewSentinelClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
		err := sc.Failover(ctx, g.Name).Err()
		_ = sc.Close()
		if err == nil {
			return true
		}
	}
	return false
}

// Failover asks a live Sentinel for a failover (SENTINEL FAILOVER), as an
// operator would before maintenance of the primary. Sentinel refuses while
// a previous failover of the group is still settling; Failover retries that
// for a while.
func (g *SentinelGroup) Failover(t testing.TB) {
	t.Helper()
	g.failoverAsked = true
	Eventually(t, 20*time.Second, func() bool {
		if g.askFailover() {
			return true
		}
		time.Sleep(100 * time.Millisecond)
		return false
	}, "no Sentinel accepted SENTINEL FAILOVER %s", g.Name)
}

// running reports whether the server's process is up (not killed).
func (s *Server) running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil
}
