package config

import (
	"errors"
	"fmt"
	"maps"
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
	switch u.Mode {
	case ModeSentinel:
		// Its own keys (sentinels, master_name) are checked with the named
		// upstreams.
		if c.Upstream.Mode == ModeSentinel && u.MasterName == c.Upstream.MasterName && overlap(u.Sentinels, c.Upstream.Sentinels) {
			bad("%s watches [upstream]'s primary (master_name %q through the same Sentinels): mirroring to the primary itself would run every write twice", section, u.MasterName)
		}
	case ModeCluster:
		// A cluster has database 0 only: the commands of clients in other
		// databases are dropped (db_range), as docs/COMPATIBILITY.md says.
		if overlap(u.Seeds, c.Upstream.Seeds) || slices.Contains(u.Seeds, c.Upstream.Address) {
			bad("%s.seeds name [upstream]'s nodes: mirroring to the primary itself would run every write twice", section)
		}
	default:
		switch {
		case u.Address == EmbeddedAddress:
			bad("%s.address: the embedded demo store cannot be a mirror", section)
		case checkHostPort(u.Address, true) != nil:
			bad("%s.address: %v", section, checkHostPort(u.Address, true))
		case c.Upstream.Mode == ModeStandalone && u.Address == c.Upstream.Address:
			bad("%s.address is upstream.address: mirroring to the primary itself would run every write twice", section)
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

// overlap reports whether a and b share an address.
func overlap(a, b []string) bool {
	for _, x := range a {
		if slices.Contains(b, x) {
			return true
		}
	}
	return false
}
