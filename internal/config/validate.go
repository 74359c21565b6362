package config

import (
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/config/units"
)

// maxSlowlogLen caps the slow log's memory: an entry is a few hundred bytes.
const maxSlowlogLen = 10000

// maxAuthFailureLimit bounds server.auth_failure_limit: past it the limit
// no longer slows guessing; 0 is how to turn it off.
const maxAuthFailureLimit = 1000000

// check collects every invalid setting rather than stopping at the first, so
// an operator fixes a config in one pass.
func (c *Config) check() []*Error {
	var errs []*Error
	bad := func(key, format string, args ...any) {
		errs = append(errs, &Error{Key: key, Msg: fmt.Sprintf(format, args...)})
	}

	s := &c.Server
	switch {
	case s.Listen == "" && !s.TLS.Enabled() && len(s.Listeners) == 0:
		bad("server.listen", "is empty and neither server.tls.listen nor [[server.listeners]] is set: no client could connect")
	case s.Listen != "":
		if err := checkHostPort(s.Listen, false); err != nil {
			bad("server.listen", "%v; \"\" accepts TLS clients only", err)
		}
	}
	if s.Admin != "" {
		if err := checkHostPort(s.Admin, false); err != nil {
			bad("server.admin", "%v; \"\" turns the admin server off", err)
		}
	}
	switch s.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		bad("server.log_level", "invalid level %q (use debug, info, warn or error)", s.LogLevel)
	}
	switch s.LogFormat {
	case "text", "json":
	default:
		bad("server.log_format", "invalid format %q (use text or json)", s.LogFormat)
	}
	if s.MaxClients <= 0 {
		bad("server.max_clients", "must be > 0, got %d", s.MaxClients)
	}
	if s.MaxRequestBytes < units.KB || s.MaxRequestBytes > 4*units.GB {
		bad("server.max_request_bytes", "must be between 1KB and 4GB, got %v", s.MaxRequestBytes)
	}
	if s.MaxBulkBytes <= 0 || s.MaxBulkBytes > s.MaxRequestBytes {
		bad("server.max_bulk_bytes", "must be > 0 and <= server.max_request_bytes (%v), got %v", s.MaxRequestBytes, s.MaxBulkBytes)
	}
	if s.MaxArgs <= 0 || s.MaxArgs > math.MaxInt32 {
		bad("server.max_args", "must be between 1 and %d, got %d", math.MaxInt32, s.MaxArgs)
	}
	if s.MaxInlineBytes <= 0 || s.MaxInlineBytes > s.MaxRequestBytes {
		bad("server.max_inline_bytes", "must be > 0 and <= server.max_request_bytes (%v), got %v", s.MaxRequestBytes, s.MaxInlineBytes)
	}
	if s.ClientOutputLimit <= 0 {
		bad("server.client_output_limit", "must be > 0, got %v", s.ClientOutputLimit)
	}
	if s.PubSubOutputLimit <= 0 {
		bad("server.pubsub_output_limit", "must be > 0, got %v", s.PubSubOutputLimit)
	}
	if s.PubSubOutputSoftLimit < 0 {
		bad("server.pubsub_output_soft_limit", "must be >= 0 (0 turns it off), got %v", s.PubSubOutputSoftLimit)
	}
	if s.PubSubOutputSoftTime.Duration < 0 {
		bad("server.pubsub_output_soft_time", "must not be negative, got %v", s.PubSubOutputSoftTime)
	}
	nonNegative := func(key string, d units.Duration) {
		if d.Duration < 0 {
			bad(key, "must not be negative, got %v", d)
		}
	}
	nonNegative("server.idle_timeout", s.IdleTimeout)
	nonNegative("server.idle_park_after", s.IdleParkAfter)
	nonNegative("server.client_write_timeout", s.ClientWriteTimeout)
	nonNegative("server.shutdown_timeout", s.ShutdownTimeout)
	nonNegative("server.slowlog_threshold", s.SlowlogThreshold)
	if s.AuthFailureLimit < 0 || s.AuthFailureLimit > maxAuthFailureLimit {
		bad("server.auth_failure_limit", "must be between 0 (no limit) and %d, got %d", maxAuthFailureLimit, s.AuthFailureLimit)
	}
	for i, e := range s.AuthLimitExempt {
		if _, err := parsePrefix(e); err != nil {
			bad(fmt.Sprintf("server.auth_limit_exempt[%d]", i), "%q is neither an IP address nor a CIDR prefix (use e.g. \"127.0.0.1\", \"10.0.0.0/8\", \"::1\")", e)
		}
	}
	if s.SlowlogMaxLen < 0 || s.SlowlogMaxLen > maxSlowlogLen {
		bad("server.slowlog_max_len", "must be between 0 (off) and %d, got %d", maxSlowlogLen, s.SlowlogMaxLen)
	}

	errs = append(errs, checkUpstream(&c.Upstream)...)
	if c.Upstream.Mode == ModeCluster {
		for i, usr := range c.Users {
			// The router's node connections carry [upstream]'s credential
			// only; a user's own would be silently not applied.
			if usr.UpstreamUser != "" {
				bad(fmt.Sprintf("users[%d].upstream_user", i), "a user's own upstream credential is not supported in cluster mode yet")
			}
		}
	}
	errs = append(errs, c.checkRoutes()...)
	errs = append(errs, c.checkTLS()...)
	errs = append(errs, c.checkListeners()...)
	errs = append(errs, c.securityErrors()...)
	errs = append(errs, policyErrors(c.Policy)...)
	errs = append(errs, stampedeErrors(c.Stampede)...)
	errs = append(errs, localcacheErrors(c.LocalCache)...)
	errs = append(errs, c.mirrorErrors()...)
	return errs
}

