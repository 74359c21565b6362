package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/cluster"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/resp"
	"github.com/redproxy/redproxy/internal/route"
	"github.com/redproxy/redproxy/internal/sentinel"
	"github.com/redproxy/redproxy/internal/stampede"
	"github.com/redproxy/redproxy/internal/upstream"
)

// Routes ([upstreams.NAME], [[route]], [[channel_route]]): each key goes to
// the upstream of the first route whose pattern matches it, [upstream]
// (index route.Default) when none does. The route of a command is chosen
// in two places:
//
//   - commands on shared connections are routed per batch, in flush
//     (routedDo): each command to its keys' upstream, split (MGET, MSET,
//     DEL, UNLINK, EXISTS, TOUCH) or fanned out (SCAN, DBSIZE, KEYS,
//     FLUSHALL, ...) over several, and the replies merged in order;
//   - commands on a dedicated connection (WATCH, blocking commands,
//     SUBSCRIBE and the other relays) take it from the one upstream all
//     their keys or channels route to, decided at dispatch (routeStep);
//     keys of another upstream fail before anything is sent. A
//     transaction is held until EXEC (queueHeld, cluster.go) and sent
//     whole to its keys' one upstream, or not at all.
//
// The routes are an immutable route.Table a reload swaps whole; the
// upstreams and their connections are set up at start only.

// routeState is the routes' part of a Server; nil when none are
// configured.
type routeState struct {
	table atomic.Pointer[route.Table]
	// recent are the last routeHistory tables put in force, oldest first,
	// for watchMoved; swapped whole, and before table, so that a table
	// read from table is in the recent read after it.
	recent  atomic.Pointer[[]*route.Table]
	targets []*routeTarget // by upstream index; targets[0] is [upstream]
	routed  *prometheus.CounterVec
	failed  *prometheus.CounterVec
	// keyRules are the key routes in force, to tell whether a reload
	// changes them (the tier is flushed then); channelRules the channel
	// routes. A reload that changes neither keeps the table in force.
	keyRules     []config.Route
	channelRules []config.Route
	// replicas: some upstream reads from replicas (routeTarget.replicas).
	replicas bool
}

// routeTarget is one upstream's connections.
type routeTarget struct {
	name string
	mode string
	// backend is a standalone or Sentinel upstream's shared pools (for
	// the default upstream, Server.backend); nil for a cluster.
	backend *upstream.Backend
	// users are the pools of the proxy users' own upstream credentials;
	// for the default upstream, userState.backends.
	users    map[auth.Credential]*upstream.Backend
	router   *cluster.Router   // a cluster upstream
	sentinel *sentinel.Watcher // a Sentinel upstream other than the default
	// replicas, when its read_from is not "primary", are its replicas
	// (routereplicas.go); opts, the options of its pools at an address.
	replicas *replicaSet
	opts     func(addr, user, pass string) upstream.BackendOptions
	routed   prometheus.Counter
	failed   prometheus.Counter
}

// initRoutes sets up the named upstreams and the routes, after initUsers
// (the users' credentials get pools on every upstream).
func initRoutes(s *Server) error {
	cfg := s.cfg
	if !cfg.Routed() {
		return nil
	}
	rs := &routeState{
		routed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "redproxy_route_commands_total", Help: "Commands (or parts of split and fanned-out commands) sent to each upstream on shared connections, by upstream name."}, []string{"upstream"}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "redproxy_route_errors_total", Help: "Commands (or parts) sent to an upstream that got no reply from it (unreachable, connection lost), by upstream name."}, []string{"upstream"}),
	}
	if err := s.metrics.Registry.Register(rs.routed); err != nil {
		return err
	}
	if err := s.metrics.Registry.Register(rs.failed); err != nil {
		return err
	}
	s.routes = rs
	for i, name := range cfg.RoutedUpstreams() {
		t := &routeTarget{name: name, routed: rs.routed.WithLabelValues(name), failed: rs.failed.WithLabelValues(name)}
		rs.targets = append(rs.targets, t)
		if i == route.Default {
			t.mode, t.backend, t.users = cfg.Upstream.Mode, s.backend, s.users.backends
			continue
		}
		if err := s.startTarget(t, cfg.NamedUpstream(name)); err != nil {
			return err
		}
	}
	keys := resolvedRoutes(cfg)
	tbl, err := newRouteTable(cfg, keys)
	if err != nil {
		return err
	}
	rs.recent.Store(&[]*route.Table{tbl})
	rs.table.Store(tbl)
	rs.keyRules = keys
	rs.channelRules = slices.Clone(cfg.ChannelRoutes)
	return nil
}

// resolvedRoutes are cfg's key routes with each ring's server names filled
// in (config.RingNames): a ring without server_names hashes its upstreams
// under their addresses, so a reload of upstream.address changes the ring
// though the [[route]] itself does not (found by review: the reload kept
// the old placement, a restart with the same file took the new one).
func resolvedRoutes(cfg *config.Config) []config.Route {
	out := slices.Clone(cfg.Routes)
	for i, r := range out {
		if len(r.Upstreams) > 0 {
			out[i].ServerNames = cfg.RingNames(r)
		}
	}
	return out
}

