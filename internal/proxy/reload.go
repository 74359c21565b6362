package proxy

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/resp"
	"github.com/redproxy/redproxy/internal/stampede"
	"github.com/redproxy/redproxy/internal/upstream"
)

// Config returns the configuration in force: the one the server started
// with, or the last one Reload applied. It is an immutable snapshot.
func (s *Server) Config() *config.Config { return s.live.Load() }

// clientLimits are the request limits for a new client connection; a
// reload changes them for connections accepted after it.
func (s *Server) clientLimits() resp.Limits {
	c := s.Config()
	return resp.Limits{
		MaxArgs:    c.Server.MaxArgs,
		MaxBulk:    int64(c.Server.MaxBulkBytes),
		MaxRequest: int64(c.Server.MaxRequestBytes),
		MaxInline:  int(c.Server.MaxInlineBytes),
		MaxBatch:   resp.DefaultMaxBatch,
	}
}

func (s *Server) backendOptions(c *config.Config, addr string) upstream.BackendOptions {
	return upstream.BackendOptions{
		Addr:         addr,
		Username:     c.Upstream.Username,
		Password:     c.Upstream.Password,
		TLS:          s.tls.upstream.Load(),
		Connections:  c.Upstream.Connections,
		MaxPinned:    c.Upstream.MaxPinned,
		Pins:         s.pins,
		Databases:    c.Upstream.Databases,
		DialTimeout:  c.Upstream.DialTimeout.Duration,
		ReplyTimeout: c.Upstream.ReplyTimeout.Duration,
		DeadTimeout:  c.Upstream.DeadTimeout.Duration,
		ReconnectMin: c.Upstream.ReconnectMin.Duration,
		ReconnectMax: c.Upstream.ReconnectMax.Duration,
		Logger:       s.log,
		OnReadOnly:   s.readOnlyHook(),
		WantPrimary:  s.sentinel != nil,
		// No Call on a connection keeps more replies than a client may
		// be sent, nor does its reader hold a longer push: see
		// upstream.Options.ReplyLimit.
		ReplyLimit: int(c.Server.ClientOutputLimit),
	}
}

// mainBackendOptions are backendOptions for [upstream]'s shared pools at
// addr (Server.backend). Their dials also learn HELLO's version, so that
// HELLO and INFO name the server the proxy talks to after a reload to
// another address or a failover as after a start (found by review: a
// reload from a 6.2.99 to a 7.0.15 kept saying 6.2.99), and once a Redis
// down at the start comes up; a server other than the one the command
// table was read from has its table read (upstreamSeen). The version is
// taken from addr's dials only while addr is the upstream: a dial of the
// old server that ends after a switch does not count.
func (s *Server) mainBackendOptions(c *config.Config, addr string) upstream.BackendOptions {
	s.versionFrom.Store(&addr)
	o := s.backendOptions(c, addr)
	if c.Upstream.Address == config.EmbeddedAddress {
		// The embedded store's HELLO names a version of its own (8.4.0)
		// and its COMMAND reply is an approximation: the built-in table
		// and version it stands in for stay (found by a probe: HELLO and
		// INFO proxy said 8.4.0 after the first RESP3 dial, INFO server
		// 7.0.15).
		return o
	}
	o.OnVersion = func(v string) {
		if cur := s.versionFrom.Load(); cur != nil && *cur == addr {
			s.SetUpstreamVersion(v)
			s.upstreamSeen(addr, v) // the command table follows (cmdtable.go)
		}
	}
	return o
}

// ErrRestartRequired is returned (wrapped, with the settings and reasons)
// by Reload when the new configuration changes a setting that only takes
// effect on a restart. Nothing of that configuration is applied.
var ErrRestartRequired = errors.New("settings that need a restart changed")

// ErrShuttingDown is returned by Reload once Shutdown has begun: the
// proxy is draining its clients, and a switch of pools then would dial
// connections nothing closes.
var ErrShuttingDown = errors.New("the proxy is shutting down")

