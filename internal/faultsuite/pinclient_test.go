package faultsuite

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// pinClient keeps taking dedicated upstream connections, with MULTI,
// SUBSCRIBE (mostly RESP3) and BLPOP, and holds them a while, so that
// upstream.max_pinned is reached over and over. When the proxy refuses, the
// client checks that its connection still answers its own commands, in
// order, and that nothing meant for a transaction ran outside one.
type pinClient struct {
	s   *suite
	id  int64
	key string // only this client writes it
	val strModel
	n   int
}

func (s *suite) newPinClient() *pinClient {
	w := &pinClient{s: s, id: s.newID()}
	w.key = fmt.Sprintf("fs:h:%d:k", w.id)
	initial := fmt.Sprintf("c%d:init", w.id)
	w.val = newStrModel(initial)
	ctx, cancel := redisCtx()
	defer cancel()
	if err := s.direct.Set(ctx, w.key, initial, 0).Err(); err != nil {
		s.t.Fatalf("setup: %v", err)
	}
	return w
}

func (w *pinClient) hold(ctx context.Context) {
	pause(ctx, 300*time.Millisecond+rand.N(1200*time.Millisecond))
}

func (w *pinClient) run(ctx context.Context) {
	for ctx.Err() == nil {
		resp3 := rand.IntN(4) != 0
		c := w.s.connect(ctx, w.id, resp3)
		if c == nil {
			return
		}
		switch rand.IntN(3) {
		case 0:
			w.multi(ctx, c)
		case 1:
			w.subscribe(ctx, c)
		default:
			w.blpop(c)
		}
		c.close()
		if !pause(ctx, rand.N(200*time.Millisecond)) {
			return
		}
	}
}

func (w *pinClient) multi(ctx context.Context, c *client) {
	s := w.s
	multi, live := s.roundTrip(c, w.id, "MULTI", "MULTI")
	if !live {
		return
	}
	inMulti := multi.kind == '+' && multi.str == "OK"
	switch {
	case inMulti:
		w.hold(ctx)
	case multi.isErr():
		s.noteError(multi)
		if isPinRefusal(multi) {
			s.pinRefused.Add(1)
		}
	default:
		s.wrongReply(w.id, multi, "MULTI: want +OK or an error")
		return
	}
	w.n++
	val := fmt.Sprintf("c%d:h%d", w.id, w.n)
	sent := time.Now()
	if err := c.send([]string{"SET", w.key, val}, []string{"EXEC"}); err != nil {
		s.connFailed(w.id, err, "sending SET and EXEC")
		w.val.maybe(val, sent, time.Now())
		return
	}
	set, exec, err := c.readTwo()
	if err != nil {
		s.connFailed(w.id, err, "reading SET's or EXEC's reply")
		w.val.maybe(val, sent, time.Now())
		s.maybes.Add(1)
		return
	}
	s.ops.Add(2)
	now := time.Now()
	if !inMulti {
		switch {
		case set.isErr():
			s.noteError(set)
			w.val.maybe(val, sent, now)
		case set.kind == '+' && set.str == "OK":
			s.wrongReply(w.id, set, "SET %s %s after MULTI was refused with %s: it ran outside any transaction; want an error", w.key, val, multi)
			w.val.acked(val, sent, now)
			return
		default:
			s.wrongReply(w.id, set, "SET %s %s after a refused MULTI: want an error", w.key, val)
			w.val.maybe(val, sent, now)
			return
		}
		if !exec.isErr() {
			s.wrongReply(w.id, exec, "EXEC after MULTI was refused with %s: want an error", multi)
		}
		return
	}
	switch {
	case set.isErr():
		s.noteError(set)
		if isPinRefusal(set) {
			// A MULTI that got no connection answers +OK; its commands
			// carry the refusal.
			s.pinRefused.Add(1)
		}
	case set.kind != '+' || set.str != "QUEUED":
		s.wrongReply(w.id, set, "SET %s %s inside MULTI: want +QUEUED", w.key, val)
		w.val.maybe(val, sent, now)
		return
	}
	switch {
	case exec.isErr() && strings.HasPrefix(exec.str, "EXECABORT"):
		// Discarded, by Redis or by the proxy before anything reached
		// Redis: the SET must never show.
		s.noteError(exec)
	case exec.isErr():
		s.noteError(exec)
		w.val.maybe(val, sent, now)
		s.maybes.Add(1)
	case exec.isArray() && len(exec.elems) == 1 && exec.elems[0].kind == '+' && exec.elems[0].str == "OK":
		w.val.acked(val, sent, now)
		s.execApplied.Add(1)
	default:
		// No WATCH, so EXEC cannot abort.
		s.wrongReply(w.id, exec, "EXEC of SET %s %s: want [+OK]", w.key, val)
		w.val.maybe(val, sent, now)
	}
}

