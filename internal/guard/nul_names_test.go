package guard_test

// Command names with a NUL byte (from review-guard's
// review_guard_test.go, renamed without "Review").
//
// What they show: Redis finds a command by hashing its whole name, NUL
// bytes included, but compares the candidates of the hash's bucket with
// strcasecmp, which stops at the first NUL. So "KEYS\x00<suffix>" runs as
// KEYS whenever the whole name lands in KEYS's bucket (about one try in
// 256; for a subcommand such as "CONFIG SET\x00<suffix>", about one in 8).
//
// What went wrong: the proxy compared the whole name, did not know the
// command, and forwarded it unchecked as an unknown command. KEYS,
// FLUSHALL and a denied CONFIG SET ran through the guard, and
// "SELECT\x00<suffix> 9" ran SELECT on a connection other clients share,
// moving their commands to database 9. The proxy now answers a command
// whose name (or subcommand name) has a NUL byte itself, with Redis's
// unknown command error, and never forwards it.

import (
	"fmt"
	"strings"
	"testing"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/proxytest"
)

// nulTries sends name+"\x00"+i (i = 0, 1, ...) with args through nc, in
// pipelines of 256, until one reply satisfies ran or tries runs out. Redis
// finds a command by hashing the whole name but compares the candidates
// of the hash's bucket with strcasecmp, which stops at the NUL: a name
// that lands in the bucket of the real command runs as that command.
// It returns the name that ran and its reply, or "".
func nulTries(t *testing.T, send func(cmds [][]string) []string, build func(i int) []string, ran func(reply string) bool, tries int) (string, string) {
	t.Helper()
	for start := 0; start < tries; start += 256 {
		var cmds [][]string
		for i := start; i < start+256 && i < tries; i++ {
			cmds = append(cmds, build(i))
		}
		for j, r := range send(cmds) {
			if ran(r) {
				return fmt.Sprintf("%q", strings.Join(cmds[j], " ")), r
			}
		}
	}
	return "", ""
}

// TestNULSuffixedCommandBypassesDeny: KEYS, FLUSHALL and a denied CONFIG
// SET must be refused (README "Policy": refused unless allowed), however
// their name is spelled. With a NUL byte and a suffix after the name they
// used to be forwarded as unknown commands, and Redis ran them whenever
// the whole name hashed into the real command's bucket.
func TestNULSuffixedCommandBypassesDeny(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) {
		c.Policy = policy.Config{Mode: "enforce", Commands: policy.CommandRules{Deny: []string{"config|set"}}}
	})
	direct := p.Redis.Client(t)
	nc := p.Dial(t)
	send := func(cmds [][]string) []string { return roundTrip(t, nc, cmds...) }

	t.Run("KEYS", func(t *testing.T) {
		check(t, "seed", direct.Set(ctx, "secret:1", "x", 0).Err())
		if got := roundTrip(t, nc, []string{"KEYS", "*"}); !strings.HasPrefix(got[0], "-ERR redproxy policy: KEYS is disabled") {
			t.Fatalf("control: KEYS * = %q", got)
		}
		name, reply := nulTries(t, send, func(i int) []string { return []string{fmt.Sprintf("KEYS\x00%d", i), "*"} },
			func(r string) bool { return strings.HasPrefix(r, "*[") }, 8192)
		if name != "" {
			t.Errorf("%s through the proxy ran KEYS on Redis: %s", name, reply)
		}
		// What Redis answers when the name misses KEYS's bucket: its
		// unknown command error, the name cut at the NUL.
		if got := roundTrip(t, nc, []string{"KEYS\x00x", "*"}); got[0] != "-ERR unknown command 'KEYS', with args beginning with: '*' " {
			t.Errorf("KEYS\\x00x * = %q", got)
		}
	})

	t.Run("CONFIG SET", func(t *testing.T) {
		if got := roundTrip(t, nc, []string{"CONFIG", "SET", "slowlog-max-len", "4321"}); !strings.HasPrefix(got[0], "-ERR redproxy policy: CONFIG SET is disabled") {
			t.Fatalf("control: CONFIG SET = %q", got)
		}
		name, _ := nulTries(t, send, func(i int) []string {
			return []string{"CONFIG", fmt.Sprintf("SET\x00%d", i), "slowlog-max-len", "4321"}
		}, func(r string) bool { return r == "+OK" }, 512)
		if name != "" {
			v, _ := direct.ConfigGet(ctx, "slowlog-max-len").Result()
			t.Errorf("%s through the proxy ran the denied CONFIG SET: slowlog-max-len is now %v", name, v)
		}
		if got := roundTrip(t, nc, []string{"CONFIG", "SET\x00x", "slowlog-max-len", "4321"}); got[0] != "-ERR unknown subcommand 'SET'. Try CONFIG HELP." {
			t.Errorf("CONFIG SET\\x00x ... = %q", got)
		}
	})

	t.Run("FLUSHALL", func(t *testing.T) {
		check(t, "seed", direct.Set(ctx, "precious:1", "x", 0).Err())
		if got := roundTrip(t, nc, []string{"FLUSHALL"}); !strings.HasPrefix(got[0], "-ERR redproxy policy: FLUSHALL is disabled") {
			t.Fatalf("control: FLUSHALL = %q", got)
		}
		name, _ := nulTries(t, send, func(i int) []string { return []string{fmt.Sprintf("FLUSHALL\x00%d", i)} },
			func(r string) bool { return r == "+OK" }, 8192)
		if name != "" {
			t.Errorf("%s through the proxy ran FLUSHALL: precious:1 exists = %d", name, direct.Exists(ctx, "precious:1").Val())
		}
	})
}

