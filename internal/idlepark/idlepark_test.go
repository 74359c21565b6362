//go:build linux

package idlepark

import (
	"net"
	"syscall"
	"testing"
	"time"
)

func pair(t *testing.T) (server, client net.Conn) {
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
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close(); client.Close() })
	return server, client
}

func rawOf(t *testing.T, c net.Conn) syscall.RawConn {
	t.Helper()
	rc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	return rc
}

// parkee is a connection to park in a test: a socket and what resumes it.
type parkee struct {
	syscall.RawConn
	resume func()
}

func (c parkee) Resume() { c.resume() }

func waitResumed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("not resumed: %s", what)
	}
}

func newParker(t *testing.T) *Parker {
	t.Helper()
	p, err := New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// Bytes, already queued or arriving later, and a hang-up each resume a
// parked connection once; the bytes are still there to read.
func TestResumeOnReadiness(t *testing.T) {
	p := newParker(t)
	server, client := pair(t)
	resumed := make(chan struct{}, 2)
	if err := p.Park(7, parkee{rawOf(t, server), func() { resumed <- struct{}{} }}); err != nil {
		t.Fatal(err)
	}
	if p.Len() != 1 {
		t.Fatalf("Len = %d, want 1", p.Len())
	}
	client.Write([]byte("x"))
	waitResumed(t, resumed, "bytes after parking")
	if p.Len() != 0 {
		t.Fatalf("Len = %d after resume, want 0", p.Len())
	}
	buf := make([]byte, 1)
	if _, err := server.Read(buf); err != nil || buf[0] != 'x' {
		t.Fatalf("read after resume: %q %v", buf, err)
	}

	// Queued before Park: reported at once (level-triggered add).
	client.Write([]byte("y"))
	time.Sleep(10 * time.Millisecond) // let the byte reach the socket; a miss only makes the next Park wait for it
	if err := p.Park(7, parkee{rawOf(t, server), func() { resumed <- struct{}{} }}); err != nil {
		t.Fatal(err)
	}
	waitResumed(t, resumed, "bytes queued before parking")
	server.Read(buf)

	// Hang-up.
	if err := p.Park(7, parkee{rawOf(t, server), func() { resumed <- struct{}{} }}); err != nil {
		t.Fatal(err)
	}
	client.Close()
	waitResumed(t, resumed, "peer hang-up")
	select {
	case <-resumed:
		t.Fatal("resumed twice")
	case <-time.After(50 * time.Millisecond):
	}
}

// Unpark takes a connection back exactly once, and readiness after it
// resumes nothing; the socket can be parked again under the same key.
func TestUnpark(t *testing.T) {
	p := newParker(t)
	server, client := pair(t)
	resumed := make(chan struct{}, 1)
	if err := p.Park(9, parkee{rawOf(t, server), func() { resumed <- struct{}{} }}); err != nil {
		t.Fatal(err)
	}
	if !p.Unpark(9) {
		t.Fatal("Unpark of a parked connection = false")
	}
	if p.Unpark(9) {
		t.Fatal("second Unpark = true")
	}
	client.Write([]byte("x"))
	select {
	case <-resumed:
		t.Fatal("an unparked connection was resumed by readiness")
	case <-time.After(100 * time.Millisecond):
	}
	// Removed from the set: parking it again works, and reports the byte.
	if err := p.Park(9, parkee{rawOf(t, server), func() { resumed <- struct{}{} }}); err != nil {
		t.Fatalf("park again: %v", err)
	}
	waitResumed(t, resumed, "parked again")
	if err := p.Park(0, parkee{rawOf(t, server), func() {}}); err != ErrBadKey {
		t.Fatalf("Park under key 0 = %v, want ErrBadKey", err)
	}
}

// A closed connection cannot be parked, and Park after Close fails.
func TestParkErrors(t *testing.T) {
	p := newParker(t)
	server, _ := pair(t)
	rc := rawOf(t, server)
	server.Close()
	if err := p.Park(3, parkee{rc, func() { t.Error("resumed") }}); err == nil {
		t.Fatal("Park of a closed connection succeeded")
	}
	if p.Len() != 0 {
		t.Fatalf("Len = %d after a failed Park", p.Len())
	}
	p.Close()
	s2, _ := pair(t)
	if err := p.Park(4, parkee{rawOf(t, s2), func() {}}); err != ErrClosed {
		t.Fatalf("Park after Close = %v, want ErrClosed", err)
	}
}

// A hang-ups parker resumes a connection when its peer closes, not when
// it sends bytes: a client blocked in BLPOP may pipeline more behind it,
// and must still be seen leaving at once.
func TestHangupsResumeOnCloseNotOnData(t *testing.T) {
	p, err := NewHangups()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	server, client := pair(t)
	resumed := make(chan struct{})
	if err := p.Park(1, parkee{rawOf(t, server), func() { close(resumed) }}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Write([]byte("PING\r\n")); err != nil {
		t.Fatal(err)
	}
	// Once the bytes are in the socket, a second connection parked and
	// closed: epoll reports every socket ready by then in the same wait,
	// in the order they became ready, so had the bytes resumed the first,
	// that happened before the second's hang-up did.
	waitReadable(t, server)
	otherServer, otherClient := pair(t)
	otherResumed := make(chan struct{})
	if err := p.Park(2, parkee{rawOf(t, otherServer), func() { close(otherResumed) }}); err != nil {
		t.Fatal(err)
	}
	otherClient.Close()
	waitResumed(t, otherResumed, "the other peer closed")
	select {
	case <-resumed:
		t.Fatal("resumed for bytes, not a hang-up")
	default:
	}
	client.Close()
	waitResumed(t, resumed, "the peer closed")
}

// waitReadable waits until bytes wait unread on c's socket.
func waitReadable(t *testing.T, c net.Conn) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		n := 0
		rawOf(t, c).Control(func(fd uintptr) {
			var b [8]byte
			n, _, _ = syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		})
		if n > 0 {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("the bytes never arrived")
}
