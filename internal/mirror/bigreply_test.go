package mirror

import (
	"bytes"
	"context"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/resp"
	"github.com/redproxy/redproxy/internal/upstream"
)

// allocTarget measures the bytes allocated while the mirror's replies are
// read: runtime.MemStats.TotalAlloc around the inner Do, which is the
// sender waiting for the mirror's pipe to read its replies.
type allocTarget struct {
	Target
	mu     sync.Mutex
	allocs []uint64
}

func (t *allocTarget) Do(db int, resp3 bool, c *upstream.Call) error {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	err := t.Target.Do(db, resp3, c)
	runtime.ReadMemStats(&after)
	t.mu.Lock()
	t.allocs = append(t.allocs, after.TotalAlloc-before.TotalAlloc)
	t.mu.Unlock()
	return err
}

func (t *allocTarget) total() (n uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, a := range t.allocs {
		n += a
	}
	return n
}

// bigMirror starts a mirror of a real redis-server, with the given queue
// bytes, every Do measured.
func bigMirror(t *testing.T, queueBytes units.ByteSize) (*Mirror, *allocTarget, *redistest.Server) {
	t.Helper()
	srv := redistest.Start(t)
	at := &allocTarget{}
	m := New(Options{
		Config:    Config{Upstream: "new", ReadsSample: 1, Compare: true, Queue: 100, QueueBytes: queueBytes},
		Databases: 16,
		Dial: func(<-chan struct{}) Target {
			at.Target = BackendTarget(upstream.NewBackend(upstream.BackendOptions{Addr: srv.Addr(), Connections: 1, Databases: 16,
				DialTimeout: time.Second, ReplyTimeout: 10 * time.Second}), nil)
			return at
		},
	})
	t.Cleanup(m.Close)
	return m, at, srv
}

// waitIdle waits until the sender has sent and checked everything queued.
func waitIdle(t *testing.T, m *Mirror, sent int64) Report {
	t.Helper()
	redistest.Eventually(t, 60*time.Second, func() bool {
		n, _ := m.Queued()
		return n == 0 && m.Report(0).Sent >= sent
	}, "the mirror never answered: %+v", m.Report(0))
	return m.Report(0)
}

func getCmd(key string) []byte { return resp.AppendCommandStrings(nil, "GET", key) }

// bulk is the RESP bulk string of v.
func bulk(v []byte) []byte {
	b := append([]byte("$"+strconv.Itoa(len(v))+"\r\n"), v...)
	return append(b, "\r\n"...)
}

// TestMirrorBigReplyBoundedMemory: a 64 MB value read back from the
// mirror costs the proxy a bounded amount of memory, not the value's size
// (a review measured ~255 MB allocated for it: the pipe's read buffer
// doubled until the whole reply fitted, and only then did the run's reply
// cap drop it). The mirror's reply is only compared, so it is streamed
// past; the compare still counts it, as a mismatch here (the primary
// answered something else), and the small read after it in the same run
// is still compared byte for byte.
func TestMirrorBigReplyBoundedMemory(t *testing.T) {
	const size = 64 << 20
	m, at, srv := bigMirror(t, 64*units.MB)
	rc := srv.Client(t)
	ctx := context.Background()
	// Built on the server: the test allocates none of it.
	if err := rc.SetRange(ctx, "big", size-1, "x").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rc.Set(ctx, "small", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	var b Batch
	b.Read("get", getCmd("big"), []byte("$3\r\nfoo\r\n"), []byte("big"), true)
	b.Read("get", getCmd("small"), []byte("$1\r\nv\r\n"), []byte("small"), true)
	m.Enqueue(0, false, &b)
	r := waitIdle(t, m, 2)
	allocated := at.total()
	t.Logf("allocated %.1f MB while the mirror read a %d MB reply; %+v", float64(allocated)/(1<<20), size>>20, r)
	if allocated > 8<<20 {
		t.Errorf("reading the mirror's %d MB reply allocated %.1f MB; want under 8 MB", size>>20, float64(allocated)/(1<<20))
	}
	if r.Compared != 2 || r.Mismatches != 1 || r.Errors[ErrConnection] != 0 {
		t.Errorf("compared %d, mismatches %d, connection errors %d; want 2 compared, 1 mismatch (the big one), no error",
			r.Compared, r.Mismatches, r.Errors[ErrConnection])
	}
}

// TestMirrorBigReplyCompare: replies too big to keep (past maxKeptReply)
// are still compared honestly, in both protocols: the same value matches,
// one that differs in a single byte (in the middle, or the last) or in
// length mismatches; and reading them costs a bounded amount of memory
// (85 MB was allocated for these five 4 MB replies before they were
// streamed).
func TestMirrorBigReplyCompare(t *testing.T) {
	const size = 4 << 20
	m, at, srv := bigMirror(t, 64*units.MB)
	rc := srv.Client(t)
	ctx := context.Background()
	value := bytes.Repeat([]byte{0}, size)
	value[size-1] = 'x'
	type setRange struct {
		key    string
		offset int64
		value  string
	}
	for _, op := range []setRange{
		{"same", size - 1, "x"},
		{"middle", size - 1, "x"}, {"middle", size / 2, "y"}, // one byte differs, in the middle
		{"last", size - 1, "z"}, // the last byte differs
		{"longer", size, "x"},
		{"shorter", size - 2, "x"},
	} {
		if err := rc.SetRange(ctx, op.key, op.offset, op.value).Err(); err != nil {
			t.Fatal(err)
		}
	}
	primary := bulk(value)
	for i, resp3 := range []bool{false, true} {
		var b Batch
		for _, key := range []string{"same", "middle", "last", "longer", "shorter"} {
			b.Read("get", getCmd(key), primary, []byte(key), true)
		}
		m.Enqueue(0, resp3, &b)
		r := waitIdle(t, m, int64(5*(i+1)))
		t.Logf("resp3=%v: allocated %.1f MB in all reading replies of %d MB; %+v", resp3, float64(at.total())/(1<<20), size>>20, r)
		if r.Compared != int64(5*(i+1)) || r.Mismatches != int64(4*(i+1)) || r.Errors[ErrConnection] != 0 {
			t.Fatalf("resp3=%v: compared %d, mismatches %d; want 5 more compared, 4 more mismatches (all but \"same\")", resp3, r.Compared, r.Mismatches)
		}
	}
	if n := at.total(); n > 8<<20 {
		t.Errorf("reading ten 4 MB replies allocated %.1f MB; want under 8 MB", float64(n)/(1<<20))
	}
}
