package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/resp"
	"github.com/redproxy/redproxy/internal/sentinel"
	"github.com/redproxy/redproxy/internal/upstream"
)

var (
	// roleHello asks a candidate primary its role: HELLO's reply has a
	// "role" field, and any user may send HELLO, while ROLE is @admin
	// and @dangerous, refused to a hardened user (found by review: the
	// proxy then never found a primary). HELLO 2 keeps the check's
	// connection on RESP2; it is thrown away after.
	roleHello = resp.AppendCommandStrings(nil, "HELLO", "2")
	// cmdRole is asked when HELLO is refused (unknown before Redis 6).
	cmdRole = resp.AppendCommandStrings(nil, "ROLE")
)

// newSentinelWatcher sets up the watcher of upstream.mode = "sentinel"
// and returns the primary to start with. When the caller asked the
// Sentinels already (start, from FindSentinelPrimary), that answer and the
// watcher that got it are kept; else they are asked now. "" when none is
// known yet: the proxy then starts anyway, not ready (/readyz 503, clients
// get "upstream unavailable"), and switches as soon as the watcher finds
// one.
func (s *Server) newSentinelWatcher(cfg *config.Config, start *SentinelStart) string {
	if start == nil {
		start = FindSentinelPrimary(cfg, s.log)
	}
	start.onSwitch = s.failover
	s.sentinel = start.w
	// With routes every upstream's metrics carry its name, [upstream]'s
	// too (as its connection metrics: NewServer); without, no label, as
	// before named upstreams had the gauge.
	reg := prometheus.Registerer(s.metrics.Registry)
	if cfg.Routed() {
		reg = prometheus.WrapRegistererWith(prometheus.Labels{"upstream": config.DefaultUpstream}, reg)
	}
	reg.MustRegister(sentinelsAnswering(s.sentinel))
	return start.Primary
}

// sentinelsAnswering is the gauge of how many of an upstream's Sentinels
// answered w's last check; registered labelled with the upstream's name
// when routes are configured ([upstream] and each named Sentinel
// upstream: routes.go).
func sentinelsAnswering(w *sentinel.Watcher) prometheus.GaugeFunc {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "redproxy_sentinels_answering",
		Help: "Sentinels of an upstream in Sentinel mode that answered the last check (counting stops at a majority; -1 before the first). 0: a failover cannot be followed.",
	}, func() float64 { return float64(w.Answering()) })
}

// SentinelStart is what FindSentinelPrimary found: the primary, and the
// watcher that asked for it, which the server keeps (Options.Sentinel)
// instead of building another. What the first question learnt so carries
// over: with no Sentinel answering, the warning saying so is logged once,
// where a second watcher said it again at its first check (found by
// review).
type SentinelStart struct {
	// Primary is the primary the Sentinels named, "" if none is known.
	Primary string
	w       *sentinel.Watcher
	// onSwitch is the watcher's OnSwitch, set by NewServer before the
	// watcher starts (no switch is made before Start).
	onSwitch func(addr string)
}

// Close stops the watcher, for a caller that gives it to no server;
// NewServer takes it over, and closes it when it fails.
func (st *SentinelStart) Close() {
	if st != nil {
		st.w.Close()
	}
}

// FindSentinelPrimary asks the Sentinels of cfg (upstream.mode =
// "sentinel") for the primary, for what the caller must read from Redis
// before the proxy starts (its command table and version). The answer
// goes to NewServer (Options.Sentinel), or is closed.
func FindSentinelPrimary(cfg *config.Config, log *slog.Logger) *SentinelStart {
	st := &SentinelStart{}
	o := sentinelOptions(cfg, log)
	o.OnSwitch = func(addr string) { st.onSwitch(addr) }
	st.w = sentinel.New(o)
	st.Primary = discoverAtStart(st.w, cfg, log)
	return st
}

func discoverAtStart(w *sentinel.Watcher, cfg *config.Config, log *slog.Logger) string {
	u := cfg.Upstream
	// Each Sentinel gets its dial timeout, twice (two questions), and the
	// candidates their role check.
	ctx, cancel := context.WithTimeout(context.Background(), 3*u.DialTimeout.Duration*time.Duration(len(u.Sentinels)))
	defer cancel()
	addr, _, err := w.Discover(ctx, "", -1)
	if err != nil {
		log.Warn("sentinel: no primary found at start; not ready until one is", "master_name", u.MasterName, "err", err)
		return ""
	}
	log.Info("sentinel: primary found", "master_name", u.MasterName, "primary", addr)
	return addr
}

