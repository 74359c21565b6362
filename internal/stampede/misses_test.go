package stampede

import (
	"errors"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config/units"
	rglob "github.com/redproxy/redproxy/internal/glob"
)

func dur(d time.Duration) units.Duration { return units.Duration{Duration: d} }

// fakeClock is a manual clock for the δ measurements; hold timeouts use
// real timers.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func newMisses(t *testing.T, c Config) (*Misses, *Metrics, *fakeClock) {
	t.Helper()
	m := NewMetrics(nil)
	ms := NewMisses(c, m)
	if ms == nil {
		t.Fatal("NewMisses returned nil for a config with rules")
	}
	clk := &fakeClock{now: time.Unix(1000, 0)}
	ms.now = clk.Now
	return ms, m, clk
}

func closed(h *Hold) bool {
	select {
	case <-h.done:
		return true
	default:
		return false
	}
}

func TestNewMissesWithoutRules(t *testing.T) {
	if NewMisses(DefaultConfig(), nil) != nil {
		t.Fatal("no rules should mean no Misses")
	}
	if (Match{}).Any() {
		t.Fatal("the zero Match applies a rule")
	}
}

func TestMatchFirstRuleWins(t *testing.T) {
	ms, _, _ := newMisses(t, Config{
		Hold:         []HoldRule{{Pattern: "cache:*", Timeout: dur(time.Second)}, {Pattern: "*", Timeout: dur(2 * time.Second)}},
		EarlyRefresh: []RefreshRule{{Pattern: "page:?"}},
	})
	for _, tc := range []struct {
		key           string
		hold, refresh int
	}{
		{"cache:x", 1, 0},
		{"page:1", 2, 1},
		{"page:12", 2, 0},
	} {
		r := ms.Match([]byte(tc.key))
		if r.hold != tc.hold || r.refresh != tc.refresh {
			t.Errorf("%s: got %+v, want hold rule %d refresh rule %d (1-based, 0 = none)", tc.key, r, tc.hold, tc.refresh)
		}
	}
	if ms.refreshRules[0].beta != DefaultBeta {
		t.Fatalf("unset beta = %v, want %v", ms.refreshRules[0].beta, DefaultBeta)
	}
}

func TestHoldLifecycle(t *testing.T) {
	ms, m, _ := newMisses(t, Config{Hold: []HoldRule{{Pattern: "cache:*", Timeout: dur(time.Hour)}}})
	key := []byte("cache:k")
	r := ms.Match(key)

	if h := ms.Held(0, key, r, 2); h != nil {
		t.Fatal("held before any miss")
	}
	// Owner 1 gets the first nil: it becomes the filler and is not held.
	if h := ms.Missed(0, key, r, 1, true); h != nil {
		t.Fatal("the first client to miss was held")
	}
	if h := ms.Held(0, key, r, 1); h != nil {
		t.Fatal("the filler's own read was held")
	}
	if h := ms.Held(1, key, r, 2); h != nil {
		t.Fatal("a hold in DB 0 held a read in DB 1")
	}
	h := ms.Held(0, key, r, 2)
	if h == nil {
		t.Fatal("another client's read was not held")
	}
	// A client that shared the filler's nil reply is held too, unless it
	// was held already.
	if h2 := ms.Missed(0, key, r, 3, true); h2 != h {
		t.Fatal("a second client missing during the hold was not held")
	}
	if h3 := ms.Missed(0, key, r, 4, false); h3 != nil {
		t.Fatal("a read that was held once was held again")
	}
	if closed(h) {
		t.Fatal("hold ended early")
	}
	ms.Written(0, []byte("cache:other"), ms.Match([]byte("cache:other")))
	if closed(h) {
		t.Fatal("a write of another key ended the hold")
	}
	ms.Written(0, key, r)
	if !closed(h) {
		t.Fatal("a write of the key did not end the hold")
	}
	if got := counter(m.Held); got != 2 {
		t.Fatalf("held reads = %v, want 2", got)
	}
	if counter(m.HoldTimeouts) != 0 {
		t.Fatal("a released hold counted as a timeout")
	}
	// The next miss starts a new hold.
	if ms.Missed(0, key, r, 5, true) != nil || ms.Held(0, key, r, 6) == nil {
		t.Fatal("no new hold after the first ended")
	}
}

