package resp

import (
	"bytes"
	"io"
	"runtime"
	"strconv"
	"testing"
)

// A large request grows the read buffer; the small requests pipelined
// behind it must still come out in batches of at most MaxBatch, every one
// of them, in order. Without the cap they all came out as one batch.
func TestReadBatchIsCappedAfterLargeRequest(t *testing.T) {
	const pings = 200_000
	var in bytes.Buffer
	big := bytes.Repeat([]byte("v"), 4<<20)
	in.WriteString("*3\r\n$3\r\nSET\r\n$3\r\nbig\r\n$" + strconv.Itoa(len(big)) + "\r\n")
	in.Write(big)
	in.WriteString("\r\n")
	for i := range pings {
		s := strconv.Itoa(i)
		in.WriteString("*2\r\n$4\r\nECHO\r\n$" + strconv.Itoa(len(s)) + "\r\n" + s + "\r\n")
	}
	lim := DefaultLimits
	rd := NewReader(&chunkReader{data: in.Bytes(), n: 8 << 20}, lim)
	next, batches, largest := -1, 0, 0
	for {
		reqs, err := rd.ReadBatch()
		if len(reqs) > 0 {
			batches++
			largest = max(largest, len(reqs))
		}
		for _, r := range reqs {
			if next < 0 {
				if string(r.Args[0]) != "SET" || len(r.Args[2]) != len(big) {
					t.Fatalf("first request is %q, want the SET", r.Args[0])
				}
				next = 0
				continue
			}
			if got := string(r.Args[1]); got != strconv.Itoa(next) {
				t.Fatalf("request %d carries %q: order lost", next, got)
			}
			next++
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if next != pings {
		t.Fatalf("read %d of %d pipelined requests", next, pings)
	}
	if largest > lim.MaxBatch {
		t.Fatalf("a batch held %d requests; the cap is %d", largest, lim.MaxBatch)
	}
	t.Logf("%d requests in %d batches, largest %d", pings+1, batches, largest)
}

// A request of a million one-byte arguments, arriving 64 KB at a time,
// costs the reader a small multiple of its size: its bookkeeping grew one
// argument at a time, reallocating about five times its final size (200
// MB allocated for a 7 MB MGET, found by review).
func TestManyArgumentsAllocateInProportion(t *testing.T) {
	const n = 1_000_000
	var in bytes.Buffer
	in.WriteString("*" + strconv.Itoa(n+1) + "\r\n$4\r\nMGET\r\n")
	for range n {
		in.WriteString("$1\r\nk\r\n")
	}
	size := in.Len()
	rd := NewReader(&chunkReader{data: in.Bytes(), n: 64 << 10}, DefaultLimits)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	var got int
	for got == 0 {
		reqs, err := rd.ReadBatch()
		if err != nil {
			t.Fatal(err)
		}
		if len(reqs) == 1 {
			got = len(reqs[0].Args)
		}
	}
	runtime.ReadMemStats(&after)
	if got != n+1 {
		t.Fatalf("read %d arguments, want %d", got, n+1)
	}
	// The buffer holding the request, 16 bytes of offsets and 24 of
	// argument slice per argument, the offsets grown by doubling: 15.6
	// times the request's 7 MB when written. Growing by one argument at
	// a time took 32.
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 24*uint64(size) {
		t.Fatalf("reading a %d-byte request allocated %d bytes (%.1f times)", size, alloc, float64(alloc)/float64(size))
	}
}
