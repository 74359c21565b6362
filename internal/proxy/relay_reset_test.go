package proxy_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/redproxy/redproxy/internal/proxytest"
)

// clientInfoField is field k of a CLIENT INFO line.
func clientInfoField(info any, k string) string {
	s, _ := info.(string)
	for _, f := range strings.Fields(s) {
		if v, ok := strings.CutPrefix(f, k+"="); ok {
			return v
		}
	}
	return "<" + k + " missing in " + s + ">"
}

// A subscriber or tracking client that RESETs its connection is a normal
// RESP2 client again, as on Redis, although the proxy keeps it on its
// relay: CLIENT INFO's flags and resp say so, and CLIENT KILL TYPE pubsub
// leaves it alone; subscribing again makes it a subscriber again. HELLO on
// a relay changes its protocol. Before, the proxy listed it flags=P resp=3
// for ever, and a CLIENT KILL TYPE pubsub killed it (found by a probe).
func TestRelayAfterResetIsANormalClient(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	for _, target := range []struct{ name, addr string }{{"redis", p.Redis.Addr()}, {"proxy", p.Addr}} {
		for _, start := range [][][]string{
			{{"HELLO", "3"}, {"SUBSCRIBE", "ch"}},
			{{"SUBSCRIBE", "ch"}},
			{{"HELLO", "3"}, {"PSUBSCRIBE", "x*"}},
			{{"HELLO", "3"}, {"CLIENT", "TRACKING", "ON"}},
		} {
			name := target.name + " " + strings.Join(start[len(start)-1], " ")
			c := dialRaw(t, target.addr)
			for _, cmd := range start {
				c.send(cmd)
				c.readReply()
			}
			if v := c.do("RESET"); v != "RESET" {
				t.Fatalf("%s: RESET = %#v", name, v)
			}
			info := c.do("CLIENT", "INFO")
			if f, r := clientInfoField(info, "flags"), clientInfoField(info, "resp"); f != "N" || r != "2" {
				t.Errorf("%s: after RESET flags=%s resp=%s, want N and 2", name, f, r)
			}
			admin := dialRaw(t, target.addr)
			if v := admin.do("CLIENT", "KILL", "TYPE", "pubsub"); v != int64(0) {
				t.Errorf("%s: CLIENT KILL TYPE pubsub after RESET = %#v, want 0", name, v)
			}
			if v := c.do("PING"); v != "PONG" {
				t.Fatalf("%s: PING after the kill = %#v", name, v)
			}
			// Subscribed again, it is a subscriber again.
			c.send([]string{"SUBSCRIBE", "again"})
			c.readReply()
			if v := admin.do("CLIENT", "KILL", "TYPE", "pubsub"); v != int64(1) {
				t.Errorf("%s: CLIENT KILL TYPE pubsub once subscribed again = %#v, want 1", name, v)
			}
		}
		// HELLO on a tracking relay changes its protocol.
		c := dialRaw(t, target.addr)
		c.do("HELLO", "3")
		c.do("CLIENT", "TRACKING", "ON")
		c.do("HELLO", "2")
		info := c.do("CLIENT", "INFO")
		if r := clientInfoField(info, "resp"); r != "2" {
			t.Errorf("%s: HELLO 2 on a tracking client: resp=%s, want 2", target.name, r)
		}
		c.do("HELLO", "3", "SETNAME", "again3")
		info = c.do("CLIENT", "INFO")
		if r, n := clientInfoField(info, "resp"), clientInfoField(info, "name"); r != "3" || n != "again3" {
			t.Errorf("%s: HELLO 3 SETNAME on a tracking client: resp=%s name=%s, want 3 and again3", target.name, r, n)
		}
	}
}

// A tracking client that subscribes, or a RESP3 subscriber that turns
// tracking on, is both to Redis: flags=Pt, of TYPE pubsub. The proxy
// showed t alone and CLIENT KILL TYPE pubsub left it (found by a probe).
// Flags come in Redis's order (a tracking client in MULTI is xt), and
// multi= counts its queued commands.
func TestRelayThatSubscribesAndTracksShowsBoth(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	for _, target := range []struct{ name, addr string }{{"redis", p.Redis.Addr()}, {"proxy", p.Addr}} {
		for _, tc := range []struct {
			steps [][]string
			flags string
		}{
			{[][]string{{"HELLO", "3"}, {"CLIENT", "TRACKING", "ON"}, {"SUBSCRIBE", "x"}}, "Pt"},
			{[][]string{{"HELLO", "3"}, {"SUBSCRIBE", "x"}, {"CLIENT", "TRACKING", "ON"}}, "Pt"},
			{[][]string{{"HELLO", "3"}, {"SUBSCRIBE", "x"}, {"CLIENT", "TRACKING", "ON"}, {"CLIENT", "TRACKING", "OFF"}}, "P"},
			{[][]string{{"HELLO", "3"}, {"CLIENT", "TRACKING", "ON"}, {"MULTI"}, {"CLIENT", "ID"}, {"SET", "k", "v"}}, "xt"},
		} {
			name := fmt.Sprintf("%s %v", target.name, tc.steps)
			c := dialRaw(t, target.addr)
			id := fmt.Sprint(c.do("CLIENT", "ID"))
			for _, cmd := range tc.steps {
				c.send(cmd)
				c.readReply() // SUBSCRIBE's is a push
			}
			admin := dialRaw(t, target.addr)
			line := admin.do("CLIENT", "LIST", "ID", id)
			if f := clientInfoField(line, "flags"); f != tc.flags {
				t.Errorf("%s: flags=%s, want %s", name, f, tc.flags)
			}
			// multi= counts what is queued, a CLIENT command answered by
			// the proxy too (found by a probe: 1 of 2 on a relay).
			if m := clientInfoField(line, "multi"); tc.flags == "xt" && m != "2" {
				t.Errorf("%s: multi=%s, want 2", name, m)
			}
			want := int64(0)
			if tc.flags[0] == 'P' {
				want = 1
			}
			if v := admin.do("CLIENT", "KILL", "TYPE", "pubsub"); v != want {
				t.Errorf("%s: CLIENT KILL TYPE pubsub = %#v, want %d", name, v, want)
			}
		}
	}
}