// A nil whose fetch was sent before a write ended the key's hold is
// answered with the ended hold (fetch again), not made a new filler; one
// sent after the end, or already held once, may fill. Found by review
// (TestReviewHoldEndedBeforeNilHandledMakesSecondFiller).
func TestMissedBeforeHoldEndedFetchesAgain(t *testing.T) {
	ms, _, _ := newMisses(t, Config{Hold: []HoldRule{{Pattern: "cache:*", Timeout: dur(time.Hour)}}})
	key := []byte("cache:k")
	r := ms.Match(key)
	early := ms.Seq() // a read sent now, before the filler writes
	if ms.MissedSince(0, key, r, 1, true, early) != nil {
		t.Fatal("the first client to miss was held")
	}
	h := ms.Held(0, key, r, 9)
	ms.Written(0, key, r)
	if got := ms.MissedSince(0, key, r, 2, true, early); got != h || !closed(got) {
		t.Fatal("a nil fetched before the filler's write, handled after the hold ended, did not fetch again")
	}
	if ms.Held(0, key, r, 3) != nil {
		t.Fatal("fetching again started a hold")
	}
	if ms.MissedSince(0, key, r, 2, false, early) != nil || ms.Held(0, key, r, 3) == nil {
		t.Fatal("a read held once that still finds nil did not become the filler")
	}
	ms.Written(0, key, r)
	if ms.MissedSince(0, key, r, 4, true, ms.Seq()) != nil || ms.Held(0, key, r, 5) == nil {
		t.Fatal("a nil fetched after the last hold ended did not make a new filler")
	}
}

func TestHoldEndsWhenFillerCloses(t *testing.T) {
	ms, _, _ := newMisses(t, Config{Hold: []HoldRule{{Pattern: "*", Timeout: dur(time.Hour)}}})
	key := []byte("k")
	r := ms.Match(key)
	ms.Missed(0, key, r, 1, true)
	h := ms.Held(0, key, r, 2)
	ms.OwnerClosed(2)
	if closed(h) {
		t.Fatal("a held client closing ended the hold")
	}
	ms.OwnerClosed(1)
	if !closed(h) {
		t.Fatal("the filler closing did not end the hold")
	}
	if ms.Held(0, key, r, 3) != nil {
		t.Fatal("the hold is still active after its filler left")
	}
}

func TestHoldTimeout(t *testing.T) {
	ms, m, _ := newMisses(t, Config{Hold: []HoldRule{{Pattern: "*", Timeout: dur(time.Millisecond)}}})
	key := []byte("k")
	ms.Missed(0, key, ms.Match(key), 1, true)
	ms.mu.Lock()
	h := ms.holds["0:k"]
	ms.mu.Unlock()
	if h != nil {
		h.Wait()
	} // else the timer has already ended it
	if got := counter(m.HoldTimeouts); got != 1 {
		t.Fatalf("hold timeouts = %v, want 1", got)
	}
	if ms.Held(0, key, ms.Match(key), 2) != nil {
		t.Fatal("a timed-out hold still holds reads")
	}
}

func TestXFetch(t *testing.T) {
	const delta, ttl = 100 * time.Millisecond, 300 * time.Millisecond
	for _, beta := range []float64{0.5, 1, 2} {
		// Refresh exactly when u <= exp(-ttl/(beta*delta)).
		p := math.Exp(-float64(ttl) / (beta * float64(delta)))
		if !xfetch(delta, beta, ttl, p*0.999) {
			t.Errorf("beta %v: u just under exp(-τ/βδ) did not refresh", beta)
		}
		if xfetch(delta, beta, ttl, p*1.001) {
			t.Errorf("beta %v: u just over exp(-τ/βδ) refreshed", beta)
		}
	}
	if xfetch(delta, 1, ttl, 1) {
		t.Error("u = 1 (ln u = 0) refreshed a key with time to live")
	}
	if !xfetch(delta, 1, time.Nanosecond, 0.5) {
		t.Error("a key about to expire was not refreshed")
	}
}

