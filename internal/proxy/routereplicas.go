package proxy

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/route"
	"github.com/redproxy/redproxy/internal/upstream"
)

// Replica reads with routes: every standalone or Sentinel upstream whose
// read_from is not "primary" has its own replicaSet (discovery, polling,
// lag and fallback as for [upstream] without routes, replicas.go), and
// routedDo sends each upstream's share of a batch to one of its replicas
// when every command of the share is a read a replica may serve. A
// client's read-your-writes state is kept per upstream
// (routeSession.reads): a write to one upstream holds back only that
// upstream's reads, until its next poll has read its primary's offset.

// initRouteReplicas sets up the replica sets of the routes' upstreams
// (initReplicas, after initRoutes). Their metrics carry an "upstream"
// label, as the named upstreams' connection metrics do.
func initRouteReplicas(s *Server) error {
	for up, t := range s.routes.targets {
		u := s.cfg.NamedUpstream(t.name)
		if u.ReadFrom == config.ReadPrimary || u.ReadFrom == "" || t.backend == nil {
			continue // (config refuses replica reads on a cluster)
		}
		opts := func(addr string) upstream.BackendOptions { return t.opts(addr, u.Username, u.Password) }
		w := t.sentinel
		if up == route.Default {
			opts = func(addr string) upstream.BackendOptions { return s.backendOptions(s.Config(), addr) }
			w = s.sentinel
		}
		reg := prometheus.WrapRegistererWith(prometheus.Labels{"upstream": t.name}, s.metrics.Registry)
		set, err := newReplicaSet(s, u, t.backend, w, opts, reg, s.log.With("upstream", t.name))
		if err != nil {
			return err
		}
		t.replicas = set
		s.routes.replicas = true
	}
	return nil
}

// routeToReplicas reports whether r's keys route to one upstream that
// reads from replicas (so stampede protection, whose fetches go to the
// primary, leaves r to routedDo).
func (sess *Session) routeToReplicas(r *request) bool {
	if sess.srv.routes == nil || !sess.srv.routes.replicas {
		return false
	}
	up, keyed, cross := sess.routeKeys(r)
	return keyed && cross == nil && sess.srv.routes.targets[up].replicas != nil
}

// routeReads is the client's read-your-writes state for upstream up,
// allocated on the first batch that needs it: sessions without replica
// reads carry a nil pointer.
func (sess *Session) routeReads(up int) *replicaReads {
	if sess.route.reads == nil {
		reads := make([]replicaReads, len(sess.srv.routes.targets))
		sess.route.reads = &reads
	}
	return &(*sess.route.reads)[up]
}

// routeWritesAnswered: the replies of the batch are in; every upstream
// whose share held a command that may write (one the command table does
// not know included), so the client's reads of it wait for a poll started
// after now.
func (sess *Session) routeWritesAnswered(b *routeBatch) {
	for up, wrote := range b.mayWrites {
		if t := sess.srv.routes.targets[up]; wrote && t.replicas != nil {
			sess.routeReads(up).needEpoch = t.replicas.started.Load() + 1
		}
	}
}

// routeReplicaAnswered: the batch's shares are in; if a replica answered
// any, the mirror must not compare the batch's replies as the primaries'
// (replicaReads.answered).
func (sess *Session) routeReplicaAnswered() {
	if sess.route.reads == nil {
		return
	}
	for i := range *sess.route.reads {
		if rr := &(*sess.route.reads)[i]; rr.answered {
			rr.answered = false
			sess.reads.answered = true
		}
	}
}

// replicaRead reports whether a replica may serve cmd with args, as
// replicaCandidate decides for a command without routes: XREAD only
// without BLOCK.
func replicaRead(cmd *commands.Command, args [][]byte) bool {
	if cmd == nil {
		return false
	}
	if cmd.Name == "xread" {
		for _, a := range args[1:] {
			if len(a) == 5 && (a[0]|0x20) == 'b' && (a[1]|0x20) == 'l' && (a[2]|0x20) == 'o' && (a[3]|0x20) == 'c' && (a[4]|0x20) == 'k' {
				return false
			}
		}
		return true
	}
	return replicaCommand(cmd)
}
