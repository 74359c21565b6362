package guard

import (
	"sync"
	"time"
)

// limiter is a token bucket for log lines: a burst of lines at once, then
// rate lines per second. A misbehaving client can cause a violation per
// command, and the log must not become the bottleneck or drown everything
// else; the metrics and the report still count every violation.
type limiter struct {
	mu         sync.Mutex
	rate       float64 // tokens per second
	burst      float64
	tokens     float64
	last       time.Time
	suppressed int64 // lines dropped since the last allowed one
}

func newLimiter(rate float64, burst int) *limiter {
	return &limiter{rate: rate, burst: float64(burst), tokens: float64(burst)}
}

// allow reports whether a line may be written at now and, if so, how many
// lines were dropped since the last one, so the line can say so.
func (l *limiter) allow(now time.Time) (ok bool, suppressed int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.last.IsZero() {
		if dt := now.Sub(l.last).Seconds(); dt > 0 {
			l.tokens = min(l.burst, l.tokens+dt*l.rate)
		}
	}
	if now.After(l.last) {
		l.last = now
	}
	if l.tokens < 1 {
		l.suppressed++
		return false, 0
	}
	l.tokens--
	suppressed, l.suppressed = l.suppressed, 0
	return true, suppressed
}
