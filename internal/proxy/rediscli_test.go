package proxy_test

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/proxytest"
)

// redisCLI runs redis-cli against the proxy and returns its output, and
// an error if it exited other than with 0 (cliAt).
func redisCLI(t *testing.T, p *proxytest.Proxy, stdin []byte, args ...string) (string, error) {
	t.Helper()
	out, code := cliAt(t, p.Addr, stdin, args...)
	if code != 0 {
		return out, fmt.Errorf("redis-cli exited with %d", code)
	}
	return out, nil
}

// TestRedisCLI drives the proxy with redis-cli as an operator does: single
// commands, the guard's refusal as redis-cli shows it, and --pipe mass
// insertion, whose replies redis-cli counts.
func TestRedisCLI(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	direct := p.Redis.Client(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"PING"}, "PONG"},
		{[]string{"SET", "cli:greeting", "hello world"}, "OK"},
		{[]string{"GET", "cli:greeting"}, "hello world"},
		{[]string{"--no-raw", "GET", "cli:greeting"}, `"hello world"`},
		{[]string{"INCRBY", "cli:n", "5"}, "5"},
		{[]string{"-n", "3", "SET", "cli:db3", "x"}, "OK"},
	} {
		if out, err := redisCLI(t, p, nil, tc.args...); err != nil || out != tc.want {
			t.Errorf("redis-cli %v = %q, %v; want %q", tc.args, out, err, tc.want)
		}
	}
	db3 := redis.NewClient(&redis.Options{Addr: p.Redis.Addr(), DB: 3})
	defer db3.Close()
	if got := db3.Get(ctx, "cli:db3").Val(); got != "x" {
		t.Errorf("cli:db3 in Redis DB 3 = %q", got)
	}

	// The guard's refusal reaches redis-cli as a Redis error line.
	out, _ := redisCLI(t, p, nil, "KEYS", "*")
	if want := "ERR redproxy policy: KEYS is disabled; use SCAN 0 MATCH pattern COUNT 100"; !strings.Contains(out, want) {
		t.Errorf("redis-cli KEYS * = %q, want it to show %q", out, want)
	}
	out, _ = redisCLI(t, p, nil, "FLUSHALL")
	if !strings.Contains(out, "ERR redproxy policy: FLUSHALL is disabled") {
		t.Errorf("redis-cli FLUSHALL = %q", out)
	}

	// --pipe: raw RESP on stdin, every reply counted, none an error.
	const n = 5000
	var proto bytes.Buffer
	for i := range n {
		key, val := "cli:pipe:"+strconv.Itoa(i), "v"+strconv.Itoa(i)
		fmt.Fprintf(&proto, "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n", len(key), key, len(val), val)
	}
	out, err := redisCLI(t, p, proto.Bytes(), "--pipe")
	if err != nil || !strings.Contains(out, fmt.Sprintf("errors: 0, replies: %d", n)) {
		t.Fatalf("redis-cli --pipe: %v\n%s", err, out)
	}
	if got := direct.Get(ctx, "cli:pipe:4999").Val(); got != "v4999" {
		t.Fatalf("last piped key = %q", got)
	}
	if got := direct.Get(ctx, "cli:greeting").Val(); got != "hello world" {
		t.Fatalf("cli:greeting in Redis = %q", got)
	}
}
