package proxy_test

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/proxytest"
)

// rfReadLines reads until n lines have arrived, or d passed (the CI's race
// run missed a WATCH reply in a fixed 50 ms window).
func rfReadLines(nc net.Conn, n int, d time.Duration) string {
	var sb strings.Builder
	buf := make([]byte, 4096)
	nc.SetReadDeadline(time.Now().Add(d))
	for strings.Count(sb.String(), "\r\n") < n {
		k, err := nc.Read(buf)
		sb.Write(buf[:k])
		if err != nil {
			break
		}
	}
	return sb.String()
}

// WATCH, then the pinned connection is killed and the key changed by
// another client: EXEC must never succeed.
func TestReviewFaultsWatchKilledThenExec(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	direct := p.Redis.Client(t)
	other := p.Client(t)
	ctx := context.Background()
	for i := range 20 {
		nc := p.Dial(t)
		rfSend(t, nc, "WATCH", "wk")
		out := rfReadLines(nc, 1, 10*time.Second)
		if out != "+OK\r\n" {
			t.Fatalf("WATCH: %q", out)
		}
		rfKillNamed(t, direct, " name=redproxy-pinned")
		rfKillNamed(t, direct, " cmd=watch ")
		other.Set(ctx, "wk", "other"+strconv.Itoa(i), 0)
		rfSend(t, nc, "MULTI")
		rfSend(t, nc, "SET", "wk", "mine")
		rfSend(t, nc, "EXEC")
		out = rfReadLines(nc, 3, 10*time.Second)
		more, _ := rfReadAll(nc, 100*time.Millisecond) // anything past three replies
		out += more
		// MULTI may answer +OK (the transaction is aborted, as after a
		// queue-time error); SET and EXEC must fail.
		isErr := func(l string) bool { return strings.HasPrefix(l, "-") }
		if lines := strings.Split(strings.TrimSuffix(out, "\r\n"), "\r\n"); len(lines) != 3 || lines[0] != "+OK" && !isErr(lines[0]) ||
			!isErr(lines[1]) || !isErr(lines[2]) {
			t.Errorf("iteration %d: MULTI, SET, EXEC after the WATCH's connection was lost and the key changed = %q; want EXEC and SET to fail, nothing run", i, out)
		}
		if v := direct.Get(ctx, "wk").Val(); v != "other"+strconv.Itoa(i) {
			t.Errorf("iteration %d: wk = %q after the failed transaction, want the other client's write", i, v)
		}
		nc.Close()
	}
}
