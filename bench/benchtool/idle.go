package main

// benchtool idle: the idle-connections scenario of bench/run.sh. It opens
// many client connections to a proxy, sends one GET on each and reads the
// reply, then leaves them idle and reports how much the proxy's resident
// memory grew. That is what a fleet of mostly idle application connections
// costs a proxy, and where a per-connection goroutine and read buffer show.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// ipBindAddressNoPort is IP_BIND_ADDRESS_NO_PORT (linux/in.h). With it, a
// socket bound to a source address gets its port at connect time, unique per
// destination, instead of at bind time, unique per source address; so one
// source address is not limited to the ports no other socket holds.
const ipBindAddressNoPort = 24

type idleConfig struct {
	addr      string
	conns     int
	pid       int
	keyspace  int
	perSource int
	parallel  int
	settle    time.Duration
	timeout   time.Duration
	tls       bool
}

func idle(args []string) error {
	fs := flag.NewFlagSet("idle", flag.ContinueOnError)
	var c idleConfig
	fs.StringVar(&c.addr, "addr", "", "proxy address host:port (loopback)")
	fs.IntVar(&c.conns, "conns", 10000, "client connections to open and hold")
	fs.IntVar(&c.pid, "pid", 0, "PID of the proxy whose VmRSS to read")
	fs.IntVar(&c.keyspace, "keyspace", 100000, "connection i sends GET key:%012d of i mod keyspace")
	fs.IntVar(&c.perSource, "per-source", 5000, "connections per source address (127.0.0.1, 127.0.0.2, ...)")
	fs.IntVar(&c.parallel, "parallel", 64, "connections being opened at once")
	fs.DurationVar(&c.settle, "settle", time.Second, "pause before each RSS reading")
	fs.DurationVar(&c.timeout, "timeout", 120*time.Second, "give up (and close everything) after this long")
	fs.BoolVar(&c.tls, "tls", false, "connect with TLS (to [server.tls] listen), without verifying the proxy's certificate: a loopback benchmark")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case c.addr == "" || c.pid <= 0:
		return errors.New("idle: -addr and -pid are required")
	case c.conns < 1 || c.keyspace < 1 || c.perSource < 1 || c.parallel < 1:
		return errors.New("idle: -conns, -keyspace, -per-source and -parallel must be positive")
	case (c.conns+c.perSource-1)/c.perSource > 253:
		return fmt.Errorf("idle: %d connections at %d per source address need more than 253 addresses in 127.0.0.0/8", c.conns, c.perSource)
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	// The script stops us with SIGTERM when it is interrupted; every
	// connection is closed on the way out either way.
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	res, err := runIdle(ctx, c)
	if err != nil {
		return err
	}
	fmt.Printf("conns=%d rss_before_kb=%d rss_after_kb=%d open_ms=%d alive=%d\n",
		c.conns, res.rssBefore, res.rssAfter, res.open.Milliseconds(), res.alive)
	return nil
}

type idleResult struct {
	rssBefore, rssAfter int64 // kB
	open                time.Duration
	alive               int // connections that still answered PING at the end
}

func runIdle(ctx context.Context, c idleConfig) (idleResult, error) {
	var res idleResult
	// One connection first, so the proxy's one-time setup (pools, first
	// client's bookkeeping) is not charged to the idle connections.
	warm, err := dialGet(ctx, c, 0, make([]byte, 4096))
	if err != nil {
		return res, fmt.Errorf("idle: warm-up connection: %w", err)
	}
	warm.Close()
	if res.rssBefore, err = settledRSS(ctx, c.pid, c.settle); err != nil {
		return res, err
	}

	conns := make([]net.Conn, c.conns)
	defer func() {
		for _, conn := range conns {
			if conn != nil {
				conn.Close()
			}
		}
	}()
	start := time.Now()
	var next atomic.Int64
	var firstErr error
	var errOnce sync.Once
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for range min(c.parallel, c.conns) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 4096)
			for {
				i := int(next.Add(1) - 1)
				if i >= c.conns || wctx.Err() != nil {
					return
				}
				conn, err := dialGet(wctx, c, i, buf)
				if err != nil {
					errOnce.Do(func() { firstErr = fmt.Errorf("idle: connection %d of %d: %w", i+1, c.conns, err); cancel() })
					return
				}
				conns[i] = conn
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return res, firstErr
	}
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("idle: opening %d connections: %w", c.conns, err)
	}
	res.open = time.Since(start)
	if res.rssAfter, err = settledRSS(ctx, c.pid, c.settle); err != nil {
		return res, err
	}
	res.alive = closeAll(ctx, conns, c.parallel)
	return res, nil
}

// dialGet opens connection i from its source address, sends one GET and
// reads the reply; buf is the caller's scratch space for it. The connection
// is left with no deadline and nothing buffered on our side.
func dialGet(ctx context.Context, c idleConfig, i int, buf []byte) (net.Conn, error) {
	src := net.IPv4(127, 0, 0, byte(1+i/c.perSource))
	d := net.Dialer{
		LocalAddr: &net.TCPAddr{IP: src},
		Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IP, ipBindAddressNoPort, 1)
			})
			if err != nil {
				return err
			}
			return serr
		},
	}
	conn, err := d.DialContext(ctx, "tcp", c.addr)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	if c.tls {
		conn = tls.Client(conn, &tls.Config{InsecureSkipVerify: true})
	}
	key := fmt.Sprintf("key:%012d", i%c.keyspace)
	req := fmt.Sprintf("*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n", len(key), key)
	if _, err := conn.Write([]byte(req)); err != nil {
		conn.Close()
		return nil, err
	}
	reply, err := readReply(conn, buf)
	if err != nil {
		conn.Close()
		return nil, err
	}
	if reply[0] != '$' {
		conn.Close()
		return nil, fmt.Errorf("GET %s: unexpected reply %q", key, truncate(reply, 80))
	}
	conn.SetDeadline(time.Time{})
	return conn, nil
}

