// Package proxy is the data path: it accepts client connections, reads
// their commands in batches, decides for each command where it goes, and
// writes the replies back in order with one write per batch.
//
// One command's trip (see docs/ARCHITECTURE.md):
//
//	client socket -> resp.Reader (frame, cap sizes) -> Session.serveBatch
//	  -> commands.Table (what is it) -> proxy-answered / guard / forward
//	  -> upstream.Call on a shared upstream.Pipe -> Redis
//	  -> reply framed by the pipe's reader -> Session writes replies in order
package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/redproxy/redproxy/internal/cluster"
	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/mirror"
	"github.com/redproxy/redproxy/internal/sentinel"
	"github.com/redproxy/redproxy/internal/stampede"
	"github.com/redproxy/redproxy/internal/upstream"
)

// ErrServerClosed is returned by Serve after Shutdown.
var ErrServerClosed = errors.New("redproxy: server closed")

// Server is the client-facing side of the proxy.
type Server struct {
	// cfg is the configuration the server started with. Read it only for
	// settings a reload cannot change (reload.go lists them); the others
	// come from Config, the snapshot in force.
	cfg  *config.Config
	live atomic.Pointer[config.Config]
	// waitShardedMark: WAIT's marker is an SPUBLISH (stateful.go).
	waitShardedMark atomic.Bool
	// batchLoad caps clients' batches while many are answered at once
	// (limits.go).
	batchLoad batchLoad
	reloadMu  sync.Mutex
	// upstreamAddr is the address dialled, which differs from
	// cfg.Upstream.Address for the embedded store; in cluster mode the
	// admin backend's at the start (followCluster moves the backend, and
	// nothing reads upstreamAddr there after the start).
	upstreamAddr string
	// clusterAdmin is backend in cluster mode once made, for the router's
	// refresher (followCluster), which runs from before NewServer set it.
	clusterAdmin atomic.Pointer[upstream.Backend]
	adminMoving  atomic.Bool // a followCluster move is under way
	// startSilent is Options.UpstreamSilent, for the pools built at start
	// to the upstream found silent (the main one, users'); others wait
	// for their dials as usual.
	startSilent bool
	// cmds is the command table in force and the handlers resolved for
	// it, swapped as a whole when the upstream changes (cmdtable.go).
	cmds       atomic.Pointer[commandSet]
	tables     tableFollow // the table's reads from the upstream (cmdtable.go)
	log        *slog.Logger
	metrics    *metrics.Metrics
	backend    *upstream.Backend
	router     *cluster.Router                     // cluster mode only (cluster.go)
	guard      *serverGuard                        // the policy guard (guard.go)
	flight     atomic.Pointer[stampede.Protection] // stampede protection (flight.go); a reload replaces it
	tier       *tierState                          // the local tier (tier.go)
	sentinel   *sentinel.Watcher                   // upstream.mode = "sentinel" (sentinel.go); nil otherwise
	replicas   *replicaSet                         // upstream.read_from = replica*: reads from replicas (replicas.go); nil otherwise
	creplicas  *clusterReplicas                    // the same in cluster mode (clusterreplicas.go)
	park       serverPark                          // idle clients parked without a goroutine (park.go)
	slow       slowState                           // the slow log (slowlog.go)
	tls        tlsState                            // TLS on both sides (tls.go)
	listeners  listenerState                       // the client listeners by name (listeners.go)
	users      *userState                          // proxy users and their upstream pools (users.go)
	proxyProto proxyProtoState                     // PROXY protocol headers on the client listeners (proxyproto.go)
	routes     *routeState                         // named upstreams and [[route]] (routes.go); nil without routes
	mirror     *mirror.Mirror                      // [mirror] (mirror.go); nil when off
	// pins is upstream.max_pinned, shared by every backend of one server
	// (the proxy's, each user credential's): the bound is on all their
	// dedicated connections together. A cluster node's backend takes from
	// a Child of it, a bound of the same size per node.
	pins *upstream.PinLimit

	mu       sync.Mutex
	lns      []net.Listener // the client listeners served
	sessions map[*Session]struct{}
	// endNotices are closed when their session ends (CLIENT KILL waits on
	// them: endNotice), under mu.
	endNotices map[*Session]chan struct{}
	// relays are the relayed clients' upstream connections, for CLIENT
	// UNBLOCK from other clients (relayOf), under mu.
	relays  map[*Session]relayUpstream
	closing bool
	// draining is closing for Ready, which must not wait on mu.
	draining atomic.Bool
	active   sync.WaitGroup
	nextID   atomic.Int64
	clients  atomic.Int64
	// fileLimit is the process's file descriptor limit at start (0:
	// unknown), which bounds max_clients (maxClients).
	fileLimit atomic.Int64
	// tlsRejecting counts the TLS connections over max_clients being told
	// so (rejectTLS), which wait for a handshake: see maxTLSRejecting.
	tlsRejecting atomic.Int32
	// maxClientsLog limits the warning for clients refused at
	// server.max_clients to one a second (they were only counted, in
	// redproxy_client_connections_rejected_total: found by the
	// operations review, as max_pinned's refusals are logged).
	maxClientsLog logLimiter
	version       atomic.Pointer[string]
	started       time.Time // for INFO's proxy_uptime_in_seconds
	// crossProtocolLog limits the warning for POST and Host: commands
	// (crossProtocolStep), which anyone who can reach the port can send.
	crossProtocolLog logLimiter
	// closeLogs limit the warning for clients the proxy closes itself
	// (closeFor: output limit, write timeout, ...), a *logLimiter per
	// reason (closeLogFor).
	closeLogs sync.Map
	// versionFrom is the address whose dials tell the version HELLO and
	// INFO report (mainBackendOptions).
	versionFrom atomic.Pointer[string]
}

