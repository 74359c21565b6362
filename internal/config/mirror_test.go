package config

import (
	"strings"
	"testing"
	"time"
)

// TestMirrorSection: [mirror] names one of [upstreams]; a mirror the proxy
// cannot use is refused at load with the key and the reason.
func TestMirrorSection(t *testing.T) {
	good := `[upstream]
address = "10.0.0.1:6379"

[upstreams.new]
address = "10.0.0.2:6379"
username = "mirror"
password = "pw"
reply_timeout = "1s"

[mirror]
upstream = "new"
reads_sample = 0.01
compare = true
`
	c, err := Parse([]byte(good), "m.toml")
	if err != nil {
		t.Fatal(err)
	}
	u, ok := c.MirrorUpstream()
	if !ok || u.Address != "10.0.0.2:6379" || u.Username != "mirror" || u.Password != "pw" || u.ReplyTimeout.Duration != time.Second {
		t.Fatalf("MirrorUpstream = %+v, %v", u, ok)
	}
	// What the entry leaves out is the default, never [upstream]'s.
	d := Default().Upstream
	if u.Mode != ModeStandalone || u.Connections != d.Connections || u.DialTimeout != d.DialTimeout || u.Databases != d.Databases {
		t.Fatalf("MirrorUpstream defaults = %+v", u)
	}
	if _, ok := Default().MirrorUpstream(); ok {
		t.Fatal("mirroring is on by default")
	}
	if RestartOnly("mirror.reads_sample") == "" || RestartOnly("upstreams") == "" {
		t.Error("a reload may change the mirror; it is built at start")
	}

	for _, tc := range []struct{ name, doc, key, msg string }{
		{"unknown upstream", "[upstreams.old]\naddress = \"10.0.0.2:1\"\n[mirror]\nupstream = \"new\"\n",
			"mirror.upstream", `no [upstreams.new] section (named upstreams: old)`},
		{"no upstreams", "[mirror]\nupstream = \"new\"\n", "mirror.upstream", "no [upstreams.new] section"},
		{"sentinel itself", "[upstream]\nmode = \"sentinel\"\nsentinels = [\"10.0.0.3:26379\"]\nmaster_name = \"m\"\n[upstreams.new]\nmode = \"sentinel\"\nsentinels = [\"10.0.0.3:26379\"]\nmaster_name = \"m\"\n[mirror]\nupstream = \"new\"\n",
			"mirror.upstream", `watches [upstream]'s primary`},
		{"cluster itself", "[upstream]\nmode = \"cluster\"\nseeds = [\"10.0.0.3:7000\"]\n[upstreams.new]\nmode = \"cluster\"\nseeds = [\"10.0.0.3:7000\"]\n[mirror]\nupstream = \"new\"\n",
			"mirror.upstream", `seeds name [upstream]'s nodes`},
		{"itself", "[upstream]\naddress = \"10.0.0.1:6379\"\n[upstreams.new]\naddress = \"10.0.0.1:6379\"\n[mirror]\nupstream = \"new\"\n",
			"mirror.upstream", "would run every write twice"},
		// A route's upstream, and the primary under another spelling of
		// its address, were accepted (found by review): every write ran
		// twice on that server.
		{"route upstream", "[upstreams.q]\naddress = \"10.0.0.2:6379\"\n[[route]]\npattern = \"q:*\"\nupstream = \"q\"\n[mirror]\nupstream = \"q\"\n",
			"mirror.upstream", `a [[route]] or [[channel_route]] (pattern "q:*") sends clients' commands`},
		{"channel route upstream", "[upstreams.q]\naddress = \"10.0.0.2:6379\"\n[[channel_route]]\npattern = \"ev.*\"\nupstream = \"q\"\n[mirror]\nupstream = \"q\"\n",
			"mirror.upstream", "would run every write twice"},
		{"a route's server", "[upstreams.q]\naddress = \"10.0.0.2:6379\"\n[upstreams.new]\naddress = \"10.0.0.2:6379\"\n[[route]]\npattern = \"q:*\"\nupstream = \"q\"\n[mirror]\nupstream = \"new\"\n",
			"mirror.upstream", "is [upstreams.q]'s address"},
		{"localhost", "[upstream]\naddress = \"127.0.0.1:6379\"\n[upstreams.new]\naddress = \"localhost:6379\"\n[mirror]\nupstream = \"new\"\n",
			"mirror.upstream", "is [upstream]'s address"},
		{"no address", "[upstreams.new]\npassword = \"x\"\n[mirror]\nupstream = \"new\"\n", "mirror.upstream", "upstreams.new.address"},
		{"fewer databases", "[upstreams.new]\naddress = \"10.0.0.2:1\"\ndatabases = 2\n[mirror]\nupstream = \"new\"\n",
			"mirror.upstream", "upstreams.new.databases (2) is less than upstream.databases (16)"},
		{"sample", "[upstreams.new]\naddress = \"10.0.0.2:1\"\n[mirror]\nupstream = \"new\"\nreads_sample = 1.5\n",
			"mirror.reads_sample", "between 0 and 1"},
		{"compare without sample", "[upstreams.new]\naddress = \"10.0.0.2:1\"\n[mirror]\nupstream = \"new\"\ncompare = true\n",
			"mirror.compare", "reads_sample is 0"},
		{"queue", "[mirror]\nqueue = 0\n", "mirror.queue", "between 1 and"},
		{"queue bytes", "[mirror]\nqueue_bytes = 10\n", "mirror.queue_bytes", "between 1KB and 4GB"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.doc), "m.toml")
			if err == nil {
				t.Fatal("accepted")
			}
			found := false
			for _, e := range configErrors(t, err) {
				if e.Key == tc.key && strings.Contains(e.Msg, tc.msg) {
					found = true
				}
			}
			if !found {
				t.Fatalf("want %s: ...%s...; got %v", tc.key, tc.msg, err)
			}
		})
	}
}

// TestMirrorSentinelAndClusterTargets: a Sentinel or cluster upstream may
// be the mirror; a cluster one whatever upstream.databases says (it has
// database 0 only; other databases' commands are dropped, counted).
func TestMirrorSentinelAndClusterTargets(t *testing.T) {
	for name, doc := range map[string]string{
		"sentinel": "[upstreams.new]\nmode = \"sentinel\"\nsentinels = [\"10.0.0.3:26379\"]\nmaster_name = \"m\"\n[mirror]\nupstream = \"new\"\n",
		"cluster":  "[upstreams.new]\nmode = \"cluster\"\nseeds = [\"10.0.0.3:7000\"]\n[mirror]\nupstream = \"new\"\n",
	} {
		c, err := Parse([]byte(doc), "m.toml")
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if u, ok := c.MirrorUpstream(); !ok || string(u.Mode) != name {
			t.Fatalf("%s: MirrorUpstream = %+v, %v", name, u, ok)
		}
	}
}
