package localcache_test

import (
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/localcache"
	"github.com/redproxy/redproxy/internal/proxytest"
)

// fillHold holds the next fill of one key after its reply arrived and
// before the tier decides whether to keep it: a reply "still on its way".
type fillHold struct {
	key     string
	armed   atomic.Bool
	reached chan struct{}
	release chan struct{}
}

func newFillHold(key string) *fillHold {
	return &fillHold{key: key, reached: make(chan struct{}), release: make(chan struct{})}
}

func (h *fillHold) afterFill(key []byte) {
	if string(key) == h.key && h.armed.CompareAndSwap(true, false) {
		h.reached <- struct{}{}
		<-h.release
	}
}

// c3Race runs n iterations of: another client's read fills the key and its
// fill is held with the old value; the writer writes the key through the
// proxy and gets OK; the held fill is released either after the write's
// reply or while the writer's next read waits for it; the writer's next
// read must return what it wrote. It returns the first stale read.
func c3Race(t *testing.T, p *proxytest.Proxy, hold *fillHold, n int) (iteration int, got, want string) {
	one := func(o *redis.Options) { o.PoolSize = 1 }
	writer, reader := p.Client(t, one), p.Client(t, one)
	key := hold.key
	for i := range n {
		old := "old" + strconv.Itoa(i)
		if err := writer.Set(ctx, key, old, 0).Err(); err != nil {
			t.Fatal(err)
		}
		hold.armed.Store(true)
		readDone := make(chan string)
		go func() {
			v, _ := reader.Get(ctx, key).Result()
			readDone <- v
		}()
		<-hold.reached // the reader's fill has read `old` and is held
		want = "new" + strconv.Itoa(i)
		if err := writer.Set(ctx, key, want, 0).Err(); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			// Released after the write's reply: the fill is stored (or
			// not) after the write completed.
			hold.release <- struct{}{}
			if v := <-readDone; v != old {
				t.Fatalf("the held read returned %q, want %q", v, old)
			}
			got = mustGet(t, writer, key)
		} else {
			// The writer reads while the old fill is still held: it must
			// not join that fill, and must not be served what it keeps.
			next := make(chan string)
			go func() {
				v, err := writer.Get(ctx, key).Result()
				if err != nil {
					v = "error: " + err.Error()
				}
				next <- v
			}()
			hold.release <- struct{}{}
			<-readDone
			got = <-next
		}
		if got != want {
			return i, got, want
		}
	}
	return -1, "", ""
}

// C3: a client that got OK for a write through the proxy never reads an
// older value afterwards, even when a fill that read the old value was in
// flight across the write.
func TestReadYourWritesAcrossFill(t *testing.T) {
	hold := newFillHold("c3")
	withHooks(t, &localcache.TestHooks{AfterFill: hold.afterFill})
	p := startTier(t, nil)
	n := 2000
	if testing.Short() {
		n = 300
	}
	if i, got, want := c3Race(t, p, hold, n); i >= 0 {
		t.Fatalf("iteration %d: the writer read %q after writing %q", i, got, want)
	}
	if d := metric(t, p.Metrics.Registry, "redproxy_localcache_fills_total", "result=discarded"); d == 0 {
		t.Fatal("no fill was discarded: the race was not exercised")
	}
}

// The same race with the generation check off (and invalidations ignored,
// so nothing else repairs it) must fail at once.
func TestReadYourWritesCheckCatchesBrokenTier(t *testing.T) {
	hold := newFillHold("c3")
	withHooks(t, &localcache.TestHooks{AfterFill: hold.afterFill, SkipGenerationCheck: true, IgnorePushes: true})
	p := startTier(t, nil)
	if i, _, _ := c3Race(t, p, hold, 20); i < 0 {
		t.Fatal("a tier that keeps fills across writes passed the read-your-writes race 20 times")
	}
}
