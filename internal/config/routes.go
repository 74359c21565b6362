package config

import (
	"fmt"
	"net"
	"slices"
	"sort"
	"strings"

	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/glob"
	"github.com/redproxy/redproxy/internal/route"
)

// Route sends the keys ([[route]]) or channels ([[channel_route]])
// matching Pattern, a glob as in SCAN MATCH, to the named upstream
// Upstream. Routes are tried in the order written; the first match wins.
//
// A [[route]] may instead spread its keys over several upstreams
// (Upstreams), by a hash of the key as twemproxy does, so that a
// twemproxy pool can be replaced with every key found where it was: the
// same Hash, Distribution, HashTag, per-upstream Weights and
// ServerNames (the names twemproxy hashes its servers under; by default
// each upstream's "host:port", as twemproxy's default).
type Route struct {
	Pattern      string   `toml:"pattern"`
	Upstream     string   `toml:"upstream,omitempty"`
	Upstreams    []string `toml:"upstreams,omitempty"`
	Distribution string   `toml:"distribution,omitempty"`
	Hash         string   `toml:"hash,omitempty"`
	HashTag      string   `toml:"hash_tag,omitempty"`
	Weights      []int    `toml:"weights,omitempty"`
	ServerNames  []string `toml:"server_names,omitempty"`
}

// Equal reports whether r and o route the same way.
func (r Route) Equal(o Route) bool {
	return r.Pattern == o.Pattern && r.Upstream == o.Upstream && slices.Equal(r.Upstreams, o.Upstreams) &&
		r.Distribution == o.Distribution && r.Hash == o.Hash && r.HashTag == o.HashTag &&
		slices.Equal(r.Weights, o.Weights) && slices.Equal(r.ServerNames, o.ServerNames)
}

// Targets are the upstreams r sends keys to.
func (r Route) Targets() []string {
	if len(r.Upstreams) > 0 {
		return r.Upstreams
	}
	return []string{r.Upstream}
}

// RingNames are the names each of r's Upstreams is hashed under: its
// ServerNames, or else each upstream's address (its name when it has no
// address, as a Sentinel or cluster upstream).
func (c *Config) RingNames(r Route) []string {
	if len(r.ServerNames) > 0 {
		return r.ServerNames
	}
	names := make([]string, len(r.Upstreams))
	for i, n := range r.Upstreams {
		names[i] = n
		if u := c.NamedUpstream(n); u.Mode == ModeStandalone && u.Address != "" {
			names[i] = u.Address
			// As twemproxy (for libmemcached's sake): a server on port
			// 11211 is hashed under its host alone (found by review).
			if host, port, err := net.SplitHostPort(u.Address); err == nil && port == "11211" {
				names[i] = host
			}
		}
	}
	return names
}

// maxRingName is the longest server name a ring hashes: nutcracker builds
// each ketama point's name in a fixed buffer, and longer names were placed
// differently from it (found by review, from 270 bytes).
const maxRingName = 255

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

