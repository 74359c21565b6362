package rawio_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/rawio"
)

// pair returns both ends of a loopback TCP connection.
func pair(t testing.TB) (a, b net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	a, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b = <-accepted
	if b == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func TestWriterOnlyForBareSockets(t *testing.T) {
	a, _ := pair(t)
	if rawio.NewWriter(a) == nil {
		t.Fatal("no raw access to a TCP connection")
	}
	c1, c2 := net.Pipe()
	defer c1.Close()
	defer c2.Close()
	if rawio.NewWriter(c1) != nil {
		t.Fatal("raw access to a net.Pipe, which has no descriptor")
	}
}

// A write larger than the socket buffers waits for the reader, as
// net.Conn.Write does, and everything arrives in order.
func TestWriteWaitsForRoomAndWritesAll(t *testing.T) {
	a, b := pair(t)
	w := rawio.NewWriter(a)
	msg, got := bigMessageReadBy(b)
	n, err := w.Write(msg)
	if err != nil || n != len(msg) {
		t.Fatalf("Write = %d, %v; want %d, nil", n, err, len(msg))
	}
	if !bytes.Equal(<-got, msg) {
		t.Fatal("the reader got other bytes than were written")
	}
}

// A peer that reads nothing makes the write end at the write deadline
// with the error net.Conn.Write gives.
func TestWriteHonoursTheDeadline(t *testing.T) {
	a, _ := pair(t)
	w := rawio.NewWriter(a)
	// Made before the deadline is set, a second away: see
	// TestWriteVecHonoursTheDeadline.
	big := make([]byte, 64<<20)
	a.SetWriteDeadline(time.Now().Add(time.Second))
	n, err := w.Write(big)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("err = %v; want the deadline", err)
	}
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("err = %v is not a net.Error timeout", err)
	}
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != "write" {
		t.Fatalf("err = %#v; want a *net.OpError of op write", err)
	}
	if n <= 0 || n >= 64<<20 {
		t.Fatalf("wrote %d bytes before the deadline; want some, not all", n)
	}
}

// A write to a connection the peer reset fails with the system call's
// error, and one to a closed connection with net.ErrClosed, as
// net.Conn.Write reports them.
func TestWriteErrors(t *testing.T) {
	a, b := pair(t)
	w := rawio.NewWriter(a)
	b.(*net.TCPConn).SetLinger(0)
	b.Close() // sends RST
	var err error
	for range 100 {
		if _, err = w.Write([]byte("x")); err != nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	var se *os.SyscallError
	if !errors.As(err, &se) || se.Syscall != "write" {
		t.Fatalf("err = %v; want a write *os.SyscallError", err)
	}
	if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("err = %v; want ECONNRESET or EPIPE", err)
	}
	a.Close()
	if _, err := w.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write after close: err = %v; want net.ErrClosed", err)
	}
}

// ReadFD reports an empty socket with EAGAIN, and reads what was sent.
func TestReadFD(t *testing.T) {
	a, b := pair(t)
	raw, err := a.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	var n int
	var rerr error
	raw.Control(func(fd uintptr) { n, rerr = rawio.ReadFD(fd, buf) })
	if rerr != syscall.EAGAIN {
		t.Fatalf("read of an empty socket = %d, %v; want EAGAIN", n, rerr)
	}
	b.Write([]byte("hello"))
	err = raw.Read(func(fd uintptr) bool {
		n, rerr = rawio.ReadFD(fd, buf)
		return rerr != syscall.EAGAIN
	})
	if err != nil || rerr != nil || string(buf[:n]) != "hello" {
		t.Fatalf("read = %q, %v, %v; want hello", buf[:n], rerr, err)
	}
}

// A write allocates nothing: it is on the path of every reply.
func TestWriteAllocatesNothing(t *testing.T) {
	a, b := pair(t)
	w := rawio.NewWriter(a)
	msg := []byte("+OK\r\n")
	buf := make([]byte, len(msg))
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := w.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(b, buf); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per write and read; want 0", allocs)
	}
}

// WriteWithin sets the deadline only when the socket is full: a write the
// socket takes at once succeeds although an earlier deadline has passed,
// and a peer that reads nothing makes a write end at the timeout.
func TestWriteWithinTimesOutOnlyAFullSocket(t *testing.T) {
	a, b := pair(t)
	w := rawio.NewWriter(a)
	a.SetWriteDeadline(time.Now().Add(-time.Second)) // left behind, expired
	if _, err := w.WriteWithin([]byte("hello"), time.Minute); err != nil {
		t.Fatalf("a write the socket takes at once failed on the old deadline: %v", err)
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(b, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("read %q, %v; want hello", buf, err)
	}
	n, err := w.WriteWithin(make([]byte, 64<<20), 50*time.Millisecond)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a write to a peer reading nothing ended with %v after %d bytes; want the deadline", err, n)
	}
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != "write" {
		t.Fatalf("err = %#v; want a *net.OpError of op write", err)
	}
}

