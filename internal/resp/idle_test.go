package resp

import (
	"errors"
	"net"
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// tcpPair returns both ends of a loopback TCP connection: the Reader's
// fast path needs a real socket.
func tcpPair(t *testing.T) (server, client net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err = ln.Accept()
	if err != nil {
		client.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close(); client.Close() })
	return server, client
}

// A client with nothing to send holds no read buffer: the Reader gives it
// back (and calls OnIdle) before waiting, takes one again when bytes come,
// and the wait still ends on a read deadline set while it waits, as
// Session.interrupt does, and on Close.
func TestReaderIdleHoldsNoBuffer(t *testing.T) {
	server, client := tcpPair(t)
	rd := NewReader(server, DefaultLimits)
	t.Cleanup(rd.Close) // before the socket's close (cleanups run last first)
	if rd.raw == nil {
		t.Skip("no raw socket reads on this platform")
	}
	var idles atomic.Int32
	rd.OnIdle(func() { idles.Add(1) })
	if got := rd.BufferCap(); got != 0 {
		t.Fatalf("a new Reader holds %d bytes", got)
	}

	type result struct {
		reqs []Request
		err  error
		cap  int
	}
	read := func() <-chan result {
		ch := make(chan result, 1)
		go func() {
			reqs, err := rd.ReadBatch()
			ch <- result{reqs, err, rd.BufferCap()}
		}()
		return ch
	}
	waitIdle := func(n int32) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for idles.Load() < n {
			if time.Now().After(deadline) {
				t.Fatalf("the Reader never went idle (%d of %d)", idles.Load(), n)
			}
			time.Sleep(time.Millisecond)
		}
	}

	for round := int32(1); round <= 3; round++ {
		ch := read()
		waitIdle(round) // waiting for bytes, without a buffer
		if _, err := client.Write([]byte("*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\n")); err != nil {
			t.Fatal(err)
		}
		res := <-ch
		if res.err != nil || len(res.reqs) != 1 || string(res.reqs[0].Args[1]) != "hi" {
			t.Fatalf("round %d: %q %v", round, res.reqs, res.err)
		}
		if res.cap == 0 {
			t.Fatalf("round %d: the request's buffer was given back while in use", round)
		}
	}

	// Interrupted while idle.
	ch := read()
	waitIdle(4)
	server.SetReadDeadline(time.Now())
	res := <-ch
	if !errors.Is(res.err, os.ErrDeadlineExceeded) {
		t.Fatalf("interrupted wait returned %v, want a deadline error", res.err)
	}
	if res.cap != 0 {
		t.Fatalf("an idle Reader holds %d bytes", res.cap)
	}

	// Closed while idle.
	server.SetReadDeadline(time.Time{})
	ch = read()
	waitIdle(5)
	server.Close()
	if res := <-ch; !errors.Is(res.err, net.ErrClosed) || res.cap != 0 {
		t.Fatalf("closed wait returned %v holding %d bytes, want net.ErrClosed and none", res.err, res.cap)
	}
}

// stepConn reports, each time the Reader finds its socket empty, the buffer
// the Reader holds; the test then sends the next byte, so every read
// returns exactly one byte.
type stepConn struct {
	net.Conn
	rd    *Reader
	waits chan int
}

func (c *stepConn) SyscallConn() (syscall.RawConn, error) {
	raw, err := c.Conn.(syscall.Conn).SyscallConn()
	return stepRaw{raw, c}, err
}

type stepRaw struct {
	syscall.RawConn
	c *stepConn
}

func (s stepRaw) Read(f func(uintptr) bool) error {
	return s.RawConn.Read(func(fd uintptr) bool {
		if f(fd) {
			return true
		}
		s.c.waits <- s.c.rd.BufferCap()
		return false
	})
}