// stampedeMetrics are stampede protection's counters with routes, labelled
// with the upstream of each read's key (the upstreams are set at start, so
// the label's values are the configured names; a reload may move a key to
// another route, never add an upstream). Without routes the counters keep
// no label, as before routes existed.
func (rs *routeState) stampedeMetrics(reg prometheus.Registerer) *stampede.Metrics {
	t := rs.table.Load()
	names := make([]string, t.Len())
	for i := range names {
		names[i] = t.Name(i)
	}
	return stampede.NewMetricsPerUpstream(reg, names, func(key []byte) int {
		up, _ := rs.table.Load().Key(key)
		return up
	})
}

// newRouteTable compiles cfg's routes; keys are its key routes as
// resolvedRoutes gives them, so a ring's names are worked out once.
func newRouteTable(cfg *config.Config, keys []config.Route) (*route.Table, error) {
	conv := func(rs []config.Route) []route.Rule {
		out := make([]route.Rule, len(rs))
		for i, r := range rs {
			out[i] = route.Rule{Pattern: r.Pattern, Upstream: r.Upstream}
			if len(r.Upstreams) > 0 {
				out[i].Upstreams = r.Upstreams
				out[i].Ring = route.RingConfig{Distribution: r.Distribution, Hash: r.Hash, HashTag: r.HashTag, Weights: r.Weights, Names: r.ServerNames}
			}
		}
		return out
	}
	return route.New(cfg.RoutedUpstreams(), conv(keys), conv(cfg.ChannelRoutes))
}

// routedCluster reports whether a named upstream of the routes is a
// cluster, whose nodes' redproxy_upstream_* series carry a node label: the
// other upstreams' series then carry it too, empty, since the series of
// one name in one registry must carry the same labels.
func routedCluster(cfg *config.Config) bool {
	for _, name := range cfg.RoutedUpstreams() {
		if name != config.DefaultUpstream && cfg.NamedUpstream(name).Mode == config.ModeCluster {
			return true
		}
	}
	return false
}

// registerBackendMetrics registers a standalone or Sentinel upstream's
// connection metrics in reg, which labels them with the upstream's name.
func registerBackendMetrics(b *upstream.Backend, reg prometheus.Registerer, cfg *config.Config) {
	if routedCluster(cfg) {
		b.RegisterMetricsWithNode(reg)
	} else {
		b.RegisterMetrics(reg)
	}
}

// startTarget dials named upstream t, set up as u says.
func (s *Server) startTarget(t *routeTarget, u config.Upstream) error {
	t.mode = u.Mode
	tlsConf, err := u.ClientTLS()
	if err != nil {
		return err
	}
	if u.TLS != nil && u.TLS.InsecureSkipVerify {
		s.log.Warn("INSECURE: tls.insecure_skip_verify is set for a named upstream: its certificate is NOT verified", "upstream", t.name)
	}
	reg := prometheus.WrapRegistererWith(prometheus.Labels{"upstream": t.name}, s.metrics.Registry)
	// The upstream's max_pinned bounds its dedicated connections of every
	// credential together, and a cluster upstream's per node, as
	// [upstream]'s does.
	pins := upstream.NewPinLimit(u.MaxPinned)
	t.opts = func(addr, user, pass string) upstream.BackendOptions {
		return upstream.BackendOptions{
			Addr: addr, Username: user, Password: pass, TLS: tlsConf,
			Connections: u.Connections, MaxPinned: u.MaxPinned, Pins: pins,
			// SELECT's range is [upstream]'s: every upstream serves the
			// client's database.
			Databases:    s.cfg.Upstream.Databases,
			DialTimeout:  u.DialTimeout.Duration,
			ReplyTimeout: u.ReplyTimeout.Duration,
			DeadTimeout:  u.DeadTimeout.Duration,
			ReconnectMin: u.ReconnectMin.Duration,
			ReconnectMax: u.ReconnectMax.Duration,
			Logger:       s.log.With("upstream", t.name),
			ReplyLimit:   int(s.Config().Server.ClientOutputLimit),
		}
	}
	opts := t.opts
	if u.Mode == config.ModeCluster {
		o := opts("", u.Username, u.Password)
		t.router = cluster.New(cluster.Options{Seeds: u.Seeds, Backend: o, Tables: s.tableInForce, Logger: s.log.With("upstream", t.name),
			// The router answers a command no node answered with an
			// error reply, which the batch here cannot tell from Redis's.
			Unanswered: t.failed})
		// Its nodes' connection metrics, with a node label, which every
		// other upstream's series then carry empty (routedCluster): it
		// had none, and with every node down it showed nowhere (found
		// by a probe).
		return reg.Register(t.router)
	}
	addr := u.Address
	if u.Mode == config.ModeSentinel {
		so := sentinelOptions(&config.Config{Upstream: u}, s.log.With("upstream", t.name))
		so.OnSwitch = func(primary string) { s.targetFailover(t, primary, opts) }
		t.sentinel = sentinel.New(so)
		// As [upstream]'s, under the upstream's name (found by review:
		// a named upstream whose Sentinels were all down only logged it).
		if err := reg.Register(sentinelsAnswering(t.sentinel)); err != nil {
			t.sentinel.Close()
			t.sentinel = nil
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*u.DialTimeout.Duration*time.Duration(len(u.Sentinels)))
		found, _, err := t.sentinel.Discover(ctx, "", -1)
		cancel()
		if err != nil {
			s.log.Warn("sentinel: no primary found at start for a named upstream; its keys fail until one is", "upstream", t.name, "master_name", u.MasterName, "err", err)
		}
		addr = found
	}
	t.backend = upstream.NewBackend(opts(addr, u.Username, u.Password))
	registerBackendMetrics(t.backend, reg, s.cfg)
	t.users = map[auth.Credential]*upstream.Backend{}
	for cred := range s.users.backends {
		t.users[cred] = upstream.NewBackend(opts(addr, cred.User, cred.Password))
	}
	if t.sentinel != nil {
		t.sentinel.Start(addr)
	}
	return nil
}

