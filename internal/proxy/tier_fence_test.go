package proxy_test

import (
	"bytes"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/localcache"
	"github.com/redproxy/redproxy/internal/proxy"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// holdTierPushes makes the tier's tracking connections wait before taking
// each invalidation push while the returned pointer holds a channel, until
// that channel is closed: pushes as late as a loaded machine may make them.
func holdTierPushes(t *testing.T) *atomic.Pointer[chan struct{}] {
	var hold atomic.Pointer[chan struct{}]
	prev := localcache.SetTestHooks(&localcache.TestHooks{BeforePush: func() {
		if ch := hold.Load(); ch != nil {
			<-*ch
		}
	}})
	t.Cleanup(func() { localcache.SetTestHooks(prev) })
	return &hold
}

// A write whose keys the proxy cannot name (a script writing a key it gets
// in ARGV) is fenced: no tier hit until the tracking connection answered a
// PING sent after the write's reply. The fence must be up before any byte
// of that reply reaches the client. A batch whose replies pass outSpill
// (256 KB) is written to the client while its replies are still being
// handed out, and the fence used to be raised only after the last one
// (batchFlushed at the end of flush): a client that had the script's OK
// could read the key on another connection and get the tier's value from
// before the script, until the invalidation arrived. The differential
// test's long runs saw it three times (the "twin" reads after an EVAL that
// SETs ARGV[1]), when the session goroutine was descheduled in that window.
//
// Here the window is held open: the reply hook stops the session on the
// batch's last reply (after the spill wrote the script's reply), and the
// invalidation pushes are held back, as a loaded machine may delay them.
func TestTierFenceIsUpBeforeTheScriptsReplyIsWritten(t *testing.T) {
	holdPushes := holdTierPushes(t)
	p := proxytest.Start(t, nil, func(c *config.Config) {
		eagerTier(c, 5*time.Second)
	})
	redistest.Eventually(t, 10*time.Second, func() bool { return p.LocalTier().Live(0) }, "local tier never became live")
	hits := func() float64 { return metricSum(t, p, "redproxy_localcache_hits_total") }
	rc := p.Redis.Client(t)
	const marker = "fence:last-reply"
	big := strings.Repeat("b", 300<<10) // one reply past outSpill
	if err := rc.Set(ctx, "fence:big", big, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rc.Set(ctx, "fence:marker", marker, 0).Err(); err != nil {
		t.Fatal(err)
	}
	reader := p.Client(t)

	markerReply := []byte("$" + strconv.Itoa(len(marker)) + "\r\n" + marker + "\r\n")
	var stopAtMarker atomic.Pointer[chan struct{}]
	reached := make(chan struct{}, 1)
	restore := proxy.SetTestReplyHook(func(_ int64, reply []byte) []byte {
		if ch := stopAtMarker.Load(); ch != nil && bytes.Equal(reply, markerReply) {
			reached <- struct{}{}
			<-*ch
		}
		return reply
	})
	t.Cleanup(restore)

	for round := 0; round < 20; round++ {
		key := "fence:k" + strconv.Itoa(round)
		if err := rc.Set(ctx, key, "old", 0).Err(); err != nil {
			t.Fatal(err)
		}
		waitTierHit(t, reader, hits, key)

		pushes, session := make(chan struct{}), make(chan struct{})
		holdPushes.Store(&pushes)
		stopAtMarker.Store(&session)
		w := dialRaw(t, p.Addr)
		w.send([]string{"EVAL", "return redis.call('SET', ARGV[1], ARGV[2])", "0", key, "new"},
			[]string{"GET", "fence:big"},
			[]string{"GET", "fence:marker"})
		if v, _ := w.readReply(); v != "OK" {
			t.Fatalf("EVAL: %v", v)
		}
		// The script's OK is in: any read that starts now must see it.
		before := hits()
		got, err := reader.Get(ctx, key).Result()
		wasHit := hits() > before
		holdPushes.Store(nil)
		close(pushes)
		close(session)
		if v, _ := w.readReply(); v != big {
			t.Fatalf("GET fence:big: %v", v)
		}
		<-reached
		stopAtMarker.Store(nil)
		if v, _ := w.readReply(); v != marker {
			t.Fatalf("GET fence:marker: %v", v)
		}
		if err != nil || got != "new" {
			t.Fatalf("round %d: GET %s after the script's SET was acknowledged = %q (%v), want \"new\" (tier hit: %v)", round, key, got, err, wasHit)
		}
	}
}

// The same for a relayed client: a RESP3 subscriber's writes are released
// (and fenced) as Redis's replies to them pass through the relay, before
// the client gets them. Once its replies can no longer be counted (here
// after CLIENT REPLY ON), its writes stay marked until the relay ends, but
// a script's write marks nothing: its fence was raised only when the relay
// ended, and meanwhile, with the invalidations late, another client read
// the key's old value from the tier after the subscriber had the script's
// OK. Now, while such a write is held, the relay raises a fence before
// passing on each chunk of Redis's output.
func TestTierFenceForAnUncountedRelaysScript(t *testing.T) {
	p, reader, hits := slowTierProxy(t, 300*time.Millisecond, 2*time.Second)
	rc := p.Redis.Client(t)
	for _, tc := range []struct {
		name  string
		start [][]string
	}{
		{"counted", [][]string{{"HELLO", "3"}, {"SUBSCRIBE", "x"}}},
		{"uncounted", [][]string{{"HELLO", "3"}, {"SUBSCRIBE", "x"}, {"CLIENT", "REPLY", "ON"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for round := 0; round < 3; round++ {
				key := "relayfence:" + tc.name + strconv.Itoa(round)
				if err := rc.Set(ctx, key, "old", 0).Err(); err != nil {
					t.Fatal(err)
				}
				waitTierHit(t, reader, hits, key)
				w := dialRaw(t, p.Addr)
				for _, c := range tc.start {
					w.send(c)
					w.readReply() // SUBSCRIBE's is a push
				}
				if v := w.readNonPushAfter("EVAL", "return redis.call('SET', ARGV[1], ARGV[2])", "0", key, "new"); v != "OK" {
					t.Fatalf("EVAL: %v", v)
				}
				before := hits()
				got, err := reader.Get(ctx, key).Result()
				if err != nil || got != "new" {
					t.Fatalf("round %d: GET %s after the relayed script's SET was acknowledged = %q (%v), want \"new\" (tier hit: %v)", round, key, got, err, hits() > before)
				}
				w.nc.Close() // the relay ends: hits are served again
			}
		})
	}
}

// DEBUG RELOAD (and LOADAOF) replaces every database with the file's, and
// names no key: forwarded as a command that writes nothing, it neither
// flushed the tier nor raised a fence, and until Redis's own invalidation
// of the reload arrived, hits answered the values from before it (found
// by a probe: 96 of 200 reads right after the reload's OK). Here the
// invalidation pushes are held back, as a loaded machine may delay them.
func TestTierFlushedByDebugReload(t *testing.T) {
	holdPushes := holdTierPushes(t)
	rs := redistest.Start(t, "--enable-debug-command", "yes")
	p := proxytest.Start(t, rs, func(c *config.Config) {
		eagerTier(c, 5*time.Second)
		c.Policy.Commands.Allow = append(c.Policy.Commands.Allow, "debug") // refused by default
	})
	redistest.Eventually(t, 10*time.Second, func() bool { return p.LocalTier().Live(0) }, "local tier never became live")
	hits := func() float64 { return metricSum(t, p, "redproxy_localcache_hits_total") }
	rc := rs.Client(t)
	reader, admin := p.Client(t), p.Client(t)
	for round := range 5 {
		key := "reload:k" + strconv.Itoa(round)
		if err := rc.Set(ctx, key, "saved", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if err := rc.Save(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if err := rc.Set(ctx, key, "after-save", 0).Err(); err != nil {
			t.Fatal(err)
		}
		waitTierHit(t, reader, hits, key)
		if v, err := reader.Get(ctx, key).Result(); err != nil || v != "after-save" {
			t.Fatalf("GET %s before the reload = %q (%v)", key, v, err)
		}

		pushes := make(chan struct{})
		holdPushes.Store(&pushes)
		if err := admin.Do(ctx, "DEBUG", "RELOAD", "NOSAVE").Err(); err != nil {
			t.Fatalf("DEBUG RELOAD NOSAVE through the proxy: %v", err)
		}
		// The reload's OK is in: Redis holds the saved value now.
		got, err := reader.Get(ctx, key).Result()
		holdPushes.Store(nil)
		close(pushes)
		if err != nil || got != "saved" {
			t.Fatalf("round %d: GET %s after DEBUG RELOAD was acknowledged = %q (%v), want \"saved\"", round, key, got, err)
		}
	}
}