// Reload applies next, a validated snapshot, to the running server and
// returns the dotted keys of the settings it changed, and what changed in
// the files they name (a listener's certificate, [upstream.tls]'s files)
// when no setting did. Every setting that
// can change safely at run time is applied:
//
//   - upstream.address, connections, dial_timeout, reply_timeout,
//     reconnect_min, reconnect_max: drain and switch (Backend.Switch);
//     with the local tier on, the tier also drops everything it read from
//     the old upstream and moves its tracking connections to the new one
//     (localcache.Cache.SwitchUpstream), so from the return of Reload no
//     read is answered with a value from the old upstream; with read_from,
//     an address change also clears the replica set's view of the old
//     primary's replicas and waits (up to its checkTimeout) for a poll of
//     the new one's (replicaSet.restart), so no read after Reload goes to
//     an old replica either; without an address change the replicas'
//     pools are switched to the new options and reply_timeout, by a poll
//     waited for the same way (replicaSet.reconfigure); a client's WATCH
//     taken before an address change makes its EXEC answer a null reply
//     (execMovedWatch); the new server's command table is read once its
//     dials report it, in the background (upstreamSeen, cmdtable.go);
//   - in cluster mode only max_pinned of [upstream] reloads; a certificate
//     rotated in an [upstream.tls] file is logged as needing a restart,
//     and the rest of the reload is applied;
//   - upstream.max_pinned, server.max_clients: at once;
//   - server request limits, idle_timeout and output limits: for
//     connections and relays started after the reload;
//   - [stampede]: for reads started after the reload; reads already held
//     on a miss are still released by their filler's write
//     (stampede.Protection.Succeed);
//   - server.log_level and shutdown_timeout, [policy]: by the caller
//     (main owns the logger and shutdown; the guard owns the policy),
//     which is why they are listed as changed but not acted on here.
//
// If next changes anything else (config.RestartOnly), or switches to or
// from the embedded store, Reload refuses the whole snapshot,
// keeps the one in force and says which settings and why; the error wraps
// ErrRestartRequired.
func (s *Server) Reload(next *config.Config) ([]string, error) {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	if s.draining.Load() {
		return nil, ErrShuttingDown
	}
	// What start refuses, a reload must too: dropping client_ca_file, the
	// last [[users]] or upstream.password on a listener that is not
	// loopback opened it to anyone (found by review).
	if err := config.ExposureError(next); err != nil {
		return nil, fmt.Errorf("reload refused, the configuration in force stays: %w", err)
	}
	cur := s.Config()
	changed := config.Changed(cur, next)
	var refused []error
	for _, key := range changed {
		if why := config.RestartOnly(key); why != "" {
			refused = append(refused, fmt.Errorf("%s: %s", key, why))
		}
	}
	// The certificate files are read again whatever changed: rotating a
	// certificate in place is a reload that changes no setting.
	applyTLS, upstreamTLS, upstreamTLSChanged, err := s.reloadTLS(next)
	if err != nil {
		return nil, err
	}
	settingsChanged := !onlyMaxPinned(cur, next)
	upstreamChanged := upstreamTLSChanged || settingsChanged
	if upstreamChanged && next.Upstream.Address != cur.Upstream.Address &&
		(next.Upstream.Address == config.EmbeddedAddress || cur.Upstream.Address == config.EmbeddedAddress) {
		refused = append(refused, fmt.Errorf("upstream.address: switching to or from the embedded store needs a restart"))
	}
	keepUpstreamTLS := false
	if s.router != nil {
		// The router's per-node connections are dialled with the options
		// it started with; it has no switch of generations yet.
		switch {
		case settingsChanged:
			if keys := upstreamKeys(changed); len(keys) > 0 {
				refused = append(refused, fmt.Errorf("%s: changing the upstream settings (other than max_pinned) needs a restart in cluster mode",
					strings.Join(keys, ", ")))
			}
		case upstreamTLSChanged:
			// Only what the [upstream.tls] files hold changed (a
			// certificate rotated in place): refusing would refuse every
			// later reload, whatever it changes, until a restart. The rest
			// is applied; the cluster keeps the certificates it started
			// with, and says so.
			keepUpstreamTLS, upstreamChanged = true, false
			s.log.Warn("upstream.tls: the certificate files changed, but in cluster mode the connections to the cluster keep the certificates loaded at start until a restart; the rest of the reload is applied",
				"files", strings.Join(tlsFiles(next.Upstream.TLS), ","))
		}
	}
	if err := s.checkRouteReload(next); err != nil {
		refused = append(refused, err)
	}
	if s.users != nil {
		refused = append(refused, s.users.users.RotatedPasswords(next.Users)...)
	}
	if len(refused) > 0 {
		return nil, fmt.Errorf("%w (restart redproxy to apply them):\n%w", ErrRestartRequired, errors.Join(refused...))
	}
	// Checked before anything is applied, so a bad policy keeps the old
	// configuration as a whole; the guard compiles it again when applying.
	if _, err := policy.Compile(next.Policy); err != nil {
		return nil, err
	}
	// Dialled only for a reload that is otherwise accepted: a refused one
	// need not wait on Redis. (Not in cluster mode, whose connections
	// keep the files they started with.)
	if upstreamTLSChanged && s.router == nil {
		if err := s.verifiesUpstream(next, upstreamTLS); err != nil {
			return nil, err
		}
	}
	// A listener's certificate rotated in place is a change the caller
	// lists (a probe: the reload's log line said changed=nothing).
	var certs []string
	for _, name := range applyTLS(!keepUpstreamTLS) {
		certs = append(certs, fmt.Sprintf("the certificate of listener %q (the files it names)", name))
	}
	if s.sentinel != nil && !keepUpstreamTLS {
		// [upstream.tls] covers the Sentinels and the role checks of
		// their candidates too: left on the files read at start, a
		// rotated CA made the watcher find no primary it could verify,
		// and the next failover was never followed (found by a probe).
		s.sentinel.SetTLS(upstreamTLS)
	}
	if len(changed) == 0 && !upstreamChanged {
		return certs, nil
	}
	if upstreamTLSChanged && !keepUpstreamTLS && !slices.ContainsFunc(changed, func(k string) bool { return strings.HasPrefix(k, "upstream.tls") }) {
		// What the files hold changed, not the settings: said, or a
		// reload that switched the upstream logged changed=nothing
		// (found by a probe).
		changed = append(changed, "upstream.tls (the files it names)")
	}

	s.live.Store(next)
	s.reloadRoutes(next)
	if upstreamChanged {
		addr := next.Upstream.Address
		if addr == config.EmbeddedAddress || next.Upstream.Mode == config.ModeSentinel {
			// The embedded store's address, or the primary the Sentinel
			// watcher follows.
			addr = s.upstreamAddr
		}
		moved := addr != s.upstreamAddr
		s.upstreamAddr = addr
		switchBackend := func() {
			moveBackends(false, append([]backendMove{{s.backend, s.mainBackendOptions(next, addr)}}, s.userMoves(next, addr)...))
		}
		if s.tier != nil {
			// The tier drops everything it read from the old upstream and
			// keeps no fill sent there, then redials its tracking
			// connections to the new one (localcache.Cache.SwitchUpstream).
			s.tier.cache.SwitchUpstream(switchBackend)
		} else {
			switchBackend()
		}
		for _, rs := range s.allReplicaSets() {
			if rs.primary != s.backend {
				continue // a named upstream's: restart-only
			}
			if moved {
				// The replicas read were the old primary's: forget them
				// now that the pools send to the new one, and poll its
				// replicas (with the new options: optsGen).
				rs.optsGen.Add(1)
				rs.replyTimeout.Store(int64(next.Upstream.ReplyTimeout.Duration))
				rs.restart(rs.checkTimeout())
			} else {
				// The same replicas, with the new reply_timeout, pool
				// sizes, timeouts and TLS.
				rs.reconfigure(next.Upstream.ReplyTimeout.Duration, rs.checkTimeout())
			}
		}
		s.log.Info("upstream switched; requests already sent finish on the old connections", "upstream", addr)
	} else {
		s.pins.SetMax(next.Upstream.MaxPinned) // every backend's, cluster nodes' (Child) too
	}
	// After an upstream switch, a new flight group too: a read started
	// after Reload returns must not join a coalesced fetch (or tier fill)
	// that an earlier read sent to the old upstream. Stored only now that
	// the backend and the tier use the new upstream, so every fetch led in
	// the new group goes there.
	//
	// Holds are about keys, not the upstream nor the coalescing settings:
	// with the same hold and early refresh rules the new group keeps the
	// old holds, so a read held on a miss is released by its filler's
	// write through the new group; with new rules, the new group forwards
	// writes and closes to the old holds until they have drained
	// (stampede.Protection.Succeed).
	stampedeChanged := !reflect.DeepEqual(cur.Stampede, next.Stampede)
	if upstreamChanged || stampedeChanged {
		old := s.flight.Load()
		fs := s.newFlight(next.Stampede, old.Metrics())
		fs.Succeed(old, stampede.SameMissRules(cur.Stampede, next.Stampede))
		s.flight.Store(fs)
	}
	return append(changed, certs...), nil
}

