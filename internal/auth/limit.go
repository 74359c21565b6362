package auth

import (
	"sync"
	"time"
)

// FailLimiter rate-limits failed AUTH attempts per client address: each
// address has a bucket of burst failures that refills at Rate per second.
// While the bucket is empty, the address's AUTH attempts are refused
// without looking at the password, so guessing is slow whatever the number
// of connections. Memory is capped: at MaxAddrs tracked addresses, full
// buckets are forgotten, and if none is full an arbitrary half goes.
//
// The burst is an argument of each call, not a field, so that a reload
// (server.auth_failure_limit) applies to the next AUTH without a lock
// around the configuration: a bucket filled under a larger burst is simply
// capped at the new one when it next refills.
type FailLimiter struct {
	Rate     float64 // tokens per second
	MaxAddrs int
	now      func() time.Time

	mu      sync.Mutex
	buckets map[string]*bucket
}

type bucket struct {
	tokens float64
	at     time.Time
}

// Default limits: ten wrong passwords in a row, then one a second.
const (
	DefaultFailBurst = 10
	DefaultFailRate  = 1
	defaultMaxAddrs  = 16384
)

// NewFailLimiter returns a limiter with the default limits.
func NewFailLimiter() *FailLimiter {
	return &FailLimiter{Rate: DefaultFailRate, MaxAddrs: defaultMaxAddrs, now: time.Now}
}

// SetClock replaces the clock, for tests.
func (l *FailLimiter) SetClock(now func() time.Time) { l.now = now }

func (l *FailLimiter) refill(b *bucket, now time.Time, burst float64) {
	if el := now.Sub(b.at).Seconds(); el > 0 {
		b.tokens = b.tokens + el*l.Rate
		b.at = now
	}
	b.tokens = min(burst, b.tokens)
}

// Allowed reports whether addr may try a password now, with burst failures
// allowed in a row.
func (l *FailLimiter) Allowed(addr string, burst int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buckets[addr]
	if b == nil {
		return true
	}
	l.refill(b, l.now(), float64(burst))
	return b.tokens >= 1
}

// Failed records a failed attempt from addr.
func (l *FailLimiter) Failed(addr string, burst int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if l.buckets == nil {
		l.buckets = make(map[string]*bucket)
	}
	b := l.buckets[addr]
	if b == nil {
		if len(l.buckets) >= l.MaxAddrs {
			l.shrink(now, float64(burst))
		}
		b = &bucket{tokens: float64(burst), at: now}
		l.buckets[addr] = b
	}
	l.refill(b, now, float64(burst))
	b.tokens = max(0, b.tokens-1)
}

// shrink makes room: full buckets carry no information; if there are none,
// an arbitrary half goes (an attacker spraying addresses gains at most one
// fresh burst per address, which it had anyway by using new addresses).
func (l *FailLimiter) shrink(now time.Time, burst float64) {
	for a, b := range l.buckets {
		l.refill(b, now, burst)
		if b.tokens >= burst {
			delete(l.buckets, a)
		}
	}
	if len(l.buckets) < l.MaxAddrs {
		return
	}
	n := 0
	for a := range l.buckets { // map order is random: an arbitrary half
		delete(l.buckets, a)
		if n++; n >= l.MaxAddrs/2 {
			break
		}
	}
}

// Tracked returns the number of addresses with a bucket, for tests.
func (l *FailLimiter) Tracked() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.buckets)
}
