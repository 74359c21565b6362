package config

import (
	"fmt"
	"net"
	"strings"

	"github.com/redproxy/redproxy/internal/namespace"
)

// Names of the listeners server.listen and [server.tls] listen stand for:
// they are the implicit first client listeners, before [[server.listeners]],
// and these names are reserved for them.
const (
	ListenerPlain = "plain" // server.listen
	ListenerTLS   = "tls"   // server.tls.listen
)

// Listener is one [[server.listeners]] entry: a client listener beside
// server.listen and server.tls.listen, with a name that policy scopes
// (policy.scope.listeners), metrics and the slow log know it by.
type Listener struct {
	Name   string `toml:"name"`
	Listen string `toml:"listen"`
	// TLS makes it a TLS listener, with [server.tls]'s certificate, key
	// and client CA unless CertFile and KeyFile name its own (with its own
	// optional ClientCAFile). min_version and handshake_timeout are
	// [server.tls]'s.
	TLS          bool   `toml:"tls"`
	CertFile     string `toml:"cert_file"`
	KeyFile      string `toml:"key_file"`
	ClientCAFile string `toml:"client_ca_file"`
	// ProxyProtocol: whether connections start with a PROXY header; unset
	// takes server.proxy_protocol.
	ProxyProtocol *bool `toml:"proxy_protocol"`
	// Namespace is handed to the sessions of this listener; checked here,
	// applied by the namespace feature.
	Namespace string `toml:"namespace"`
}

// ClientListeners returns every client listener in force, the implicit
// ones first ("plain" for server.listen, "tls" for server.tls.listen),
// each resolved: ProxyProtocol set, and a TLS listener without its own
// certificate given [server.tls]'s files.
func (c *Config) ClientListeners() []Listener {
	pp := c.Server.ProxyProtocol
	var ls []Listener
	if c.Server.Listen != "" {
		ls = append(ls, Listener{Name: ListenerPlain, Listen: c.Server.Listen, ProxyProtocol: &pp})
	}
	if c.Server.TLS.Enabled() {
		t := c.Server.TLS
		ls = append(ls, Listener{Name: ListenerTLS, Listen: t.Listen, TLS: true, CertFile: t.CertFile, KeyFile: t.KeyFile, ClientCAFile: t.ClientCAFile, ProxyProtocol: &pp})
	}
	for _, l := range c.Server.Listeners {
		if l.ProxyProtocol == nil {
			l.ProxyProtocol = &pp
		}
		if l.TLS && l.CertFile == "" && l.KeyFile == "" {
			l.CertFile, l.KeyFile, l.ClientCAFile = c.Server.TLS.CertFile, c.Server.TLS.KeyFile, c.Server.TLS.ClientCAFile
		}
		ls = append(ls, l)
	}
	return ls
}

// UsesProxyProtocol reports whether l expects a PROXY header (on a
// listener from ClientListeners).
func (l Listener) UsesProxyProtocol() bool { return l.ProxyProtocol != nil && *l.ProxyProtocol }

// ServerTLS returns the [server.tls] equivalent of a resolved TLS listener,
// whose ServerConfig reads its certificate files.
func (l Listener) ServerTLS(global ServerTLS) ServerTLS {
	return ServerTLS{Listen: l.Listen, CertFile: l.CertFile, KeyFile: l.KeyFile, ClientCAFile: l.ClientCAFile,
		MinVersion: global.MinVersion, HandshakeTimeout: global.HandshakeTimeout}
}

// inheritsTLSFiles reports whether some [[server.listeners]] entry uses
// [server.tls]'s certificate.
func (c *Config) inheritsTLSFiles() bool {
	for _, l := range c.Server.Listeners {
		if l.TLS && l.CertFile == "" && l.KeyFile == "" {
			return true
		}
	}
	return false
}

