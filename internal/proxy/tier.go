package proxy

import (
	"errors"
	"net/http"

	"github.com/redproxy/redproxy/internal/cluster"
	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/localcache"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/upstream"
)

// tierState is the local tier's part of a Server. Each session keeps its
// own writes in flight (Session.tierWrites).
type tierState struct {
	cache *localcache.Cache
}

func initTier(s *Server) error {
	cfg := s.cfg.LocalCache
	if !cfg.Enabled {
		return nil
	}
	opt := localcache.Options{
		Upstream:  func(db int) upstream.Options { return s.backend.Options(db, true) },
		Databases: s.cfg.Upstream.Databases,
		Logger:    s.log,
		Registry:  s.metrics.Registry,
	}
	if r := s.router; r != nil {
		opt.Cluster = clusterTier(r, func(addr string) upstream.Options {
			o := s.backend.Options(0, true)
			o.Addr = addr
			// The admin backend's reports the version of the server the
			// table follows; a node's tracking dial is another server
			// (in a cluster mid-upgrade, another version each time).
			o.OnVersion = nil
			return o
		})
	}
	if s.routes != nil {
		opt.Routes = s.routes.tierRoutes(s.cfg)
	}
	c, err := localcache.New(cfg, opt)
	if err != nil {
		return err
	}
	c.Connect(0) // most clients use DB 0: have it live before they come
	if s.router != nil {
		s.router.OnDeparted(func(addrs []string) { c.DropNodes("", addrs) })
	}
	if s.routes != nil {
		for _, t := range s.routes.targets {
			if t.router != nil {
				name := t.name
				t.router.OnDeparted(func(addrs []string) { c.DropNodes(name, addrs) })
			}
		}
	}
	if m := s.routerMap(); m != nil {
		for _, a := range m.Primaries() {
			c.ConnectNode(a)
		}
	}
	if s.routes != nil {
		for _, t := range s.routes.targets {
			switch {
			case t.router != nil:
				if m := t.router.Map(); m != nil {
					for _, a := range m.Primaries() {
						c.ConnectUpstreamNode(t.name, a)
					}
				}
			case t.backend != nil:
				c.ConnectOwner(t.name, 0)
			}
		}
	}
	s.tier = &tierState{cache: c}
	return nil
}

// LocalTier returns the local tier, or nil when it is off.
func (s *Server) LocalTier() *localcache.Cache {
	if s.tier == nil {
		return nil
	}
	return s.tier.cache
}

// HotKeysHandler serves /debug/hotkeys for the admin server.
func (s *Server) HotKeysHandler() http.Handler {
	if s.tier == nil {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "the local tier is off (localcache.enabled, --local-tier)", http.StatusNotFound)
		})
	}
	return s.tier.cache.HotKeysHandler()
}

// closeTier stops the tier's connections; called by Shutdown.
func (s *Server) closeTier() {
	if s.tier != nil {
		s.tier.cache.Close()
	}
}

// tierStep answers a read from the local tier when it may.
//
// Order: a hit is served only when nothing of this client's batch is still
// to be sent to Redis ahead of it; otherwise the read is forwarded behind
// it, because answering it now would reorder this client's commands in a
// way other clients can observe. (A coalesced read, which runs on another
// connection, is only ever the sole command of its batch, so it never
// precedes this one.) For the same reason an admitted miss is filled right
// here, before any later command of the batch is sent.
func (sess *Session) tierStep(r *request) bool {
	cmd, req, m := r.cmd, r.Request, r.m
	t := sess.srv.tier
	// The session does not call this in MULTI, under WATCH or when relayed;
	// the pin check is a second line of defence.
	if t == nil || cmd == nil || sess.pin.pipe != nil {
		return false
	}
	if !sess.cmds.cacheable[cmd] {
		return false
	}
	if sess.pendingUpstream() {
		t.cache.CountRead(sess.db, cmd, req.Args)
		return false
	}
	key, ok := localcache.CacheableKey(cmd, req.Args)
	if !ok {
		return false
	}
	db, resp3 := sess.db, sess.resp3
	reply, st := t.cache.Get(db, resp3, req.Raw, key)
	switch st {
	case localcache.Hit:
		sess.replyLocal(m, reply)
		return true
	case localcache.Fill:
		if sess.tierHeldFill(t, r, key) {
			return true
		}
		reply, err := sess.tierFill(t, cmd, req.Raw, key)
		if err != nil {
			return false // forwarded like any read; Redis answers or the error shows
		}
		sess.replyLocal(m, reply)
		return true
	case localcache.Stale:
		return sess.tierStale(t, req.Raw, key, m)
	case localcache.PassToPrimary:
		// Not to a replica: one behind the primary would answer a value
		// older than the one the tier served this client before the write
		// began (found by a probe with read_from = "replica_preferred":
		// 100 reads in 103,491 went back in time).
		r.toPrimary = true
	}
	return false
}