// readReply reads one reply that is a simple string, error, integer or bulk
// string (all GET and QUIT can return) into buf and returns it.
func readReply(conn net.Conn, buf []byte) ([]byte, error) {
	n := 0
	for {
		if size, ok, err := replySize(buf[:n]); err != nil {
			return nil, err
		} else if ok {
			if size != n {
				return nil, fmt.Errorf("%d unexpected bytes after the reply", n-size)
			}
			return buf[:n], nil
		}
		if n == len(buf) {
			return nil, fmt.Errorf("reply longer than %d bytes", len(buf))
		}
		m, err := conn.Read(buf[n:])
		n += m
		if err != nil {
			return nil, err
		}
	}
}

// replySize reports whether b holds a complete reply and how long it is.
func replySize(b []byte) (size int, complete bool, err error) {
	line := bytes.Index(b, []byte("\r\n"))
	if line < 0 {
		return 0, false, nil
	}
	if line == 0 {
		return 0, false, errors.New("empty reply line")
	}
	switch b[0] {
	case '+', '-', ':':
		return line + 2, true, nil
	case '$':
		l, err := strconv.Atoi(string(b[1:line]))
		if err != nil || l < -1 {
			return 0, false, fmt.Errorf("bad bulk length %q", b[:line])
		}
		if l == -1 {
			return line + 2, true, nil
		}
		size = line + 2 + l + 2
		if len(b) < size {
			return 0, false, nil
		}
		return size, true, nil
	}
	return 0, false, fmt.Errorf("unexpected reply type %q", b[0])
}

// closeAll checks that every connection is still served (PING, +PONG), then
// sends QUIT and waits for the proxy to close, so the TIME_WAIT state lands
// on the proxy's side, not on the client's ports (repeated runs would
// otherwise run out of them). Redis and redproxy answer QUIT with +OK before
// closing; twemproxy closes without a reply. It returns how many
// connections answered PING: all of them if the proxy kept every idle
// connection. Connections that fail are reset instead.
func closeAll(ctx context.Context, conns []net.Conn, parallel int) int {
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	dl, _ := qctx.Deadline()
	var alive atomic.Int64
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(parallel, len(conns)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 512)
			for {
				i := int(next.Add(1) - 1)
				if i >= len(conns) {
					return
				}
				conn := conns[i]
				conns[i] = nil
				served := qctx.Err() == nil && roundTrip(conn, dl, "*1\r\n$4\r\nPING\r\n", "+PONG\r\n", buf)
				if served {
					alive.Add(1)
				}
				if served && quit(conn, dl, buf) {
					conn.Close()
					continue
				}
				raw := conn
				if tc, ok := conn.(*tls.Conn); ok {
					raw = tc.NetConn()
				}
				if tc, ok := raw.(*net.TCPConn); ok {
					tc.SetLinger(0)
				}
				conn.Close()
			}
		}()
	}
	wg.Wait()
	return int(alive.Load())
}

func roundTrip(conn net.Conn, dl time.Time, req, want string, buf []byte) bool {
	conn.SetDeadline(dl)
	if _, err := conn.Write([]byte(req)); err != nil {
		return false
	}
	reply, err := readReply(conn, buf)
	return err == nil && string(reply) == want
}

// quit sends QUIT and reports whether the proxy then closed the connection
// (after +OK, or at once).
func quit(conn net.Conn, dl time.Time, buf []byte) bool {
	conn.SetDeadline(dl)
	if _, err := conn.Write([]byte("*1\r\n$4\r\nQUIT\r\n")); err != nil {
		return false
	}
	reply, err := readReply(conn, buf)
	if err == nil {
		if string(reply) != "+OK\r\n" {
			return false
		}
		_, err = conn.Read(buf)
	}
	return errors.Is(err, io.EOF)
}

// settledRSS waits settle, then reads VmRSS until two readings a quarter of
// a second apart are within 1 % of each other (at most 5 s): a Go proxy may
// still be growing or returning memory just after a burst of connections.
func settledRSS(ctx context.Context, pid int, settle time.Duration) (int64, error) {
	if err := sleepCtx(ctx, settle); err != nil {
		return 0, err
	}
	prev, err := vmRSS(pid)
	if err != nil {
		return 0, err
	}
	for range 20 {
		if err := sleepCtx(ctx, 250*time.Millisecond); err != nil {
			return 0, err
		}
		cur, err := vmRSS(pid)
		if err != nil {
			return 0, err
		}
		if diff := cur - prev; diff*100 <= cur && -diff*100 <= cur {
			return cur, nil
		}
		prev = cur
	}
	return prev, nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// vmRSS returns the resident set size of pid in kB.
func vmRSS(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	kb, err := parseVmRSS(f)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", f.Name(), err)
	}
	return kb, nil
}

// parseVmRSS returns the VmRSS value, in kB, of /proc/PID/status text.
func parseVmRSS(r io.Reader) (int64, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			return parseKB(v)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, errors.New("no VmRSS line (a zombie has none)")
}

// parseKB parses the value of a /proc/PID/status line such as " 1234 kB".
func parseKB(v string) (int64, error) {
	num, unit, _ := strings.Cut(strings.TrimSpace(v), " ")
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || strings.TrimSpace(unit) != "kB" {
		return 0, fmt.Errorf("bad VmRSS value %q", v)
	}
	return n, nil
}

func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}