// MaxDatabases bounds upstream.databases. Redis's default is 16; a
// deployment with thousands of databases is far past what anyone runs.
const MaxDatabases = 10000

// checkUpstream checks the settings of one upstream, [upstream] or a named
// one (checkRoutes rewrites the keys of the latter).
func checkUpstream(u *Upstream) []*Error {
	var errs []*Error
	bad := func(key, format string, args ...any) {
		errs = append(errs, &Error{Key: key, Msg: fmt.Sprintf(format, args...)})
	}
	positive := func(key string, d units.Duration) {
		if d.Duration <= 0 {
			bad(key, "must be > 0, got %v", d)
		}
	}
	// A setting of another mode is almost certainly a forgotten mode =
	// "...": ignoring it would dial the wrong Redis.
	type setting struct {
		key string
		set bool
	}
	notHere := func(keys ...setting) {
		for _, k := range keys {
			if k.set {
				bad(k.key, "is not used with upstream.mode = %q", u.Mode)
			}
		}
	}
	sentinelKeys := []setting{
		{"upstream.sentinels", len(u.Sentinels) > 0},
		{"upstream.master_name", u.MasterName != ""},
		{"upstream.sentinel_username", u.SentinelUsername != ""},
		{"upstream.sentinel_password", u.SentinelPassword != ""},
	}
	seedKeys := []setting{{"upstream.seeds", len(u.Seeds) > 0}}
	switch u.Mode {
	case ModeStandalone:
		if u.Address != EmbeddedAddress {
			if err := checkHostPort(u.Address, true); err != nil {
				bad("upstream.address", "%v (or %q for the in-process demo store)", err, EmbeddedAddress)
			}
		}
		notHere(sentinelKeys...)
		notHere(seedKeys...)
	case ModeSentinel:
		errs = append(errs, checkSentinel(u)...)
		notHere(seedKeys...)
	case ModeCluster:
		if len(u.Seeds) == 0 {
			bad("upstream.seeds", "cluster mode needs at least one seed node (host:port)")
		}
		for _, a := range u.Seeds {
			if err := checkHostPort(a, true); err != nil {
				bad("upstream.seeds", "%q: %v", a, err)
			}
		}
		notHere(sentinelKeys...)
	default:
		bad("upstream.mode", "invalid mode %q (use %q, %q or %q)", u.Mode, ModeStandalone, ModeSentinel, ModeCluster)
	}
	if u.Username != "" && u.Password == "" {
		// AUTH with a username always needs a password; failing here beats
		// failing on every reconnect.
		bad("upstream.username", "is set but upstream.password is empty")
	}
	if u.Connections < 1 || u.Connections > 64 {
		bad("upstream.connections", "must be between 1 and 64, got %d", u.Connections)
	}
	if u.MaxPinned <= 0 {
		bad("upstream.max_pinned", "must be > 0, got %d", u.MaxPinned)
	}
	positive("upstream.dial_timeout", u.DialTimeout)
	positive("upstream.reply_timeout", u.ReplyTimeout)
	// A dead_timeout below reply_timeout acts as reply_timeout (upstream
	// Options), so configurations written before it existed keep working.
	positive("upstream.dead_timeout", u.DeadTimeout)
	positive("upstream.reconnect_min", u.ReconnectMin)
	if u.ReconnectMax.Duration < u.ReconnectMin.Duration {
		bad("upstream.reconnect_max", "must be >= upstream.reconnect_min (%v), got %v", u.ReconnectMin, u.ReconnectMax)
	}
	if u.Databases < 1 || u.Databases > MaxDatabases {
		// The proxy keeps connection state per database and upstream
		// (twice, one per protocol); found by review, 10^12 passed the
		// check and ran the proxy out of memory at start.
		bad("upstream.databases", "must be between 1 and %d, got %d", MaxDatabases, u.Databases)
	}
	errs = append(errs, checkReplicaReads("upstream", u)...)
	return errs
}

