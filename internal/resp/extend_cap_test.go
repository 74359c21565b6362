package resp

import (
	"io"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A batch cut by the load cap leaves complete requests buffered. Extend
// hands those back without reading the socket first (found by review: it
// read first, and a client waiting for its replies sends nothing, so the
// session waited out its look-ahead deadline). A request the client sent
// later is not taken: it shows that no read happened.
func TestReaderExtendTakesBufferedRequestsWithoutReading(t *testing.T) {
	server, client := tcpPair(t)
	var c atomic.Int32
	c.Store(2)
	r := NewReader(server, DefaultLimits)
	r.SetBatchCap(&c)
	defer r.Close()
	ping := "*1\r\n$4\r\nPING\r\n"
	if _, err := client.Write([]byte(strings.Repeat(ping, 5))); err != nil {
		t.Fatal(err)
	}
	reqs, err := r.ReadBatch()
	if err != nil || len(reqs) != 2 {
		t.Fatalf("ReadBatch: %d requests, %v; want the cap's 2", len(reqs), err)
	}
	// Lifted, as when other sessions left their batches; then one more
	// request is already in the socket when Extend runs.
	c.Store(0)
	if _, err := client.Write([]byte("*2\r\n$4\r\nECHO\r\n$5\r\nlater\r\n")); err != nil {
		t.Fatal(err)
	}
	server.SetReadDeadline(time.Now().Add(10 * time.Second))
	more, grew := r.Extend(1<<20, 0)
	if len(more) != 5 || !grew {
		t.Fatalf("Extend: %d requests, grew %v; want the 5 buffered, and no read for the sixth", len(more), grew)
	}
	reqs, err = r.ReadBatch()
	if err != nil || len(reqs) != 1 || string(reqs[0].Args[1]) != "later" {
		t.Fatalf("the next ReadBatch: %d requests, %v; want the ECHO", len(reqs), err)
	}
}

// A request that arrives over several reads, after a batch, is read whole
// by one Extend: the look-ahead stopped at the first read that brought
// only part of it (found by a probe: a 70 KB value between a write and
// its EXPIRE ended the look-ahead, and the write was refused).
func TestReaderExtendReadsARequestThatComesInPieces(t *testing.T) {
	big := strings.Repeat("v", 70<<10)
	stream := "*3\r\n$3\r\nSET\r\n$1\r\na\r\n$1\r\n1\r\n" +
		"*3\r\n$3\r\nSET\r\n$3\r\nbig\r\n$" + strconv.Itoa(len(big)) + "\r\n" + big + "\r\n" +
		"*3\r\n$7\r\nPEXPIRE\r\n$1\r\na\r\n$4\r\n5000\r\n"
	r := NewReader(&chunkReader{data: []byte(stream), n: 4096}, DefaultLimits)
	defer r.Close()
	reqs, err := r.ReadBatch()
	if err != nil || len(reqs) != 1 {
		t.Fatalf("ReadBatch: %d requests, %v; want the first SET alone", len(reqs), err)
	}
	more, grew := r.Extend(1<<20, 0)
	if !grew || len(more) < 2 || len(more[1].Args[2]) != len(big) {
		t.Fatalf("Extend: %d requests, grew %v; want the large SET read whole", len(more), grew)
	}
	if len(more) == 2 {
		more, grew = r.Extend(1<<20, 0)
	}
	if !grew || len(more) != 3 || string(more[2].Args[0]) != "PEXPIRE" {
		t.Fatalf("Extend: %d requests, grew %v; want the PEXPIRE too", len(more), grew)
	}
}

// A batch at its cap grows past it by the extra requests Extend is given,
// and no further than MaxExtendedBatch; with none it stays at the cap.
func TestReaderExtendGrowsPastTheCapByExtra(t *testing.T) {
	ping := "*1\r\n$4\r\nPING\r\n"
	lim := DefaultLimits
	lim.MaxBatch = 4
	read := func() *Reader {
		r := NewReader(&chunkReader{data: []byte(strings.Repeat(ping, 10)), n: 1 << 20}, lim)
		t.Cleanup(r.Close)
		if reqs, err := r.ReadBatch(); err != nil || len(reqs) != 4 {
			t.Fatalf("ReadBatch: %d requests, %v; want the cap's 4", len(reqs), err)
		}
		return r
	}
	if more, grew := read().Extend(1<<20, 0); more != nil || grew {
		t.Fatalf("Extend with no extra: %d requests, grew %v; want the batch left at its cap", len(more), grew)
	}
	r := read()
	if more, grew := r.Extend(1<<20, 3); !grew || len(more) != 7 {
		t.Fatalf("Extend by 3: %d requests, grew %v; want 7", len(more), grew)
	}
	if reqs, err := r.ReadBatch(); err != nil || len(reqs) != 3 {
		t.Fatalf("the next ReadBatch: %d requests, %v; want the 3 left", len(reqs), err)
	}
	// Extended again and again, it stops at MaxExtendedBatch.
	r = NewReader(&chunkReader{data: []byte(strings.Repeat(ping, MaxExtendedBatch+10)), n: 1 << 20}, lim)
	defer r.Close()
	reqs, err := r.ReadBatch()
	if err != nil || len(reqs) != 4 {
		t.Fatalf("ReadBatch: %d requests, %v", len(reqs), err)
	}
	for range MaxExtendedBatch {
		more, _ := r.Extend(1<<20, 1<<20)
		if more == nil {
			break
		}
		reqs = more
	}
	if len(reqs) != MaxExtendedBatch {
		t.Fatalf("extended to %d requests, want MaxExtendedBatch (%d)", len(reqs), MaxExtendedBatch)
	}
}

// trickleReader returns first whole, then the rest a byte per read.
type trickleReader struct{ first, rest []byte }

func (c *trickleReader) Read(p []byte) (int, error) {
	if len(c.first) > 0 {
		n := copy(p, c.first)
		c.first = c.first[n:]
		return n, nil
	}
	if len(c.rest) == 0 {
		return 0, io.EOF
	}
	p[0] = c.rest[0]
	c.rest = c.rest[1:]
	return 1, nil
}

// A value trickled in tiny pieces behind a batch is read on without the
// batch being parsed again per piece, only once the argument can be
// whole: parsed per read, 20 KB a byte at a time behind 1,000 requests
// took 1.6 s of CPU (found by review).
func TestReaderExtendParsesATrickledValueOnce(t *testing.T) {
	value := strings.Repeat("v", 20000)
	head := strings.Repeat("*1\r\n$4\r\nPING\r\n", 1000) + "*2\r\n$4\r\nECHO\r\n$20000\r\n"
	r := NewReader(&trickleReader{first: []byte(head), rest: []byte(value + "\r\n")}, DefaultLimits)
	defer r.Close()
	reqs, err := r.ReadBatch()
	if err != nil || len(reqs) != 1000 {
		t.Fatalf("ReadBatch: %d requests, %v", len(reqs), err)
	}
	before := r.parses
	more, grew := r.Extend(1<<20, 64)
	if !grew || len(more) != 1001 || len(more[1000].Args[1]) != len(value) {
		t.Fatalf("Extend: %d requests, grew %v; want the ECHO read whole", len(more), grew)
	}
	if n := r.parses - before; n > 4 {
		t.Fatalf("the batch was parsed %d times while 20,002 bytes came one at a time", n)
	}
}