// SetUpstreamVersion records the Redis version HELLO reports, so clients
// that check it see the server they really talk to.
func (s *Server) SetUpstreamVersion(v string) { s.version.Store(&v) }

// UpstreamVersion is the version HELLO reports.
func (s *Server) UpstreamVersion() string {
	if v := s.version.Load(); v != nil {
		return *v
	}
	return "7.0.0"
}

// Options are what a Server needs beyond its configuration.
type Options struct {
	Config *config.Config
	// Table is the command table read from the upstream at start, or
	// the built-in one standing in for it. It follows the upstream from
	// then on: another server behind the main pools (a reload, a
	// failover) has its own table read (cmdtable.go).
	Table *commands.Table
	// TableStandIn says Table is the built-in one standing in for a
	// table the upstream did not give at start (down, silent, too slow):
	// it is read from the upstream once a dial reaches it, as for another
	// server, instead of being taken for that server's own.
	TableStandIn bool
	Logger       *slog.Logger
	Metrics      *metrics.Metrics
	// UpstreamAddr overrides cfg.Upstream.Address (used for the embedded
	// store, whose address is only known once it runs). In Sentinel mode
	// it is the primary the caller read Table from, which says whose
	// table it is (cmdtable.go); the primary served is
	// Options.Sentinel's, or asked for.
	UpstreamAddr string
	// UpstreamSilent says the caller's probes got no answer from Redis
	// (neither COMMAND nor a PING: refused, or accepted and silent): the
	// pools are built without waiting for their first dials, which would
	// time out too, so the listeners open at once and the proxy starts
	// not ready.
	UpstreamSilent bool
	// Sentinel is the caller's question to the Sentinels at start
	// (FindSentinelPrimary), whose watcher the server keeps: they are not
	// asked again before the listeners open, which waited their timeouts
	// twice and logged the warnings twice. NewServer takes it over, and
	// closes it if it fails. Nil: NewServer asks them (Sentinel mode).
	Sentinel *SentinelStart
}