func (w *pinClient) subscribe(ctx context.Context, c *client) {
	s := w.s
	channel := fmt.Sprintf("fs:hch:%d", w.id)
	v, live := s.roundTrip(c, w.id, "SUBSCRIBE", "SUBSCRIBE", channel)
	if !live {
		return
	}
	switch {
	case v.isErr():
		s.noteError(v)
		if isPinRefusal(v) {
			s.pinRefused.Add(1)
		}
		if isUnavailable(v) {
			checkClosedAfterRefusal(s, c, w.id, "SUBSCRIBE "+channel)
			return
		}
		w.checkPlain(c, "SUBSCRIBE "+channel)
		return
	case !isSubscribeConfirm(v, channel):
		s.wrongReply(w.id, v, "SUBSCRIBE %s: want its confirmation", channel)
		return
	}
	w.hold(ctx)
	w.n++
	tag := fmt.Sprintf("c%d:p%d", w.id, w.n)
	if v, live = s.roundTrip(c, w.id, "PING while subscribed", "PING", tag); !live {
		return
	}
	ok := v.isBulk(tag) // RESP3
	if !c.resp3 {
		ok = v.kind == '*' && len(v.elems) == 2 && v.elems[0].str == "pong" && v.elems[1].str == tag
	}
	if !ok && !v.isErr() {
		s.wrongReply(w.id, v, "PING %s while subscribed to %s", tag, channel)
	}
}

func (w *pinClient) blpop(c *client) {
	s := w.s
	key := fmt.Sprintf("fs:h:%d:never", w.id) // nothing is ever pushed here
	v, live := s.roundTrip(c, w.id, "BLPOP", "BLPOP", key, "1")
	if !live {
		return
	}
	switch {
	case v.isErr():
		s.noteError(v)
		if isPinRefusal(v) {
			s.pinRefused.Add(1)
		}
	case !v.isNull():
		s.wrongReply(w.id, v, "BLPOP %s 1 on a key nobody pushes to: want nil", key)
		return
	}
	w.checkPlain(c, "BLPOP "+key)
}

// checkPlain checks that the connection answers ECHO and a GET of the
// client's own key exactly, in order.
func (w *pinClient) checkPlain(c *client, after string) {
	s := w.s
	w.n++
	tag := fmt.Sprintf("c%d:e%d", w.id, w.n)
	if err := c.send([]string{"ECHO", tag}, []string{"GET", w.key}); err != nil {
		s.connFailed(w.id, err, "sending ECHO and GET")
		return
	}
	echo, get, err := c.readTwo()
	if err != nil {
		s.connFailed(w.id, err, "reading ECHO's or GET's reply")
		return
	}
	s.ops.Add(2)
	if !echo.isBulk(tag) && !echo.isErr() {
		s.wrongReply(w.id, echo, "ECHO %s after %s", tag, after)
		return
	}
	if get.isErr() {
		s.noteError(get)
		return
	}
	want := w.val.String()
	if get.kind != '$' && !get.isNull() || !w.val.observe(get.str, get.isNull(), time.Now()) {
		s.wrongReply(w.id, get, "GET %s after %s: want %s", w.key, after, want)
	}
}

func (w *pinClient) finalCheck() {
	s := w.s
	ctx, cancel := redisCtx()
	defer cancel()
	got, err := s.direct.Get(ctx, w.key).Result()
	isNil := errors.Is(err, redis.Nil)
	if err != nil && !isNil {
		s.t.Errorf("final check: GET %s from redis: %v", w.key, err)
		return
	}
	want := w.val.String()
	if !w.val.observe(got, isNil, time.Now()) {
		s.fail(&s.lost, "lost_writes", "client c%d: redis holds %s=%q at the end; the client was told %s", w.id, w.key, got, want)
	}
}
