package proxy_test

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/proxytest"
)

// TestCrossProtocolNames: POST and Host: close the client as Redis closes
// it (no reply to them, nothing after them runs, a MULTI in progress is
// discarded); a name that only starts with them is an unknown command.
// Checked against redis-server 7.0.15 by hand: every closing case below
// closes there too.
func TestCrossProtocolNames(t *testing.T) {
	p := proxytest.Start(t, nil, nil)
	rc := p.Redis.Client(t)
	closes := map[string]string{
		"inline POST":   "PING\r\nPOST / HTTP/1.1\r\nSET after 1\r\n",
		"inline Host:":  "PING\r\nHost: 127.0.0.1\r\nSET after 1\r\n",
		"multibulk":     "*1\r\n$4\r\nPING\r\n*1\r\n$5\r\nhOsT:\r\n*3\r\n$3\r\nSET\r\n$5\r\nafter\r\n$1\r\n1\r\n",
		"NUL suffix":    "*1\r\n$4\r\nPING\r\n*1\r\n$6\r\npost\x00x\r\n*3\r\n$3\r\nSET\r\n$5\r\nafter\r\n$1\r\n1\r\n",
		"separate read": "PING\r\n",
	}
	for name, in := range closes {
		t.Run(name, func(t *testing.T) {
			nc := p.Dial(t)
			if _, err := nc.Write([]byte(in)); err != nil {
				t.Fatal(err)
			}
			readExactly(t, nc, "+PONG\r\n")
			if name == "separate read" {
				if _, err := nc.Write([]byte("POST / HTTP/1.1\r\nSET after 1\r\n")); err != nil {
					t.Fatal(err)
				}
			}
			nc.SetReadDeadline(time.Now().Add(5 * time.Second))
			rest, err := io.ReadAll(nc)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("connection still open 5 s after POST/Host: (read %q)", rest)
			}
			if len(rest) != 0 {
				t.Errorf("after POST/Host: the client got %q, want the connection closed with nothing more", rest)
			}
			if n := rc.Exists(ctx, "after").Val(); n != 0 {
				t.Errorf("a command after POST/Host: ran")
			}
		})
	}

	t.Run("inside MULTI", func(t *testing.T) {
		nc := p.Dial(t)
		nc.Write([]byte("MULTI\r\nSET inmulti 1\r\nPOST\r\n"))
		readExactly(t, nc, "+OK\r\n+QUEUED\r\n")
		nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		if rest, err := io.ReadAll(nc); err != nil || len(rest) != 0 {
			t.Fatalf("got %q, %v; want the connection closed", rest, err)
		}
		if n := rc.Exists(ctx, "inmulti").Val(); n != 0 {
			t.Errorf("the closed client's transaction ran")
		}
	})

	t.Run("longer name", func(t *testing.T) {
		nc := p.Dial(t)
		nc.Write([]byte("posts\r\nPING\r\n"))
		readExactly(t, nc, "-ERR unknown command 'posts', with args beginning with: \r\n+PONG\r\n")
	})
}

// readExactly reads len(want) bytes from nc and compares them with want.
func readExactly(t *testing.T, nc net.Conn, want string) {
	t.Helper()
	nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	got := make([]byte, len(want))
	if _, err := io.ReadFull(nc, got); err != nil || string(got) != want {
		t.Fatalf("read %q, %v; want %q", got, err, want)
	}
}
