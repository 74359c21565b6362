package resp

import (
	"bytes"
	"slices"
	"strconv"
	"testing"
)

// A request with a large argument ends in a buffer of its own size. The
// buffer full of all but the last bytes of the argument was doubled for
// them (found by a heap profile: a 256 MB SET took a 512 MB buffer, and
// the proxy's heap reached 833 MB for it).
func TestLargeArgumentGetsABufferOfItsSize(t *testing.T) {
	const size = 16 << 20 // 16 KB read buffer, grown 64 KB, 256 KB, 1 MB, 4 MB, then 16 MB and its header
	value := bytes.Repeat([]byte("v"), size)
	req := []byte("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$" + strconv.Itoa(size) + "\r\n")
	req = append(append(req, value...), "\r\n"...)
	lim := DefaultLimits
	r := NewReader(&chunkReader{data: req, n: 64 << 10}, lim)
	defer r.Close()
	reqs, err := r.ReadBatch()
	if err != nil || len(reqs) != 1 {
		t.Fatalf("ReadBatch: %d requests, %v", len(reqs), err)
	}
	if !bytes.Equal(reqs[0].Args[2], value) || !bytes.Equal(reqs[0].Raw, req) {
		t.Fatal("the request read is not the request sent")
	}
	if got := r.BufferCap(); got != len(req) {
		t.Errorf("buffer of %d bytes for a request of %d; want its size", got, len(req))
	}
}

// Extend after a request larger than the read buffer, with a long
// pipeline behind it: every request comes back once, in order. Found by
// review: grow took the size of the request cut short as counted from
// the batch's start, made a buffer smaller than what it held, and the
// slice past its end panicked (a 50 KB SET and 2,000 SETs of 1 KB).
func TestExtendAfterALargeRequest(t *testing.T) {
	var wire []byte
	var want []string
	add := func(key string, size int) {
		wire = AppendCommandStrings(wire, "SET", key, string(bytes.Repeat([]byte("v"), size)))
		want = append(want, key)
	}
	add("large", 50<<10)
	for i := 0; i < 2000; i++ {
		add("k"+strconv.Itoa(i), 1<<10)
	}
	r := NewReader(&chunkReader{data: wire, n: 64 << 10}, DefaultLimits)
	defer r.Close()
	var got []string
	for len(got) < len(want) {
		reqs, err := r.ReadBatch()
		if err != nil {
			t.Fatalf("ReadBatch after %d requests: %v", len(got), err)
		}
		for {
			more, ok := r.Extend(1<<20, 0)
			if more == nil {
				break
			}
			reqs = more
			if !ok {
				break
			}
		}
		for _, q := range reqs {
			got = append(got, string(q.Args[1]))
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("%d requests read, want %d in order", len(got), len(want))
	}
}