func TestEarlyRefresh(t *testing.T) {
	ms, m, clk := newMisses(t, Config{EarlyRefresh: []RefreshRule{{Pattern: "cache:*"}}})
	key := []byte("cache:e")
	r := ms.Match(key)
	u := 1e-9 // a roll that always refreshes once δ is known
	ms.rand = func() float64 { return u }

	if ms.Early(0, key, r, 1, time.Second) {
		t.Fatal("refreshed early before δ was measured")
	}
	// δ: a miss handed out, then the key written 50ms later.
	ms.Missed(0, key, r, 1, true)
	clk.Add(50 * time.Millisecond)
	ms.Written(0, key, r)
	if d := ms.Delta(0); d != 50*time.Millisecond {
		t.Fatalf("δ = %v, want 50ms", d)
	}
	// A write with no miss before it is not a sample.
	clk.Add(time.Second)
	ms.Written(0, key, r)
	if d := ms.Delta(0); d != 50*time.Millisecond {
		t.Fatalf("δ = %v after a write without a miss, want 50ms", d)
	}

	if ms.Early(0, key, r, 1, 0) {
		t.Fatal("refreshed a key without a TTL")
	}
	if !ms.Early(0, key, r, 2, time.Second) {
		t.Fatal("did not refresh early with a winning roll")
	}
	if ms.Early(0, key, r, 3, time.Second) {
		t.Fatal("a second reader was handed an early miss while the first refreshes")
	}
	// The filler writes 150ms later: δ moves toward 150ms, and the key may
	// be refreshed again.
	clk.Add(150 * time.Millisecond)
	ms.Written(0, key, r)
	if d, want := ms.Delta(0), 80*time.Millisecond; d != want {
		t.Fatalf("δ = %v, want %v (EWMA)", d, want)
	}
	u = 1
	if ms.Early(0, key, r, 3, time.Second) {
		t.Fatal("refreshed with a losing roll")
	}
	u = 1e-9
	if !ms.Early(0, key, r, 3, time.Second) {
		t.Fatal("no refresh after the previous one completed")
	}
	// The filler leaving frees the key for another reader.
	ms.OwnerClosed(3)
	if !ms.Early(0, key, r, 4, time.Second) {
		t.Fatal("no refresh after the filler closed")
	}
	// A refresh whose filler never writes stops blocking others once the
	// key's TTL has run out.
	clk.Add(time.Second + time.Millisecond)
	if !ms.Early(0, key, r, 5, time.Second) {
		t.Fatal("an abandoned refresh blocks the key forever")
	}
	if got := counter(m.EarlyRefreshes); got != 4 {
		t.Fatalf("early refreshes = %v, want 4", got)
	}
}

func TestMissedBookkeepingIsBounded(t *testing.T) {
	ms, _, clk := newMisses(t, Config{EarlyRefresh: []RefreshRule{{Pattern: "*"}}})
	for i := range missMaxKeys + 10 {
		k := []byte("k" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + itoa(i))
		ms.Missed(0, k, ms.Match(k), 1, true)
	}
	if len(ms.missed) > missMaxKeys {
		t.Fatalf("%d miss marks kept, bound is %d", len(ms.missed), missMaxKeys)
	}
	// Misses of more keys while the map is full and nothing in it is
	// stale sweep it once, not once each (found by a probe: each walked
	// the whole map under the lock).
	before := ms.sweeps
	for i := range 1000 {
		k := []byte("more" + itoa(i))
		ms.Missed(0, k, ms.Match(k), 1, true)
	}
	if n := ms.sweeps - before; n > 1 {
		t.Fatalf("1000 misses on a full map swept it %d times", n)
	}
	clk.Add(missMaxAge + time.Second)
	k := []byte("late")
	ms.Missed(0, k, ms.Match(k), 1, true)
	if _, ok := ms.missed["0:late"]; !ok || len(ms.missed) != 1 {
		t.Fatalf("stale marks not swept: %d kept", len(ms.missed))
	}
}

