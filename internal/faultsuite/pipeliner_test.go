package faultsuite

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// counterBase: a pipeliner's counter starts at its id times counterBase, so
// an INCR reply names the client it belongs to.
const counterBase = 1_000_000

const pipelinerKeys = 4

type opKind uint8

const (
	opSet opKind = iota
	opGet
	opIncr
	opEcho
)

type pipeOp struct {
	kind opKind
	key  int // index into the pipeliner's keys
	val  string
}

// pipeliner sends pipelines of 1 to 32 SET/GET/INCR/ECHO on keys only it
// uses, so it knows every reply exactly.
type pipeliner struct {
	s      *suite
	id     int64
	resp3  bool
	keys   [pipelinerKeys]string
	vals   [pipelinerKeys]strModel
	ctrKey string
	ctr    counterModel
	seq    int
}

func (s *suite) newPipeliner(resp3 bool) *pipeliner {
	w := &pipeliner{s: s, id: s.newID(), resp3: resp3}
	for k := range w.keys {
		w.keys[k] = fmt.Sprintf("fs:p:%d:k%d", w.id, k)
		w.vals[k] = newStrModel("")
	}
	w.ctrKey = fmt.Sprintf("fs:p:%d:n", w.id)
	w.ctr.lo = w.id * counterBase
	ctx, cancel := redisCtx()
	defer cancel()
	if err := s.direct.Set(ctx, w.ctrKey, w.ctr.lo, 0).Err(); err != nil {
		s.t.Fatalf("setup: %v", err)
	}
	return w
}

func (w *pipeliner) batch() []pipeOp {
	ops := make([]pipeOp, 1+rand.IntN(32))
	for i := range ops {
		w.seq++
		op := pipeOp{key: rand.IntN(pipelinerKeys)}
		switch r := rand.IntN(100); {
		case r < 35:
			op.kind, op.val = opSet, fmt.Sprintf("c%d:s%d", w.id, w.seq)
		case r < 70:
			op.kind = opGet
		case r < 85:
			op.kind = opIncr
		default:
			op.kind, op.val = opEcho, fmt.Sprintf("c%d:e%d", w.id, w.seq)
		}
		ops[i] = op
	}
	return ops
}

func (w *pipeliner) command(op pipeOp) []string {
	switch op.kind {
	case opSet:
		return []string{"SET", w.keys[op.key], op.val}
	case opGet:
		return []string{"GET", w.keys[op.key]}
	case opIncr:
		return []string{"INCR", w.ctrKey}
	default:
		return []string{"ECHO", op.val}
	}
}

func (w *pipeliner) run(ctx context.Context) {
	var c *client
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
		ops := w.batch()
		cmds := make([][]string, len(ops))
		for i, op := range ops {
			cmds[i] = w.command(op)
		}
		sent := time.Now()
		if err := c.send(cmds...); err != nil {
			w.s.connFailed(w.id, err, "sending a pipeline")
			w.unknown(ops, sent)
			c.close()
			c = nil
			continue
		}
		erred := false
		for j, op := range ops {
			v, err := c.read()
			if err != nil {
				w.s.connFailed(w.id, err, fmt.Sprintf("reading reply %d of a pipeline of %d", j+1, len(ops)))
				w.unknown(ops[j:], sent)
				c.close()
				c = nil
				break
			}
			w.s.ops.Add(1)
			erred = erred || v.isErr()
			if !w.check(op, v, sent) {
				// The stream can no longer be trusted; start afresh.
				w.unknown(ops[j+1:], sent)
				c.close()
				c = nil
				break
			}
		}
		// While Redis is away, do not spin on instant errors.
		if erred && !pause(ctx, 20*time.Millisecond) {
			return
		}
	}
}

// unknown records writes whose outcome the client never learned.
func (w *pipeliner) unknown(ops []pipeOp, sent time.Time) {
	now := time.Now()
	for _, op := range ops {
		switch op.kind {
		case opSet:
			w.vals[op.key].maybe(op.val, sent, now)
			w.s.maybes.Add(1)
		case opIncr:
			w.ctr.maybe++
			w.s.maybes.Add(1)
		}
	}
}

