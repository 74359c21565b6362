package proxy_test

import (
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/proxytest"
)

// TestLatencyCountedPerCommandInPipelines checks that a pipeline's
// latencies, recorded as one observation per run of equal commands
// (flush's latencyRun), still count every command: for each command the
// histogram's count equals redproxy_commands_total, with runs broken by
// other commands, replies from Redis and from the proxy, and an error.
func TestLatencyCountedPerCommandInPipelines(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	c := p.Client(t)
	cmds := [][]any{
		{"GET", "a"}, {"GET", "b"}, {"GET", "c"}, {"SET", "d", "1"}, {"GET", "d"}, {"GET", "e"},
		{"ECHO", "x"}, {"ECHO", "y"}, {"PING"}, {"INCR", "d"}, {"INCR", "d"}, {"LPUSH", "d", "x"}, {"GET", "a"},
	}
	pipe := c.Pipeline() // one write: one batch
	res := make([]*redis.Cmd, len(cmds))
	for i, args := range cmds {
		res[i] = pipe.Do(ctx, args...)
	}
	pipe.Exec(ctx) // the first error is GET a's redis.Nil
	if err := res[11].Err(); err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Fatalf("LPUSH on a string: %v, want WRONGTYPE", err)
	}
	want := map[string]uint64{}
	for _, args := range cmds {
		want[strings.ToLower(args[0].(string))]++
	}
	for name, n := range want {
		calls, _, err := metrics.CounterSum(p.Metrics.Registry, "redproxy_commands_total", "command", name)
		if err != nil || uint64(calls) != n {
			t.Fatalf("%s: redproxy_commands_total %v (%v), want %d", name, calls, err, n)
		}
		got, _, err := metrics.HistogramCount(p.Metrics.Registry, "redproxy_command_duration_seconds", "command", name)
		if err != nil || got != n {
			t.Errorf("%s: duration histogram counts %d (%v), want %d", name, got, err, n)
		}
	}
}

// TestClientListShowsLastCommand checks CLIENT LIST's cmd field, which the
// session stores only when the command changes: after a run of one command,
// after another in the same batch, after a batch of one, and for the
// CLIENT INFO that asks.
func TestClientListShowsLastCommand(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	c, watcher := p.Client(t).Conn(), p.Client(t) // c: one connection
	t.Cleanup(func() { c.Close() })
	c.Ping(ctx) // connect before watching
	cmdOf := func() string {
		t.Helper()
		list, err := watcher.ClientList(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(list, "\n") {
			if !strings.Contains(line, "cmd=client|list") {
				for _, f := range strings.Fields(line) {
					if v, ok := strings.CutPrefix(f, "cmd="); ok {
						return v
					}
				}
			}
		}
		t.Fatalf("no other client in CLIENT LIST:\n%s", list)
		return ""
	}
	pipe := c.Pipeline()
	for range 5 {
		pipe.Get(ctx, "k")
	}
	pipe.Exec(ctx)
	if got := cmdOf(); got != "get" {
		t.Fatalf("after five GETs cmd=%s, want get", got)
	}
	pipe = c.Pipeline()
	pipe.Get(ctx, "k")
	pipe.Set(ctx, "k", "v", 0)
	pipe.Exec(ctx)
	if got := cmdOf(); got != "set" {
		t.Fatalf("after GET, SET cmd=%s, want set", got)
	}
	c.Get(ctx, "k")
	if got := cmdOf(); got != "get" {
		t.Fatalf("after a lone GET cmd=%s, want get", got)
	}
	info, err := c.ClientInfo(ctx).Result()
	if err != nil || info.LastCmd != "client|info" {
		t.Fatalf("CLIENT INFO: cmd=%q (%v), want client|info", info.LastCmd, err)
	}
}

// The same on a relay (a RESP3 subscriber, whose CLIENT INFO the proxy
// answers through Redis): the relay's commands are the client's last
// ones, where the field said "subscribe" for the rest of its life (found
// by the differential sweep).
func TestClientListShowsLastCommandOnARelay(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	sub := dialRaw(t, p.Addr)
	wantReplies(t, sub, []string{"HELLO", "3"})
	sub.readReply()
	wantReplies(t, sub, []string{"SUBSCRIBE", "lc:ch"}, []any{"subscribe", "lc:ch", int64(1)})
	info, _ := sub.do("CLIENT", "INFO").(string)
	if !strings.Contains(info, " cmd=client|info ") {
		t.Fatalf("CLIENT INFO of a subscriber: %q, want cmd=client|info", info)
	}
	wantReplies(t, sub, []string{"PING"}, "PONG")
	list, err := p.Client(t).ClientList(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(list, "\n") {
		if strings.Contains(line, "flags=P") {
			if !strings.Contains(line, " cmd=ping ") {
				t.Fatalf("the subscriber after PING in CLIENT LIST: %q, want cmd=ping", line)
			}
			return
		}
	}
	t.Fatalf("no subscriber in CLIENT LIST:\n%s", list)
}

// Commands on a relay count in redproxy_commands_total as any client's:
// a tracking client's (rueidis with client-side caching) and a RESP3
// subscriber's were missing, the rest of the batch that started the relay
// too (found by a probe). Their replies pass through raw, so they are not
// in the duration histogram or redproxy_command_errors_total.
func TestRelayedCommandsAreCounted(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	calls := func(name string) float64 {
		n, _, err := metrics.CounterSum(p.Metrics.Registry, "redproxy_commands_total", "command", name)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	c := dialRaw(t, p.Addr)
	c.send([]string{"HELLO", "3"})
	c.readReply()
	// The relay starts with the batch of CLIENT TRACKING ON; the GET
	// behind it is relayed with it, then two more batches.
	c.send([]string{"CLIENT", "TRACKING", "ON"}, []string{"GET", "a"})
	c.readReply()
	c.readReply()
	c.send([]string{"GET", "b"}, []string{"SET", "c", "1"})
	c.readReply()
	c.readReply()
	c.send([]string{"GET", "c"})
	c.readReply()
	for name, want := range map[string]float64{"client|tracking": 1, "get": 3, "set": 1} {
		if got := calls(name); got != want {
			t.Errorf("redproxy_commands_total{command=%q} = %v, want %v", name, got, want)
		}
	}
}
