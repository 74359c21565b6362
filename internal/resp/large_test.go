package resp

import (
	"bytes"
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
