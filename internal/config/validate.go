package config

import (
	"fmt"
	"math"
	"net"
	"strconv"

	"github.com/redproxy/redproxy/internal/config/units"
)

// maxSlowlogLen caps the slow log's memory: an entry is a few hundred bytes.
const maxSlowlogLen = 10000

// check collects every invalid setting rather than stopping at the first, so
// an operator fixes a config in one pass.
func (c *Config) check() []*Error {
	var errs []*Error
	bad := func(key, format string, args ...any) {
		errs = append(errs, &Error{Key: key, Msg: fmt.Sprintf(format, args...)})
	}

	s := &c.Server
	if err := checkHostPort(s.Listen, false); err != nil {
		bad("server.listen", "%v", err)
	}
	if s.Admin != "" {
		if err := checkHostPort(s.Admin, false); err != nil {
			bad("server.admin", "%v (use \"\" to disable the admin server)", err)
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
	nonNegative := func(key string, d units.Duration) {
		if d.Duration < 0 {
			bad(key, "must not be negative, got %v", d)
		}
	}
	positive := func(key string, d units.Duration) {
		if d.Duration <= 0 {
			bad(key, "must be > 0, got %v", d)
		}
	}
	nonNegative("server.idle_timeout", s.IdleTimeout)
	nonNegative("server.client_write_timeout", s.ClientWriteTimeout)
	nonNegative("server.shutdown_timeout", s.ShutdownTimeout)
	nonNegative("server.slowlog_threshold", s.SlowlogThreshold)
	if s.SlowlogMaxLen < 0 || s.SlowlogMaxLen > maxSlowlogLen {
		bad("server.slowlog_max_len", "must be between 0 (off) and %d, got %d", maxSlowlogLen, s.SlowlogMaxLen)
	}

	u := &c.Upstream
	switch u.Mode {
	case ModeStandalone:
	case ModeCluster:
		if len(u.Seeds) == 0 {
			bad("upstream.seeds", "cluster mode needs at least one seed node (host:port)")
		}
		for _, a := range u.Seeds {
			if err := checkHostPort(a, true); err != nil {
				bad("upstream.seeds", "%q: %v", a, err)
			}
		}
		if c.LocalCache.Enabled {
			// Tracking is per node and slots move between nodes; the
			// tier does not follow them yet (docs/COMPATIBILITY.md).
			bad("localcache.enabled", "the local tier is not supported in cluster mode yet")
		}
	default:
		bad("upstream.mode", "must be %q or %q, got %q", ModeStandalone, ModeCluster, u.Mode)
	}
	if u.Address != EmbeddedAddress {
		if err := checkHostPort(u.Address, true); err != nil {
			bad("upstream.address", "%v (or %q for the in-process demo store)", err, EmbeddedAddress)
		}
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
	if u.Databases < 1 {
		bad("upstream.databases", "must be > 0, got %d", u.Databases)
	}
	errs = append(errs, policyErrors(c.Policy)...)
	errs = append(errs, stampedeErrors(c.Stampede)...)
	errs = append(errs, localcacheErrors(c.LocalCache)...)
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