// check compares one reply with the model; false means it was wrong.
func (w *pipeliner) check(op pipeOp, v value, sent time.Time) bool {
	s := w.s
	now := time.Now()
	if v.isErr() {
		s.noteError(v)
		if other, ok := s.otherID(w.id, v); ok {
			s.fail(&s.crossTalk, "cross_talk", "client c%d: %s answered with an error naming client c%d: %s", w.id, w.describe(op), other, v)
			w.unknown([]pipeOp{op}, sent)
			return false
		}
		w.unknown([]pipeOp{op}, sent)
		return true
	}
	switch op.kind {
	case opSet:
		if v.kind == '+' && v.str == "OK" {
			w.vals[op.key].acked(op.val, sent, now)
			return true
		}
		s.wrongReply(w.id, v, "%s: want +OK", w.describe(op))
		w.unknown([]pipeOp{op}, sent)
		return false
	case opGet:
		m := &w.vals[op.key]
		want := m.String()
		if (v.isNull() || v.kind == '$') && m.observe(v.str, v.isNull(), now) {
			return true
		}
		s.wrongReply(w.id, v, "%s: want %s", w.describe(op), want)
		return false
	case opIncr:
		want := fmt.Sprintf("%d..%d", w.ctr.lo+1, w.ctr.lo+1+w.ctr.maybe)
		if v.kind == ':' && w.ctr.next(v.num) {
			return true
		}
		s.wrongReply(w.id, v, "%s: want :%s", w.describe(op), want)
		w.unknown([]pipeOp{op}, sent)
		return false
	default:
		if v.isBulk(op.val) {
			return true
		}
		s.wrongReply(w.id, v, "%s: want %q", w.describe(op), op.val)
		return false
	}
}

func (w *pipeliner) describe(op pipeOp) string {
	return strings.Join(w.command(op), " ")
}

// finalCheck reads the client's keys straight from Redis.
func (w *pipeliner) finalCheck() {
	s := w.s
	ctx, cancel := redisCtx()
	defer cancel()
	now := time.Now()
	for k, key := range w.keys {
		got, err := s.direct.Get(ctx, key).Result()
		isNil := errors.Is(err, redis.Nil)
		if err != nil && !isNil {
			s.t.Errorf("final check: GET %s from redis: %v", key, err)
			return
		}
		want := w.vals[k].String()
		if !w.vals[k].observe(got, isNil, now) {
			s.fail(&s.lost, "lost_writes", "client c%d: redis holds %s=%q at the end; the client was told %s", w.id, key, got, want)
		}
	}
	got, err := s.direct.Get(ctx, w.ctrKey).Result()
	if err != nil {
		s.t.Errorf("final check: GET %s from redis: %v", w.ctrKey, err)
		return
	}
	n, err := strconv.ParseInt(got, 10, 64)
	switch {
	case err != nil:
		s.fail(&s.phantom, "phantom_writes", "client c%d: redis holds %s=%q, not a number", w.id, w.ctrKey, got)
	case n < w.ctr.lo:
		s.fail(&s.lost, "lost_writes", "client c%d: redis holds %s=%d at the end; INCR had answered %s", w.id, w.ctrKey, n, &w.ctr)
	case !w.ctr.holds(n):
		s.fail(&s.phantom, "phantom_writes", "client c%d: redis holds %s=%d at the end; the client's INCRs allow %s", w.id, w.ctrKey, n, &w.ctr)
	}
}

// connect dials the proxy until it answers or ctx ends.
func (s *suite) connect(ctx context.Context, id int64, resp3 bool) *client {
	for ctx.Err() == nil {
		c, err := dial(s.proxy, resp3)
		if err == nil {
			return c
		}
		s.connFailed(id, err, "connecting")
		if !pause(ctx, 50*time.Millisecond) {
			return nil
		}
	}
	return nil
}