// NewServer builds a server and its upstream connection pools.
func NewServer(o Options) (*Server, error) {
	cfg := o.Config
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Metrics == nil {
		o.Metrics = metrics.New()
	}
	addr := cfg.Upstream.Address
	if o.UpstreamAddr != "" {
		addr = o.UpstreamAddr
	}
	s := &Server{
		cfg:          cfg,
		upstreamAddr: addr,
		startSilent:  o.UpstreamSilent,
		log:          o.Logger,
		metrics:      o.Metrics,
		sessions:     make(map[*Session]struct{}),
		started:      time.Now(),
		pins:         upstream.NewPinLimit(cfg.Upstream.MaxPinned),
	}
	s.live.Store(cfg)
	s.fileLimit.Store(int64(fileLimit()))
	if n := s.maxClients(); n < cfg.Server.MaxClients {
		s.log.Warn("server.max_clients is more than the file descriptor limit allows: clients past the lower number are refused as at max_clients; raise the limit (ulimit -n, LimitNOFILE) or lower max_clients",
			"max_clients", cfg.Server.MaxClients, "file_limit", s.fileLimit.Load(), "clients_allowed", n)
	}
	// The server the table describes: in Sentinel mode the primary the
	// caller read it from, never upstream.address, which that mode does
	// not use (a primary at that address had the built-in table kept as
	// its own).
	from := addr
	if cfg.Upstream.Mode == config.ModeSentinel {
		from = o.UpstreamAddr
	}
	if o.TableStandIn {
		from = "" // no server's: the first one dialled has its table read
	}
	s.initCommands(o.Table, from)
	if cfg.Upstream.Mode != config.ModeSentinel {
		o.Sentinel.Close()
	}
	// TLS first: the backend dials as soon as it exists.
	if err := initTLS(s); err != nil {
		o.Sentinel.Close()
		return nil, err
	}
	if cfg.Upstream.Mode == config.ModeCluster {
		// The router has its own connections per node; this backend
		// only serves what has no node of its own (admin round trips),
		// and is pointed at a node that answered, not a seed that is down
		// (with none answering, the first seed; followCluster moves it to
		// a primary once a map is loaded).
		// After initTLS: the nodes are dialled with [upstream.tls].
		s.router = newRouter(s, cfg)
		addr = s.router.AnyNode()
		s.upstreamAddr = addr
		s.registerClusterMetrics()
	}
	if cfg.Upstream.Mode == config.ModeSentinel {
		addr = s.newSentinelWatcher(cfg, o.Sentinel)
		s.upstreamAddr = addr
	}
	bo := s.mainBackendOptions(cfg, addr)
	bo.NoDialWait = s.startSilent
	s.backend = upstream.NewBackend(bo)
	if s.router != nil {
		s.clusterAdmin.Store(s.backend) // followCluster may move it from now on
		// A map loaded between the router's start and here went by
		// followCluster unseen: have the next one soon.
		s.router.RefreshSoon()
	}
	switch {
	case s.router != nil:
		// Per node, labelled with it; the admin backend above is not
		// counted (its series would collide with its node's).
		o.Metrics.Registry.MustRegister(s.router)
	case cfg.Routed():
		// Every upstream's connection metrics carry its name (routes.go).
		registerBackendMetrics(s.backend, prometheus.WrapRegistererWith(prometheus.Labels{"upstream": config.DefaultUpstream}, o.Metrics.Registry), cfg)
	default:
		s.backend.RegisterMetrics(o.Metrics.Registry)
	}
	// The features the data path consults (hooks.go), each built from its
	// part of the configuration, in this order. None reads another's state
	// while it is built; the backend comes first because the local tier
	// dials through its options, and the local tier comes last because it
	// is the only step that starts anything (a maintenance goroutine and
	// its tracking connections): a policy that does not compile fails
	// NewServer with nothing of the tier running.
	for _, build := range []func(*Server) error{
		initUsers,         // proxy users, per-credential pools; refuses an open non-loopback listener (users.go)
		initRoutes,        // named upstreams and routes, when configured (routes.go)
		initFlight,        // stampede protection: coalescing, miss holds (flight.go)
		initReplicas,      // reads from replicas, when upstream.read_from asks for them (replicas.go)
		initGuard,         // the policy guard (guard.go)
		initSlowlog,       // the slow log (slowlog.go)
		initProxyProtocol, // PROXY protocol headers, when server.proxy_protocol is on (proxyproto.go)
		initMirror,        // the mirror's queue and sender, when [mirror] names an upstream (mirror.go)
		initTier,          // the local tier, when enabled (tier.go)
	} {
		if err := build(s); err != nil {
			// The pools' first dials may have started a read of the
			// command table (upstreamSeen): it must not outlive us.
			s.stopTables()
			if s.sentinel != nil {
				s.sentinel.Close()
			}
			s.closeUsers()
			s.closeRoutes()
			s.closeMirror()
			if s.router != nil {
				s.router.Close()
			}
			s.backend.Close()
			return nil, err
		}
	}
	if s.sentinel != nil {
		s.sentinel.Start(addr)
	}
	s.startReplicas()
	return s, nil
}

