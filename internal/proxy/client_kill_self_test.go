package proxy_test

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/resp"
)

// sendAllReadToEnd writes cmds in one write on a new connection to addr
// (before is sent first, each reply read, to learn things such as the
// connection's id) and returns every byte the server sends until it
// closes the connection or wait passes, and whether it closed.
func sendAllReadToEnd(t *testing.T, addr string, build func(nc net.Conn) [][]string, wait time.Duration) (string, bool) {
	t.Helper()
	nc := dialAddr(t, addr)
	cmds := build(nc)
	var b []byte
	for _, c := range cmds {
		b = resp.AppendCommandStrings(b, c...)
	}
	if _, err := nc.Write(b); err != nil {
		t.Fatal(err)
	}
	nc.SetReadDeadline(time.Now().Add(wait))
	got, err := io.ReadAll(nc)
	closed := err == nil
	if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		closed = true // a reset
	}
	return string(got), closed
}

// TestClientKillSelfMidPipelineMatchesRedis: a client that kills itself
// (CLIENT KILL with its own address, or ID with SKIPME no) in the middle
// of a pipeline gets the kill's reply and then the end of the connection,
// and nothing it pipelined behind the kill runs: Redis marks the client
// CLOSE_AFTER_REPLY and stops processing its query buffer. Through the
// proxy the reply is lost and the commands behind it still run.
func TestClientKillSelfMidPipelineMatchesRedis(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	direct := p.Redis.Client(t)
	for _, form := range []string{"addr", "id"} {
		t.Run(form, func(t *testing.T) {
			key := "selfkill:" + form
			run := func(addr string) (string, bool, int64) {
				direct.Del(ctx, key)
				got, closed := sendAllReadToEnd(t, addr, func(nc net.Conn) [][]string {
					kill := []string{"CLIENT", "KILL", nc.LocalAddr().String()}
					if form == "id" {
						id := rawDo(t, nc, "CLIENT", "ID") // ":<id>\r\n"
						kill = []string{"CLIENT", "KILL", "ID", id[1 : len(id)-2], "SKIPME", "no"}
					}
					return [][]string{kill, {"SET", key, "ran"}, {"PING"}}
				}, 3*time.Second)
				// The connection may end before the proxy has flushed
				// what followed the kill: give it time to.
				time.Sleep(500 * time.Millisecond)
				n, _ := direct.Exists(ctx, key).Result()
				return got, closed, n
			}
			wantOut, wantClosed, wantSet := run(p.Redis.Addr())
			gotOut, gotClosed, gotSet := run(p.Addr)
			if gotOut != wantOut || gotClosed != wantClosed || gotSet != wantSet {
				t.Fatalf("CLIENT KILL of itself, then SET and PING in the same write:\n"+
					"  redis: replies %q, closed %v, SET ran: %v\n"+
					"  proxy: replies %q, closed %v, SET ran: %v",
					wantOut, wantClosed, wantSet == 1, gotOut, gotClosed, gotSet == 1)
			}
		})
	}
}