// A write larger than the socket takes at once finishes as the peer reads,
// within the timeout, which counts from when the socket was full.
func TestWriteWithinWaitsForRoom(t *testing.T) {
	a, b := pair(t)
	w := rawio.NewWriter(a)
	msg, got := bigMessageReadBy(b)
	if n, err := w.WriteWithin(msg, time.Minute); err != nil || n != len(msg) {
		t.Fatalf("WriteWithin = %d, %v; want %d, nil", n, err, len(msg))
	}
	if !bytes.Equal(<-got, msg) {
		t.Fatal("the reader got other bytes than were written")
	}
}

// bigMessageReadBy returns a message larger than the socket buffers and
// a channel that gets what r read of it, once all of it is read.
func bigMessageReadBy(r io.Reader) ([]byte, <-chan []byte) {
	msg := bytes.Repeat([]byte("0123456789abcdef"), 1<<18) // 4 MiB
	got := make(chan []byte, 1)
	go func() {
		buf, _ := io.ReadAll(io.LimitReader(r, int64(len(msg))))
		got <- buf
	}()
	return msg, got
}

// WriteVec writes its buffers in order, whatever their number (more than
// writev takes at once) and sizes (empty ones, ones the socket takes only
// in part while the peer reads slowly).
func TestWriteVecWritesEveryBufferInOrder(t *testing.T) {
	a, b := pair(t)
	w := rawio.NewWriter(a)
	var want []byte
	var bufs [][]byte
	for i := range 3000 {
		n := (i * 7919) % 97
		if i%500 == 3 {
			n = 300 << 10 // more than the socket takes at once
		}
		buf := bytes.Repeat([]byte{byte('a' + i%26)}, n)
		bufs = append(bufs, buf)
		want = append(want, buf...)
	}
	got := make(chan []byte, 1)
	go func() {
		var all []byte
		chunk := make([]byte, 4096)
		for len(all) < len(want) {
			n, err := b.Read(chunk)
			all = append(all, chunk[:n]...)
			if err != nil {
				break
			}
			time.Sleep(time.Microsecond)
		}
		got <- all
	}()
	n, err := w.WriteVec(bufs)
	if err != nil || n != len(want) {
		t.Fatalf("WriteVec = %d, %v; want %d, nil", n, err, len(want))
	}
	if g := <-got; !bytes.Equal(g, want) {
		t.Fatalf("the reader got %d bytes, not the %d written in order", len(g), len(want))
	}
}

// A WriteVec to a peer that reads nothing ends at the write deadline, as
// Write does; a WriteVec after close reports net.ErrClosed.
func TestWriteVecHonoursTheDeadline(t *testing.T) {
	a, _ := pair(t)
	w := rawio.NewWriter(a)
	// The buffer is made before the deadline is set, and the deadline is a
	// second away, so that the first writev starts before it even on a
	// loaded machine: CI once spent the whole 50 ms this test used to allow
	// before WriteVec ran, and it wrote nothing.
	big := make([]byte, 32<<20)
	a.SetWriteDeadline(time.Now().Add(time.Second))
	n, err := w.WriteVec([][]byte{[]byte("*3\r\n"), big, big})
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("err = %v; want the deadline", err)
	}
	if n <= 0 || n >= 64<<20 {
		t.Fatalf("wrote %d bytes before the deadline; want some, not all", n)
	}
	a.Close()
	if _, err := w.WriteVec([][]byte{[]byte("x"), []byte("y")}); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("WriteVec after close: err = %v; want net.ErrClosed", err)
	}
}

// A WriteVec allocates nothing once its array has grown.
func TestWriteVecAllocatesNothing(t *testing.T) {
	a, b := pair(t)
	w := rawio.NewWriter(a)
	head, body := []byte("$5\r\n"), []byte("hello\r\n")
	bufs := make([][]byte, 2)
	buf := make([]byte, len(head)+len(body))
	allocs := testing.AllocsPerRun(100, func() {
		bufs[0], bufs[1] = head, body
		if _, err := w.WriteVec(bufs); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(b, buf); err != nil || string(buf) != "$5\r\nhello\r\n" {
			t.Fatal(string(buf), err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per WriteVec and read; want 0", allocs)
	}
}