// TestNULSuffixedSelectMovesOtherClients: the same hole outside the
// guard. SELECT is a command the proxy must handle itself (it changes the
// connection other clients share); spelled "SELECT\x00<n>" it was unknown
// to the proxy and forwarded on a shared connection, where Redis ran it
// once the name landed in SELECT's bucket. Every other client on that
// connection then read and wrote database 9.
func TestNULSuffixedSelectMovesOtherClients(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Upstream.Connections = 1 })
	db0, db9 := dbClient(t, p.Redis, 0), dbClient(t, p.Redis, 9)
	a := p.Dial(t)
	name, _ := nulTries(t, func(cmds [][]string) []string { return roundTrip(t, a, cmds...) },
		func(i int) []string { return []string{fmt.Sprintf("SELECT\x00%d", i), "9"} },
		func(r string) bool { return r == "+OK" }, 8192)
	if name != "" {
		t.Errorf("%s through the proxy answered +OK: it ran SELECT", name)
	}
	b := p.Dial(t) // another client, on database 0
	if got := roundTrip(t, b, []string{"SET", "victim", "v"}); got[0] != "+OK" {
		t.Fatalf("SET: %q", got)
	}
	if db0.Exists(ctx, "victim").Val() != 1 {
		t.Errorf("after client A sent %s, client B's SET victim (database 0) landed in database 9: exists there = %d",
			name, db9.Exists(ctx, "victim").Val())
	}
}

// TestNULNamedCommandInMultiAndOnRelay: the same answer on the paths that
// do not share a connection. Inside MULTI it is a queue-time error, as in
// Redis (EXEC answers EXECABORT and nothing runs); a tracking client's
// commands are relayed raw on its own connection, where KEYS spelled with
// a NUL would still have bypassed the deny list.
func TestNULNamedCommandInMultiAndOnRelay(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Policy = policy.Config{Mode: "enforce"} })
	direct := p.Redis.Client(t)
	check(t, "seed", direct.Set(ctx, "secret:1", "x", 0).Err())
	const keysErr = "-ERR unknown command 'KEYS', with args beginning with: '*' "

	t.Run("MULTI", func(t *testing.T) {
		nc := p.Dial(t)
		got := roundTrip(t, nc, []string{"MULTI"}, []string{"KEYS\x00x", "*"}, []string{"SET", "tx:k", "v"}, []string{"EXEC"})
		equalReplies(t, got, []string{"+OK", keysErr, "+QUEUED", "-EXECABORT Transaction discarded because of previous errors."})
		if n := direct.Exists(ctx, "tx:k").Val(); n != 0 {
			t.Errorf("the aborted transaction's SET ran: tx:k exists = %d", n)
		}
	})

	t.Run("tracking relay", func(t *testing.T) {
		nc := p.Dial(t)
		equalReplies(t, roundTrip(t, nc, []string{"CLIENT", "TRACKING", "ON"}), []string{"+OK"})
		send := func(cmds [][]string) []string { return roundTrip(t, nc, cmds...) }
		name, reply := nulTries(t, send, func(i int) []string { return []string{fmt.Sprintf("KEYS\x00%d", i), "*"} },
			func(r string) bool { return r != keysErr }, 2048)
		if name != "" {
			t.Errorf("%s on a tracking relay answered %q", name, reply)
		}
	})
}
