package proxy

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
)

// TestSentinelRoleCheckBoundedByReplyTimeout: the ROLE check of a
// candidate primary waits at most upstream.reply_timeout for its reply.
// The server here (a fault injector, not a stand-in for Redis) completes
// the connection's handshake and never answers ROLE, as a server frozen
// just then does. The check used to wait dead_timeout (30 s by default),
// and Discover with it.
func TestSentinelRoleCheckBoundedByReplyTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer nc.Close()
				br := bufio.NewReader(nc)
				for {
					// Each command of the handshake is one RESP array
					// of bulk strings; answer +OK to each but ROLE.
					var n int
					line, err := br.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := fmt.Sscanf(line, "*%d", &n); err != nil {
						return
					}
					var name string
					for i := range 2 * n {
						line, err := br.ReadString('\n')
						if err != nil {
							return
						}
						if i == 1 {
							name = strings.TrimSpace(line)
						}
					}
					if strings.EqualFold(name, "ROLE") {
						io.Copy(io.Discard, br) // frozen until the check hangs up
					}
					nc.Write([]byte("+OK\r\n"))
				}
			}()
		}
	}()
	cfg := config.Default()
	cfg.Upstream.DialTimeout = units.Duration{Duration: 500 * time.Millisecond}
	cfg.Upstream.ReplyTimeout = units.Duration{Duration: 500 * time.Millisecond}
	cfg.Upstream.DeadTimeout = units.Duration{Duration: 20 * time.Second}
	opt := sentinelOptions(cfg, slog.New(slog.DiscardHandler))
	done := make(chan error, 1)
	go func() {
		_, err := opt.Role(ln.Addr().String())
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("ROLE check of a frozen server succeeded")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ROLE check still waiting after 10 s with reply_timeout 500ms")
	}
}