// targetFailover moves a named Sentinel upstream to its new primary, as
// Server.failover does for [upstream].
func (s *Server) targetFailover(t *routeTarget, addr string, opts func(addr, user, pass string) upstream.BackendOptions) {
	u := s.cfg.Upstreams[t.name]
	switchBackend := func() {
		// Every credential's pools at once, as for [upstream] (failing
		// them over one after the other lost the later ones' writes).
		moves := []backendMove{{t.backend, opts(addr, u.Username, u.Password)}}
		for cred, b := range t.users {
			moves = append(moves, backendMove{b, opts(addr, cred.User, cred.Password)})
		}
		moveBackends(true, moves)
	}
	// reloadMu keeps this apart from a reload's or another failover's
	// switch of the tier and of the coalescing group.
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	if s.tier != nil {
		// As for [upstream] (Server.failover): nothing read from the old
		// primary is served again (C4).
		s.tier.cache.SwitchUpstreamOf(t.name, switchBackend)
	} else {
		switchBackend()
	}
	// As for [upstream]: the group is shared by every upstream, so reads
	// of the others' keys simply stop coalescing behind fetches already
	// sent.
	s.newFlightGroup(s.Config())
	s.log.Warn("upstream switched to the new primary", "upstream", t.name, "primary", addr)
}

// UpstreamRouter returns the router of the named upstream called name when
// it is a cluster, nil otherwise (no routes, or another mode).
func (s *Server) UpstreamRouter(name string) *cluster.Router {
	if s.routes == nil {
		return nil
	}
	for _, t := range s.routes.targets {
		if t.name == name {
			return t.router
		}
	}
	return nil
}

// closeRoutes closes the named upstreams' connections (not the default's,
// which the server closes).
func (s *Server) closeRoutes() {
	if s.routes == nil {
		return
	}
	for _, t := range s.routes.targets[1:] {
		if t.sentinel != nil {
			t.sentinel.Close()
		}
		if t.router != nil {
			t.router.Close()
		}
		if t.backend != nil {
			t.backend.Close()
		}
		for _, b := range t.users {
			b.Close()
		}
	}
}

// NamedUpstreamsReady reports whether every named upstream can serve
// (true without routes). Not part of Ready (/readyz): see there. Tests
// wait for it at start.
func (s *Server) NamedUpstreamsReady() bool {
	if s.routes == nil {
		return true
	}
	for _, t := range s.routes.targets[1:] {
		switch {
		case t.router != nil:
			if !t.router.Ready() {
				return false
			}
		case t.sentinel != nil && t.sentinel.Primary() == "":
			return false
		case !t.backend.Ready():
			return false
		}
	}
	return true
}

// checkRouteReload refuses a reload that turns routes on or off: the
// upstreams' connections are set up at start.
func (s *Server) checkRouteReload(next *config.Config) error {
	if (s.routes != nil) != next.Routed() {
		return errors.New("route: turning routes on or off needs a restart")
	}
	return nil
}

// reloadRoutes swaps the routes for next's, whole: a batch being routed
// keeps the table it started with.
func (s *Server) reloadRoutes(next *config.Config) {
	if s.routes == nil {
		return
	}
	nextKeys := resolvedRoutes(next)
	sameKeys := slices.EqualFunc(s.routes.keyRules, nextKeys, config.Route.Equal)
	if sameKeys && slices.EqualFunc(s.routes.channelRules, next.ChannelRoutes, config.Route.Equal) {
		// The same routes: the table in force stays, so a WATCH taken
		// before a reload that changed something else (a timeout, a
		// pool size) does not age out of recent and fail its EXEC
		// (found by review: 17 such reloads aborted a WATCH).
		return
	}
	t, err := newRouteTable(next, nextKeys)
	if err != nil {
		// Validated already (config.checkRoutes); keep the routes in force.
		s.log.Error("route: reloaded routes do not compile; keeping the routes in force", "err", err)
		return
	}
	recent := append(slices.Clone(*s.routes.recent.Load()), t)
	if len(recent) > routeHistory {
		recent = recent[len(recent)-routeHistory:]
	}
	s.routes.recent.Store(&recent)
	if s.tier != nil && !sameKeys {
		// Keys may move to another upstream: the tier must not serve what
		// it filled from their old one (localcache/routes.go).
		s.tier.cache.Reroute(func() { s.routes.table.Store(t) })
	} else {
		s.routes.table.Store(t)
	}
	s.routes.keyRules = nextKeys
	s.routes.channelRules = slices.Clone(next.ChannelRoutes)
}

// routeHistory is how many route tables watchMoved can look back on: a
// WATCH older than that many reloads fails its EXEC.
const routeHistory = 16

