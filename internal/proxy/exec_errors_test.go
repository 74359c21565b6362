package proxy_test

import (
	"testing"

	"github.com/redproxy/redproxy/internal/proxytest"
)

// Errors inside EXEC's reply are counted against the commands that failed,
// as Redis counts them (errorstat, failed_calls): they were counted
// nowhere (found by a probe).
func TestExecErrorsCountedPerCommand(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	errs := func(cmd string) float64 { return counterSum(t, p, "redproxy_command_errors_total", "command", cmd) }
	c := dialRaw(t, p.Addr)
	c.send([]string{"HSET", "tx:h", "f", "v"})
	c.readReply()
	before := map[string]float64{"incr": errs("incr"), "lpush": errs("lpush"), "set": errs("set"), "exec": errs("exec")}
	c.send([]string{"MULTI"}, []string{"INCR", "tx:h"}, []string{"LPUSH", "tx:h", "x"}, []string{"SET", "tx:ok", "1"}, []string{"EXEC"})
	for range 4 {
		c.readReply()
	}
	v, _ := c.readReply()
	if got, ok := v.([]any); !ok || len(got) != 3 {
		t.Fatalf("EXEC: %#v", v)
	}
	for cmd, want := range map[string]float64{"incr": 1, "lpush": 1, "set": 0, "exec": 0} {
		if got := errs(cmd) - before[cmd]; got != want {
			t.Errorf("redproxy_command_errors_total{command=%q} rose by %v, want %v", cmd, got, want)
		}
	}
}
