package resp

// These tests and benchmarks record why the proxy parses requests itself
// instead of with redcon's Reader (the rest of redcon's encoding helpers are
// used as they are).

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/tidwall/redcon"
)

// redcon's Reader accepts any declared bulk length and keeps growing its
// buffer as bytes arrive, so one client can make the proxy hold as much
// memory as it cares to send. Ours refuses the declaration itself.
func TestRedconReaderHasNoRequestCap(t *testing.T) {
	const sent = 8 << 20
	stream := "*2\r\n$3\r\nSET\r\n$1073741824\r\n" + strings.Repeat("x", sent)

	rc := redcon.NewReader(strings.NewReader(stream))
	_, err := rc.ReadCommands()
	if err != io.EOF {
		t.Fatalf("redcon: expected it to buffer all %d bytes and hit EOF, got %v", sent, err)
	}

	lim := DefaultLimits
	lim.MaxBulk, lim.MaxRequest = 1<<20, 1<<20
	ours := NewReader(strings.NewReader(stream), lim)
	_, err = ours.ReadBatch()
	if !errors.Is(err, ErrProtocol) {
		t.Fatalf("ours: want protocol error on the declaration, got %v", err)
	}
	if len(ours.buf) > minBuffer {
		t.Fatalf("ours: buffer grew to %d before refusing", len(ours.buf))
	}
}

func pipeline16() []byte {
	var b bytes.Buffer
	for i := 0; i < 16; i++ {
		b.WriteString("*2\r\n$3\r\nGET\r\n$16\r\nkey:000000012345\r\n")
	}
	return b.Bytes()
}

// loopReader replays the same bytes forever.
type loopReader struct {
	data []byte
	off  int
}

func (l *loopReader) Read(p []byte) (int, error) {
	n := copy(p, l.data[l.off:])
	l.off = (l.off + n) % len(l.data)
	return n, nil
}

func BenchmarkReaderPipeline16(b *testing.B) {
	data := pipeline16()
	rd := NewReader(&loopReader{data: data}, DefaultLimits)
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	n := 0
	for b.Loop() {
		for n < 16 {
			reqs, err := rd.ReadBatch()
			if err != nil {
				b.Fatal(err)
			}
			n += len(reqs)
		}
		n -= 16
	}
}

func BenchmarkRedconReaderPipeline16(b *testing.B) {
	data := pipeline16()
	rd := redcon.NewReader(&loopReader{data: data})
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	n := 0
	for b.Loop() {
		for n < 16 {
			cmds, err := rd.ReadCommands()
			if err != nil {
				b.Fatal(err)
			}
			n += len(cmds)
		}
		n -= 16
	}
}