// backendFor is upstream up's pools for the client's credential, or an
// error for a cluster upstream (which routes commands itself).
func (sess *Session) backendFor(up int) (*upstream.Backend, error) {
	t := sess.srv.routes.targets[up]
	if t.router != nil {
		return nil, fmt.Errorf("redproxy: upstream '%s' is a cluster; a dedicated connection (transaction, blocking command, pub/sub) on it is not supported with routes yet", t.name)
	}
	if up == route.Default {
		return sess.backend(), nil
	}
	if sess.user != nil && sess.user.Upstream.User != "" {
		if b := t.users[sess.user.Upstream]; b != nil {
			return b, nil
		}
	}
	return t.backend, nil
}

// routeSession is a session's routing state.
type routeSession struct {
	// relay is the upstream the client's relay (SUBSCRIBE, MONITOR) runs
	// on; its later commands must route there too (routeRelayDenied).
	relay int
	// wrote is the upstreams (bit i: upstream i; there are at most 64)
	// the client has written to since its connection began, where WAIT
	// and WAITAOF must wait (routewait.go). Never cleared: a WAIT that
	// confirmed a write on N replicas says nothing of the next WAIT's
	// numreplicas, and a client that wrote to an upstream once is rarely
	// done with it.
	wrote uint64
	// moves is, once the client has written to two upstreams or more,
	// 1 + each one's Moves() at the client's last write to it, by index
	// (for one upstream, Session.wroteMoves): a WAIT after one of them
	// moved to another server answers 0 (waitAfterMove). nil until then,
	// so a client of one upstream allocates nothing.
	moves *[]uint32
	// reads is the client's read-your-writes state per upstream, by
	// index, once some upstream reads from replicas (routeReads); a
	// pointer, so a session without replica reads carries one word.
	reads *[]replicaReads
}

var errRouteInTx = func(name string) []byte {
	return []byte("-ERR redproxy: " + strings.ToUpper(strings.ReplaceAll(name, "|", " ")) + " inside a transaction is not supported with routes (it concerns every upstream)\r\n")
}

// routeKeys is the upstream of r's keys (see route.Table.Keys).
func (sess *Session) routeKeys(r *request) (up int, keyed bool, cross []byte) {
	t := sess.srv.routes.table.Load()
	up, keyed, err := t.Keys(r.cmd, r.Args, &sess.routeKeyPos)
	if err != nil {
		return up, true, route.ErrorReply(err)
	}
	return up, keyed, nil
}

// routeChannels is the upstream of a SUBSCRIBE's channels (or
// PSUBSCRIBE's patterns, routed as if they were channel names, and
// refused when they may match channels routed elsewhere: route.Pattern).
// A keyspace notification channel goes where its key does, and keyevent
// channels are refused when keys live on several upstreams
// (route.Table.Subscribe): a relay is one connection to one upstream,
// and would never hear the other upstreams' notifications (found by
// review).
func (sess *Session) routeChannels(r *request) (int, []byte) {
	t := sess.srv.routes.table.Load()
	up := -1
	for _, ch := range r.Args[1:] {
		u, err := subscribeUpstream(t, r.name, ch)
		if err != nil {
			return u, route.ErrorReply(err)
		}
		if up >= 0 && u != up {
			return up, []byte("-ERR redproxy: the channels of '" + strings.ToUpper(r.name) + "' go to different upstreams ('" + t.Name(up) + "' and '" + t.Name(u) + "'); subscribe to them on separate connections\r\n")
		}
		up = u
	}
	return max(up, route.Default), nil
}

// subscribeUpstream is where the channel (or pattern) ch of a subscribe
// command named name subscribes, or why it cannot be.
func subscribeUpstream(t *route.Table, name string, ch []byte) (int, error) {
	switch name {
	case "psubscribe":
		return t.Pattern(ch)
	case "subscribe":
		return t.Subscribe(ch)
	}
	return t.Channel(ch), nil // SSUBSCRIBE: Redis publishes no notification there
}

// routeStep decides, with routes, where the commands that need a
// dedicated connection go: it pins, queues or refuses them, and reports
// true when it answered r. Everything else goes on as usual and is routed
// by flush.
func (sess *Session) routeStep(r *request) bool {
	if sess.cmulti.open {
		return sess.queueHeld(r, routePlacer{})
	}
	cmd, m := r.cmd, r.m
	if cmd == nil {
		return false
	}
	if sess.pin.pipe != nil {
		if r.name == "multi" && len(r.Args) == 1 {
			// Under WATCH: held as well, on the WATCH's upstream. (With
			// arguments, dispatchPinned has Redis refuse it.)
			return sess.openHeld(r, routePlacer{})
		}
		return sess.routePinned(r)
	}
	var placedBy *route.Table
	if r.name == "watch" {
		// The table the WATCH is placed by is this one or a later one;
		// noteWatch records this one. Loaded after the connection was
		// pinned (a dial may come in between), a reload between the
		// placing and the load went unseen, and EXEC ran over a write to
		// the key on its new upstream (found by review).
		placedBy = sess.srv.routes.table.Load()
	}
	if sess.openHeld(r, routePlacer{}) {
		if r.name == "watch" && sess.pin.pipe != nil {
			sess.noteWatch(r, placedBy) // the WATCH that pinned the connection
		}
		return true
	}
	switch r.name {
	case "subscribe", "psubscribe", "ssubscribe":
		if !cmd.ArityOK(len(r.Args)) {
			return false
		}
		up, cross := sess.routeChannels(r)
		if cross != nil {
			sess.replyLocal(m, cross)
			return true
		}
		sess.route.relay = up
		return false
	case "monitor":
		sess.route.relay = route.Default
		return false
	case "client|tracking", "client|no-touch":
		if len(r.Args) > 2 && strings.EqualFold(string(r.Args[2]), "on") {
			// A relay carries all of the client's later commands to one
			// upstream, and tracking would hear of one upstream's writes.
			sess.replyLocal(m, []byte("-ERR redproxy: "+strings.ToUpper(strings.ReplaceAll(r.name, "|", " "))+" ON is not supported with routes yet\r\n"))
			return true
		}
		return false
	}
	if r.blocking {
		_, keyed, cross := sess.routeKeys(r)
		if keyed && cross != nil {
			sess.replyLocal(m, cross)
			return true
		}
	}
	return false
}

