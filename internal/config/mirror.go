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
	if u.Mode != ModeStandalone {
		bad("%s is a %q upstream; the mirror supports standalone upstreams only (mode = %q, with address)", section, u.Mode, ModeStandalone)
		return errs
	}
	switch {
	case u.Address == EmbeddedAddress:
		bad("%s.address: the embedded demo store cannot be a mirror", section)
	case checkHostPort(u.Address, true) != nil:
		bad("%s.address: %v", section, checkHostPort(u.Address, true))
	case c.Upstream.Mode == ModeStandalone && u.Address == c.Upstream.Address:
		bad("%s.address is upstream.address: mirroring to the primary itself would run every write twice", section)
	}
	if u.Username != "" && u.Password == "" {
		bad("%s.username is set but its password is empty", section)
	}
	if u.Databases < c.Upstream.Databases {
		bad("%s.databases (%d) is less than upstream.databases (%d): clients' commands in the higher databases could not be mirrored", section, u.Databases, c.Upstream.Databases)
	}
	if u.TLS != nil {
		for _, e := range u.TLS.check() {
			bad("%s.%s: %s", section, strings.TrimPrefix(e.Key, "upstream."), e.Msg)
		}
	}
	return errs
}
