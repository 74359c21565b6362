package upstream

import (
	"log/slog"
	"sync"
	"time"
)

// An unreachable Redis fails the dial of every pipe to it: each pool's
// connections, both protocols, every database, each with its own backoff.
// Logged per pipe, a four-second outage wrote about sixty identical lines
// (found by a user's trial) and nothing said when it ended. dialLogs keeps
// it to one line per address per dialLogEvery, with the count of those
// left out, and one line when a dial to the address succeeds again.
var dialLogs = dialLog{byAddr: map[string]*dialLogState{}}

const dialLogEvery = 10 * time.Second

type dialLog struct {
	mu     sync.Mutex
	byAddr map[string]*dialLogState
}

type dialLogState struct {
	since      time.Time // first failure of this outage
	last       time.Time // last line logged
	suppressed int       // failures not logged since last
}

// failed logs a failed dial to addr, unless one was logged less than
// dialLogEvery ago.
func (d *dialLog) failed(log *slog.Logger, addr string, db int, err error, retry time.Duration) {
	now := time.Now()
	d.mu.Lock()
	st := d.byAddr[addr]
	if st == nil {
		st = &dialLogState{since: now}
		d.byAddr[addr] = st
	} else if now.Sub(st.last) < dialLogEvery {
		st.suppressed++
		d.mu.Unlock()
		return
	}
	suppressed := st.suppressed
	st.last, st.suppressed = now, 0
	since := st.since
	d.mu.Unlock()
	log.Warn("upstream dial failed", "addr", addr, "db", db, "err", err, "retry_in", retry,
		"down_for", now.Sub(since).Round(time.Millisecond), "failures_not_logged", suppressed)
}

// restored logs, once per outage, that a dial to addr succeeded again.
func (d *dialLog) restored(log *slog.Logger, addr string) {
	d.mu.Lock()
	st := d.byAddr[addr]
	delete(d.byAddr, addr)
	d.mu.Unlock()
	if st != nil {
		log.Info("upstream reachable again", "addr", addr, "down_for", time.Since(st.since).Round(time.Millisecond))
	}
}