// routeBlockingBackend is where a blocking command borrows its connection
// with routes: the upstream of its keys (routeStep checked they share
// one); WAIT and WAITAOF the one upstream the client wrote to (one that
// wrote to several waits on each, waitEveryUpstream), [upstream] when it
// wrote nowhere.
func (sess *Session) routeBlockingBackend(r *request) (*upstream.Backend, error) {
	up, keyed, _ := sess.routeKeys(r)
	if !keyed && sess.route.wrote != 0 && (r.name == "wait" || r.name == "waitaof") {
		up = bits.TrailingZeros64(sess.route.wrote)
	}
	return sess.backendFor(up)
}

// routePinned checks a command of a client holding a pinned connection:
// its keys must route to the transaction's upstream (pin.slot), and a
// command that concerns every upstream cannot run on one. A refused
// command inside MULTI makes EXEC fail, as a queue-time error does.
func (sess *Session) routePinned(r *request) bool {
	pin := &sess.pin
	if r.wrongArity() {
		// Redis checks arity before slots: dispatchPinned refuses it
		// with the arity error, not a cross-slot one.
		return false
	}
	var reply []byte
	if route.FansOut(r.name) {
		reply = errRouteInTx(r.name)
	} else {
		// PUBLISH belongs to its channel's upstream, as in a held
		// transaction (routePlacer.target): under WATCH it went out on the
		// WATCH's upstream, answered :0, and no subscriber heard it.
		up, keyed, cross := routePlacer{}.target(sess, r)
		if !keyed {
			return false
		}
		if cross == nil && (pin.slot < 0 || up == pin.slot) {
			pin.slot = up
			if r.name == "watch" {
				sess.noteWatch(r, nil) // a later WATCH on the same connection
			}
			return false
		}
		if reply = cross; reply == nil {
			reply = errCrossTx(sess.srv.routes.table.Load(), r.name, up, pin.slot)
		}
	}
	sess.refusedInMulti()
	sess.replyLocal(r.m, reply)
	return true
}

// errCrossTx refuses, in a transaction on upstream want, a command whose
// keys route to upstream got.
func errCrossTx(t *route.Table, name string, got, want int) []byte {
	return []byte("-CROSSROUTE redproxy: the keys of '" + strings.ToUpper(strings.ReplaceAll(name, "|", " ")) + "' go to upstream '" + t.Name(got) + "', the transaction's are on '" + t.Name(want) + "'; a transaction stays on one upstream\r\n")
}

// routePlacer holds a transaction until EXEC, then sends it whole to the
// one upstream all its keys route to (queueHeld).
type routePlacer struct{}

func (routePlacer) wholeRefusal(name string) []byte {
	if route.FansOut(name) {
		return errRouteInTx(name)
	}
	return nil
}

func (routePlacer) target(sess *Session, r *request) (int, bool, []byte) {
	// PUBLISH's channel's upstream is where its subscribers are
	// ([[channel_route]]): published on another, they would never hear
	// of it; PUBSUB NUMSUB counts them there, and one over several
	// upstreams is refused (split, it is not one command of the
	// transaction's upstream).
	up, keyed, err := sess.srv.routes.table.Load().Upstream(r.cmd, r.Args, &sess.routeKeyPos)
	if err != nil {
		return up, true, route.ErrorReply(err)
	}
	return up, keyed, nil
}

func (routePlacer) backend(sess *Session, up int) (*upstream.Backend, error) {
	return sess.backendFor(up)
}

func (routePlacer) keyless() int { return route.Default }

func (routePlacer) toExec() bool { return true }

func (routePlacer) elsewhere(sess *Session, name string, got, want int) []byte {
	return errCrossTx(sess.srv.routes.table.Load(), name, got, want)
}

func (routePlacer) full(count, size int) []byte {
	if count >= maxHeldTx || size > maxHeldTxBytes {
		return errHeldTxFull
	}
	return nil
}

func (routePlacer) stateRefusal(name string) []byte {
	return errInMulti(name)
}

