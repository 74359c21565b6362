package proxy

import (
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/redproxy/redproxy/internal/cluster"
	"github.com/redproxy/redproxy/internal/config"
)

// newRouter builds the router of upstream.mode = "cluster". The session
// hands it whole batches (flush); which node a command goes to, and how
// split commands come back together, is the router's business.
func newRouter(s *Server, cfg *config.Config) *cluster.Router {
	return cluster.New(cluster.Options{
		Seeds:   cfg.Upstream.Seeds,
		Backend: s.backendOptions(cfg, ""),
		Table:   s.table,
		Logger:  s.log,
	})
}

// Router is the cluster router, or nil in standalone mode.
func (s *Server) Router() *cluster.Router { return s.router }

var (
	errClusterSelect = []byte("-ERR SELECT is not allowed in cluster mode\r\n")
)

// clusterStep answers, in cluster mode, the commands that cannot go
// through the router as they are: SELECT of another database, and the
// commands that need a connection of their own (transactions, blocking
// commands, relays), which cluster mode does not pin to a node yet.
func (sess *Session) clusterStep(r *request) bool {
	cmd, args, m := r.cmd, r.Args, r.m
	if cmd == nil {
		return false
	}
	switch cmd.Name {
	case "select":
		if len(args) == 2 {
			if db, err := strconv.Atoi(string(args[1])); err == nil && db != 0 {
				sess.replyLocal(m, errClusterSelect)
				return true
			}
		}
		return false
	case "multi", "watch", "subscribe", "psubscribe", "ssubscribe", "monitor":
		sess.replyLocal(m, errClusterUnsupported(cmd.Name))
		return true
	case "client|tracking", "client|no-touch":
		if len(args) > 2 && strings.EqualFold(string(args[2]), "on") {
			sess.replyLocal(m, errClusterUnsupported(cmd.Name))
			return true
		}
		return false
	}
	if cmd.IsBlocking(args) {
		sess.replyLocal(m, errClusterUnsupported(cmd.Name))
		return true
	}
	return false
}

func errClusterUnsupported(name string) []byte {
	return []byte("-ERR redproxy: " + strings.ToUpper(strings.ReplaceAll(name, "|", " ")) + " is not supported in cluster mode yet\r\n")
}

// registerClusterMetrics exposes the redirections the router followed for
// clients: a steady stream means the proxy's map keeps going stale.
func (s *Server) registerClusterMetrics() {
	r := s.router
	for kind, read := range map[string]func() uint64{
		"moved":   func() uint64 { m, _, _ := r.Stats(); return m },
		"ask":     func() uint64 { _, a, _ := r.Stats(); return a },
		"retried": func() uint64 { _, _, t := r.Stats(); return t },
	} {
		s.metrics.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "redproxy_cluster_redirections_total",
			Help:        "Cluster replies the proxy handled for its clients: MOVED and ASK followed, and commands retried after TRYAGAIN, CLUSTERDOWN, NOSCRIPT or an unreachable node.",
			ConstLabels: prometheus.Labels{"kind": kind},
		}, func() float64 { return float64(read()) }))
	}
}
