package faultsuite

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// txCounter is a counter every transactor increments with
// WATCH c; GET c; MULTI; SET c v+1; INCR shadow; EXEC. With WATCH honoured
// and EXEC atomic, c and its shadow both equal the number of EXECs that ran.
type txCounter struct {
	key, shadow string
	applied     atomic.Int64 // EXEC answered with an array
	maybe       atomic.Int64 // EXEC's outcome unknown
}

func (s *suite) setupTx() {
	ctx, cancel := redisCtx()
	defer cancel()
	for i := range s.tx {
		s.tx[i].key = fmt.Sprintf("fs:tx:%d", i)
		s.tx[i].shadow = fmt.Sprintf("fs:txs:%d", i)
		if err := s.direct.MSet(ctx, s.tx[i].key, 0, s.tx[i].shadow, 0).Err(); err != nil {
			s.t.Fatalf("setup: %v", err)
		}
	}
}

type transactor struct {
	s     *suite
	id    int64
	resp3 bool
	seen  [nTxCounters]int64 // highest value read or written per counter
}

func isPinRefusal(v value) bool { return v.isErr() && strings.Contains(v.str, "max_pinned") }

func (w *transactor) run(ctx context.Context) {
	var c *client
	drop := func() {
		c.close()
		c = nil
	}
	defer func() {
		if c != nil {
			c.close()
		}
	}()
	for ctx.Err() == nil {
		if c == nil {
			if c = w.s.connect(ctx, w.id, w.resp3); c == nil {
				return
			}
		}
		if !w.once(c) {
			drop()
		}
		// Pinned connections are scarce by design; do not spin on refusals.
		if !pause(ctx, time.Duration(1+rand.IntN(10))*time.Millisecond) {
			return
		}
	}
}

// once runs one transaction; false means the connection must be dropped.
func (w *transactor) once(c *client) bool {
	s := w.s
	i := rand.IntN(nTxCounters)
	tc := &s.tx[i]
	if err := c.send([]string{"WATCH", tc.key}, []string{"GET", tc.key}); err != nil {
		s.connFailed(w.id, err, "sending WATCH")
		return false
	}
	watch, err := c.read()
	if err != nil {
		s.connFailed(w.id, err, "reading WATCH's reply")
		return false
	}
	get, err := c.read()
	if err != nil {
		s.connFailed(w.id, err, "reading GET's reply under WATCH")
		return false
	}
	s.ops.Add(2)
	switch {
	case watch.isErr():
		s.noteError(watch)
		if isPinRefusal(watch) {
			s.pinRefused.Add(1)
		}
		return w.checkGet(i, get) != -1 // not watching; just check GET
	case watch.kind != '+' || watch.str != "OK":
		s.wrongReply(w.id, watch, "WATCH %s: want +OK", tc.key)
		return false
	}
	v := w.checkGet(i, get)
	if v < 0 {
		return false
	}
	// Leave a little room for a CLIENT KILL of the pinned connection to
	// land between WATCH and MULTI.
	time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
	next := strconv.FormatInt(v+1, 10)
	if err := c.send([]string{"MULTI"}, []string{"SET", tc.key, next}, []string{"INCR", tc.shadow}, []string{"EXEC"}); err != nil {
		s.connFailed(w.id, err, "sending MULTI")
		tc.maybe.Add(1)
		s.maybes.Add(1)
		return false
	}
	var replies [4]value
	for k := range replies {
		r, err := c.read()
		if err != nil {
			s.connFailed(w.id, err, fmt.Sprintf("reading reply %d of MULTI/SET/INCR/EXEC", k+1))
			tc.maybe.Add(1)
			s.maybes.Add(1)
			return false
		}
		replies[k] = r
		s.ops.Add(1)
		if r.isErr() {
			s.noteError(r)
			if isPinRefusal(r) {
				s.pinRefused.Add(1)
			}
		}
	}
	multi, set, incr, exec := replies[0], replies[1], replies[2], replies[3]
	inMulti := multi.kind == '+' && multi.str == "OK"
	if !inMulti && !multi.isErr() {
		s.wrongReply(w.id, multi, "MULTI: want +OK or an error")
		tc.maybe.Add(1)
		s.maybes.Add(1)
		return false
	}
	for _, q := range []struct {
		r    value
		what string
	}{{set, "SET " + tc.key + " " + next}, {incr, "INCR " + tc.shadow}} {
		switch {
		case q.r.isErr():
		case inMulti && q.r.kind == '+' && q.r.str == "QUEUED":
		case inMulti:
			s.wrongReply(w.id, q.r, "%s inside MULTI: want +QUEUED", q.what)
			tc.maybe.Add(1)
			s.maybes.Add(1)
			return false
		default:
			// MULTI failed, so the commands meant for the transaction must
			// fail too; running them alone is half a transaction.
			s.wrongReply(w.id, q.r, "%s after MULTI was refused with %s: it ran outside any transaction; want an error", q.what, multi)
			tc.maybe.Add(1)
			s.maybes.Add(1)
			return false
		}
	}
	switch {
	case exec.isErr():
		// Unless Redis itself discarded it, the transaction may have run:
		// even when every reply was an error, a timed-out MULTI ... EXEC
		// can still be read and run by Redis after a freeze.
		if !strings.HasPrefix(exec.str, "EXECABORT") {
			tc.maybe.Add(1)
			s.maybes.Add(1)
		}
		return true
	case !inMulti:
		s.wrongReply(w.id, exec, "EXEC after MULTI was refused with %s: want an error", multi)
		return false
	case exec.isNull():
		s.execAborted.Add(1)
		return true
	case exec.isArray() && len(exec.elems) == 2 && exec.elems[0].kind == '+' && exec.elems[0].str == "OK" && exec.elems[1].kind == ':':
		tc.applied.Add(1)
		s.execApplied.Add(1)
		w.seen[i] = max(w.seen[i], v+1)
		return true
	default:
		s.wrongReply(w.id, exec, "EXEC of SET %s %s, INCR %s: want [+OK :n] or nil", tc.key, next, tc.shadow)
		tc.maybe.Add(1)
		s.maybes.Add(1)
		return false
	}
}