func sentinelOptions(cfg *config.Config, log *slog.Logger) sentinel.Options {
	u := cfg.Upstream
	// [upstream.tls] covers the Sentinels and the data nodes alike. The
	// files were checked when the configuration loaded; if they have
	// become unreadable since, trust nothing rather than fall back to
	// plaintext.
	tlsConf, err := u.ClientTLS()
	if err != nil {
		log.Error("sentinel: [upstream.tls] files unreadable; no connection will verify", "err", err)
		tlsConf = &tls.Config{RootCAs: x509.NewCertPool()}
	}
	// One holder for the Sentinel dials and the role checks of the
	// candidates, which a reload updates (Watcher.SetTLS).
	cur := new(atomic.Pointer[tls.Config])
	cur.Store(tlsConf)
	return sentinel.Options{
		TLS:        cur,
		Sentinels:  u.Sentinels,
		MasterName: u.MasterName,
		Username:   u.SentinelUsername,
		Password:   u.SentinelPassword,
		Role: func(addr string) ([]byte, error) {
			// With Redis's credentials, as the data path dials. RoundTrip
			// waits DeadTimeout for the reply (30 s when unset): a
			// candidate that took the handshake and then stalled held
			// Discover that long; HELLO and ROLE answer at once or not at
			// all.
			o := upstream.Options{
				Addr: addr, Username: u.Username, Password: u.Password, TLS: cur.Load(),
				DialTimeout: u.DialTimeout.Duration, ReplyTimeout: u.ReplyTimeout.Duration,
				DeadTimeout: u.ReplyTimeout.Duration, Name: "redproxy-sentinel-check", Logger: log,
			}
			r, err := upstream.RoundTrip(o, roleHello)
			if err != nil || !resp.IsError(r) {
				return r, err
			}
			role, err := upstream.RoundTrip(o, cmdRole)
			if err != nil || !resp.IsError(role) {
				return role, err
			}
			return nil, fmt.Errorf("HELLO refused (%s) and ROLE refused (%s)", trimErr(r), trimErr(role))
		},
		DialTimeout:  u.DialTimeout.Duration,
		ReconnectMax: u.ReconnectMax.Duration,
		Logger:       log,
	}
}

// trimErr is an error reply's text, for a log line.
func trimErr(r []byte) string {
	return strings.TrimSpace(string(r[1:min(len(r), 200)]))
}

// readOnlyHook is what the backend calls on a -READONLY reply: in
// Sentinel mode, the primary may have been demoted, so the watcher checks
// at once instead of at its next poll.
func (s *Server) readOnlyHook() func() {
	if s.sentinel == nil {
		return nil
	}
	return s.sentinel.Recheck
}

// failover moves the proxy to the new primary addr, as a reload changing
// upstream.address would, but without waiting on the old server:
//
//   - for the proxy's pools and every user credential's:
//     requests still waiting on the old primary fail with "connection
//     lost" (never resent: a write may have run), and the dedicated
//     connections to it (MULTI, blocking commands, pub/sub, MONITOR,
//     tracking) are cut, so their clients see the loss (Backend.Failover);
//   - with the local tier on, the tier drops every entry and keeps no
//     fill from the old primary, then tracks on the new one
//     (localcache.Cache.SwitchUpstream): after the switch no read is
//     answered with a value read from the old primary (C4);
//   - a new coalescing group, so no read joins a fetch sent to the old
//     primary;
//   - the new primary's command table, read once its dials report it, in
//     the background (upstreamSeen, cmdtable.go).
func (s *Server) failover(addr string) {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	cfg := s.Config()
	s.upstreamAddr = addr
	switchBackend := func() {
		// Users with their own upstream credential have pools of their
		// own; left behind, their writes were acknowledged by the old
		// primary and lost, then failed for good (found by review).
		moveBackends(true, append([]backendMove{{s.backend, s.mainBackendOptions(cfg, addr)}}, s.userMoves(cfg, addr)...))
	}
	if s.tier != nil {
		s.tier.cache.SwitchUpstream(switchBackend)
	} else {
		switchBackend()
	}
	s.newFlightGroup(cfg)
	s.log.Warn("upstream switched to the new primary", "upstream", addr)
}

// newFlightGroup starts a new coalescing group after a failover, keeping
// the miss holds (they are about keys, not the upstream). The caller holds
// reloadMu. No read joins a fetch already sent in any case (the join rule,
// package stampede: a read arriving while one is in flight collects behind
// it and fetches anew, from the upstream in force then); with a new group
// it does not even wait behind a fetch to the old primary.
func (s *Server) newFlightGroup(cfg *config.Config) {
	old := s.flight.Load()
	fs := s.newFlight(cfg.Stampede, old.Metrics())
	fs.KeepMisses(old)
	s.flight.Store(fs)
}

// SentinelPrimary returns the primary the Sentinel watcher knows, or ""
// when none is known or the proxy is not in Sentinel mode.
func (s *Server) SentinelPrimary() string {
	if s.sentinel == nil {
		return ""
	}
	return s.sentinel.Primary()
}
