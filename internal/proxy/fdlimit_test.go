package proxy_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxy"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// A file descriptor limit below max_clients lowers it, as Redis lowers
// maxclients: a client past what the limit leaves room for is told "max
// number of clients reached" rather than left unanswered while accept
// fails (found by a probe: ulimit -n 256 with max_clients 10000).
func TestFileLimitBoundsMaxClients(t *testing.T) {
	p := proxytest.Start(t, redistest.Start(t), func(c *config.Config) { c.Upstream.MaxPinned = 1 })
	p.SetFileLimit(proxy.FDReserve + 1 + 2) // room for two clients, one of them pinned
	var conns []*rawConn
	for range 2 {
		c := dialRaw(t, p.Addr)
		conns = append(conns, c)
		c.send([]string{"PING"})
		if got, _ := c.readReply(); got != "PONG" {
			t.Fatalf("a client within the limit: %#v", got)
		}
	}
	third := p.Dial(t)
	third.SetDeadline(time.Now().Add(5 * time.Second))
	if got := newReplyReader(third).line(t); got != "-ERR max number of clients reached" {
		t.Fatalf("the client past the file limit: %q", got)
	}
	conns[0].send([]string{"INFO", "proxy"})
	if info, _ := conns[0].readReply(); !strings.Contains(fmt.Sprint(info), "proxy_max_clients:2\r\n") {
		t.Fatalf("INFO proxy with room for two clients:\n%v", info)
	}
}
