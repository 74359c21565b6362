package proxy

import (
	"crypto/tls"
	"fmt"
	"net"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/redproxy/redproxy/internal/config"
)

// Client listeners (config.Config.ClientListeners): server.listen is
// "plain", server.tls.listen is "tls", and each [[server.listeners]] entry
// has its own name. The set is fixed at start (restart-only); a reload only
// re-reads the certificates of the TLS ones. Sessions know the listener
// they came through: policy scopes select on its name, the slow log shows
// it, and its namespace is handed to the session.

// listener is one client listener the server may serve.
type listener struct {
	cfg config.Listener // resolved: ProxyProtocol set, TLS files filled in
	// live is the TLS configuration the next handshake uses; nil on a
	// plaintext listener. conf asks it on every handshake, so a reload's
	// certificate applies to connections accepted after it.
	live     atomic.Pointer[tls.Config]
	conf     *tls.Config
	accepted prometheus.Counter
}

func (l *listener) secure() bool { return l.conf != nil }

// listenerState is the server's client listeners, by name.
type listenerState struct {
	byName   map[string]*listener
	accepted *prometheus.CounterVec
}

// initListeners builds the client listeners of s.cfg, reading the
// certificates of the TLS ones. It runs within initTLS, before anything
// dials.
func initListeners(s *Server) error {
	st := &s.listeners
	st.byName = map[string]*listener{}
	st.accepted = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "redproxy_listener_connections_total",
		Help: "Client connections accepted, by listener name (server.listen is \"plain\", server.tls.listen \"tls\", [[server.listeners]] their own).",
	}, []string{"listener"})
	if err := s.metrics.Registry.Register(st.accepted); err != nil {
		return err
	}
	for _, lc := range s.cfg.ClientListeners() {
		if _, err := st.add(lc, s.cfg.Server.TLS); err != nil {
			return err
		}
	}
	return nil
}

func (st *listenerState) add(lc config.Listener, global config.ServerTLS) (*listener, error) {
	l := &listener{cfg: lc, accepted: st.accepted.WithLabelValues(lc.Name)}
	if lc.TLS {
		c, err := lc.ServerTLS(global).ServerConfig()
		if err != nil {
			return nil, fmt.Errorf("listener %q: %w", lc.Name, err)
		}
		l.live.Store(c)
		l.conf = &tls.Config{
			GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return l.live.Load(), nil },
		}
	}
	st.byName[lc.Name] = l
	return l, nil
}

// reloadListenerTLS reads the certificates of every TLS listener from
// next, and returns what installs them once the reload is accepted.
func (s *Server) reloadListenerTLS(next *config.Config) (apply func() (rotated []string), err error) {
	type swap struct {
		l    *listener
		c    *tls.Config
		file string
	}
	var swaps []swap
	for _, lc := range next.ClientListeners() {
		l := s.listeners.byName[lc.Name]
		if l == nil || !l.secure() || !lc.TLS {
			continue // listeners are restart-only: Reload refuses a change
		}
		c, err := lc.ServerTLS(next.Server.TLS).ServerConfig()
		if err != nil {
			return nil, fmt.Errorf("listener %q: %w", lc.Name, err)
		}
		swaps = append(swaps, swap{l, c, lc.CertFile})
	}
	return func() (rotated []string) {
		for _, w := range swaps {
			if old := w.l.live.Swap(w.c); !sameCertificates(old, w.c) {
				s.log.Info("TLS certificate reloaded; new clients get it, connected ones keep theirs",
					"listener", w.l.cfg.Name, "cert_file", w.file, "expires", config.CertificateExpiry(w.c))
				rotated = append(rotated, w.l.cfg.Name)
			}
		}
		return rotated
	}, nil
}

// ServeListener accepts clients on ln for the configured client listener
// named name (config.ListenerPlain, config.ListenerTLS or a
// [[server.listeners]] name) until Shutdown; ln is a plain TCP listener,
// the server runs TLS handshakes itself.
func (s *Server) ServeListener(name string, ln net.Listener) error {
	l := s.listeners.byName[name]
	if l == nil {
		ln.Close()
		return fmt.Errorf("redproxy: no client listener is named %q", name)
	}
	return s.serve(ln, l)
}

// plainListener is the listener Serve uses: "plain", or one like it when
// server.listen is off (Serve then still serves plaintext, as it always
// has).
func (s *Server) plainListener() *listener {
	if l := s.listeners.byName[config.ListenerPlain]; l != nil && !l.secure() {
		return l
	}
	pp := s.cfg.Server.ProxyProtocol
	return &listener{cfg: config.Listener{Name: config.ListenerPlain, ProxyProtocol: &pp}, accepted: s.listeners.accepted.WithLabelValues(config.ListenerPlain)}
}

// listenerName is the name of the listener the client came through.
func (sess *Session) listenerName() string {
	if sess.listener == nil {
		return config.ListenerPlain
	}
	return sess.listener.cfg.Name
}