// tierFill fills an admitted miss through stampede protection's group
// (stampede.Protection.Fill), so concurrent misses of a hot key make one
// request, shared with any coalesced read of the same command.
func (sess *Session) tierFill(t *tierState, cmd *commands.Command, raw, key []byte) ([]byte, error) {
	db, resp3 := sess.db, sess.resp3
	fill := func() ([]byte, error) { return t.cache.Fill(db, resp3, cmd, raw, key) }
	fs := sess.srv.flight.Load()
	if fs == nil {
		return fill()
	}
	return fs.Fill(db, resp3, raw, fill)
}

// tierHeldFill fills an admitted miss of a read that miss holds may apply
// to (a lone read, as flightStep takes them, whose key a hold or early
// refresh rule matches) through stampede.Protection.FillRead, which
// applies the hold protocol to the fill: it reports false, leaving the
// read to tierFill, for any other read. Found by review: the tier keeps no
// nil reply, so every read of an admitted key that is missing is a fill,
// and fills never applied the hold, so the hold never covered exactly the
// hot keys it exists for. The hold is applied here, in the fill, rather
// than by stepping the tier aside for these keys: stepping aside on every
// Fill would keep hold keys out of the tier for good, and a hit (a value)
// needs no hold anyway. Outcomes are answered as flightStep answers them.
func (sess *Session) tierHeldFill(t *tierState, r *request, key []byte) bool {
	fs := sess.srv.flight.Load()
	// A muted read (CLIENT REPLY OFF or SKIP) is no filler: flightStep.
	if fs == nil || len(sess.batchReqs) != 1 || r.blocking || sess.curMute || !fs.HoldsOrRefreshes(r.cmd, r.Args) {
		return false
	}
	db, resp3 := sess.db, sess.resp3
	cmd, raw := r.cmd, r.Raw
	fill := func() ([]byte, error) { return t.cache.Fill(db, resp3, cmd, raw, key) }
	reply, err := fs.FillRead(cmd, r.Args, raw, db, resp3, sess.id, sess.left, fill)
	// Past max_waiters FillRead fills alone, still under the rules.
	if err != nil {
		sess.flightFailed(r, err)
	} else {
		sess.replyLocal(r.m, reply)
	}
	return true
}

// tierStale handles a read the tier holds a stale-if-error value for while
// it cannot serve: Redis is asked first (nothing of the batch is pending,
// so asking now keeps the client's order), and the stale value answers
// only a connection failure.
func (sess *Session) tierStale(t *tierState, raw, key []byte, m *metrics.Command) bool {
	db, resp3 := sess.db, sess.resp3
	call := upstream.NewCall()
	call.Add(raw)
	call.SetReplyLimit(sess.replyLimit())
	if r := sess.srv.router; r != nil {
		// The router answers a lost node with an error reply, not an
		// error, so the stale value is never used in cluster mode.
		r.Do(call, resp3)
	} else if sess.srv.routes != nil {
		sess.tierStaleRouted(call, key)
	} else {
		sess.backend().Pool(db, resp3).Do(call)
	}
	reply, err := call.Reply(0)
	if err == nil {
		t.cache.Refreshed(db, key)
		sess.replyLocal(m, reply)
		return true
	}
	if errors.Is(err, upstream.ErrOutputLimit) {
		sess.overLimit()
		return true
	}
	if errors.Is(err, upstream.ErrUnavailable) || errors.Is(err, upstream.ErrConnLost) || errors.Is(err, upstream.ErrTimeout) {
		if v, ok := t.cache.StaleValue(db, resp3, raw, key); ok {
			sess.replyLocal(m, v)
			return true
		}
	}
	sess.replyLocal(m, errorReply(err))
	return true
}