// RoutedUpstreams are UpstreamNames without the one [mirror] sends to:
// the upstreams clients' commands may reach, by route index, and those a
// command about every upstream (DBSIZE, SCAN, FLUSHALL, WAIT, ...) goes
// to. No route may name the mirror's (mirrorErrors), and counted among
// them it doubled DBSIZE and SCAN's keys, showed keys only the mirror has,
// and made readiness, SCAN and WAIT wait for a mirror that was down
// (found by review).
func (c *Config) RoutedUpstreams() []string {
	names := c.UpstreamNames()
	if c.Mirror.Enabled() {
		names = slices.DeleteFunc(names, func(n string) bool { return n == c.Mirror.Upstream })
	}
	return names
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
		if u.Databases == 0 {
			// Every upstream has [upstream]'s databases (one database
			// index means one thing whatever the route); shown so by
			// check. A different value is an error (checkRoutes).
			u.Databases = c.Upstream.Databases
		}
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
		if d := c.Upstreams[name].Databases; d != 0 && d != c.Upstream.Databases {
			// Found by review: accepted, shown by check, then ignored.
			bad(prefix+".databases", "every upstream has [upstream]'s databases (%d), which a client's SELECT is checked against; remove it here or set upstream.databases", c.Upstream.Databases)
		}
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
		seen := map[string]int{}
		catchAll := -1
		for i, r := range routes {
			key := fmt.Sprintf("%s[%d]", section, i)
			if r.Pattern == "" {
				bad(key+".pattern", "is empty")
			} else if err := glob.Check(r.Pattern); err != nil {
				bad(key+".pattern", "%v", err)
			} else {
				// As for [[policy.ttl]]: a route after its own pattern
				// or after "*" never matches, and was accepted without
				// a word (found by a probe).
				if j, dup := seen[r.Pattern]; dup {
					bad(key+".pattern", "%q is already %s[%d]; the first match wins, so this route would never apply", r.Pattern, section, j)
				} else if catchAll >= 0 {
					bad(key+".pattern", "%s[%d] matches everything first (pattern \"*\"), so this route would never apply", section, catchAll)
				}
				seen[r.Pattern] = i
				if r.Pattern == "*" && catchAll < 0 {
					catchAll = i
				}
			}
			// upstreams = [] alone is a spread with too few upstreams, not
			// a route missing its upstream (found by a probe: it was told
			// "no [upstreams.] is configured"); beside upstream = "NAME"
			// it was accepted before, and still is (review).
			spread := len(r.Upstreams) > 0 || r.Upstreams != nil && r.Upstream == "" || r.Distribution != "" || r.Hash != "" || r.HashTag != "" || len(r.Weights) > 0 || len(r.ServerNames) > 0
			switch {
			case spread && section == "channel_route":
				bad(key, "a channel route sends its channels to one upstream: upstreams, distribution, hash, hash_tag, weights and server_names are for [[route]]")
				continue
			case spread:
				c.checkRing(key, r, bad)
				continue
			}
			if r.Upstream == "" {
				bad(key+".upstream", "is missing: give upstream = \"NAME\" (or, in a [[route]], upstreams = [...] to spread keys over several)")
				continue
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

// checkRing checks a [[route]] that spreads its keys over upstreams.
func (c *Config) checkRing(key string, r Route, bad func(key, format string, args ...any)) {
	if r.Upstream != "" {
		bad(key, "give either upstream (one upstream) or upstreams (keys spread over several), not both")
	}
	if len(r.Upstreams) < 2 {
		bad(key+".upstreams", "list at least two upstreams to spread keys over (or use upstream = \"NAME\")")
		return
	}
	seen := map[string]bool{}
	for _, n := range r.Upstreams {
		if _, ok := c.Upstreams[n]; !ok && n != DefaultUpstream {
			bad(key+".upstreams", "no [upstreams.%s] is configured (named upstreams: %s)", n, strings.Join(c.UpstreamNames(), ", "))
		}
		if seen[n] {
			bad(key+".upstreams", "%q is listed twice", n)
		}
		seen[n] = true
	}
	if r.Distribution != "" && !slices.Contains(route.Distributions, r.Distribution) {
		bad(key+".distribution", "unknown distribution %q: want \"ketama\" (the default) or \"modula\", as twemproxy's", r.Distribution)
	}
	if r.Hash != "" && !slices.Contains(route.HashNames(), r.Hash) {
		bad(key+".hash", "unknown hash %q: want one of %s (twemproxy's names; default fnv1a_64)", r.Hash, strings.Join(route.HashNames(), ", "))
	}
	if r.HashTag != "" && len(r.HashTag) != 2 {
		bad(key+".hash_tag", "want two characters, as \"{}\", or none")
	} else if strings.IndexByte(r.HashTag, 0) >= 0 {
		bad(key+".hash_tag", "%q: a NUL byte cannot delimit a hash tag (twemproxy copies the tag as a C string, so a pool with it places keys by whatever memory follows)", r.HashTag)
	}
	if r.Weights != nil && len(r.Weights) != len(r.Upstreams) {
		bad(key+".weights", "%d weights for %d upstreams", len(r.Weights), len(r.Upstreams))
	}
	for _, w := range r.Weights {
		if w < 1 || w > 1000 {
			bad(key+".weights", "weight %d: want 1 to 1000", w)
		}
	}
	if r.ServerNames != nil {
		if len(r.ServerNames) != len(r.Upstreams) {
			bad(key+".server_names", "%d names for %d upstreams", len(r.ServerNames), len(r.Upstreams))
		}
		for i, n := range r.ServerNames {
			if n == "" || slices.Contains(r.ServerNames[:i], n) {
				bad(key+".server_names", "names must be non-empty and distinct (%q)", n)
			}
			if len(n) > maxRingName {
				bad(key+".server_names", "a name of %d bytes: at most %d (twemproxy hashes longer names differently)", len(n), maxRingName)
			}
		}
	} else {
		names := c.RingNames(r)
		for i, n := range names {
			if slices.Contains(names[:i], n) {
				bad(key+".upstreams", "two upstreams have the address %s, which each is hashed under; give server_names", n)
			}
		}
	}
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