// checkSentinel checks the settings of upstream.mode = "sentinel".
func checkSentinel(u *Upstream) []*Error {
	var errs []*Error
	bad := func(key, format string, args ...any) {
		errs = append(errs, &Error{Key: key, Msg: fmt.Sprintf(format, args...)})
	}
	if len(u.Sentinels) == 0 {
		bad("upstream.sentinels", "is empty: sentinel mode needs the Sentinels' addresses, e.g. [\"10.0.0.1:26379\", \"10.0.0.2:26379\"]")
	}
	seen := map[string]bool{}
	for i, addr := range u.Sentinels {
		key := fmt.Sprintf("upstream.sentinels[%d]", i)
		if err := checkHostPort(addr, true); err != nil {
			bad(key, "%v", err)
		} else if seen[addr] {
			bad(key, "%q is listed twice", addr)
		}
		seen[addr] = true
	}
	if u.MasterName == "" {
		bad("upstream.master_name", "is empty: sentinel mode needs the name the Sentinels monitor the primary under (sentinel monitor <name> ...)")
	}
	if u.SentinelUsername != "" && u.SentinelPassword == "" {
		bad("upstream.sentinel_username", "is set but upstream.sentinel_password is empty")
	}
	return errs
}

// checkHostPort accepts "host:port". Port 0 (pick any) is fine for listeners,
// which tests use, but not for an address we dial.
func checkHostPort(addr string, dial bool) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("invalid address %q (use host:port, e.g. \"127.0.0.1:6379\")", addr)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 || (dial && p == 0) {
		return fmt.Errorf("invalid port in %q", addr)
	}
	return nil
}

// securityErrors checks [[users]] and their scopes. (Whether a listener
// may be exposed without authentication is decided when the server starts,
// proxy.NewServer, because it depends on the listener actually bound.)
func (c *Config) securityErrors() []*Error {
	var errs []*Error
	if err := auth.Validate(c.Users, nil); err != nil {
		errs = append(errs, sectionErrors("users", err, func(e error) (string, string, bool) {
			var ue *auth.Error
			if errors.As(e, &ue) {
				return ue.Key, ue.Msg, true
			}
			return "", "", false
		})...)
	}
	errs = append(errs, c.scopeListenerErrors()...)
	errs = append(errs, c.scopeUserErrors()...)
	errs = append(errs, c.overlappingNamespaces()...)
	for i, u := range c.Users {
		if u.Scope != "" && !c.hasScope(u.Scope) {
			errs = append(errs, &Error{Key: fmt.Sprintf("users[%d].scope", i), Msg: fmt.Sprintf("no [[policy.scope]] is named %q", u.Scope)})
		}
	}
	return errs
}