// tierWriteForwarded tells the tier about a write before it is sent: its
// keys are dropped and neither served nor filled until tierBatchFlushed.
func (sess *Session) tierWriteForwarded(cmd *commands.Command, args [][]byte) {
	t := sess.srv.tier
	if t == nil {
		return
	}
	// Writes replayed at EXEC arrive while the transaction is still open,
	// marked in the session's database; a SELECT queued before them may
	// have moved them, which only a fence covers. Without one their keys
	// are named as outside MULTI: a fence for every transaction paused
	// every client's hits for a round trip (a review measured half the
	// hits gone with transactions in the write mix).
	inTx := sess.pin.pipe != nil && sess.pin.inMulti && sess.pin.txSelected
	t.cache.WriteStart(&sess.tierWrites, sess.db, cmd, args, inTx)
}

// tierBatchFlushed: the replies of the session's writes are in, so their
// keys may be filled again (and a fence raised if one is due).
func (sess *Session) tierBatchFlushed() {
	t := sess.srv.tier
	if t == nil || !sess.tierWrites.Pending() {
		return
	}
	t.cache.WriteDone(&sess.tierWrites)
}

// tierSessionClosed releases anything a session that ended mid-batch held.
func (sess *Session) tierSessionClosed() { sess.tierBatchFlushed() }

// routerMap is the cluster router's slot map, nil in other modes or before
// one was loaded.
func (s *Server) routerMap() *cluster.Map {
	if s.router == nil {
		return nil
	}
	return s.router.Map()
}

// clusterTier is how the tier reads from the cluster r routes to: one
// tracking connection per node, each key on the node owning its slot in
// r's map now (localcache/cluster.go), dialled with node's options.
func clusterTier(r *cluster.Router, node func(addr string) upstream.Options) *localcache.Cluster {
	return &localcache.Cluster{
		Owner: func(key []byte) string {
			if m := r.Map(); m != nil {
				return m.Owner(cluster.Slot(key))
			}
			return ""
		},
		Demoted: func(string) { r.RefreshSoon() },
		Node:    node,
	}
}

// tierRoutes makes the tier track each key on its route's upstream
// (localcache/routes.go): on the upstream's connection of the key's
// database, or for a cluster upstream on the connection of the node of
// that cluster owning the key's slot now.
func (rs *routeState) tierRoutes(cfg *config.Config) *localcache.Routes {
	r := &localcache.Routes{
		Route: func(key []byte) int {
			up, _ := rs.table.Load().Key(key)
			return up
		},
		Options: func(up, db int) upstream.Options { return rs.targets[up].backend.Options(db, true) },
	}
	for i, t := range rs.targets {
		r.Upstreams = append(r.Upstreams, t.name)
		r.Clusters = append(r.Clusters, nil)
		if t.router != nil {
			u := cfg.NamedUpstream(t.name)
			bo := t.opts("", u.Username, u.Password)
			r.Clusters[i] = clusterTier(t.router, func(addr string) upstream.Options {
				o := bo
				o.Addr = addr
				return o.ConnOptions(0, true)
			})
		}
	}
	return r
}

// tierStaleRouted asks the upstream of key's route, with the client's
// credential, for a read the tier holds a stale-if-error value for.
func (sess *Session) tierStaleRouted(call *upstream.Call, key []byte) {
	up, _ := sess.srv.routes.table.Load().Key(key)
	if r := sess.srv.routes.targets[up].router; r != nil {
		if sess.db != 0 {
			call.Fail(errClusterDB(sess.srv.routes.targets[up].name))
			return
		}
		// As in cluster mode, the router answers a lost node with an error
		// reply, so the stale value is never used for a cluster upstream.
		r.Do(call, sess.resp3)
		return
	}
	b, err := sess.backendFor(up)
	if err != nil {
		call.Fail(err)
		return
	}
	b.Pool(sess.db, sess.resp3).Do(call)
}
