package proxy_test

import (
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/proxytest"
)

// replyTrace sends each write of writes on a new connection to addr (one
// write each, without waiting between them), then reads every reply
// until the connection ends or nothing comes for wait, and returns them
// as "types value" strings, with "<closed>" at the end if it ended.
func replyTrace(t *testing.T, addr string, writes [][][]string, raw []byte, wait time.Duration) []string {
	t.Helper()
	c := dialRaw(t, addr)
	for _, w := range writes {
		c.send(w...)
	}
	if raw != nil {
		if _, err := c.nc.Write(raw); err != nil {
			t.Fatal(err)
		}
	}
	var out []string
	for {
		c.nc.SetReadDeadline(time.Now().Add(wait))
		var types []byte
		v, err := readValue(c.rd, &types)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return out
			}
			return append(out, "<closed>")
		}
		out = append(out, string(types)+" "+fmt.Sprint(v))
	}
}

// skipCases runs each case against Redis and the proxy and compares the
// replies.
func skipCases(t *testing.T, p *proxytest.Proxy, cases map[string][][][]string) {
	for name, writes := range cases {
		t.Run(name, func(t *testing.T) {
			want := replyTrace(t, p.Redis.Addr(), writes, nil, time.Second)
			got := replyTrace(t, p.Addr, writes, nil, time.Second)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("replies differ:\n  redis: %q\n  proxy: %q", want, got)
			}
		})
	}
}

// TestReplySkipBeforeResetMatchesRedis: CLIENT REPLY SKIP mutes the reply
// of the next command, RESET included: RESET clears REPLY OFF and a SKIP
// still pending, not the skip of the command running, so Redis sends no
// +RESET. The proxy answers RESET itself with the mute cleared first
// (local.go cmdReset: curMute = false), so the client gets a +RESET it
// does not expect and takes every later reply for the one before.
func TestReplySkipBeforeResetMatchesRedis(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	skipCases(t, p, map[string][][][]string{
		"RESET":          {{{"CLIENT", "REPLY", "SKIP"}, {"RESET"}, {"PING"}}},
		"OFF SKIP RESET": {{{"CLIENT", "REPLY", "OFF"}, {"CLIENT", "REPLY", "SKIP"}, {"RESET"}, {"PING"}}},
		"OFF SKIP ON":    {{{"CLIENT", "REPLY", "OFF"}, {"CLIENT", "REPLY", "SKIP"}, {"CLIENT", "REPLY", "ON"}, {"PING"}}},
		"SKIP RESET OFF": {{{"CLIENT", "REPLY", "SKIP"}, {"RESET"}, {"CLIENT", "REPLY", "OFF"}, {"PING"}, {"CLIENT", "REPLY", "ON"}, {"ECHO", "x"}}},
		"OFF RESET":      {{{"CLIENT", "REPLY", "OFF"}, {"RESET"}, {"PING"}}},
	})
}

// TestReplySkipBeforeRelayStartMatchesRedis: CLIENT REPLY SKIP before a
// command that makes the proxy relay the client on a connection of its own
// (MONITOR, CLIENT TRACKING ON). Redis mutes that command's +OK. The proxy
// carries only CLIENT REPLY OFF over to the relay's connection
// (stateful.go startRelay/relay: sess.replyOff), so the pending skip is
// lost and Redis's +OK on the relay's connection reaches the client.
func TestReplySkipBeforeRelayStartMatchesRedis(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	skipCases(t, p, map[string][][][]string{
		"MONITOR": {{{"CLIENT", "REPLY", "SKIP"}, {"MONITOR"}}},
		"CLIENT TRACKING ON": {{
			{"CLIENT", "REPLY", "SKIP"}, {"HELLO", "3"}, {"CLIENT", "REPLY", "SKIP"}, {"CLIENT", "TRACKING", "ON"}, {"PING"},
		}},
		// The skip in a write of its own, then the command.
		"MONITOR apart":            {{{"CLIENT", "REPLY", "SKIP"}}, {{"MONITOR"}}},
		"CLIENT TRACKING ON RESP2": {{{"CLIENT", "REPLY", "SKIP"}, {"CLIENT", "TRACKING", "ON"}, {"PING"}}},
		"CLIENT TRACKING ON BCAST": {{
			{"CLIENT", "REPLY", "SKIP"}, {"HELLO", "3"}, {"CLIENT", "REPLY", "SKIP"}, {"CLIENT", "TRACKING", "ON", "BCAST"}, {"PING"},
		}},
		// The skip ends with the command it muted.
		"CLIENT TRACKING ON then ECHO": {{
			{"CLIENT", "REPLY", "SKIP"}, {"HELLO", "3"}, {"CLIENT", "REPLY", "SKIP"}, {"CLIENT", "TRACKING", "ON"}, {"ECHO", "a"}, {"ECHO", "b"},
		}},
		// Pub/sub confirmations are pushes, which Redis never mutes; the
		// skip goes with them.
		"SUBSCRIBE":        {{{"CLIENT", "REPLY", "SKIP"}, {"SUBSCRIBE", "skip:ch"}, {"PING"}}},
		"PSUBSCRIBE":       {{{"CLIENT", "REPLY", "SKIP"}, {"PSUBSCRIBE", "skip:*"}, {"PING"}}},
		"SSUBSCRIBE":       {{{"CLIENT", "REPLY", "SKIP"}, {"SSUBSCRIBE", "skip:ch"}, {"PING"}}},
		"SUBSCRIBE two":    {{{"CLIENT", "REPLY", "SKIP"}, {"SUBSCRIBE", "skip:a", "skip:b"}, {"UNSUBSCRIBE"}, {"PING"}}},
		"SUBSCRIBE RESP3":  {{{"CLIENT", "REPLY", "SKIP"}, {"HELLO", "3"}, {"CLIENT", "REPLY", "SKIP"}, {"SUBSCRIBE", "skip:ch"}, {"PING"}}},
		"SUBSCRIBE leaves": {{{"CLIENT", "REPLY", "SKIP"}, {"HELLO", "3"}, {"CLIENT", "REPLY", "SKIP"}, {"SUBSCRIBE", "skip:ch"}, {"UNSUBSCRIBE"}, {"SET", "skip:k", "v"}, {"GET", "skip:k"}}},
	})
}
