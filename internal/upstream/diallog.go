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
// it to one line per address per logEvery, with the count of those left
// out, and one line when a dial to the address succeeds again.
//
// lossLogs does the same for established connections lost: a Redis
// restart ends every pipe's connection at once, one line each (65 for a
// proxy whose clients used 8 databases over both protocols, found by
// review). The lines left out go to the debug level.
var (
	dialLogs = addrLog{byAddr: map[string]*addrLogState{}}
	lossLogs = addrLog{byAddr: map[string]*addrLogState{}}
)

const logEvery = 10 * time.Second

// addrLog limits a warning to one line per address per logEvery.
type addrLog struct {
	mu     sync.Mutex
	byAddr map[string]*addrLogState
}

type addrLogState struct {
	since      time.Time // first event of this run of them
	last       time.Time // last line logged
	suppressed int       // events not logged since last
}

// allow reports whether an event for addr is logged now, and if so how
// many were left out since the last line and since when they run.
func (d *addrLog) allow(addr string) (ok bool, suppressed int, since time.Time) {
	now := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	st := d.byAddr[addr]
	switch {
	case st == nil:
		st = &addrLogState{since: now}
		d.byAddr[addr] = st
	case now.Sub(st.last) < logEvery:
		st.suppressed++
		return false, 0, st.since
	}
	suppressed = st.suppressed
	st.last, st.suppressed = now, 0
	return true, suppressed, st.since
}

// failed logs a failed dial to addr, unless one was logged less than
// logEvery ago. The pipe does not call it for a dial that failed but had
// begun before another to the address succeeded (dialGate.failed).
func (d *addrLog) failed(log *slog.Logger, addr string, db int, err error, retry time.Duration) {
	ok, suppressed, since := d.allow(addr)
	if !ok {
		return
	}
	// retry_within: the backoff; a client's command makes the next try
	// sooner (Pipe.wanted), so "retry_in" said 2s of redials 50 ms apart
	// (found by a probe).
	log.Warn("upstream dial failed", "addr", addr, "db", db, "err", err, "retry_within", retry,
		"down_for", time.Since(since).Round(time.Millisecond), "failures_not_logged", suppressed)
}

// lost logs a connection to addr lost, unless one was logged less than
// logEvery ago (then at the debug level).
func (d *addrLog) lost(log *slog.Logger, addr string, db int, resp3 bool, err error, failedCalls int) {
	ok, suppressed, _ := d.allow(addr)
	if !ok {
		log.Debug("upstream connection lost", "addr", addr, "db", db, "resp3", resp3, "err", err, "failed_calls", failedCalls)
		return
	}
	log.Warn("upstream connection lost", "addr", addr, "db", db, "resp3", resp3, "err", err, "failed_calls", failedCalls,
		"losses_not_logged", suppressed)
}

// take removes addr's state and returns it (nil: none).
func (d *addrLog) take(addr string) *addrLogState {
	d.mu.Lock()
	defer d.mu.Unlock()
	st := d.byAddr[addr]
	delete(d.byAddr, addr)
	return st
}

// restored logs, once per outage, that a dial to addr succeeded again,
// with the failed dials and (losses, if given) lost connections the outage
// did not log, dropped with its state before (a 3 s outage said
// failures_not_logged 0 where there were dozens, found by a probe), and
// reports whether an outage ended. Then the next loss is another
// outage's, logged (found by review: a second restart within 10 s logged
// no loss, TestConnectionLossLoggedForEachOutage).
func (d *addrLog) restored(log *slog.Logger, addr string, losses *addrLog) bool {
	dial := d.take(addr)
	if dial == nil {
		return false
	}
	args := []any{"addr", addr, "down_for", time.Since(dial.since).Round(time.Millisecond), "failures_not_logged", dial.suppressed}
	if losses != nil {
		if loss := losses.take(addr); loss != nil {
			args = append(args, "losses_not_logged", loss.suppressed)
		}
	}
	log.Info("upstream reachable again", args...)
	return true
}
