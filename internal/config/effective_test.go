package config

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// TestEffectiveRoundTrip: the effective configuration of the example and of
// the defaults parses back to the same snapshot, so what `redproxy check`
// prints is a config file that runs the same proxy.
func TestEffectiveRoundTrip(t *testing.T) {
	example, err := Load("../../config.example.toml")
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]*Config{"example": example, "default": Default()} {
		out, err := c.Effective()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		back, err := Parse(out, "effective.toml")
		if err != nil {
			t.Fatalf("%s: output does not parse: %v\n%s", name, err, out)
		}
		if got, want := comparable(back), comparable(c); got != want {
			t.Errorf("%s: round trip changed settings:\n got %s\nwant %s", name, got, want)
		}
		for key, v := range settings(c) {
			if v := reflect.ValueOf(v); v.Kind() == reflect.Pointer && v.IsNil() || v.Kind() == reflect.Map && v.Len() == 0 {
				continue // an absent optional table ([policy.values], [upstreams.*]) stays absent
			}
			if _, ok := mustScan(t, out)[key]; !ok {
				t.Errorf("%s: %s missing from the effective configuration", name, key)
			}
		}
	}
}

// TestEffectiveRedactsPassword: the upstream password never appears.
func TestEffectiveRedactsPassword(t *testing.T) {
	c, err := Parse([]byte("[upstream]\npassword = \"s3cret-pw\"\n[upstreams.new]\naddress = \"10.0.0.9:6379\"\npassword = \"n4med-pw\"\n"), "p.toml")
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.Effective()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "s3cret-pw") || strings.Contains(string(out), "n4med-pw") || !strings.Contains(string(out), RedactedPassword) {
		t.Fatalf("password not redacted:\n%s", out)
	}
	if c.Upstream.Password != "s3cret-pw" || c.Upstreams["new"].Password != "n4med-pw" {
		t.Fatal("Effective modified the snapshot")
	}
}

// comparable renders every setting so that a nil and an empty list, and
// two pointers to equal tables, compare equal.
func comparable(c *Config) string {
	var b strings.Builder
	for _, key := range slices.Sorted(maps.Keys(settings(c))) {
		v := reflect.ValueOf(settings(c)[key])
		if v.Kind() == reflect.Pointer && !v.IsNil() {
			v = v.Elem()
		}
		fmt.Fprintf(&b, "%s=%+v\n", key, v)
	}
	return b.String()
}

func mustScan(t *testing.T, data []byte) lineIndex {
	t.Helper()
	idx, _, errs := scan(data)
	if len(errs) > 0 {
		t.Fatalf("scan: %v", errs)
	}
	return idx
}

// TestEffectiveShowsTheHandshakeTimeoutInForce: handshake_timeout 0 means
// the default, and the effective configuration says what that is (found
// by a probe: '0s', where 10 s applied).
func TestEffectiveShowsTheHandshakeTimeoutInForce(t *testing.T) {
	c, err := Parse([]byte("[server.tls]\nhandshake_timeout = \"0s\"\n"), "t.toml")
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.Effective()
	if err != nil {
		t.Fatal(err)
	}
	if want := "handshake_timeout = '10s'"; !strings.Contains(string(out), want) {
		t.Fatalf("effective configuration lacks %q:\n%s", want, out)
	}
	if c.Server.TLS.HandshakeTimeout.Duration != 0 {
		t.Fatal("Effective modified the snapshot")
	}
}

// TestEffectiveShowsTheDefaultsZeroStandsFor: max_value_bytes 0 is the
// 100 KB default, in [policy.values] and a scope's, and an early refresh
// rule's beta 0 (or none) is 1; check printed the 0s (found by a probe).
func TestEffectiveShowsTheDefaultsZeroStandsFor(t *testing.T) {
	c, err := Parse([]byte(`[policy.values]
max_value_bytes = 0

[[policy.scope]]
listeners = ["plain"]
[policy.scope.values]
max_value_bytes = 0

[[stampede.early_refresh]]
pattern = "cache:*"
`), "t.toml")
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.Effective()
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(out), "max_value_bytes = '100KB'"); n != 2 {
		t.Errorf("%d value limits shown as 100KB, want 2:\n%s", n, out)
	}
	if !strings.Contains(string(out), "beta = 1.0") {
		t.Errorf("early refresh's beta not shown as 1.0:\n%s", out)
	}
	if c.Policy.Values.MaxValueBytes != 0 || c.Policy.Scopes[0].Values.MaxValueBytes != 0 || c.Stampede.EarlyRefresh[0].Beta != 0 {
		t.Fatal("Effective modified the snapshot")
	}
	back, err := Parse(out, "effective.toml")
	if err != nil {
		t.Fatalf("the effective configuration does not parse: %v\n%s", err, out)
	}
	if back.Policy.Values.MaxValueBytes != 100<<10 {
		t.Fatalf("parsed back: %v", back.Policy.Values.MaxValueBytes)
	}
}
