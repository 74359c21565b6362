package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/panjf2000/gnet/v2"
)

// The behaviour tests run the spike in-process against a real
// redis-server on a free loopback port and talk raw RESP to it.

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// dialUntil polls addr until it accepts a connection.
func dialUntil(t *testing.T, addr string) net.Conn {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never accepted: %v", addr, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func startRedis(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server not installed")
	}
	port := freePort(t)
	dir := t.TempDir()
	cmd := exec.Command("redis-server", "--port", fmt.Sprint(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir, "--logfile", filepath.Join(dir, "redis.log"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	dialUntil(t, addr).Close()
	return addr
}

// startSpike runs the proxy in-process with two loops and two pipes per
// loop, so clients on different loops and pipes are mixed in every test.
func startSpike(t *testing.T, redisAddr string, mode flushMode) string {
	t.Helper()
	upstream, err := net.ResolveTCPAddr("tcp", redisAddr)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	p := newProxy(upstream, 2, mode, log)
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	done := make(chan error, 1)
	go func() { done <- gnet.Run(p, "tcp://"+listen, gnet.WithNumEventLoop(2)) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = gnet.Stop(ctx, "tcp://"+listen)
		<-done
	})
	dialUntil(t, listen).Close()
	return listen
}

func command(args ...string) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	return b.Bytes()
}

// readReply reads one RESP2 reply and returns it as text: simple strings,
// errors and integers with their type byte, bulk strings as their value.
func readReply(t *testing.T, r *bufio.Reader) string {
	t.Helper()
	line, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("reading a reply: %v", err)
	}
	line = strings.TrimSuffix(line, "\r\n")
	switch line[0] {
	case '$':
		var n int
		fmt.Sscanf(line[1:], "%d", &n)
		if n < 0 {
			return "(nil)"
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			t.Fatalf("reading a bulk reply: %v", err)
		}
		return string(buf[:n])
	case '*':
		var n int
		fmt.Sscanf(line[1:], "%d", &n)
		parts := make([]string, n)
		for i := range parts {
			parts[i] = readReply(t, r)
		}
		return "[" + strings.Join(parts, " ") + "]"
	}
	return line
}

func TestPipelinesKeepOrderAndOwner(t *testing.T) {
	for _, mode := range []flushMode{flushLoop, flushImmediate} {
		t.Run(fmt.Sprint("flush", mode), func(t *testing.T) {
			addr := startSpike(t, startRedis(t), mode)
			const clients, rounds, depth = 16, 20, 25
			var wg sync.WaitGroup
			errs := make(chan error, clients)
			for i := 0; i < clients; i++ {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					c, err := net.Dial("tcp", addr)
					if err != nil {
						errs <- err
						return
					}
					defer c.Close()
					r := bufio.NewReader(c)
					for round := 0; round < rounds; round++ {
						var batch []byte
						for j := 0; j < depth; j++ {
							batch = append(batch, command("ECHO", fmt.Sprintf("c%d-%d-%d", i, round, j))...)
						}
						if _, err := c.Write(batch); err != nil {
							errs <- err
							return
						}
						for j := 0; j < depth; j++ {
							want := fmt.Sprintf("c%d-%d-%d", i, round, j)
							if got := readReply(t, r); got != want {
								errs <- fmt.Errorf("client %d: got %q, want %q", i, got, want)
								return
							}
						}
					}
				}(i)
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
		})
	}
}

func TestLocalRepliesComeInOrder(t *testing.T) {
	addr := startSpike(t, startRedis(t), flushLoop)
	c := dialUntil(t, addr)
	defer c.Close()
	r := bufio.NewReader(c)
	// One write: the refused MULTI must be answered after the first ECHO's
	// reply from Redis and before the second's, and QUIT after both.
	var b []byte
	b = append(b, command("ECHO", "one")...)
	b = append(b, command("multi")...)
	b = append(b, "ECHO two\r\n\r\n"...) // inline, then an empty line Redis ignores
	b = append(b, command("SUBSCRIBE", "ch")...)
	b = append(b, command("ECHO", "three")...)
	b = append(b, command("QUIT")...)
	b = append(b, command("ECHO", "never")...)
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	want := []string{"one", "-ERR 'multi' is not supported by the event-loop spike", "two",
		"-ERR 'subscribe' is not supported by the event-loop spike", "three", "+OK"}
	for _, w := range want {
		if got := readReply(t, r); got != w {
			t.Fatalf("got %q, want %q", got, w)
		}
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if rest, err := r.ReadString('\n'); err != io.EOF {
		t.Fatalf("after QUIT: got %q, %v; want the connection closed", rest, err)
	}
}

func TestProtocolErrorClosesAfterEarlierReplies(t *testing.T) {
	addr := startSpike(t, startRedis(t), flushLoop)
	c := dialUntil(t, addr)
	defer c.Close()
	r := bufio.NewReader(c)
	b := append(command("ECHO", "first"), "*1\r\n+PING\r\n"...)
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	if got := readReply(t, r); got != "first" {
		t.Fatalf("got %q, want first", got)
	}
	if got := readReply(t, r); got != "-"+errExpectedBulk.Error() {
		t.Fatalf("got %q, want the protocol error", got)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := r.ReadByte(); err != io.EOF {
		t.Fatalf("after a protocol error: %v, want the connection closed", err)
	}
}

// A value larger than gnet's 64 KiB read buffer arrives over many reads in
// both directions.
func TestLargeValueRoundTrip(t *testing.T) {
	addr := startSpike(t, startRedis(t), flushLoop)
	c := dialUntil(t, addr)
	defer c.Close()
	r := bufio.NewReader(c)
	value := strings.Repeat("0123456789abcdef", 256*1024) // 4 MiB
	b := append(command("SET", "big", value), command("GET", "big")...)
	b = append(b, command("STRLEN", "big")...)
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	if got := readReply(t, r); got != "+OK" {
		t.Fatalf("SET: got %q", got)
	}
	if got := readReply(t, r); got != value {
		t.Fatalf("GET: got %d bytes, want %d", len(got), len(value))
	}
	if got := readReply(t, r); got != fmt.Sprintf(":%d", len(value)) {
		t.Fatalf("STRLEN: got %q", got)
	}
}

// A client that keeps sending an incomplete request is cut off at the query
// buffer limit instead of growing the proxy's memory.
func TestQueryBufferLimit(t *testing.T) {
	saved := maxQueryBuffer
	maxQueryBuffer = 1 << 20
	t.Cleanup(func() { maxQueryBuffer = saved })
	addr := startSpike(t, startRedis(t), flushLoop)
	c := dialUntil(t, addr)
	defer c.Close()
	// A 4 MiB value announced but only partly sent: one byte over the
	// limit in all, so the proxy has read every byte when it closes (unread
	// bytes would turn its close into a reset that hides the error).
	header := []byte("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$4194304\r\n")
	body := bytes.Repeat([]byte("v"), maxQueryBuffer+1-len(header))
	if _, err := c.Write(append(header, body...)); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if got := readReply(t, r); got != "-ERR client query buffer limit reached" {
		t.Fatalf("got %q, want the query buffer limit error", got)
	}
	if _, err := r.ReadByte(); err != io.EOF {
		t.Fatalf("after the limit: %v, want the connection closed", err)
	}
}
