package config

import (
	"strings"
	"testing"
	"time"
)

// TestRoutesSection: named upstreams get [upstream]'s defaults for what
// they leave out and are validated as [upstream] is, with errors naming
// their own keys and lines; a route naming an unknown upstream is an
// error saying where; routes exclude a cluster [upstream].
func TestRoutesSection(t *testing.T) {
	good := `
[upstream]
address = "127.0.0.1:7000"

[upstreams.queue]
address = "127.0.0.1:7001"
password = "q"
connections = 3

[upstreams.big]
mode = "cluster"
seeds = ["127.0.0.1:7100"]

[[route]]
pattern = "queue:*"
upstream = "queue"

[[route]]
pattern = "big:*"
upstream = "big"

[[channel_route]]
pattern = "jobs.*"
upstream = "queue"
`
	// upstreams = [] beside upstream was accepted before, and still is.
	if _, err := Parse([]byte("[upstreams.q]\naddress = \"127.0.0.1:7001\"\n[[route]]\npattern = \"a:*\"\nupstream = \"q\"\nupstreams = []\n[[channel_route]]\npattern = \"a\"\nupstream = \"q\"\nupstreams = []\n"), "r.toml"); err != nil {
		t.Fatalf("upstream with an empty upstreams list: %v", err)
	}
	c, err := Parse([]byte(good), "routes.toml")
	if err != nil {
		t.Fatal(err)
	}
	q := c.Upstreams["queue"]
	if q.Mode != ModeStandalone || q.Connections != 3 || q.DialTimeout.Duration != 2*time.Second || q.Databases != 16 || q.MaxPinned != 256 {
		t.Fatalf("queue upstream without defaults: %+v", q)
	}
	if got := strings.Join(c.UpstreamNames(), ","); got != "default,big,queue" {
		t.Fatalf("UpstreamNames = %s", got)
	}
	if len(c.Routes) != 2 || c.Routes[1].Upstream != "big" || c.ChannelRoutes[0].Pattern != "jobs.*" {
		t.Fatalf("routes: %+v %+v", c.Routes, c.ChannelRoutes)
	}
	out, err := c.Effective()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), `password = "q"`) {
		t.Fatalf("a named upstream's password is shown:\n%s", out)
	}

	for _, tc := range []struct {
		name, doc, key string
		line           int
		msg            string
	}{
		{"unknown upstream", "[[route]]\npattern = \"a:*\"\nupstream = \"nope\"\n", "route[0].upstream", 3, "no [upstreams.nope]"},
		// Found by a probe: both were told "no [upstreams.] is configured".
		{"empty upstreams", "[upstreams.q]\naddress = \"127.0.0.1:7001\"\n[[route]]\npattern = \"a:*\"\nupstreams = []\n", "route[0].upstreams", 0, "at least two upstreams"},
		{"no upstream", "[upstreams.q]\naddress = \"127.0.0.1:7001\"\n[[route]]\npattern = \"a:*\"\n", "route[0].upstream", 0, "is missing"},
		{"unknown channel upstream", "[upstreams.q]\naddress = \"127.0.0.1:7001\"\n[[channel_route]]\npattern = \"a\"\nupstream = \"x\"\n", "channel_route[0].upstream", 5, "named upstreams: default, q"},
		{"bad pattern", "[upstreams.q]\naddress = \"127.0.0.1:7001\"\n[[route]]\npattern = \"a[\"\nupstream = \"q\"\n", "route[0].pattern", 4, "["},
		{"named upstream validated", "[upstreams.q]\naddress = \"nowhere\"\n", "upstreams.q.address", 2, "invalid address"},
		{"named sentinel", "[upstreams.q]\nmode = \"sentinel\"\n", "upstreams.q.sentinels", 0, "is empty"},
		{"reserved name", "[upstreams.default]\naddress = \"127.0.0.1:7001\"\n", "upstreams.default", 1, "[upstream]'s"},
		{"replica reads on a named cluster", "[upstreams.q]\nmode = \"cluster\"\nseeds = [\"127.0.0.1:7001\"]\nread_from = \"replica\"\n[[route]]\npattern = \"a:*\"\nupstream = \"q\"\n", "upstreams.q.read_from", 0, "cluster"},
		// Found by a probe: accepted, the second route never applying.
		{"duplicate pattern", "[upstreams.q]\naddress = \"127.0.0.1:7001\"\n[[route]]\npattern = \"q:*\"\nupstream = \"q\"\n[[route]]\npattern = \"q:*\"\nupstream = \"default\"\n", "route[1].pattern", 0, "already route[0]"},
		{"shadowed by a catch-all", "[upstreams.q]\naddress = \"127.0.0.1:7001\"\n[[channel_route]]\npattern = \"*\"\nupstream = \"q\"\n[[channel_route]]\npattern = \"a\"\nupstream = \"q\"\n", "channel_route[1].pattern", 0, "matches everything first"},
		{"cluster default", "[upstream]\nmode = \"cluster\"\nseeds = [\"127.0.0.1:7000\"]\n[upstreams.q]\naddress = \"127.0.0.1:7001\"\n[[channel_route]]\npattern = \"a\"\nupstream = \"q\"\n", "upstream.mode", 2, "routes need [upstream]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.doc), "r.toml")
			if err == nil {
				t.Fatal("no error")
			}
			for _, e := range configErrors(t, err) {
				if e.Key == tc.key && strings.Contains(e.Msg, tc.msg) && (tc.line == 0 || e.Line == tc.line) {
					return
				}
			}
			t.Fatalf("want %s (line %d) %q; got %v", tc.key, tc.line, tc.msg, err)
		})
	}
}

