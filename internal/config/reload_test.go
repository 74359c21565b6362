package config

import (
	"slices"
	"strings"
	"testing"

	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/stampede"
)

// TestChanged names exactly the settings that differ, with lists compared
// whole and nil equal to empty.
func TestChanged(t *testing.T) {
	a := Default()
	if got := Changed(a, Default()); len(got) != 0 {
		t.Fatalf("Changed(default, default) = %v", got)
	}
	b := Default()
	b.Server.Listen = "0.0.0.0:6380"
	b.Upstream.ReplyTimeout = dur(9e9)
	b.Stampede.Hold = []stampede.HoldRule{{Pattern: "cache:*", Timeout: dur(1e9)}}
	b.Policy.Commands.Deny = []string{"debug"}
	b.Policy.TTL = []policy.TTLRule{} // empty, like the default's nil
	b.LocalCache.Exclude = []string{} // likewise
	want := []string{"server.listen", "upstream.reply_timeout", "policy.commands.deny", "stampede.hold"}
	if got := Changed(a, b); !slices.Equal(got, want) {
		t.Fatalf("Changed = %v, want %v", got, want)
	}
}

// TestChangedIgnoresAnAddressTheModeDoesNotUse: in Sentinel and cluster
// modes upstream.address is not used; editing a leftover one is no change
// (before: "changed: upstream.address", and every pool switched to the
// same primary, or the reload refused in cluster mode). Switching modes
// still names it, with the mode.
func TestChangedIgnoresAnAddressTheModeDoesNotUse(t *testing.T) {
	for _, mode := range []string{ModeSentinel, ModeCluster} {
		a, b := Default(), Default()
		a.Upstream.Mode, b.Upstream.Mode = mode, mode
		b.Upstream.Address = "10.9.9.9:6379"
		if got := Changed(a, b); len(got) != 0 {
			t.Errorf("%s mode, only upstream.address edited: Changed = %v, want none", mode, got)
		}
	}
	a, b := Default(), Default()
	b.Upstream.Mode, b.Upstream.Address = ModeSentinel, "10.9.9.9:6379"
	if got, want := Changed(a, b), []string{"upstream.mode", "upstream.address"}; !slices.Equal(got, want) {
		t.Errorf("standalone to sentinel with another address: Changed = %v, want %v", got, want)
	}
}

// TestRestartOnly: the settings a reload refuses, and a few it applies.
func TestRestartOnly(t *testing.T) {
	for _, key := range []string{"server.listen", "server.admin", "server.log_format", "upstream.password", "upstream.username", "upstream.databases", "localcache.enabled", "localcache.max_bytes"} {
		if RestartOnly(key) == "" {
			t.Errorf("%s: a reload would apply it", key)
		}
	}
	for _, key := range []string{"upstream.address", "upstream.connections", "upstream.max_pinned", "server.max_clients", "server.log_level", "server.idle_timeout", "stampede.hold", "policy.ttl"} {
		if why := RestartOnly(key); why != "" {
			t.Errorf("%s: needs a restart (%s), want reloadable", key, why)
		}
	}
	// Every key of the schema is classified by the same rule: no typo in
	// the list leaves a real key unmatched.
	for _, r := range restartOnly {
		found := false
		for key := range settings(Default()) {
			found = found || key == r.key || strings.HasSuffix(r.key, ".") && strings.HasPrefix(key, r.key)
		}
		if !found {
			t.Errorf("restartOnly entry %q matches no setting", r.key)
		}
	}
}

// Review of 6b7d187: a named upstream in Sentinel or cluster mode does not
// use its address either (config.example.toml), but a leftover address
// edited there is still a change of "upstreams", which a reload refuses
// as a whole (restart-only), where the same edit in [upstream] is none.
func TestChangedIgnoresAnUnusedAddressOfANamedUpstream(t *testing.T) {
	for _, u := range []Upstream{
		{Mode: ModeSentinel, Sentinels: []string{"127.0.0.1:26379"}, MasterName: "mymaster"},
		{Mode: ModeCluster, Seeds: []string{"127.0.0.1:7000"}},
	} {
		a, b := Default(), Default()
		a.Upstreams = map[string]Upstream{"queue": u}
		u.Address = "10.9.9.9:6379"
		b.Upstreams = map[string]Upstream{"queue": u}
		if got := Changed(a, b); len(got) != 0 {
			t.Errorf("%s named upstream, only its unused address edited: Changed = %v (restart-only: %q), want none",
				u.Mode, got, RestartOnly(got[0]))
		}
	}
}
