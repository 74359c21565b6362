package resp

import (
	"bytes"
	"io"
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