// Replica reads with routes, on [upstream] and on named standalone or
// Sentinel upstreams, are accepted: each upstream has its own replica set
// (proxy/routereplicas.go).
func TestRoutesReplicaReadsAccepted(t *testing.T) {
	for _, doc := range []string{
		"[upstream]\nread_from = \"replica\"\n[upstreams.q]\naddress = \"127.0.0.1:7001\"\n[[route]]\npattern = \"a:*\"\nupstream = \"q\"\n",
		"[upstreams.q]\naddress = \"127.0.0.1:7001\"\nread_from = \"replica_preferred\"\n[[route]]\npattern = \"a:*\"\nupstream = \"q\"\n",
		"[upstreams.q]\nmode = \"sentinel\"\nsentinels = [\"127.0.0.1:7002\"]\nmaster_name = \"m\"\nread_from = \"replica\"\n[[route]]\npattern = \"a:*\"\nupstream = \"q\"\n",
	} {
		if _, err := Parse([]byte(doc), "r.toml"); err != nil {
			t.Errorf("replica reads with routes refused: %v\n%s", err, doc)
		}
	}
}

// TestRoutesRestartOnly: routes reload, named upstreams need a restart.
func TestRoutesRestartOnly(t *testing.T) {
	if RestartOnly("upstreams") == "" {
		t.Error("upstreams should be restart-only")
	}
	for _, k := range []string{"route", "channel_route"} {
		if why := RestartOnly(k); why != "" {
			t.Errorf("%s is restart-only: %s", k, why)
		}
	}
}

// A named upstream no route names (the target of [mirror]) turns routing
// on for nothing.
// The local tier with routes is accepted whatever the named upstreams'
// modes: it tracks each key on its route's upstream, per node of a
// cluster upstream (proxy/tier.go).
func TestRoutesLocalTierAccepted(t *testing.T) {
	for _, named := range []string{
		"address = \"127.0.0.1:7001\"",
		"mode = \"cluster\"\nseeds = [\"127.0.0.1:7001\"]",
	} {
		doc := "[localcache]\nenabled = true\n[upstreams.q]\n" + named + "\n[[route]]\npattern = \"a:*\"\nupstream = \"q\"\n"
		if _, err := Parse([]byte(doc), "r.toml"); err != nil {
			t.Errorf("the local tier with routes is refused: %v\n%s", err, doc)
		}
	}
}

func TestNamedUpstreamWithoutRoutesDoesNotRoute(t *testing.T) {
	doc := "[localcache]\nenabled = true\n[upstreams.q]\naddress = \"127.0.0.1:7001\"\n"
	c, err := Parse([]byte(doc), "r.toml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Routed() {
		t.Fatal("Routed() with named upstreams and no route")
	}
	if _, err := Parse([]byte("[upstreams.q]\naddress = \"nowhere\"\n"), "r.toml"); err == nil || !strings.Contains(err.Error(), "upstreams.q.address") {
		t.Fatalf("a named upstream without routes is not checked: %v", err)
	}
}
