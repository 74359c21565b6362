package config

import (
	"maps"
	"reflect"
	"slices"
	"strings"

	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/policy"
)

// restartOnly lists the settings (dotted keys, or a section prefix ending
// in ".") that a reload cannot change, with the reason an operator is
// shown. Everything else is applied at run time (see proxy.Server.Reload
// and README "Reloading").
var restartOnly = []struct{ key, why string }{
	{"server.listen", "the client listener is bound once at start"},
	{"server.admin", "the admin listener is bound once at start"},
	{"server.tls.listen", "the TLS listener is bound once at start (its certificates reload)"},
	{"server.listeners", "the client listeners are bound once at start (the certificates of TLS ones reload)"},
	{"server.proxy_protocol", "whether the listeners expect a PROXY header is fixed at start, with the load balancer in front"},
	{"server.log_format", "the log handler is built once at start"},
	{"server.slowlog_threshold", "the slow log is built once at start"},
	{"server.slowlog_max_len", "the slow log's ring is sized once at start"},
	{"upstream.mode", "the router or the single upstream is built once at start"},
	{"upstream.seeds", "the cluster router asks the seeds at start and follows the cluster's own view afterwards"},
	{"upstream.username", "clients are authenticated against the upstream credentials they connected with"},
	{"upstream.password", "clients are authenticated against the upstream credentials they connected with"},
	{"upstream.mode", "the way the upstream is found is chosen at start"},
	{"upstream.sentinels", "the Sentinel watcher is started once at start"},
	{"upstream.master_name", "the Sentinel watcher is started once at start"},
	{"upstream.sentinel_username", "the Sentinel watcher is started once at start"},
	{"upstream.sentinel_password", "the Sentinel watcher is started once at start"},
	{"upstream.databases", "the per-database pools and the range SELECT accepts are sized at start"},
	{"upstream.read_from", "the replicas' connections and their offset poller are set up at start"},
	{"upstream.max_replica_lag", "the replicas' offset poller is set up at start"},
	{"upstream.replica_poll_interval", "the replicas' offset poller is set up at start"},
	{"users", "proxy users and their upstream connections are set up at start"},
	{"admin.", "the admin endpoint takes the path of its token file at start (what the file holds is read again on every reload)"},
	{"upstreams", "named upstreams and their connections are set up at start ([[route]] and [[channel_route]] reload)"},
	{"localcache.", "the local tier's memory, tracking connections and admission state are built at start"},
	{"mirror.", "the mirror's queue and connections are built at start"},
	{"upstreams", "the named upstreams' connections (the mirror's) are dialled at start"},
}

// RestartOnly returns why key (as Changed names it) cannot change without a
// restart, or "" if a reload applies it.
func RestartOnly(key string) string {
	for _, r := range restartOnly {
		if key == r.key || strings.HasSuffix(r.key, ".") && strings.HasPrefix(key, r.key) {
			return r.why
		}
	}
	return ""
}

// Changed returns the dotted keys whose values differ between two
// snapshots, in schema order. Lists and optional tables are compared
// whole, under their own key ("policy.ttl", "stampede.hold").
func Changed(a, b *Config) []string {
	if len(a.Upstreams) > 0 && len(b.Upstreams) > 0 {
		// The same for a named upstream: its unused address edited was a
		// change of "upstreams", which refused the reload (found by
		// review, TestChangedIgnoresAnUnusedAddressOfANamedUpstream).
		ac, bc := *a, *b
		ac.Upstreams, bc.Upstreams = maps.Clone(a.Upstreams), maps.Clone(b.Upstreams)
		for name, x := range ac.Upstreams {
			if y, ok := bc.Upstreams[name]; ok && x.Mode == y.Mode && !x.UsesAddress() {
				x.Address, y.Address = "", ""
				ac.Upstreams[name], bc.Upstreams[name] = x, y
			}
		}
		a, b = &ac, &bc
	}
	var keys []string
	walkSettings(reflect.ValueOf(*a), reflect.ValueOf(*b), "", &keys)
	if a.Upstream.Mode == b.Upstream.Mode && !a.Upstream.UsesAddress() {
		// Not used in this mode (the primary comes from the Sentinels, the
		// nodes from the seeds): a leftover address edited was reported
		// as changed, and switched every pool to the same primary, or
		// refused the reload in cluster mode (found by review).
		keys = slices.DeleteFunc(keys, func(k string) bool { return k == "upstream.address" })
	}
	return keys
}

func walkSettings(a, b reflect.Value, prefix string, keys *[]string) {
	for i := range a.NumField() {
		f := a.Type().Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
		if name == "" || name == "-" {
			continue
		}
		av, bv := a.Field(i), b.Field(i)
		if av.Kind() == reflect.Struct && !isLeafType(f.Type) {
			walkSettings(av, bv, prefix+name+".", keys)
			continue
		}
		if !equalSetting(av, bv) {
			*keys = append(*keys, prefix+name)
		}
	}
}

func isLeafType(t reflect.Type) bool {
	return t == reflect.TypeFor[units.Duration]() || t == reflect.TypeFor[policy.Duration]()
}

// equalSetting treats a nil and an empty list as equal: a file that says
// "include = []" changes nothing.
func equalSetting(a, b reflect.Value) bool {
	if a.Kind() == reflect.Slice && a.Len() == 0 && b.Len() == 0 {
		return true
	}
	return reflect.DeepEqual(a.Interface(), b.Interface())
}
