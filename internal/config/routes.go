package config

import (
	"fmt"
	"sort"
	"strings"

	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/glob"
)

// Route sends the keys ([[route]]) or channels ([[channel_route]])
// matching Pattern, a glob as in SCAN MATCH, to the named upstream
// Upstream. Routes are tried in the order written; the first match wins.
type Route struct {
	Pattern  string `toml:"pattern"`
	Upstream string `toml:"upstream"`
}

// DefaultUpstream is the name under which routes and metrics refer to
// [upstream], where every key no route matches goes.
const DefaultUpstream = "default"

// maxUpstreams bounds the named upstreams: a SCAN cursor carries the
// upstream's index in its low bits (proxy/routes.go), and metrics carry
// the names as a label.
const maxUpstreams = 63

// Routed reports whether routes are configured: key or channel routes.
// Named upstreams alone do not route: [mirror] may name one that no route
// sends traffic to, and the proxy must not depend on it being up.
func (c *Config) Routed() bool {
	return len(c.Routes) > 0 || len(c.ChannelRoutes) > 0
}

// UpstreamNames are the named upstreams in a fixed order: [upstream] is
// index 0 (DefaultUpstream), then the [upstreams.NAME] sorted by name.
func (c *Config) UpstreamNames() []string {
	names := make([]string, 0, len(c.Upstreams)+1)
	for n := range c.Upstreams {
		names = append(names, n)
	}
	sort.Strings(names)
	return append([]string{DefaultUpstream}, names...)
}

// NamedUpstream is the settings of upstream name (DefaultUpstream is
// [upstream]).
func (c *Config) NamedUpstream(name string) Upstream {
	if name == DefaultUpstream {
		return c.Upstream
	}
	// Defaults again: a Config built in Go rather than parsed has not had
	// them filled.
	return withUpstreamDefaults(c.Upstreams[name])
}

// fillUpstreamDefaults gives the named upstreams the built-in defaults
// for what they leave unset, as [upstream] has them. Zero is never a
// valid value of the settings filled, so it means "not set".
func (c *Config) fillUpstreamDefaults() {
	if len(c.Upstreams) == 0 {
		return
	}
	filled := make(map[string]Upstream, len(c.Upstreams))
	for name, u := range c.Upstreams {
		filled[name] = withUpstreamDefaults(u)
	}
	c.Upstreams = filled
}

// withUpstreamDefaults is u with what it leaves unset at [upstream]'s
// built-in defaults.
func withUpstreamDefaults(u Upstream) Upstream {
	d := Default().Upstream
	if u.Mode == "" {
		u.Mode = d.Mode
	}
	if u.Sentinels == nil {
		u.Sentinels = []string{}
	}
	if u.Seeds == nil {
		u.Seeds = []string{}
	}
	if u.Connections == 0 {
		u.Connections = d.Connections
	}
	if u.MaxPinned == 0 {
		u.MaxPinned = d.MaxPinned
	}
	if u.ReadFrom == "" {
		u.ReadFrom = d.ReadFrom
	}
	for _, f := range []struct{ dst, def *units.Duration }{
		{&u.DialTimeout, &d.DialTimeout}, {&u.ReplyTimeout, &d.ReplyTimeout}, {&u.DeadTimeout, &d.DeadTimeout},
		{&u.ReconnectMin, &d.ReconnectMin}, {&u.ReconnectMax, &d.ReconnectMax},
		{&u.MaxReplicaLag, &d.MaxReplicaLag}, {&u.ReplicaPollInterval, &d.ReplicaPollInterval},
	} {
		if f.dst.Duration == 0 {
			*f.dst = *f.def
		}
	}
	if u.Databases == 0 {
		u.Databases = d.Databases
	}
	return u
}

// checkRoutes checks the named upstreams as [upstream] is checked, and
// that every route names an upstream that exists.
func (c *Config) checkRoutes() []*Error {
	var errs []*Error
	bad := func(key, format string, args ...any) {
		errs = append(errs, &Error{Key: key, Msg: fmt.Sprintf(format, args...)})
	}
	if !c.Routed() && len(c.Upstreams) == 0 {
		return nil
	}
	if len(c.Upstreams) > maxUpstreams {
		bad("upstreams", "at most %d named upstreams are supported, got %d", maxUpstreams, len(c.Upstreams))
	}
	for _, name := range c.UpstreamNames()[1:] {
		prefix := "upstreams." + name
		if name == DefaultUpstream {
			bad(prefix, "the name %q is [upstream]'s; choose another", DefaultUpstream)
			continue
		}
		if name == "" || strings.ContainsAny(name, " \t\r\n\"'") {
			bad(prefix, "invalid upstream name %q", name)
			continue
		}
		u := c.NamedUpstream(name)
		if u.Address == EmbeddedAddress {
			bad(prefix+".address", "the embedded store can only be [upstream]")
		}
		rekey := func(list []*Error) {
			for _, e := range list {
				if rest, ok := strings.CutPrefix(e.Key, "upstream."); ok {
					e.Key = prefix + "." + rest
				}
				e.Msg = strings.ReplaceAll(e.Msg, "upstream.", prefix+".")
				errs = append(errs, e)
			}
		}
		rekey(checkUpstream(&u))
		if u.TLS != nil {
			if _, err := u.ClientTLS(); err != nil {
				rekey(tlsErrorList(err))
			}
		}
		if u.Mode == ModeCluster && u.ReadFrom != ReadPrimary {
			bad(prefix+".read_from", "reads from replicas of a cluster named upstream are not supported yet (use %q)", ReadPrimary)
		}
		if u.Mode == ModeCluster {
			for i, usr := range c.Users {
				if usr.UpstreamUser != "" {
					bad(fmt.Sprintf("users[%d].upstream_user", i), "a user's own upstream credential is not supported with a cluster upstream (%s) yet", prefix)
				}
			}
		}
	}
	if !c.Routed() {
		return errs // named upstreams only, for [mirror]: checked above
	}
	if c.Upstream.Mode == ModeCluster {
		bad("upstream.mode", "routes need [upstream] in %q or %q mode; a cluster can be a named upstream ([upstreams.NAME])", ModeStandalone, ModeSentinel)
	}
	checkList := func(section string, routes []Route) {
		for i, r := range routes {
			key := fmt.Sprintf("%s[%d]", section, i)
			if r.Pattern == "" {
				bad(key+".pattern", "is empty")
			} else if err := glob.Check(r.Pattern); err != nil {
				bad(key+".pattern", "%v", err)
			}
			if _, ok := c.Upstreams[r.Upstream]; !ok && r.Upstream != DefaultUpstream {
				bad(key+".upstream", "no [upstreams.%s] is configured (named upstreams: %s)", r.Upstream, strings.Join(c.UpstreamNames(), ", "))
			}
		}
	}
	checkList("route", c.Routes)
	checkList("channel_route", c.ChannelRoutes)
	return errs
}

// tlsErrorList flattens an error of ClientTLS into *Errors.
func tlsErrorList(err error) []*Error {
	var out []*Error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			out = append(out, tlsErrorList(e)...)
		}
		return out
	}
	if e, ok := err.(*Error); ok {
		return []*Error{e}
	}
	return []*Error{{Key: "upstream.tls", Msg: err.Error()}}
}
