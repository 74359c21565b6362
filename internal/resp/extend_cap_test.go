package resp

import (
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
	more, grew := r.Extend(1 << 20)
	if len(more) != 5 || !grew {
		t.Fatalf("Extend: %d requests, grew %v; want the 5 buffered, and no read for the sixth", len(more), grew)
	}
	reqs, err = r.ReadBatch()
	if err != nil || len(reqs) != 1 || string(reqs[0].Args[1]) != "later" {
		t.Fatalf("the next ReadBatch: %d requests, %v; want the ECHO", len(reqs), err)
	}
}