// Backend returns the upstream connection pools.
func (s *Server) Backend() *upstream.Backend { return s.backend }

// Ready reports whether [upstream]'s Redis is reachable (DB 0 has a
// connection up), whatever the named upstreams' state; in
// Sentinel mode, whether a primary is known; in cluster mode, whether the
// router has a slot map and its nodes. From the start of Shutdown it is
// false: the listeners are closed, so a load balancer probing /readyz must
// send new clients elsewhere while the busy ones drain.
func (s *Server) Ready() bool {
	if s.draining.Load() {
		return false
	}
	if s.router != nil {
		return s.router.Ready()
	}
	if s.sentinel != nil && s.sentinel.Primary() == "" {
		return false
	}
	// [upstream]'s alone: a named upstream down fails only its own keys,
	// and every instance of the proxy sees it down alike, so /readyz
	// going 503 for it had load balancers withdraw every instance and
	// fail every key (found by the operations review). Named upstreams
	// show in redproxy_upstream_connections_up{upstream=...}.
	return s.backend.Ready()
}

// Serve accepts plaintext clients on ln, as the "plain" listener
// (server.listen), until Shutdown. A server may serve several listeners
// (Serve, ServeTLS, ServeListener), each on its own goroutine.
func (s *Server) Serve(ln net.Listener) error { return s.serve(ln, s.plainListener()) }

func (s *Server) serve(ln net.Listener, l *listener) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		ln.Close()
		return ErrServerClosed
	}
	s.lns = append(s.lns, ln)
	s.mu.Unlock()
	s.startParking()
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closing := s.closing
			s.mu.Unlock()
			if closing {
				return ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, syscall.EMFILE) {
				// Out of file descriptors or a transient error: back off
				// rather than spin, as net/http does.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.log.Warn("accept failed; retrying", "err", err, "in", backoff)
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		s.accept(nc, l)
	}
}

var maxClientsReply = []byte("-ERR max number of clients reached\r\n")

// fdReserve is how many file descriptors past one per client maxClients
// keeps for the proxy's own: listeners, the admin endpoint, its shared
// connections to Redis (upstream.connections per database and protocol in
// use, the local tier's), beside upstream.max_pinned dedicated ones.
const fdReserve = 128

// maxClients is server.max_clients, lowered to what the file descriptor
// limit leaves room for, as Redis lowers its maxclients: past the limit
// accept failed (EMFILE) and was retried, the client left with no reply
// at all (found by a probe: ulimit -n 256 with max_clients 10000), where
// it is now told "max number of clients reached".
func (s *Server) maxClients() int {
	cfg := s.Config()
	n := cfg.Server.MaxClients
	if limit := int(s.fileLimit.Load()); limit > 0 {
		// A client uses one descriptor, and one more while it holds a
		// dedicated connection, which at most max_pinned do at once.
		room, pinned := limit-fdReserve, cfg.Upstream.MaxPinned
		fit := room - pinned
		if room < 2*pinned {
			fit = room / 2
		}
		if fit < n {
			n = max(fit, 1)
		}
	}
	return n
}

func (s *Server) accept(nc net.Conn, l *listener) {
	s.metrics.ClientsTotal.Inc()
	l.accepted.Inc()
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	if l.cfg.UsesProxyProtocol() {
		s.acceptProxied(nc, l)
		return
	}
	s.startSession(nc, l)
}

