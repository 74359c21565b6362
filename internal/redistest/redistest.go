// Package redistest starts real redis-server processes for tests.
//
// Behaviour tests in this project must talk to a real Redis, never a mock, so
// this package owns the fiddly parts: free ports, temp dirs, readiness, crash
// simulation (Kill) and recovery (Restart). Every server is killed by
// t.Cleanup, so tests cannot leak processes.
package redistest

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// startAttempts bounds retries when the port we picked was grabbed by
	// someone else between FreePort closing it and redis binding it.
	startAttempts = 5
	readyTimeout  = 10 * time.Second
	pollInterval  = 5 * time.Millisecond
	// logTail is how much of redis-server's output goes into failure messages.
	logTail = 2048
)

// Server is one redis-server process owned by a test.
type Server struct {
	bin   string
	dir   string
	extra []string
	// conf, if set, is a config file given before the other arguments
	// (Sentinels need one: they rewrite it).
	conf string

	// tlsArgs, when set, gives redis-server a TLS port (StartTLS): the
	// arguments for a given TLS port.
	tlsArgs func(tlsPort int) []string

	mu      sync.Mutex
	port    int
	tlsPort int
	cmd     *exec.Cmd
	done    chan struct{} // closed when the current process has exited
	out     *LogBuffer    // the process output; the exec copier writes while failure paths read
}

// Start launches redis-server on a free 127.0.0.1 port with a temp dir;
// t.Cleanup kills it. extra are additional redis-server arguments appended
// after the defaults (so they can override them), e.g.
// "--enable-debug-command", "local". Fails the test if redis-server is missing.
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	return start(t, "", extra)
}

// start launches redis-server with conf (a config file written by the
// caller, or "") and extra arguments.
func start(t testing.TB, conf string, extra []string) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redistest: redis-server not found in PATH: %v", err)
	}
	s := &Server{bin: bin, dir: t.TempDir(), extra: extra, conf: conf}
	if !s.start(t) {
		return nil
	}
	return s
}

// start launches the server on free ports, retrying a port taken meanwhile;
// on failure it fails t and reports false.
func (s *Server) start(t testing.TB) bool {
	t.Helper()
	t.Cleanup(s.stop)
	var lastErr error
	for range startAttempts {
		s.port = FreePort(t)
		if s.tlsArgs != nil {
			s.tlsPort = FreePort(t)
		}
		if lastErr = s.launch(); lastErr == nil {
			return true
		}
	}
	t.Fatalf("redistest: could not start redis-server after %d attempts: %v", startAttempts, lastErr)
	return false
}

// Addr is the server's "127.0.0.1:PORT".
func (s *Server) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port()))
}

// Port is the server's TCP port; it stays the same across Restart.
func (s *Server) Port() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.port
}

// Client returns a go-redis client connected straight to this Redis (not
// through the proxy); it is closed on cleanup.
func (s *Server) Client(t testing.TB) *redis.Client { return s.ClientDB(t, 0) }

// ClientDB is Client on database db.
func (s *Server) ClientDB(t testing.TB, db int) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), DB: db})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Kill simulates a crash: SIGKILL, then wait for the process to exit so the
// port is free and connections are reset when Kill returns. Killing an already
// dead server is a no-op.
func (s *Server) Kill(t testing.TB) {
	t.Helper()
	s.stop()
}

// Shutdown ends the server as SHUTDOWN NOSAVE NOW FORCE does: Redis
// closes its listener before it exits and its connections close, so a
// client that redials on losing its connection is refused. After a
// SIGKILL (Kill) a redial often connects to the dying process's listener
// and is reset at once (54 of 200 kills on this machine): a second loss
// and a recovery that a test counting one outage's log lines cannot tell
// from a bug (CI failed on it twice). A server that does not end within a
// second of the command (frozen, paused, the command refused) is killed.
func (s *Server) Shutdown(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	done := s.done
	s.mu.Unlock()
	if done == nil {
		return
	}
	if conn, rd, ok := dialPing(s.Addr(), "*4\r\n$8\r\nSHUTDOWN\r\n$6\r\nNOSAVE\r\n$3\r\nNOW\r\n$5\r\nFORCE\r\n"); ok {
		// A reply is a refusal; the end of the connection, the exit.
		if _, err := rd.ReadByte(); err != nil {
			select {
			case <-done:
			case <-time.After(time.Second):
			}
		}
		_ = conn.Close()
	}
	s.stop()
}

