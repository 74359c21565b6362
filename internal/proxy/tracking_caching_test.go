package proxy_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/redproxy/redproxy/internal/proxytest"
)

// TestTrackingCachingKeptAcrossProxyAnswers: on a tracking relay, CLIENT
// CACHING stays in force across the CLIENT subcommands the proxy answers
// itself with a script (CLIENT ID, INFO, LIST), as Redis keeps it across
// any CLIENT subcommand: the read behind them is tracked (OPTIN, CACHING
// yes) or not (OPTOUT, CACHING no) as on Redis, so a client-side cache is
// invalidated when it should be. The script ended the flag (found by a
// probe: after CLIENT CACHING yes, CLIENT ID, GET k, another client's
// SET k sent no invalidation; with OPTOUT and CACHING no, one too many).
func TestTrackingCachingKeptAcrossProxyAnswers(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	for _, mode := range []struct{ tracking, caching string }{{"OPTIN", "yes"}, {"OPTOUT", "no"}} {
		for _, between := range [][][]string{{{"CLIENT", "ID"}}, {{"CLIENT", "INFO"}}, {{"CLIENT", "LIST"}}, {{"CLIENT", "KILL", "ID", "999999"}},
			// A transaction ends the flag on Redis: not sent again after it.
			{{"MULTI"}, {"EXEC"}, {"CLIENT", "ID"}}} {
			var words []string
			for _, cmd := range between {
				words = append(words, strings.Join(cmd, "_"))
			}
			name := fmt.Sprintf("%s/%s", mode.tracking, strings.Join(words, "+"))
			t.Run(name, func(t *testing.T) {
				key := "caching:" + name
				pushes := map[string]string{}
				for target, addr := range map[string]string{"redis": p.Redis.Addr(), "proxy": p.Addr} {
					c := dialRaw(t, addr)
					c.do("HELLO", "3")
					if v := c.do("CLIENT", "TRACKING", "ON", mode.tracking); v != "OK" {
						t.Fatalf("%s: CLIENT TRACKING ON %s = %v", target, mode.tracking, v)
					}
					if v := c.do("CLIENT", "CACHING", mode.caching); v != "OK" {
						t.Fatalf("%s: CLIENT CACHING %s = %v", target, mode.caching, v)
					}
					for _, cmd := range between {
						c.do(cmd...)
					}
					c.do("GET", key)
					if v := dialRaw(t, addr).do("SET", key, "changed"); v != "OK" {
						t.Fatalf("%s: SET = %v", target, v)
					}
					// The invalidation, if any, is pushed before PING's
					// reply: the SET ran before the PING was sent.
					c.send([]string{"PING"})
					var got []string
					for {
						v, types := c.readReply()
						if types[0] != '>' {
							if v != "PONG" {
								t.Fatalf("%s: PING = %v", target, v)
							}
							break
						}
						got = append(got, fmt.Sprint(v))
					}
					pushes[target] = fmt.Sprint(got)
				}
				if pushes["proxy"] != pushes["redis"] {
					t.Fatalf("pushes after another client's SET: proxy %s, Redis %s", pushes["proxy"], pushes["redis"])
				}
				if mode.caching == "yes" && len(between) == 1 && pushes["redis"] == "[]" {
					t.Fatal("Redis itself sent no invalidation: the test checks nothing")
				}
			})
		}
	}
}

// TestTrackingCachingRefusedKeepsTheFlag: a CLIENT CACHING Redis refuses
// (no under OPTIN, yes under OPTOUT, a bad argument) leaves the flag an
// earlier one set; the relay sends again the one Redis took, not the last
// one the client sent (found by review: sent again, the refused one was
// refused again, the flag lost and the read behind it left untracked).
func TestTrackingCachingRefusedKeepsTheFlag(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	for _, tc := range []struct{ mode, ok, bad string }{{"OPTIN", "yes", "no"}, {"OPTOUT", "no", "yes"}, {"OPTIN", "yes", "maybe"}} {
		t.Run(tc.mode+"/"+tc.bad, func(t *testing.T) {
			key := "caching:refused:" + tc.mode + ":" + tc.bad
			pushes := map[string]string{}
			for target, addr := range map[string]string{"redis": p.Redis.Addr(), "proxy": p.Addr} {
				c := dialRaw(t, addr)
				c.do("HELLO", "3")
				c.do("CLIENT", "TRACKING", "ON", tc.mode)
				if v := c.do("CLIENT", "CACHING", tc.ok); v != "OK" {
					t.Fatalf("%s: CLIENT CACHING %s = %v", target, tc.ok, v)
				}
				if v, ok := c.do("CLIENT", "CACHING", tc.bad).(respError); !ok {
					t.Fatalf("%s: CLIENT CACHING %s = %v, want an error", target, tc.bad, v)
				}
				c.do("CLIENT", "ID")
				c.do("GET", key)
				dialRaw(t, addr).do("SET", key, "changed")
				c.send([]string{"PING"})
				var got []string
				for {
					v, types := c.readReply()
					if types[0] != '>' {
						break
					}
					got = append(got, fmt.Sprint(v))
				}
				pushes[target] = fmt.Sprint(got)
			}
			if pushes["proxy"] != pushes["redis"] {
				t.Fatalf("pushes after another client's SET: proxy %s, Redis %s", pushes["proxy"], pushes["redis"])
			}
		})
	}
}