// routeRelayDenied refuses a command of a relayed client whose keys or
// channels route to another upstream than the relay's.
func (sess *Session) routeRelayDenied(args [][]byte) string {
	if sess.srv.routes == nil || len(args) == 0 {
		return ""
	}
	cmd := sess.cmds.table.Lookup(args)
	if cmd == nil {
		return ""
	}
	t := sess.srv.routes.table.Load()
	up := sess.route.relay
	switch {
	case cmd.Name == "unsubscribe" || cmd.Name == "punsubscribe" || cmd.Name == "sunsubscribe":
		return "" // nothing of another upstream's is subscribed here
	case isSubscribe(cmd.Name) || cmd.Name == "publish" || cmd.Name == "spublish":
		for _, ch := range args[1:] {
			u, err := subscribeUpstream(t, cmd.Name, ch)
			if err != nil {
				return err.Error()
			}
			if u != up {
				// (The channel is the client's bytes: not echoed in an error line.)
				return "ERR redproxy: a channel of this command goes to upstream '" + t.Name(u) + "', this connection's subscriptions are on '" + t.Name(up) + "'; subscribe on another connection"
			}
			if cmd.Name == "publish" || cmd.Name == "spublish" {
				break
			}
		}
		return ""
	case (cmd.Name == "client|tracking" || cmd.Name == "client|no-touch") && len(args) > 2 && strings.EqualFold(string(args[2]), "on"):
		// As on a connection of its own (routeStep): tracking on a
		// subscribed relay heard one upstream's writes, and kept a value
		// the client cached after a reload routed its key elsewhere
		// (found by a probe: stale after an acknowledged write).
		return "ERR redproxy: " + strings.ToUpper(strings.ReplaceAll(cmd.Name, "|", " ")) + " ON is not supported with routes yet"
	case cmd.Name == "pubsub|numsub" || cmd.Name == "pubsub|shardnumsub":
		// Counted on the relay's upstream, another upstream's channels
		// would read 0.
		if u, ok, err := t.Channels(cmd.Name, args); ok && (err != nil || u != up) {
			return "ERR redproxy: channels of this command go to another upstream than this subscribed connection's ('" + t.Name(up) + "')"
		}
		return ""
	case route.FansOut(cmd.Name):
		return "ERR redproxy: " + strings.ToUpper(strings.ReplaceAll(cmd.Name, "|", " ")) + " is not supported on a subscribed connection with routes"
	}
	u, keyed, err := t.Keys(cmd, args, &sess.routeKeyPos)
	if keyed && (err != nil || u != up) {
		return "ERR redproxy: keys of this command go to another upstream than this subscribed connection's ('" + t.Name(up) + "')"
	}
	return ""
}

// routeCalls keeps the per-upstream Calls of routedDo between batches.
var routeCalls = sync.Pool{New: func() any { return &routeBatch{} }}

type routeBatch struct {
	calls []*upstream.Call // by upstream index; nil: nothing for it
	plans []route.Plan
	// where[first[op]+part] is the index of the part's reply in its
	// upstream's Call.
	where, first []int
	errs         []error
	sent         []bool
	// With replica reads: per op, whether it is a read a replica may
	// serve and whether it may write; by upstream, whether its share
	// holds a command of each kind that is not a replica read / may write.
	notRead, mayWrite   []bool
	notReads, mayWrites []bool
	args                [][]byte
	keys                []int
	parts               [][]byte
	groups              []int        // per op: the transaction (MULTI ... EXEC in the Call) it is in, from 1; 0 for none
	budget              atomic.Int64 // shared by calls (SetReplyBudget)
}

