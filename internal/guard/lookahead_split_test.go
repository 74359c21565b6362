package guard_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
)

// A pipeline sent in one write is seen whole by the look-ahead even where
// the proxy's reads split it (16 KB and up): an INCR and its EXPIRE NX, or
// a lock's SET NX and its PEXPIRE, straddling a read's end still pass
// untouched, as they do in a shorter pipeline. Found by a user's trial:
// the pair straddling 16 KB got the rule's default TTL (an hour for a
// 60-second limiter window) or a refusal. The padding in front moves the
// pair across the 16, 32 and 64 KB boundaries byte by byte, plain and
// inside MULTI.
func TestLookaheadSeesAWriteSplitByReads(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Policy = holesPolicy() })
	db0 := dbClient(t, p.Redis, 0)
	const day = 24 * time.Hour
	for _, around := range []int{16 << 10, 32 << 10, 64 << 10} {
		for shift := -64; shift <= 64; shift += 4 {
			for _, tx := range []bool{false, true} {
				name := fmt.Sprintf("%d%+d tx=%v", around, shift, tx)
				counter, lock := fmt.Sprintf("s:rl:%d:%d:%v", around, shift, tx), fmt.Sprintf("l:lock:%d:%d:%v", around, shift, tx)
				var cmds [][]string
				var want []string
				// Padding: one ECHO whose length puts the pair across the
				// boundary; RESP framing adds about 40 bytes per command.
				pad := max(around+shift-40, 1)
				cmds = append(cmds, []string{"ECHO", strings.Repeat("p", pad)})
				want = append(want, "$"+strings.Repeat("p", pad))
				if tx {
					cmds = append(cmds, []string{"MULTI"})
					want = append(want, "+OK")
				}
				cmds = append(cmds,
					[]string{"INCR", counter}, []string{"EXPIRE", counter, "60", "NX"},
					[]string{"SET", lock, "owner", "NX"}, []string{"PEXPIRE", lock, "5000"})
				if tx {
					cmds = append(cmds, []string{"EXEC"})
					want = append(want, "+QUEUED", "+QUEUED", "+QUEUED", "+QUEUED", "*[:1 :1 +OK :1]")
				} else {
					want = append(want, ":1", ":1", "+OK", ":1")
				}
				nc := p.Dial(t)
				got := roundTrip(t, nc, cmds...)
				nc.Close()
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("%s: replies %.300q, want %.300q", name, got[1:], want[1:])
					continue
				}
				if d := pttl(t, db0, counter); d > 60*time.Second || d <= 0 {
					t.Errorf("%s: the counter's TTL is %v, want the 60 s its EXPIRE NX set (not the rule's %v)", name, d, day)
				}
				if d := pttl(t, db0, lock); d > 5*time.Second || d <= 0 {
					t.Errorf("%s: the lock's TTL is %v, want its 5 s", name, d)
				}
			}
		}
	}
}

// The same with a large value between a write and its EXPIRE: the value
// comes over several reads, and the look-ahead reads on until it is whole
// (found by a probe: with 70 KB and more between them the lock's SET NX
// was refused and the counter got the rule's default, where Redis answers
// each as sent). Up to the look-ahead's 1 MB.
func TestLookaheadReadsALargeRequestBetween(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Policy = holesPolicy() })
	db0 := dbClient(t, p.Redis, 0)
	for _, size := range []int{70 << 10, 300 << 10, 600 << 10} {
		counter, lock := fmt.Sprintf("s:rl:big:%d", size), fmt.Sprintf("l:lock:big:%d", size)
		value := strings.Repeat("v", size)
		nc := p.Dial(t)
		got := roundTrip(t, nc,
			[]string{"INCR", counter}, []string{"SET", lock, "owner", "NX"},
			[]string{"SET", "free:payload", value},
			[]string{"EXPIRE", counter, "60", "NX"}, []string{"PEXPIRE", lock, "5000"})
		nc.Close()
		if want := []string{":1", "+OK", "+OK", ":1", ":1"}; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%d bytes between: replies %q, want %q", size, got, want)
			continue
		}
		if d := pttl(t, db0, counter); d > 60*time.Second || d <= 0 {
			t.Errorf("%d bytes between: the counter's TTL is %v, want the 60 s its EXPIRE NX set", size, d)
		}
		if d := pttl(t, db0, lock); d > 5*time.Second || d <= 0 {
			t.Errorf("%d bytes between: the lock's TTL is %v, want its 5 s", size, d)
		}
	}
}

// A write and its EXPIRE on either side of the batch's cap of 1,024
// requests, in one small write: the look-ahead takes the batch past the
// cap (found by a probe: INCR as the 1,024th request got the rule's
// default and its EXPIRE NX :0; a lock's SET NX was refused).
func TestLookaheadCrossesTheBatchCap(t *testing.T) {
	p := proxytest.Start(t, nil, func(c *config.Config) { c.Policy = holesPolicy() })
	db0 := dbClient(t, p.Redis, 0)
	for _, before := range []int{1022, 1023, 1024, 2046, 2047} {
		counter, lock := fmt.Sprintf("s:rl:cap:%d", before), fmt.Sprintf("l:lock:cap:%d", before)
		var cmds [][]string
		var want []string
		for range before {
			cmds = append(cmds, []string{"PING"})
			want = append(want, "+PONG")
		}
		cmds = append(cmds, []string{"INCR", counter}, []string{"EXPIRE", counter, "60", "NX"},
			[]string{"SET", lock, "owner", "NX"}, []string{"PEXPIRE", lock, "5000"})
		want = append(want, ":1", ":1", "+OK", ":1")
		nc := p.Dial(t)
		got := roundTrip(t, nc, cmds...)
		nc.Close()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%d PINGs before: replies %q, want %q", before, got[before:], want[before:])
			continue
		}
		if d := pttl(t, db0, counter); d > 60*time.Second || d <= 0 {
			t.Errorf("%d PINGs before: the counter's TTL is %v, want the 60 s its EXPIRE NX set", before, d)
		}
		if d := pttl(t, db0, lock); d > 5*time.Second || d <= 0 {
			t.Errorf("%d PINGs before: the lock's TTL is %v, want its 5 s", before, d)
		}
	}
}
