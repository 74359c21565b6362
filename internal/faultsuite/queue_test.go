package faultsuite

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"time"
)

const queueKey = "fs:q"

// queueBook accounts for every element pushed to queueKey: each must end up
// popped by a blocker or still in the list, exactly once.
type queueBook struct {
	mu     sync.Mutex
	acked  map[string]bool // RPUSH answered
	maybe  map[string]bool // RPUSH outcome unknown
	popped map[string]int  // times a blocker received the element
	// excused counts BLPOPs that ended without their reply (an error, a
	// lost connection): each may have popped one element nobody received,
	// as it would for a client talking to Redis directly.
	excused int
}

func (q *queueBook) init() {
	q.acked = make(map[string]bool)
	q.maybe = make(map[string]bool)
	q.popped = make(map[string]int)
}

// pusher RPUSHes numbered elements, a few per pipeline.
type pusher struct {
	s  *suite
	id int64
	n  int
}

func (w *pusher) run(ctx context.Context) {
	s, q := w.s, &w.s.queue
	var c *client
	defer func() {
		if c != nil {
			c.close()
		}
	}()
	for ctx.Err() == nil {
		if c == nil {
			if c = s.connect(ctx, w.id, rand.IntN(2) == 1); c == nil {
				return
			}
		}
		elems := make([]string, 1+rand.IntN(4))
		cmds := make([][]string, len(elems))
		for i := range elems {
			w.n++
			elems[i] = fmt.Sprintf("c%d:x%d", w.id, w.n)
			cmds[i] = []string{"RPUSH", queueKey, elems[i]}
		}
		unknown := func(es []string) {
			q.mu.Lock()
			for _, e := range es {
				q.maybe[e] = true
			}
			q.mu.Unlock()
		}
		if err := c.send(cmds...); err != nil {
			s.connFailed(w.id, err, "sending RPUSH")
			unknown(elems)
			c.close()
			c = nil
			continue
		}
		for i, e := range elems {
			v, err := c.read()
			if err != nil {
				s.connFailed(w.id, err, "reading RPUSH's reply")
				unknown(elems[i:])
				c.close()
				c = nil
				break
			}
			s.ops.Add(1)
			if v.isErr() {
				s.noteError(v)
				unknown(elems[i : i+1])
				continue
			}
			if v.kind != ':' || v.num < 1 {
				s.wrongReply(w.id, v, "RPUSH %s %s: want the list's length", queueKey, e)
				unknown(elems[i:])
				c.close()
				c = nil
				break
			}
			q.mu.Lock()
			q.acked[e] = true
			q.mu.Unlock()
			s.pushed.Add(1)
		}
		if !pause(ctx, 10*time.Millisecond) {
			return
		}
	}
}

// blocker pipelines ECHO tag and BLPOP queueKey 1, again and again.
type blocker struct {
	s     *suite
	id    int64
	resp3 bool
	n     int
}

func (w *blocker) run(ctx context.Context) {
	s, q := w.s, &w.s.queue
	var c *client
	defer func() {
		if c != nil {
			c.close()
		}
	}()
	excuse := func() {
		q.mu.Lock()
		q.excused++
		q.mu.Unlock()
	}
	for ctx.Err() == nil {
		if c == nil {
			if c = s.connect(ctx, w.id, w.resp3); c == nil {
				return
			}
		}
		w.n++
		tag := fmt.Sprintf("c%d:b%d", w.id, w.n)
		if err := c.send([]string{"ECHO", tag}, []string{"BLPOP", queueKey, "1"}); err != nil {
			s.connFailed(w.id, err, "sending ECHO and BLPOP")
			excuse()
			c.close()
			c = nil
			continue
		}
		echo, err := c.read()
		if err == nil {
			s.ops.Add(1)
			if !echo.isBulk(tag) && !echo.isErr() {
				s.wrongReply(w.id, echo, "ECHO %s before BLPOP: want %q", tag, tag)
				excuse()
				c.close()
				c = nil
				continue
			}
		}
		var pop value
		if err == nil {
			pop, err = c.read()
		}
		if err != nil {
			s.connFailed(w.id, err, "waiting in BLPOP")
			excuse()
			c.close()
			c = nil
			continue
		}
		s.ops.Add(1)
		switch {
		case pop.isErr():
			s.noteError(pop)
			if isPinRefusal(pop) {
				s.pinRefused.Add(1)
			} else {
				excuse()
			}
			// Do not spin while Redis is away or connections are scarce.
			if !pause(ctx, 20*time.Millisecond) {
				return
			}
		case pop.isNull():
		case pop.isArray() && len(pop.elems) == 2 && pop.elems[0].str == queueKey && pop.elems[1].kind == '$':
			q.mu.Lock()
			q.popped[pop.elems[1].str]++
			q.mu.Unlock()
			s.popped.Add(1)
		default:
			s.wrongReply(w.id, pop, "BLPOP %s 1: want [%s element] or nil", queueKey, queueKey)
			excuse()
			c.close()
			c = nil
		}
	}
}

// finalQueueCheck reads what is left in the list straight from Redis.
func (s *suite) finalQueueCheck() {
	q := &s.queue
	ctx, cancel := redisCtx()
	defer cancel()
	left, err := s.direct.LRange(ctx, queueKey, 0, -1).Result()
	if err != nil {
		s.t.Errorf("final check: LRANGE %s from redis: %v", queueKey, err)
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	count := make(map[string]int, len(q.popped)+len(left))
	for e, n := range q.popped {
		count[e] += n
	}
	for _, e := range left {
		count[e]++
	}
	for e, n := range count {
		switch {
		case !q.acked[e] && !q.maybe[e]:
			s.fail(&s.phantom, "phantom_writes", "%s: element %q popped or left but never pushed", queueKey, e)
		case n > 1:
			s.fail(&s.wrong, "wrong_reply", "%s: element %q delivered %d times (popped %d, left %d)", queueKey, e, n, q.popped[e], n-q.popped[e])
		}
	}
	var missing []string
	for e := range q.acked {
		if count[e] == 0 {
			missing = append(missing, e)
		}
	}
	if len(missing) > q.excused {
		sort.Strings(missing)
		s.fail(&s.lost, "lost_writes", "%s: %d acknowledged elements neither popped nor left (only %d BLPOPs ended without their reply), e.g. %q",
			queueKey, len(missing), q.excused, missing[:min(5, len(missing))])
	}
}