// Requests arriving one byte per read parse as if sent at once, and the
// Reader keeps its buffer while it holds part of a request, giving it back
// only at a request boundary.
func TestReaderOneByteReadsOnSocket(t *testing.T) {
	server, client := tcpPair(t)
	set := "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhe\r\no\r\n"
	ping := "PING\r\n"
	sc := &stepConn{Conn: server, waits: make(chan int)}
	rd := NewReader(sc, DefaultLimits)
	t.Cleanup(rd.Close) // it holds the socket after the last short read
	if rd.raw == nil {
		t.Skip("no raw socket reads on this platform")
	}
	sc.rd = rd
	got := make(chan []string, 2)
	errc := make(chan error, 1)
	go func() {
		defer close(errc)
		for n := 0; n < 2; {
			reqs, err := rd.ReadBatch()
			for _, r := range reqs {
				var args []string
				for _, a := range r.Args {
					args = append(args, string(a))
				}
				got <- args
				n++
			}
			if err != nil {
				errc <- err
				return
			}
		}
	}()
	stream := set + ping
	if c := <-sc.waits; c != 0 {
		t.Fatalf("holds %d bytes before the first byte", c)
	}
	for i := range len(stream) {
		if _, err := client.Write([]byte{stream[i]}); err != nil {
			t.Fatal(err)
		}
		if i == len(stream)-1 {
			break
		}
		c := <-sc.waits
		if boundary := i+1 == len(set); boundary != (c == 0) {
			t.Fatalf("after %d bytes (boundary %v) the idle Reader holds %d bytes", i+1, boundary, c)
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	first, second := <-got, <-got
	if len(first) != 3 || first[0] != "SET" || first[1] != "k" || first[2] != "he\r\no" {
		t.Fatalf("first request %q", first)
	}
	if len(second) != 1 || second[0] != "PING" {
		t.Fatalf("second request %q", second)
	}
}

// sourceOnly hides a connection's SyscallConn, as a *tls.Conn has none.
type sourceOnly struct{ net.Conn }

// With WaitSmall, a Reader over a source that is not a socket (TLS) also
// gives its buffer back and calls OnIdle before waiting, and requests much
// longer than its few wait bytes, pipelined or not, are read whole.
func TestReaderWaitSmallHoldsNoBuffer(t *testing.T) {
	server, client := tcpPair(t)
	rd := NewReader(sourceOnly{server}, DefaultLimits)
	rd.WaitSmall()
	if rd.raw != nil {
		t.Fatal("a source without SyscallConn was read as a socket")
	}
	var idles atomic.Int32
	held := make(chan int, 16)
	rd.OnIdle(func() {
		idles.Add(1)
		held <- rd.BufferCap()
	})
	big := string(make([]byte, 100<<10))
	req := "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$" + strconv.Itoa(len(big)) + "\r\n" + big + "\r\n"
	for round, tc := range []struct {
		send string
		reqs int
	}{{"*1\r\n$4\r\nPING\r\n", 1}, {req, 1}, {req + "*2\r\n$3\r\nGET\r\n$1\r\nk\r\n", 2}} {
		go client.Write([]byte(tc.send))
		got := 0
		for got < tc.reqs {
			reqs, err := rd.ReadBatch()
			if err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
			for _, r := range reqs {
				if string(r.Args[0]) == "SET" && len(r.Args[2]) != len(big) {
					t.Fatalf("round %d: SET value of %d bytes, want %d", round, len(r.Args[2]), len(big))
				}
				got++
			}
		}
		select {
		case cap := <-held:
			if cap != 0 {
				t.Fatalf("round %d: waited for the client holding %d bytes", round, cap)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: the Reader never went idle", round)
		}
	}
	if idles.Load() != 3 {
		t.Fatalf("OnIdle ran %d times for 3 waits", idles.Load())
	}
}

// The read coroutine (reads) is a goroutine, whose record the runtime keeps
// for good: a client that sends a request or two and then idles must not
// start one, and a client that keeps sending must, so that its reads after
// a short read still skip the empty read. Release starts the count over.
func TestReaderStartsCoroutineOnlyForBusyClients(t *testing.T) {
	server, client := tcpPair(t)
	rd := NewReader(server, DefaultLimits)
	t.Cleanup(rd.Close)
	if rd.raw == nil {
		t.Skip("no raw socket reads on this platform")
	}
	roundTrip := func(n int) {
		t.Helper()
		if _, err := client.Write([]byte("PING\r\n")); err != nil {
			t.Fatal(err)
		}
		reqs, err := rd.ReadBatch()
		if err != nil || len(reqs) != 1 || string(reqs[0].Args[0]) != "PING" {
			t.Fatalf("request %d: %d requests, %v", n, len(reqs), err)
		}
	}
	for n := 1; n <= readsBeforeCoroutine; n++ {
		roundTrip(n)
		if rd.nextRead != nil {
			t.Fatalf("the read coroutine runs after %d requests of a client", n)
		}
	}
	roundTrip(readsBeforeCoroutine + 1)
	if rd.nextRead == nil {
		t.Fatalf("no read coroutine after %d requests: short reads are followed by empty ones", readsBeforeCoroutine+1)
	}
	rd.Release()
	if rd.nextRead != nil {
		t.Fatal("Release kept the read coroutine")
	}
	roundTrip(1)
	if rd.nextRead != nil {
		t.Fatal("the read coroutine restarted at the first request after Release")
	}
}
