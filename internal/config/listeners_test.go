package config

import (
	"strings"
	"testing"
)

// [[server.listeners]] entries are checked, each error at its own key.
func TestListenerErrors(t *testing.T) {
	doc := `[server]
listen = "127.0.0.1:7000"

[[server.listeners]]
name = "plain"
listen = "127.0.0.1:7001"

[[server.listeners]]
name = "has space"
listen = "127.0.0.1:7002"

[[server.listeners]]
name = "a"
listen = "127.0.0.1:7000"
namespace = "x y"

[[server.listeners]]
name = "a"
listen = "nowhere"

[[server.listeners]]
name = "b"
listen = "127.0.0.1:7003"
tls = true

[[server.listeners]]
name = "c"
listen = "127.0.0.1:7004"
cert_file = "c.crt"

[[policy.scope]]
name = "s"
listeners = ["nosuch"]
`
	_, err := Parse([]byte(doc), "l.toml")
	got := configErrors(t, err)
	want := []wantErr{
		{5, "server.listeners[0].name", `"plain" is reserved for server.listen`},
		{9, "server.listeners[1].name", "printable characters without spaces"},
		{14, "server.listeners[2].listen", `is also the address of listener "plain"`},
		{15, "server.listeners[2].namespace", "contains a space"},
		{18, "server.listeners[3].name", `"a" is already the name of server.listeners[2]`},
		{19, "server.listeners[3].listen", "invalid address"},
		{24, "server.listeners[4].tls", "needs a certificate"},
		{29, "server.listeners[5].cert_file", "is set but tls is false"},
		{33, "policy.scope[0].listeners[0]", `no client listener is named "nosuch"`},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d errors, want %d: %v", len(got), len(want), err)
	}
	for i, w := range want {
		if g := got[i]; g.Line != w.line || g.Key != w.key || !strings.Contains(g.Msg, w.msg) {
			t.Errorf("error %d = %+v, want %+v", i, *g, w)
		}
	}
}

// A scope may still name a listener by its address, as before listeners
// had names; it then selects that listener by name. Names, the implicit
// ones included, are taken as they are.
func TestListenerScopeByAddress(t *testing.T) {
	c, err := Parse([]byte(`[server]
listen = "127.0.0.1:7000"

[[server.listeners]]
name = "internal"
listen = "127.0.0.1:7001"

[[policy.scope]]
name = "s"
listeners = ["127.0.0.1:7000", "internal", "127.0.0.1:7001"]
`), "l.toml")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(c.Policy.Scopes[0].Listeners, ","); got != "plain,internal,internal" {
		t.Errorf("scope listeners = %s", got)
	}
	ls := c.ClientListeners()
	if len(ls) != 2 || ls[0].Name != ListenerPlain || ls[1].Name != "internal" || ls[1].UsesProxyProtocol() {
		t.Errorf("ClientListeners = %+v", ls)
	}
}

// The admin endpoint on a client listener's port, or an upstream that is
// the proxy's own listener, are refused with what is wrong; a Redis on
// another host that happens to use the listener's port number is not.
func TestListenerAddressesClashWithAdminOrUpstream(t *testing.T) {
	for _, tc := range []struct {
		doc, want string
	}{
		{"[server]\nlisten = \"127.0.0.1:7000\"\nadmin = \"127.0.0.1:7000\"\n", "server.admin: \"127.0.0.1:7000\" is also the address of client listener"},
		{"[server]\nlisten = \"0.0.0.0:7000\"\nadmin = \"localhost:7000\"\nallow_unauthenticated = true\n", "server.admin:"},
		{"[server]\nlisten = \"127.0.0.1:7000\"\n[upstream]\naddress = \"127.0.0.1:7000\"\n", "upstream.address: \"127.0.0.1:7000\" is the proxy's own client listener \"plain\""},
		{"[server]\nlisten = \"127.0.0.1:7000\"\n[upstream]\naddress = \"localhost:7000\"\n", "upstream.address:"},
		{"[server]\nlisten = \"127.0.0.1:7000\"\n[upstream]\naddress = \"10.0.0.5:7000\"\n", ""},
		{"[server]\nlisten = \"127.0.0.1:7000\"\n[upstream]\naddress = \"127.0.0.2:7000\"\n", ""},
		{"[server]\nlisten = \"127.0.0.1:7000\"\n[upstream]\naddress = \"127.0.0.1:7001\"\n", ""},
	} {
		_, err := Parse([]byte(tc.doc), "c.toml")
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v; want it accepted", tc.doc, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q: %v; want %q", tc.doc, err, tc.want)
		}
	}
}