// checkListeners checks [[server.listeners]], and that no two client
// listeners share a name or an address.
func (c *Config) checkListeners() []*Error {
	var errs []*Error
	names := map[string]string{ListenerPlain: "server.listen", ListenerTLS: "server.tls.listen"}
	for i, l := range c.Server.Listeners {
		p := fmt.Sprintf("server.listeners[%d]", i)
		bad := func(key, format string, args ...any) {
			errs = append(errs, &Error{Key: p + "." + key, Msg: fmt.Sprintf(format, args...)})
		}
		switch prev, dup := names[l.Name]; {
		case l.Name == "":
			bad("name", "a listener needs a name (policy scopes, metrics and logs use it)")
		case !printableWord(l.Name):
			bad("name", "%q: use printable characters without spaces", l.Name)
		case dup && (l.Name == ListenerPlain || l.Name == ListenerTLS):
			bad("name", "%q is reserved for %s", l.Name, prev)
		case dup:
			bad("name", "%q is already the name of %s", l.Name, prev)
		}
		names[l.Name] = p
		if err := checkHostPort(l.Listen, false); err != nil {
			bad("listen", "%v", err)
		}
		if l.Namespace != "" {
			// The rules of a user's namespace (auth.Validate): one check.
			if _, err := namespace.New(l.Namespace); err != nil {
				bad("namespace", "%q: %v", l.Namespace, err)
			}
		}
		files := []struct{ key, path string }{{"cert_file", l.CertFile}, {"key_file", l.KeyFile}, {"client_ca_file", l.ClientCAFile}}
		if !l.TLS {
			for _, f := range files {
				if f.path != "" {
					bad(f.key, "is set but tls is false")
				}
			}
			continue
		}
		switch {
		case l.CertFile == "" && l.KeyFile == "":
			if l.ClientCAFile != "" {
				bad("client_ca_file", "set cert_file and key_file too, or leave all three to [server.tls]")
			}
			if c.Server.TLS.CertFile == "" || c.Server.TLS.KeyFile == "" {
				bad("tls", "needs a certificate: set cert_file and key_file here or in [server.tls]")
			}
			continue
		case l.CertFile == "":
			bad("cert_file", "is required when key_file is set")
			continue
		case l.KeyFile == "":
			bad("key_file", "is required when cert_file is set")
			continue
		}
		ok := true
		for _, f := range files {
			if f.path != "" {
				if err := readable(f.path); err != nil {
					bad(f.key, "%v", err)
					ok = false
				}
			}
		}
		if ok {
			if _, err := l.ServerTLS(c.Server.TLS).ServerConfig(); err != nil {
				bad("cert_file", "%v", strings.TrimPrefix(err.Error(), "server.tls.cert_file: "))
			}
		}
	}
	addrs := map[string]string{}
	for _, l := range c.ClientListeners() {
		if l.Listen == "" || strings.HasSuffix(l.Listen, ":0") {
			continue
		}
		// (server.listen against server.tls.listen is checkTLS's.)
		if prev, dup := addrs[l.Listen]; dup && !(prev == ListenerPlain && l.Name == ListenerTLS) {
			errs = append(errs, &Error{Key: listenerKey(c, l.Name), Msg: fmt.Sprintf("%q is also the address of listener %q (one port serves one listener)", l.Listen, prev)})
		}
		addrs[l.Listen] = l.Name
	}
	// Two mistakes a port typo makes, which otherwise show only at run
	// time and misleadingly (found by a user's trial): the admin endpoint
	// on a client listener's port failed to bind with "address already
	// in use", as if another process held it; an upstream that is the
	// proxy itself passed the check, then every command waited for its
	// reply timeout while the log said the upstream was reachable.
	for _, l := range c.ClientListeners() {
		if l.Listen == "" || strings.HasSuffix(l.Listen, ":0") {
			continue
		}
		if sameEndpoint(c.Server.Admin, l.Listen) {
			errs = append(errs, &Error{Key: "server.admin", Msg: fmt.Sprintf("%q is also the address of client listener %q (the admin endpoint needs a port of its own)", c.Server.Admin, l.Name)})
		}
		if c.Upstream.Address != "" && sameEndpoint(c.Upstream.Address, l.Listen) {
			errs = append(errs, &Error{Key: "upstream.address", Msg: fmt.Sprintf("%q is the proxy's own client listener %q: the upstream must be Redis", c.Upstream.Address, l.Name)})
		}
	}
	return errs
}

