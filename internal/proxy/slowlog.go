package proxy

import (
	"math"
	"net/http"
	"time"

	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/resp"
	"github.com/redproxy/redproxy/internal/slowlog"
)

// slowState is the slow log's part of a Server. The session compares each
// batch's duration with threshold, so when the log is off threshold is the
// largest duration and the comparison never holds.
type slowState struct {
	log       *slowlog.Log
	threshold time.Duration
}

func initSlowlog(s *Server) error {
	c := s.cfg.Server
	s.slow = slowState{log: slowlog.New(c.SlowlogMaxLen, c.SlowlogThreshold.Duration), threshold: c.SlowlogThreshold.Duration}
	if c.SlowlogMaxLen == 0 {
		s.slow.threshold = math.MaxInt64
	}
	return nil
}

// SlowlogHandler serves /debug/slowlog for the admin server.
func (s *Server) SlowlogHandler() http.Handler { return s.slow.log.Handler() }

// Slowlog returns the slow log.
func (s *Server) Slowlog() *slowlog.Log { return s.slow.log }

// batchStart is who a batch's first command ran as.
type batchStart struct {
	user *auth.User
	db   int
}

// lockedBatchStart is the session's batchStart now, for another goroutine
// than the session's (a direct reply's).
func (sess *Session) lockedBatchStart() batchStart {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	return batchStart{sess.user, sess.db}
}

// noteSlow enters a batch that took took in the slow log. It runs only for
// slow batches, so it may allocate. The entry names the batch's first
// command, with the user and database it ran as, at: a batch's AUTH or
// SELECT must not lend the entry another user or database (found by
// review: AUTH alice, a slow EVAL, AUTH bob was logged as bob's EVAL).
func (sess *Session) noteSlow(reqs []resp.Request, start time.Time, took, upstreamWait time.Duration, at batchStart) {
	e := slowlog.Entry{
		Time:           start,
		TotalMicros:    took.Microseconds(),
		UpstreamMicros: min(upstreamWait, took).Microseconds(),
		Batch:          len(reqs),
		Client:         sess.nc.RemoteAddr().String(),
		User:           sess.srv.nameOf(at.user), // the proxy user, not the upstream credential's (found by review)
		Listener:       sess.listenerName(),
		DB:             at.db,
	}
	e.ProxyMicros = e.TotalMicros - e.UpstreamMicros
	name := "unknown"
	if cmd := sess.cmds.table.Lookup(reqs[0].Args); cmd != nil {
		name = cmd.Name
		var kb [2]int
		if keys := cmd.KeysAtMost(reqs[0].Args, kb[:0], 1); len(keys) > 0 {
			e.KeyPattern = slowlog.KeyPattern(reqs[0].Args[keys[0]])
		}
	}
	e.Command = name
	sess.srv.slow.log.Add(e)
	sess.srv.metrics.SlowCommands.WithLabelValues(name).Inc()
}
