package stampede_test

import (
	"bufio"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// TestHeldClientThatLeavesIsDropped shows that a client held by a miss hold
// that hangs up, or is killed with CLIENT KILL, leaves CLIENT LIST at once,
// as a client blocked in BLPOP does (the BLPOP cases are controls) and as
// Redis drops a blocked client. What went wrong (found by review): heldRead
// waited in Hold.Wait, which only the hold's end wakes, so the dead session
// kept its slot (CLIENT LIST, redproxy_client_connections,
// server.max_clients, and any hold it was filling) until the hold ended, up
// to the rule's timeout (at most a minute).
func TestHeldClientThatLeavesIsDropped(t *testing.T) {
	for _, tc := range []struct{ how, cmd string }{
		{"hangs-up", "GET"}, {"client-kill", "GET"},
		// Controls: a client blocked in BLPOP through the proxy is dropped.
		{"hangs-up", "BLPOP"}, {"client-kill", "BLPOP"},
	} {
		how := tc.how
		t.Run(tc.cmd+"/"+how, func(t *testing.T) {
			p := proxytest.Start(t, nil, holdRule("cache:*", 20*time.Second))
			filler := p.Dial(t)
			if got := rawGet(t, filler, bufio.NewReader(filler), "cache:k"); got != "$-1\r\n" {
				t.Fatalf("filler got %q, want a miss", got)
			}
			admin := p.Client(t, func(o *redis.Options) { o.PoolSize = 1 })
			held := p.Dial(t)
			hr := bufio.NewReader(held)
			held.Write([]byte("*2\r\n$6\r\nCLIENT\r\n$2\r\nID\r\n"))
			line, err := hr.ReadString('\n')
			if err != nil || line[0] != ':' {
				t.Fatalf("CLIENT ID: %q, %v", line, err)
			}
			id := strings.TrimSpace(line[1:])
			if tc.cmd == "GET" {
				held.Write([]byte("*2\r\n$3\r\nGET\r\n$7\r\ncache:k\r\n"))
				redistest.Eventually(t, 5*time.Second, func() bool { return metric(t, p, mHeld) == 1 }, "the read was not held")
			} else {
				held.Write([]byte("*3\r\n$5\r\nBLPOP\r\n$4\r\nlist\r\n$1\r\n0\r\n"))
				time.Sleep(200 * time.Millisecond)
			}
			listed := func() bool {
				list, err := admin.ClientList(ctx).Result()
				if err != nil {
					t.Fatal(err)
				}
				return strings.Contains(list, "id="+id+" ")
			}
			if !listed() {
				t.Fatal("the held client is not in CLIENT LIST")
			}
			if how == "client-kill" {
				if err := admin.Do(ctx, "CLIENT", "KILL", "ID", id).Err(); err != nil {
					t.Fatal(err)
				}
			} else {
				held.Close()
			}
			left := time.Now()
			deadline := left.Add(3 * time.Second)
			for listed() && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			if listed() {
				t.Fatalf("client %s %s while in %s; %v later it is still in CLIENT LIST (hold timeout 20s; Redis drops a blocked client that leaves at once)",
					id, how, tc.cmd, time.Since(left).Round(time.Millisecond))
			}
		})
	}
}