// routedDo runs a Call of shared-connection commands against the routes'
// upstreams: each upstream's share travels in the Call's order on one of
// its connections, all upstreams at once, and the replies are filled in
// the Call's order. A MULTI ... EXEC inside the Call (the guard's TTL
// fix-ups) goes whole to the upstream of its first key.
func (sess *Session) routedDo(call *upstream.Call) {
	rs := sess.srv.routes
	t := rs.table.Load()
	b := routeCalls.Get().(*routeBatch)
	defer routeCalls.Put(b)
	n := call.Len()
	b.plans = append(b.plans[:0], make([]route.Plan, n)...)
	b.groups = append(b.groups[:0], make([]int, n)...)
	b.notRead = append(b.notRead[:0], make([]bool, n)...)
	b.mayWrite = append(b.mayWrite[:0], make([]bool, n)...)
	group, groups := 0, 0
	for i := range n {
		var err error
		b.args, err = resp.SplitCommand(call.Part(i), b.args[:0])
		if err != nil || len(b.args) == 0 {
			b.plans[i] = route.Plan{Local: errorReply(resp.ErrProtocol)}
			b.notRead[i] = true
			continue
		}
		cmd := sess.cmds.table.Lookup(b.args)
		// A command the table does not know may write (a module's).
		b.mayWrite[i] = cmd == nil || mayWrite(cmd)
		if rs.replicas {
			b.notRead[i] = !replicaRead(cmd, b.args)
		}
		if group == 0 && cmd != nil && cmd.Name == "multi" {
			groups++
			group = groups
		}
		if group != 0 {
			b.groups[i] = group
			up := route.Default
			if cmd != nil {
				u, keyed, err := t.Keys(cmd, b.args, &b.keys)
				if err != nil {
					b.plans[i] = route.Plan{Local: route.ErrorReply(err)}
				} else if keyed {
					up = u
				} else {
					up = -1 // wherever the group goes
				}
			}
			if b.plans[i].Local == nil {
				b.plans[i] = route.Single(up)
			}
			if cmd != nil && (cmd.Name == "exec" || cmd.Name == "discard") {
				group = 0
			}
			continue
		}
		b.plans[i] = t.Plan(cmd, b.args, &b.keys)
	}
	if groups > 0 {
		sess.placeRouteGroups(b, groups)
	}
	// The batch is pooled across servers: size it to this server's
	// upstreams both ways, or a batch last used by a wider server indexes
	// this one's per-upstream tables out of range.
	for len(b.calls) < t.Len() {
		b.calls = append(b.calls, nil)
	}
	b.calls = b.calls[:t.Len()]
	b.where, b.first = b.where[:0], b.first[:0]
	b.notReads = append(b.notReads[:0], make([]bool, len(b.calls))...)
	b.mayWrites = append(b.mayWrites[:0], make([]bool, len(b.calls))...)
	limit := call.ReplyLimit()
	b.budget.Store(0)
	for i := range n {
		p := &b.plans[i]
		b.first = append(b.first, len(b.where))
		for k := range p.Len() {
			part := p.Part(k)
			c := b.calls[part.Upstream]
			if c == nil {
				c = upstream.NewCall()
				b.calls[part.Upstream] = c
			}
			if c.Len() == 0 && limit > 0 {
				// The upstreams' shares are capped together like the
				// client's whole Call, as cluster mode caps its nodes'.
				c.SetReplyLimit(limit)
				c.SetReplyBudget(&b.budget)
			}
			b.where = append(b.where, c.Len())
			b.notReads[part.Upstream] = b.notReads[part.Upstream] || b.notRead[i]
			b.mayWrites[part.Upstream] = b.mayWrites[part.Upstream] || b.mayWrite[i]
			raw := part.Raw
			if raw == nil {
				raw = call.Part(i)
			}
			c.Add(raw)
		}
	}
	for up, wrote := range b.mayWrites {
		if wrote {
			sess.routeWrote(up) // where WAIT must wait (routewait.go)
		}
	}
	b.errs = append(b.errs[:0], make([]error, len(b.calls))...)
	var wg sync.WaitGroup
	b.sent = append(b.sent[:0], make([]bool, len(b.calls))...)
	sent := b.sent
	for up, c := range b.calls {
		if c == nil || c.Len() == 0 {
			continue
		}
		tg := rs.targets[up]
		tg.routed.Add(float64(c.Len()))
		if tg.router != nil {
			if sess.db != 0 {
				b.errs[up] = errClusterDB(tg.name)
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				tg.router.Do(c, sess.resp3)
			}()
			continue
		}
		be, _ := sess.backendFor(up)
		if tg.replicas != nil && !b.notReads[up] {
			// All reads: to one of the upstream's replicas, or its primary
			// (routereplicas.go).
			rr := sess.routeReads(up)
			wg.Add(1)
			go func() {
				defer wg.Done()
				if !sess.readOnReplica(tg.replicas, rr, c, be) {
					be.Pool(sess.db, sess.resp3).Do(c)
				}
			}()
			continue
		}
		if err := be.Pool(sess.db, sess.resp3).Send(c); err != nil {
			b.errs[up] = err
			continue
		}
		sent[up] = true
	}
	for up, c := range b.calls {
		if sent[up] {
			c.Wait()
		}
	}
	wg.Wait()
	if rs.replicas {
		sess.routeWritesAnswered(b)
		sess.routeReplicaAnswered()
	}
	overflow := false
	for i := range n {
		p := &b.plans[i]
		if p.Local != nil {
			call.AddReply(p.Local)
			continue
		}
		b.parts = b.parts[:0]
		for k := range p.Len() {
			up := p.Part(k).Upstream
			c := b.calls[up]
			var r []byte
			err := b.errs[up]
			if err == nil {
				r, err = c.Reply(b.where[b.first[i]+k])
			}
			if errors.Is(err, upstream.ErrOutputLimit) {
				overflow = true
			}
			if err != nil {
				rs.targets[up].failed.Inc()
				r = errorReply(err)
			}
			b.parts = append(b.parts, r)
		}
		if overflow {
			call.Overflow()
		}
		if m, ok := p.Merged(b.parts); ok {
			call.AddReplyAppend(m.Len(), m.AppendTo)
		} else {
			call.AddReply(p.Reply(b.parts))
		}
	}
	for _, c := range b.calls {
		if c != nil {
			c.Reset()
			c.Trim(64 << 10)
		}
	}
	clear(b.plans)
	clear(b.parts)
}

// placeRouteGroups sends every command of a transaction in the Call to
// the upstream of its first key; a transaction whose keys route to
// different upstreams fails whole before anything of it is sent.
func (sess *Session) placeRouteGroups(b *routeBatch, groups int) {
	ups := make([]int, groups+1)
	crossed := make([]bool, groups+1)
	for i := range ups {
		ups[i] = -1
	}
	for i, g := range b.groups {
		if g == 0 {
			continue
		}
		p := &b.plans[i]
		if p.Local != nil {
			crossed[g] = true
			continue
		}
		if up := p.Part(0).Upstream; up >= 0 {
			if ups[g] >= 0 && ups[g] != up {
				crossed[g] = true
			}
			if ups[g] < 0 {
				ups[g] = up
			}
		}
	}
	for i, g := range b.groups {
		if g == 0 {
			continue
		}
		if crossed[g] {
			b.plans[i] = route.Plan{Local: []byte("-CROSSROUTE redproxy: the keys of one transaction go to different upstreams; a transaction stays on one upstream\r\n")}
			continue
		}
		b.plans[i].Part(0).Upstream = max(ups[g], route.Default)
	}
}

