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