// A reader that is handed early refreshes of many keys and never writes
// them, on a connection that stays open (a pooled connection of an app that
// decided not to refill), must not grow the refresh bookkeeping without
// bound: entries end with their key's TTL.
func TestEarlyRefreshBookkeepingIsBounded(t *testing.T) {
	ms, _, clk := newMisses(t, Config{EarlyRefresh: []RefreshRule{{Pattern: "*"}}})
	ms.rand = func() float64 { return 1e-9 } // a roll that always refreshes once δ is known
	k0 := []byte("seed")
	ms.Missed(0, k0, ms.Match(k0), 1, true)
	clk.Add(50 * time.Millisecond)
	ms.Written(0, k0, ms.Match(k0))
	refreshed := 0
	for i := range missMaxKeys + 10 {
		k := []byte("k" + itoa(i))
		if ms.Early(0, k, ms.Match(k), 7, time.Second) {
			refreshed++
		}
	}
	if refreshed < missMaxKeys {
		t.Fatalf("only %d of %d keys refreshed early", refreshed, missMaxKeys+10)
	}
	if len(ms.refreshing) > missMaxKeys {
		t.Fatalf("%d early refreshes kept for an owner that never writes, bound is %d", len(ms.refreshing), missMaxKeys)
	}
	// Once their keys' TTLs have run out, the old entries make room.
	clk.Add(2 * time.Second)
	k := []byte("late")
	if !ms.Early(0, k, ms.Match(k), 7, time.Second) {
		t.Fatal("no early refresh once every earlier one's key had expired")
	}
	if len(ms.refreshing) != 1 {
		t.Fatalf("expired early refreshes not swept: %d kept", len(ms.refreshing))
	}
}

func itoa(i int) string {
	const digits = "0123456789"
	if i == 0 {
		return "0"
	}
	var b []byte
	for ; i > 0; i /= 10 {
		b = append([]byte{digits[i%10]}, b...)
	}
	return string(b)
}

func TestGlob(t *testing.T) {
	for _, tc := range []struct {
		pat, key string
		want     bool
	}{
		{"cache:*", "cache:", true},
		{"cache:*", "cache:user:1", true},
		{"cache:*", "cach", false},
		{"*", "", true},
		{"user:?", "user:1", true},
		{"user:?", "user:12", false},
		{"*:v[0-9]:*", "cache:v3:x", true},
		{"*:v[0-9]:*", "cache:vx:x", false},
		{"a[^b]c", "abc", false},
		{"a[^b]c", "axc", true},
		{"a[bc]d", "acd", true},
		{`a\*b`, "a*b", true},
		{`a\*b`, "axb", false},
		{"a*b*c", "aXXbYYc", true},
		{"a*b*c", "aXXbYY", false},
		{"exact", "exact", true},
		{"exact", "exactly", false},
		{"[z-a]", "m", true},
	} {
		p := compilePattern(tc.pat)
		if got := p.Match([]byte(tc.key)); got != tc.want {
			t.Errorf("%q ~ %q = %v, want %v", tc.pat, tc.key, got, tc.want)
		}
		if got := rglob.Match(tc.pat, []byte(tc.key)); got != tc.want {
			t.Errorf("globMatch(%q, %q) = %v, want %v", tc.pat, tc.key, got, tc.want)
		}
	}
}

func TestValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("default config invalid: %v", err)
	}
	c := Config{
		MaxWaiters:   0,
		Hold:         []HoldRule{{Pattern: "ok:*", Timeout: dur(time.Second)}, {Pattern: "", Timeout: dur(2 * time.Minute)}, {Pattern: "ok:*", Timeout: dur(time.Second)}},
		EarlyRefresh: []RefreshRule{{Pattern: `bad\`, Beta: math.NaN()}},
	}
	err := c.Validate()
	var keys []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var se *Error
		if !errors.As(e, &se) {
			t.Fatalf("%v is not a *stampede.Error", e)
		}
		keys = append(keys, se.Key)
	}
	want := "stampede.max_waiters stampede.hold[1].pattern stampede.hold[1].timeout stampede.hold[2].pattern stampede.early_refresh[0].pattern stampede.early_refresh[0].beta"
	if got := strings.Join(keys, " "); got != want {
		t.Fatalf("error keys:\n got %s\nwant %s", got, want)
	}
}

// TestHoldWaitForGone shows that a held read stops waiting once its
// client is gone (waitFor reports false, the hold still on), and that
// without a gone check it waits for the hold's end as before. What it
// guards: heldRead used to wait on Hold.Wait, which only the hold's end
// wakes (see TestHeldClientThatLeavesIsDropped).
func TestHoldWaitForGone(t *testing.T) {
	h := &Hold{done: make(chan struct{})}
	var left atomic.Bool
	done := make(chan bool)
	go func() { done <- h.waitFor(left.Load) }()
	time.Sleep(120 * time.Millisecond) // a few polls with the client still there
	select {
	case <-done:
		t.Fatal("waitFor returned while the hold was on and the client there")
	default:
	}
	left.Store(true)
	select {
	case ok := <-done:
		if ok {
			t.Fatal("waitFor = true for a client that left, want false")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waitFor never noticed the client left")
	}
	go func() { done <- h.waitFor(nil) }()
	close(h.done)
	if !<-done {
		t.Fatal("waitFor(nil) = false after the hold ended")
	}
}

// BenchmarkMissedOnFullMap: misses of new keys with the δ bookkeeping
// full and nothing in it stale, an early refresh rule's steady state
// under a flood of distinct missing keys.
func BenchmarkMissedOnFullMap(b *testing.B) {
	ms := NewMisses(Config{EarlyRefresh: []RefreshRule{{Pattern: "*"}}}, NewMetrics(nil))
	clk := &fakeClock{now: time.Unix(1000, 0)}
	ms.now = clk.Now
	for i := range missMaxKeys {
		k := []byte("k" + itoa(i))
		ms.Missed(0, k, ms.Match(k), 1, true)
	}
	keys := make([][]byte, 4096)
	for i := range keys {
		keys[i] = []byte("new" + itoa(i))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		k := keys[i%len(keys)]
		ms.Missed(0, k, ms.Match(k), 1, true)
	}
}

// A flood of misses on distinct keys under a hold rule opens at most
// maxHolds holds; once one ends, a new miss opens one again.
func TestHoldsAreCapped(t *testing.T) {
	defer func(n int) { maxHolds = n }(maxHolds)
	maxHolds = 50
	ms, m, _ := newMisses(t, Config{Hold: []HoldRule{{Pattern: "*", Timeout: dur(time.Minute)}}})
	open := func() int {
		ms.mu.Lock()
		defer ms.mu.Unlock()
		return len(ms.holds)
	}
	for i := range 200 {
		k := []byte("k" + itoa(i))
		ms.MissedSince(0, k, ms.Match(k), 1, true, ms.Seq())
	}
	if n := open(); n != maxHolds {
		t.Fatalf("%d holds open after 200 misses, cap %d", n, maxHolds)
	}
	if got := counter(m.HoldsSkipped); got != 150 {
		t.Fatalf("holds skipped = %v, want 150", got)
	}
	k0 := []byte("k0")
	ms.Written(0, k0, ms.Match(k0))
	if n := open(); n != maxHolds-1 {
		t.Fatalf("%d holds open after one was written, want %d", n, maxHolds-1)
	}
	k := []byte("after")
	ms.MissedSince(0, k, ms.Match(k), 1, true, ms.Seq())
	if h := ms.Held(0, k, ms.Match(k), 2); h == nil {
		t.Fatal("a miss after a hold ended opened none")
	}
	ms.mu.Lock()
	for _, h := range ms.holds {
		h.timer.Stop()
	}
	ms.mu.Unlock()
}

// An early refresh of a key already marked updates its mark also when the
// map is full (review: the size check came first, and δ was measured
// from the older miss).
func TestMarkMissUpdatesItsOwnEntryInAFullMap(t *testing.T) {
	ms, _, clk := newMisses(t, Config{EarlyRefresh: []RefreshRule{{Pattern: "*"}}})
	for i := range missMaxKeys {
		k := []byte("k" + itoa(i))
		ms.Missed(0, k, ms.Match(k), 1, true)
	}
	clk.Add(time.Second)
	ms.mu.Lock()
	ms.markMiss("0:k7", 0, clk.Now(), true)
	got := ms.missed["0:k7"].at
	ms.mu.Unlock()
	if !got.Equal(clk.Now()) {
		t.Fatalf("the overwritten mark is from %v, want %v", got, clk.Now())
	}
}