// noteWatch keeps the keys of a WATCH sent on the client's pinned
// connection, and the routes that placed the first one there (placedBy,
// loaded before it was placed; nil: the routes now), for watchMoved.
func (sess *Session) noteWatch(r *request, placedBy *route.Table) {
	pin := &sess.pin
	if pin.watchRoutes == nil {
		pin.watchRoutes = placedBy
		if placedBy == nil {
			pin.watchRoutes = sess.srv.routes.table.Load()
		}
	}
	for _, k := range r.cmd.Keys(r.Args, nil) {
		pin.watchKeys = append(pin.watchKeys, bytes.Clone(r.Args[k]))
	}
}

// watchMoved reports whether a reload since the client's first WATCH
// routed one of its WATCHed keys to another upstream than the one the
// WATCH is on (pin.slot), now or at any time in between. The WATCH then
// missed writes to the key: they went to its other upstream, which the
// WATCH never hears of, and an EXEC that ran committed over them (found by
// review: only the queued keys were checked, a moved WATCHed key let EXEC
// run). Every table in force since the WATCH is checked, not only t: a
// key moved away and back by two reloads took its writes elsewhere in
// between (TestRoutesWatchedKeyMovedAwayAndBack).
func (sess *Session) watchMoved(t *route.Table) bool {
	pin := &sess.pin
	if pin.watchRoutes == nil || pin.watchRoutes == t {
		return false
	}
	recent := *sess.srv.routes.recent.Load()
	i := slices.Index(recent, pin.watchRoutes)
	if i < 0 {
		// More reloads since the WATCH than are kept: say it failed, an
		// answer a WATCH may always give and its client retries.
		return true
	}
	for _, tbl := range recent[i+1:] {
		for _, k := range pin.watchKeys {
			if up, _ := tbl.Key(k); up != pin.slot {
				return true
			}
		}
	}
	return false
}

// failedWatch is EXEC's reply when a WATCH failed: a null array.
func failedWatch(resp3 bool) []byte {
	if resp3 {
		return []byte("_\r\n")
	}
	return []byte("*-1\r\n")
}

// reroutedHeld places again, by the routes in force now, a held
// transaction whose routes were reloaded after its MULTI (or, under a
// WATCH, after the WATCH): nothing of it has been sent, so it goes where
// its keys live now, and the client's reads after EXEC find its writes
// (sent by the old routes, they did not: found by review). It returns the
// reply ending the transaction instead when that cannot be: its keys now
// live on two upstreams (EXECABORT), or under a WATCH whose keys, or the
// transaction's, now live on another upstream than the WATCH's (a null
// reply, as for a WATCH that failed: the WATCH guarded keys that are no
// longer there, and a client retries). nil when the routes did not change.
func (sess *Session) reroutedHeld() []byte {
	cm := &sess.cmulti
	t := sess.srv.routes.table.Load()
	if cm.watched && sess.watchMoved(t) {
		return failedWatch(sess.resp3)
	}
	if cm.routes == t {
		return nil
	}
	cm.routes = t
	target := -1
	var args [][]byte
	for _, q := range cm.queued {
		var err error
		if args, err = resp.SplitCommand(q.raw, args[:0]); err != nil || q.cmd == nil {
			continue
		}
		up, keyed, kerr := t.Upstream(q.cmd, args, nil)
		if kerr != nil {
			return errExecAbort
		}
		if !keyed {
			continue
		}
		if target >= 0 && up != target {
			return errExecAbort
		}
		target = up
	}
	if cm.watched && target >= 0 && target != cm.target {
		return failedWatch(sess.resp3)
	}
	if target >= 0 {
		cm.target = target
	}
	return nil
}

// errClusterDB answers a command of a client outside database 0 whose
// route is a cluster upstream.
func errClusterDB(name string) error {
	return fmt.Errorf("redproxy: upstream '%s' is a cluster, which has only database 0", name)
}

// routedFetch is stampede protection's way upstream with routes: to the
// upstream of the read's key.
func (s *Server) routedFetch(c *upstream.Call, db int, resp3 bool, cmd []byte) {
	args, err := resp.SplitCommand(cmd, nil)
	up := route.Default
	if err == nil && len(args) > 0 {
		if command := s.cmdSet().table.Lookup(args); command != nil {
			if u, _, kerr := s.routes.table.Load().Keys(command, args, nil); kerr == nil {
				up = u
			}
		}
	}
	t := s.routes.targets[up]
	t.routed.Add(float64(c.Len()))
	switch {
	case t.router != nil && db != 0:
		// As routedDo answers: a coalesced or filling read took this way
		// and read database 0 for a client in another (found by review).
		c.Fail(errClusterDB(t.name))
	case t.router != nil:
		t.router.Do(c, resp3)
	default:
		t.backend.Pool(db, resp3).Do(c)
	}
	// Counted as routedDo counts: a command without a reply (a cluster's
	// router counts those it answered with an error of its own); a reply
	// digested for its length came (found by review: a named cluster's
	// fetches counted, the other upstreams' did not).
	for i := range c.Len() {
		if _, err := c.Reply(i); err != nil && !errors.Is(err, upstream.ErrDigested) {
			t.failed.Inc()
		}
	}
}