// Freeze stops the process with SIGSTOP, as a hung or partitioned server
// would be: connections stay open but nothing is answered. Thaw resumes it.
func (s *Server) Freeze(t testing.TB) { s.signal(t, syscall.SIGSTOP) }

// Thaw resumes a frozen server with SIGCONT.
func (s *Server) Thaw(t testing.TB) { s.signal(t, syscall.SIGCONT) }

// FreezeAll freezes servers and returns what thaws them all, which is also
// a cleanup of t, so a test that fails first leaves none frozen; it does
// something the first time only.
func FreezeAll(t testing.TB, servers ...*Server) (thaw func()) {
	t.Helper()
	for _, s := range servers {
		s.Freeze(t)
	}
	var once sync.Once
	thaw = func() {
		once.Do(func() {
			for _, s := range servers {
				s.Thaw(t)
			}
		})
	}
	t.Cleanup(thaw)
	return thaw
}

func (s *Server) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		t.Fatalf("redistest: no redis-server process to signal")
	}
	if err := cmd.Process.Signal(sig); err != nil {
		t.Fatalf("redistest: signal %v: %v", sig, err)
	}
}

// Restart starts redis-server again on the same port with the same arguments
// (after Kill) and waits until it answers PING. The dataset starts empty
// because persistence is disabled.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.stop() // tolerate a Restart without a prior Kill
	var lastErr error
	for i := range startAttempts {
		if lastErr = s.launch(); lastErr == nil {
			return
		}
		// Said, as a test counting what its clients saw of the restart
		// must know that the server came up more than once.
		t.Logf("redistest: restart attempt %d on port %d failed: %v", i+1, s.Port(), lastErr)
		// The port is fixed here, so give whoever holds it a moment to let go
		// rather than spinning through all attempts at once.
		time.Sleep(time.Duration(i+1) * 50 * time.Millisecond)
	}
	t.Fatalf("redistest: could not restart redis-server on port %d: %v", s.Port(), lastErr)
}

// launch starts the process on s.port and waits for PING. On failure the
// process is gone and the error carries the tail of its output.
func (s *Server) launch() error {
	s.mu.Lock()
	port := s.port
	var args []string
	if s.conf != "" {
		args = append(args, s.conf)
	}
	args = append(args, []string{
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--daemonize", "no",
		"--protected-mode", "no",
	}...)
	if s.tlsArgs != nil {
		args = append(args, s.tlsArgs(s.tlsPort)...)
	}
	args = append(args, s.extra...)
	out := &LogBuffer{}
	cmd := exec.Command(s.bin, args...)
	cmd.Stdout = out
	cmd.Stderr = out
	// A process group lets us kill any fork child too (BGSAVE, BGREWRITEAOF
	// issued by a test); otherwise it could keep the output pipe open.
	// No Pdeathsig: Linux delivers it when the thread that started the
	// child exits, not the process, and Go may retire that thread while the
	// test still needs its server (seen as redis-servers dying mid-fuzz).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		s.mu.Unlock()
		return fmt.Errorf("exec %s: %w", s.bin, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	s.cmd, s.done, s.out = cmd, done, out
	s.mu.Unlock()

	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(readyTimeout)
	for {
		select {
		case <-done:
			return fmt.Errorf("redis-server on port %d exited before answering PING; output tail:\n%s", port, out.tail(logTail))
		default:
		}
		if pid, ok := pingPID(addr); ok {
			if pid == cmd.Process.Pid {
				return nil
			}
			// Another test's server holds the port (its FreePort drew
			// the same one): ours cannot bind it and is about to exit.
			// Taking the other for ours handed a test a node of another
			// test's cluster ("node is not empty" from redis-cli
			// --cluster create, or a create waiting for ever: CI).
			s.stop()
			return fmt.Errorf("port %d is served by another process (pid %d)", port, pid)
		}
		if time.Now().After(deadline) {
			s.stop()
			return fmt.Errorf("redis-server on port %d did not answer PING within %v; output tail:\n%s", port, readyTimeout, out.tail(logTail))
		}
		time.Sleep(pollInterval)
	}
}

// stop SIGKILLs the current process group and waits for it to exit.
func (s *Server) stop() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd, s.done = nil, nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-done
}