// startSession serves a client whose connection is accepted (and, with
// server.proxy_protocol, whose PROXY header is read): TLS handshake if
// the listener is TLS, then the session. max_clients counts the clients of
// every listener together.
func (s *Server) startSession(nc net.Conn, l *listener) {
	_, proxied := nc.(*proxiedConn)
	var tc *tls.Conn
	if l.secure() {
		tc = tls.Server(nc, l.conf)
		nc = tc
	}
	if s.clients.Load()+s.proxyProto.waiting.Load() >= int64(s.maxClients()) {
		s.metrics.ClientsRejected.Inc()
		if suppressed, ok := s.maxClientsLog.allow(); ok {
			s.log.Warn("client refused: server.max_clients reached", "max_clients", s.maxClients(),
				"client", nc.RemoteAddr().String(), "listener", l.cfg.Name, "refused_not_logged", suppressed)
		}
		if tc != nil && s.tlsRejecting.Add(1) <= maxTLSRejecting {
			go func() {
				defer s.tlsRejecting.Add(-1)
				rejectTLS(tc, min(s.Config().Server.TLS.Handshake(), tlsRejectTimeout))
			}()
			return
		}
		if tc != nil {
			// Past the bound: closed at once, as a plain connection
			// would be, but with no words (they need a handshake).
			s.tlsRejecting.Add(-1)
			tc.NetConn().Close()
			return
		}
		nc.Write(maxClientsReply)
		nc.Close()
		return
	}
	sess := newSession(s, nc)
	sess.listener = l
	if err := sess.setNamespace(l.cfg.Namespace); err != nil {
		// Checked with the configuration; a client must never run
		// unconfined on a listener meant to confine it.
		s.log.Error("BUG: listener namespace refused; connection closed", "listener", l.cfg.Name, "err", err)
		nc.Close()
		return
	}
	if tc != nil || proxied {
		// No socket to wait on through TLS (tls.go), nor on a PROXY
		// connection holding bytes read past its header (proxyproto.go):
		// wait with a few bytes. (Without effect on a socket the Reader
		// waits on directly.)
		sess.rd.WaitSmall()
	}
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		nc.Close()
		return
	}
	s.sessions[sess] = struct{}{}
	connected := len(s.sessions)
	s.active.Add(1)
	s.mu.Unlock()
	s.clients.Add(1)
	s.metrics.ClientsConnected.Inc()
	s.kickParking(connected)
	if tc == nil {
		go sess.serve()
		return
	}
	go func() {
		if !s.tlsHandshake(sess, tc) {
			nc.Close()
			s.sessionEnded(sess)
			return
		}
		// The handshake's crypto grew this goroutine's stack to several
		// times what serving needs, and an idle client would keep it:
		// serve on a fresh goroutine, whose stack starts small.
		go sess.serve()
	}()
}

// sessionEnded forgets a session whose connection ended.
func (s *Server) sessionEnded(sess *Session) {
	s.mu.Lock()
	delete(s.sessions, sess)
	if ch := s.endNotices[sess]; ch != nil {
		close(ch)
		delete(s.endNotices, sess)
	}
	s.mu.Unlock()
	s.clients.Add(-1)
	s.metrics.ClientsConnected.Dec()
	s.active.Done()
}

// Shutdown stops accepting, lets every client finish the batch it is in
// (bounded by ctx), closes idle clients, then closes upstream connections.
func (s *Server) Shutdown(ctx context.Context) error {
	s.draining.Store(true)
	// A reload already applying finishes before anything is closed; any
	// later one sees draining and is refused.
	s.reloadMu.Lock()
	s.reloadMu.Unlock() //nolint:staticcheck // an empty section: waits out Reload
	s.mu.Lock()
	s.closing = true
	for _, ln := range s.lns {
		ln.Close()
	}
	for sess := range s.sessions {
		sess.interrupt()
	}
	for nc := range s.proxyProto.pending {
		nc.Close()
	}
	s.mu.Unlock()

	done := make(chan struct{})
	go func() { s.active.Wait(); close(done) }()
	var err error
	select {
	case <-done:
		s.stopParking()
		s.closeUpstreams()
	case <-ctx.Done():
		err = ctx.Err()
		s.mu.Lock()
		for sess := range s.sessions {
			sess.closeConn()
		}
		s.mu.Unlock()
		// A session waiting for a reply notices its closed client only
		// when the reply comes; with Redis frozen or cut off that is the
		// dead timeout (30 s by default), past a Kubernetes grace period.
		// Closing the upstream connections fails those Calls now.
		s.closeUpstreams()
		<-done
		s.stopParking()
	}
	return err
}

// closeUpstreams closes every connection to Redis the server holds, and
// stops what watches them, failing any Call still waiting.
func (s *Server) closeUpstreams() {
	s.stopTables()
	if s.sentinel != nil {
		s.sentinel.Close()
	}
	s.closeTier()
	s.closeMirror()

	s.closeReplicas()
	if s.router != nil {
		s.router.Close()
	}
	s.backend.Close()
	s.closeUsers()
	s.closeRoutes()
}

// Clients returns the number of connected clients.
func (s *Server) Clients() int64 { return s.clients.Load() }
