package proxy_test

import (
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
)

var (
	fuzzOnce  sync.Once
	fuzzProxy *proxytest.Proxy
)

// FuzzRequestPath sends arbitrary bytes to a running proxy, as a client
// would, and checks that the proxy answers or closes that connection
// without hanging, and that another client is still served afterwards.
// Commands that could stop or reconfigure Redis are denied by policy
// (fuzzDeny).
func FuzzRequestPath(f *testing.F) {
	for _, s := range []string{
		"*1\r\n$4\r\nPING\r\n",
		"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n",
		"MULTI\r\nSET a 1\r\nEXEC\r\n",
		"WATCH k\r\nMULTI\r\nINCR k\r\nEXEC\r\nUNWATCH\r\n",
		"SELECT 3\r\nHELLO 3\r\nHGETALL h\r\nRESET\r\n",
		"CLIENT REPLY SKIP\r\nPING\r\nCLIENT SETNAME x\r\nCLIENT INFO\r\n",
		"BLPOP q 0.01\r\nSUBSCRIBE c\r\nPING\r\n",
		"*1\r\n$99999999999\r\n",
		"set \"a\\x41 'b\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzOnce.Do(func() {
			fuzzProxy = startFuzzProxy(t, func(c *config.Config) {
				c.Policy.Commands.Deny = fuzzDeny
				c.Upstream.ReplyTimeout.Duration = 2 * time.Second
			})
		})
		p := fuzzProxy
		nc, err := p.DialErr()
		if err != nil {
			t.Fatal(err)
		}
		sendAndDrain(nc, data)
		expectServed(t, p, data, "*1\r\n$4\r\nPING\r\n", "+PONG\r\n")
	})
}

// expectServed checks, after a fuzzed input data, that a new client still
// gets want for send.
func expectServed(t *testing.T, p *proxytest.Proxy, data []byte, send, want string) {
	t.Helper()
	ctl, err := p.DialErr()
	if err != nil {
		t.Fatalf("proxy stopped accepting after input %q: %v", data, err)
	}
	defer ctl.Close()
	ctl.SetDeadline(time.Now().Add(5 * time.Second))
	ctl.Write([]byte(send))
	buf := make([]byte, len(want))
	if _, err := io.ReadFull(ctl, buf); err != nil || string(buf) != want {
		t.Fatalf("proxy unhealthy after input %q: %q %v", data, buf, err)
	}
}

// fuzzDeny are the commands a fuzzed client may not run: they would stop
// or reconfigure Redis, and the fuzzers explore the proxy, not ways to shut
// down its upstream.
var fuzzDeny = []string{"shutdown", "debug", "config", "replicaof", "slaveof", "client|kill", "client|pause", "swapdb", "monitor", "script|kill", "function|kill", "failover", "save", "bgsave", "bgrewriteaof", "acl", "module", "quit"}

// startFuzzProxy starts the proxy a fuzz process shares between inputs;
// it is cleaned up with the process (cleanupFreeTB).
func startFuzzProxy(t *testing.T, mutate func(*config.Config)) *proxytest.Proxy {
	// A fuzz worker talks to its coordinator over inherited pipes (fds 3
	// and 4) that are not close-on-exec; redis-server must not inherit
	// them, or the coordinator waits for it to exit before it can finish.
	for fd := 3; fd < 16; fd++ {
		syscall.CloseOnExec(fd)
	}
	return proxytest.Start(&cleanupFreeTB{T: t}, nil, mutate)
}

// sendAndDrain writes a fuzzed input to the proxy, half-closes so the
// proxy sees the client leave once it has read the input, and drains what
// comes back until it closes. A fixed read window instead made every input
// cost 50 ms, and the fuzz engine's minimizer (which reruns an input
// hundreds of times) then outlived -fuzztime. Inputs that leave the
// session waiting on Redis (a blocking command, a subscription) are cut
// off by the short deadline; the proxy must cope with that too.
func sendAndDrain(nc net.Conn, data []byte) {
	nc.SetDeadline(time.Now().Add(3 * time.Second))
	nc.Write(data)
	nc.(*net.TCPConn).CloseWrite()
	nc.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	io.Copy(io.Discard, nc)
	nc.Close()
}

// cleanupFreeTB lets the shared fuzz proxy outlive the first input's test:
// its cleanups are kept for TestMain, which runs them when the package's
// tests end, so the proxy and its redis-server live until then and no
// redis-server outlives the test binary. (A fuzz worker that is killed
// instead of returning skips them; scripts/test.sh stops those servers.)
type cleanupFreeTB struct{ *testing.T }

func (c *cleanupFreeTB) Cleanup(f func()) {
	processCleanupsMu.Lock()
	processCleanups = append(processCleanups, f)
	processCleanupsMu.Unlock()
}

var (
	processCleanupsMu sync.Mutex
	processCleanups   []func()
)

func TestMain(m *testing.M) {
	code := m.Run()
	processCleanupsMu.Lock()
	for i := len(processCleanups) - 1; i >= 0; i-- {
		processCleanups[i]()
	}
	processCleanupsMu.Unlock()
	os.Exit(code)
}