// upstreamKeys are the changed keys under [upstream], for an error; the
// restart-only ones are left out, refused with their own reason already
// (upstream.seeds was listed twice, found by a probe).
func upstreamKeys(changed []string) []string {
	var keys []string
	restartOnly := false
	for _, k := range changed {
		if !strings.HasPrefix(k, "upstream.") || k == "upstream.max_pinned" {
			continue
		}
		if config.RestartOnly(k) != "" {
			restartOnly = true
		} else {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 && !restartOnly {
		keys = []string{"upstream"}
	}
	return keys
}

// tlsFiles are the files an [upstream.tls] section names.
func tlsFiles(t *config.UpstreamTLS) []string {
	var files []string
	if t != nil {
		for _, f := range []string{t.CAFile, t.CertFile, t.KeyFile} {
			if f != "" {
				files = append(files, f)
			}
		}
	}
	return files
}

// onlyMaxPinned reports whether the upstream sections differ at most in
// max_pinned, which needs no new connections, or in an address their mode
// does not use. (Credentials and databases
// are restart-only, refused before this matters.) [upstream.tls] is
// compared by value; what its files hold, by reloadTLS.
func onlyMaxPinned(a, b *config.Config) bool {
	x, y := a.Upstream, b.Upstream
	x.MaxPinned, y.MaxPinned = 0, 0
	if x.Mode == y.Mode && !x.UsesAddress() {
		x.Address, y.Address = "", "" // not used (config.Changed)
	}
	// Seeds are restart-only, refused before this.
	return reflect.DeepEqual(x, y)
}