// sameEndpoint reports whether a and b (host:port) name the same socket
// as far as a configuration can tell: the same port, and the same host, or
// a host that is unspecified (listening on every address) or loopback on
// either side.
func sameEndpoint(a, b string) bool {
	ha, pa, err1 := net.SplitHostPort(a)
	hb, pb, err2 := net.SplitHostPort(b)
	if err1 != nil || err2 != nil || pa != pb || pa == "0" {
		return false
	}
	if ha == hb {
		return true
	}
	// Every local address: "" or 0.0.0.0 or ::; the usual names of this
	// host's loopback. (127.0.0.2 is another socket than 127.0.0.1.)
	anyAddr := func(h string) bool {
		ip := net.ParseIP(h)
		return h == "" || ip != nil && ip.IsUnspecified()
	}
	self := func(h string) bool { return h == "localhost" || h == "127.0.0.1" || h == "::1" }
	return (anyAddr(ha) || self(ha)) && (anyAddr(hb) || self(hb))
}

// listenerKey is the dotted key of a listener's listen setting.
func listenerKey(c *Config, name string) string {
	switch name {
	case ListenerPlain:
		return "server.listen"
	case ListenerTLS:
		return "server.tls.listen"
	}
	for i, l := range c.Server.Listeners {
		if l.Name == name {
			return fmt.Sprintf("server.listeners[%d].listen", i)
		}
	}
	return "server.listeners"
}

// printableWord: printable ASCII, no spaces.
func printableWord(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return s != ""
}

// bindListenerScopes lets a [[policy.scope]] name a listener by its
// address, as before listeners had names: an entry that is the listen
// address of exactly one listener (and no listener's name) becomes that
// listener's name. The list is copied, never changed in place.
func (c *Config) bindListenerScopes() {
	ls := c.ClientListeners()
	byName := map[string]bool{}
	byAddr := map[string][]string{}
	for _, l := range ls {
		byName[l.Name] = true
		byAddr[l.Listen] = append(byAddr[l.Listen], l.Name)
	}
	for i := range c.Policy.Scopes {
		s := &c.Policy.Scopes[i]
		var out []string
		for j, e := range s.Listeners {
			if names := byAddr[e]; !byName[e] && len(names) == 1 {
				if out == nil {
					out = append([]string(nil), s.Listeners...)
				}
				out[j] = names[0]
			}
		}
		if out != nil {
			s.Listeners = out
		}
	}
}

// scopeListenerErrors reports scope entries that name no listener: such a
// scope would never apply, silently.
func (c *Config) scopeListenerErrors() []*Error {
	names := map[string]bool{}
	for _, l := range c.ClientListeners() {
		names[l.Name] = true
	}
	var errs []*Error
	for i, s := range c.Policy.Scopes {
		for j, e := range s.Listeners {
			if e != "" && !names[e] {
				errs = append(errs, &Error{Key: fmt.Sprintf("policy.scope[%d].listeners[%d]", i, j), Msg: fmt.Sprintf("no client listener is named %q (names: %s)", e, strings.Join(listenerNames(c), ", "))})
			}
		}
	}
	return errs
}

func listenerNames(c *Config) []string {
	var ns []string
	seen := map[string]bool{}
	for _, l := range c.ClientListeners() {
		if !seen[l.Name] {
			seen[l.Name] = true
			ns = append(ns, fmt.Sprintf("%q", l.Name))
		}
	}
	return ns
}
