package config

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"

	"github.com/redproxy/redproxy/internal/mirror"
)

// MirrorUpstream returns the named upstream [mirror] sends to, with the
// settings the entry leaves out (pool size, timeouts, databases) at their
// defaults; ok is false when mirroring is off. Credentials and TLS are the
// entry's own, never [upstream]'s.
func (c *Config) MirrorUpstream() (u Upstream, ok bool) {
	if !c.Mirror.Enabled() {
		return Upstream{}, false
	}
	u, ok = c.Upstreams[c.Mirror.Upstream]
	if !ok {
		return Upstream{}, false
	}
	return withUpstreamDefaults(u), true
}

// mirrorErrors checks [mirror] and the upstream it names.
func (c *Config) mirrorErrors() []*Error {
	errs := sectionErrors("mirror", c.Mirror.Validate(), func(e error) (string, string, bool) {
		var me *mirror.Error
		if errors.As(e, &me) {
			return me.Key, me.Msg, true
		}
		return "", "", false
	})
	name := c.Mirror.Upstream
	if name == "" {
		return errs
	}
	bad := func(format string, args ...any) {
		errs = append(errs, &Error{Key: "mirror.upstream", Msg: fmt.Sprintf(format, args...)})
	}
	raw, ok := c.Upstreams[name]
	if !ok {
		names := slices.Sorted(maps.Keys(c.Upstreams))
		if len(names) == 0 {
			bad("names %q, but there is no [upstreams.%s] section", name, name)
		} else {
			bad("names %q, but there is no [upstreams.%s] section (named upstreams: %s)", name, name, strings.Join(names, ", "))
		}
		return errs
	}
	u := withUpstreamDefaults(raw)
	section := "upstreams." + name
	// Every upstream clients' commands go to: [upstream] and each one a
	// route names. A mirror that is one of them runs every write twice.
	served := map[string]Upstream{DefaultUpstream: c.Upstream}
	for _, r := range slices.Concat(c.Routes, c.ChannelRoutes) {
		for _, target := range r.Targets() {
			if target == name {
				bad("%s is where a [[route]] or [[channel_route]] (pattern %q) sends clients' commands: mirroring to it would run every write twice", section, r.Pattern)
				return errs
			}
			if up, ok := c.Upstreams[target]; ok {
				served[target] = withUpstreamDefaults(up)
			}
		}
	}
	for _, other := range slices.Sorted(maps.Keys(served)) {
		p, what := served[other], "[upstreams."+other+"]"
		if other == DefaultUpstream {
			what = "[upstream]"
		}
		switch u.Mode {
		case ModeSentinel:
			// Its own keys (sentinels, master_name) are checked with the
			// named upstreams.
			if p.Mode == ModeSentinel && u.MasterName == p.MasterName && overlap(u.Sentinels, p.Sentinels) {
				bad("%s watches %s's primary (master_name %q through the same Sentinels): mirroring to the primary itself would run every write twice", section, what, u.MasterName)
			}
		case ModeCluster:
			// A cluster has database 0 only: the commands of clients in
			// other databases are dropped (db_range), as
			// docs/COMPATIBILITY.md says.
			if overlap(u.Seeds, p.Seeds) || overlap(u.Seeds, []string{p.Address}) {
				bad("%s.seeds name %s's nodes: mirroring to the primary itself would run every write twice", section, what)
			}
		default:
			if p.Mode == ModeStandalone && sameAddress(u.Address, p.Address) {
				bad("%s.address is %s's address (%s): mirroring to the primary itself would run every write twice", section, what, p.Address)
			}
		}
	}
	if u.Mode == ModeStandalone {
		switch {
		case u.Address == EmbeddedAddress:
			bad("%s.address: the embedded demo store cannot be a mirror", section)
		case checkHostPort(u.Address, true) != nil:
			bad("%s.address: %v", section, checkHostPort(u.Address, true))
		}
	}
	if u.Username != "" && u.Password == "" {
		bad("%s.username is set but its password is empty", section)
	}
	if u.Mode != ModeCluster && u.Databases < c.Upstream.Databases {
		bad("%s.databases (%d) is less than upstream.databases (%d): clients' commands in the higher databases could not be mirrored", section, u.Databases, c.Upstream.Databases)
	}
	if u.TLS != nil {
		for _, e := range u.TLS.check() {
			bad("%s.%s: %s", section, strings.TrimPrefix(e.Key, "upstream."), e.Msg)
		}
	}
	return errs
}

// overlap reports whether a and b share an address (sameAddress).
func overlap(a, b []string) bool {
	for _, x := range a {
		for _, y := range b {
			if sameAddress(x, y) {
				return true
			}
		}
	}
	return false
}

// sameAddress reports whether a and b name the same server as far as the
// text tells without a DNS lookup: the same port, and the same host up to
// case, or both on this machine's loopback ("localhost", 127.0.0.0/8,
// ::1), which the mirror check once took for different servers.
func sameAddress(a, b string) bool {
	if a == b {
		return a != ""
	}
	ha, pa, err1 := net.SplitHostPort(a)
	hb, pb, err2 := net.SplitHostPort(b)
	if err1 != nil || err2 != nil || pa != pb {
		return false
	}
	return strings.EqualFold(ha, hb) || LoopbackHost(ha) && LoopbackHost(hb)
}

// LoopbackHost reports whether h, a host without a port, names this host
// only: "localhost" in any case, or a loopback IP.
func LoopbackHost(h string) bool {
	if strings.EqualFold(h, "localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}