// pingPID is ping, and the process id the server's INFO gives.
func pingPID(addr string) (int, bool) {
	conn, rd, ok := dialPing(addr, "*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n")
	if !ok {
		return 0, false
	}
	defer conn.Close()
	head, err := rd.ReadString('\n')
	if err != nil || !strings.HasPrefix(head, "$") {
		return 0, false
	}
	n, err := strconv.Atoi(strings.TrimSpace(head[1:]))
	if err != nil || n < 0 {
		return 0, false
	}
	body := make([]byte, n+2)
	if _, err := io.ReadFull(rd, body); err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(body), "\r\n") {
		if v, ok := strings.CutPrefix(line, "process_id:"); ok {
			pid, err := strconv.Atoi(v)
			return pid, err == nil
		}
	}
	return 0, false
}

// ping reports whether addr answers a RESP PING with +PONG. It speaks raw RESP
// so readiness does not depend on client retry/backoff behaviour.
func ping(addr string) bool {
	conn, _, ok := dialPing(addr, "")
	if ok {
		conn.Close()
	}
	return ok
}

// dialPing connects to addr, sends PING and then more, and reads +PONG;
// the caller reads what more brings and closes the connection (only when
// ok: it is closed otherwise).
func dialPing(addr, more string) (net.Conn, *bufio.Reader, bool) {
	conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return nil, nil, false
	}
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	rd := bufio.NewReader(conn)
	if _, err := conn.Write([]byte("*1\r\n$4\r\nPING\r\n" + more)); err != nil {
		conn.Close()
		return nil, nil, false
	}
	if line, err := rd.ReadString('\n'); err != nil || strings.TrimSpace(line) != "+PONG" {
		conn.Close()
		return nil, nil, false
	}
	return conn, rd, true
}

// Eventually polls cond every 5ms until it returns true; if timeout passes
// first it fails the test with the formatted message. Use it instead of sleeps.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("redistest: condition not met within %v: %s", timeout, fmt.Sprintf(format, args...))
			return
		}
		time.Sleep(pollInterval)
	}
}

// Allocated is the bytes the test process allocated while f ran (the
// proxy or pipe under test included), for tests that bound memory.
func Allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// FreePort returns a TCP port that was free on every address a moment ago.
// It never returns 6379 so tests cannot touch a developer's real Redis.
//
// The port is drawn below the kernel's ephemeral range (and low enough that
// a cluster node's bus port, port+10000, is below it too). A port the
// kernel handed out as "127.0.0.1:0" sits in the ephemeral range, where any
// outgoing connection of a concurrently running test package can take it as
// its local port before the test binds it: a proxy started on 0.0.0.0 then
// fails with "address already in use" (seen in CI). Below that range only
// another FreePort can collide, which is why Start still retries.
func FreePort(t testing.TB) int {
	t.Helper()
	lo, hi := freePortRange()
	for range 200 {
		port := lo + rand.IntN(hi-lo)
		if port == 6379 {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf(":%d", port))
		if err != nil {
			continue
		}
		_ = l.Close()
		return port
	}
	// The range is crowded: fall back to a kernel-chosen port.
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("redistest: no free port: %v", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if port != 6379 {
			return port
		}
	}
}

// freePortRange is [lo, hi) below the ephemeral range of
// /proc/sys/net/ipv4/ip_local_port_range, leaving room for port+10000.
func freePortRange() (lo, hi int) {
	ephemeralLow := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				ephemeralLow = n
			}
		}
	}
	lo, hi = 10000, ephemeralLow-10000
	if hi-lo < 2000 {
		lo, hi = 1024, ephemeralLow
	}
	return lo, hi
}

// LoopScript busy-loops inside Redis for ARGV[1] milliseconds, reading the
// clock so a test that fails cannot leave it running for long. It writes
// nothing, so SCRIPT KILL can stop it. Tests use it to make Redis busy
// (-BUSY past busy-reply-threshold).
const LoopScript = `local t = redis.call('TIME')
local stop = tonumber(t[1]) * 1000000 + tonumber(t[2]) + tonumber(ARGV[1]) * 1000
while true do
  local n = redis.call('TIME')
  if tonumber(n[1]) * 1000000 + tonumber(n[2]) >= stop then break end
end
return 'done'`