// overlappingNamespaces refuses two different namespaces one of which
// starts with the other ("t1" and "t10", "app:" and "app:admin:"): the
// shorter one's keys would include the longer one's, and its FLUSHDB,
// SCAN and RANDOMKEY reach them (found by review). One namespace shared
// by several users or listeners is fine.
func (c *Config) overlappingNamespaces() []*Error {
	type owner struct{ key, ns string }
	var all []owner
	for i, u := range c.Users {
		if u.Namespace != "" {
			all = append(all, owner{fmt.Sprintf("users[%d].namespace", i), u.Namespace})
		}
	}
	for i, l := range c.Server.Listeners {
		if l.Namespace != "" {
			all = append(all, owner{fmt.Sprintf("server.listeners[%d].namespace", i), l.Namespace})
		}
	}
	var errs []*Error
	for i, a := range all {
		for _, b := range all[:i] {
			if a.ns != b.ns && (strings.HasPrefix(a.ns, b.ns) || strings.HasPrefix(b.ns, a.ns)) {
				errs = append(errs, &Error{Key: a.key, Msg: fmt.Sprintf("%q overlaps %s %q: one namespace's keys would include the other's; end each with a separator such as \":\"", a.ns, b.key, b.ns)})
			}
		}
	}
	return errs
}

// scopeUserErrors reports scope entries that name no user a client can
// be: such a scope would never apply, silently (found by a probe, where
// the listener and users[].scope cases were errors). A client is one of
// the [[users]], or, where it authenticates as none of them, the upstream
// credential's user ("default" without one).
func (c *Config) scopeUserErrors() []*Error {
	names := []string{c.Upstream.Username}
	if names[0] == "" {
		names[0] = "default"
	}
	for _, u := range c.Users {
		names = append(names, u.Name)
	}
	var errs []*Error
	for i, s := range c.Policy.Scopes {
		for j, u := range s.Users {
			if !slices.Contains(names, u) {
				errs = append(errs, &Error{Key: fmt.Sprintf("policy.scope[%d].users[%d]", i, j), Msg: fmt.Sprintf("no user is named %q (users: %s)", u, strings.Join(names, ", "))})
			}
		}
	}
	return errs
}

func (c *Config) hasScope(name string) bool {
	for _, s := range c.Policy.Scopes {
		if s.Name == name {
			return true
		}
	}
	return false
}

// bindUserScopes adds every user that names a [[policy.scope]] to that
// scope's users, so the policy selects the scope by the authenticated user
// wherever the policy is compiled (start, reload, --check). The scope's
// users list is copied, never appended to in place.
func (c *Config) bindUserScopes() {
	for _, u := range c.Users {
		if u.Scope == "" {
			continue
		}
		for i := range c.Policy.Scopes {
			s := &c.Policy.Scopes[i]
			if s.Name == u.Scope && !slices.Contains(s.Users, u.Name) {
				s.Users = append(slices.Clip(s.Users), u.Name)
			}
		}
	}
}

// IsLoopback reports whether a listen address only accepts connections
// from this host: a loopback IP or "localhost". An empty host (all
// interfaces) is not loopback.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// ExposureError says why c must not start, or be reloaded: a client listener that is not
// loopback with neither [[users]] nor an upstream password (anyone who
// reaches it could use Redis), unless server.allow_unauthenticated is set.
func ExposureError(c *Config) error {
	if len(c.Users) > 0 || c.Upstream.Password != "" || c.Server.AllowUnauthenticated {
		return nil
	}
	// Every client listener (TLS without client certificates lets anyone
	// in just the same as plaintext).
	for _, l := range c.ClientListeners() {
		if IsLoopback(l.Listen) || l.TLS && l.ClientCAFile != "" {
			continue
		}
		return &Error{Key: listenerKey(c, l.Name), Msg: fmt.Sprintf("listener %q at %q is not a loopback address, and with no [[users]] and no upstream.password anyone who reaches it could use Redis through the proxy; configure [[users]] or upstream.password, listen on 127.0.0.1, or set server.allow_unauthenticated = true (--allow-unauthenticated, REDPROXY_ALLOW_UNAUTHENTICATED=true) to accept that", l.Name, l.Listen)}
	}
	return nil
}