// checkGet checks GET's reply for counter i: a number no lower than any
// this client saw before (the counter never goes down). It returns the
// value, or -1 when the reply was wrong or an error.
func (w *transactor) checkGet(i int, get value) int64 {
	s := w.s
	if get.isErr() {
		s.noteError(get)
		return -1
	}
	n, err := strconv.ParseInt(get.str, 10, 64)
	if get.kind != '$' || err != nil {
		s.wrongReply(w.id, get, "GET %s: want a number", s.tx[i].key)
		return -1
	}
	if n < w.seen[i] {
		s.wrongReply(w.id, get, "GET %s: stale, this client already saw %d", s.tx[i].key, w.seen[i])
		return -1
	}
	w.seen[i] = n
	return n
}

// finalTxCheck reads the counters straight from Redis.
func (s *suite) finalTxCheck() {
	ctx, cancel := redisCtx()
	defer cancel()
	for i := range s.tx {
		tc := &s.tx[i]
		vals, err := s.direct.MGet(ctx, tc.key, tc.shadow).Result()
		if err != nil {
			s.t.Errorf("final check: MGET %s %s from redis: %v", tc.key, tc.shadow, err)
			return
		}
		c, _ := strconv.ParseInt(fmt.Sprint(vals[0]), 10, 64)
		sh, _ := strconv.ParseInt(fmt.Sprint(vals[1]), 10, 64)
		applied, maybe := tc.applied.Load(), tc.maybe.Load()
		switch {
		case c < applied:
			s.fail(&s.lost, "lost_writes", "%s=%d in redis, but %d EXECs answered with an array (and %d maybe ran)", tc.key, c, applied, maybe)
		case c > applied+maybe:
			s.fail(&s.phantom, "phantom_writes", "%s=%d in redis, but only %d EXECs ran and %d maybe ran", tc.key, c, applied, maybe)
		}
		if c != sh {
			s.fail(&s.halfTx, "half_transactions", "%s=%d but %s=%d: some transaction ran in part (%d EXECs applied, %d unknown)", tc.key, c, tc.shadow, sh, applied, maybe)
		}
	}
}
