package faultsuite

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// channelBook is one subscriber's channel as the publisher sees it.
type channelBook struct {
	name  string
	owner int64

	mu    sync.Mutex
	next  int64          // next sequence number to publish
	maybe map[int64]bool // PUBLISHes whose outcome is unknown
}

// publisher sends numbered messages to every subscriber's channel, through
// the proxy, over one connection, so each channel's messages are ordered.
type publisher struct {
	mu    sync.Mutex
	chans []*channelBook
}

func newPublisher() *publisher { return &publisher{} }

func (p *publisher) add(name string, owner int64) *channelBook {
	b := &channelBook{name: name, owner: owner, maybe: make(map[int64]bool)}
	p.mu.Lock()
	p.chans = append(p.chans, b)
	p.mu.Unlock()
	return b
}

func (p *publisher) runner(s *suite) func(context.Context) {
	id := s.newID()
	return func(ctx context.Context) {
		var c *client
		defer func() {
			if c != nil {
				c.close()
			}
		}()
		for ctx.Err() == nil {
			if c == nil {
				if c = s.connect(ctx, id, false); c == nil {
					return
				}
			}
			p.mu.Lock()
			chans := append([]*channelBook(nil), p.chans...)
			p.mu.Unlock()
			seqs := make([]int64, len(chans))
			cmds := make([][]string, len(chans))
			for i, b := range chans {
				b.mu.Lock()
				seqs[i] = b.next
				b.next++
				b.mu.Unlock()
				cmds[i] = []string{"PUBLISH", b.name, fmt.Sprintf("c%d:m%d", b.owner, seqs[i])}
			}
			unknown := func(from, to int) {
				for i := from; i < to; i++ {
					chans[i].mu.Lock()
					chans[i].maybe[seqs[i]] = true
					chans[i].mu.Unlock()
				}
			}
			if err := c.send(cmds...); err != nil {
				s.connFailed(id, err, "sending PUBLISH")
				unknown(0, len(chans))
				c.close()
				c = nil
				continue
			}
			for i := range chans {
				v, err := c.read()
				if err != nil {
					s.connFailed(id, err, "reading PUBLISH's reply")
					unknown(i, len(chans))
					c.close()
					c = nil
					break
				}
				s.ops.Add(1)
				if v.isErr() {
					s.noteError(v)
					unknown(i, i+1)
					continue
				}
				if v.kind != ':' {
					s.wrongReply(id, v, "PUBLISH %s: want an integer", chans[i].name)
					unknown(i, len(chans))
					c.close()
					c = nil
					break
				}
				s.published.Add(1)
			}
			if !pause(ctx, 5*time.Millisecond) {
				return
			}
		}
	}
}

// subscriber subscribes to its own channel and checks that it gets only
// that channel's messages, each once, in order; it probes the connection
// with PING (and, in RESP3, GET) so a stalled relay shows as a hang.
type subscriber struct {
	s     *suite
	id    int64
	resp3 bool
	book  *channelBook
	key   string // a key only this subscriber reads, holding keyVal
	recv  []received
	probe int
}

type received struct {
	epoch int // which connection
	seq   int64
}

func (s *suite) newSubscriber(resp3 bool) *subscriber {
	w := &subscriber{s: s, id: s.newID(), resp3: resp3}
	w.book = s.pub.add(fmt.Sprintf("fs:ch:%d", w.id), w.id)
	w.key = fmt.Sprintf("fs:sub:%d", w.id)
	ctx, cancel := redisCtx()
	defer cancel()
	if err := s.direct.Set(ctx, w.key, w.keyVal(), 0).Err(); err != nil {
		s.t.Fatalf("setup: %v", err)
	}
	return w
}

func (w *subscriber) keyVal() string { return fmt.Sprintf("c%d:sub", w.id) }

func (w *subscriber) run(ctx context.Context) {
	for epoch := 1; ctx.Err() == nil; epoch++ {
		c := w.s.connect(ctx, w.id, w.resp3)
		if c == nil {
			return
		}
		w.session(ctx, c, epoch)
		c.close()
		if !pause(ctx, 20*time.Millisecond) {
			return
		}
	}
}

// expectation is a probe whose reply is due.
type expectation struct {
	want string
	what string
	sent time.Time
}

func (w *subscriber) session(ctx context.Context, c *client, epoch int) {
	s := w.s
	v, live := s.roundTrip(c, w.id, "SUBSCRIBE", "SUBSCRIBE", w.book.name)
	if !live {
		return
	}
	if v.isErr() {
		s.noteError(v)
		if isPinRefusal(v) {
			s.pinRefused.Add(1)
		}
		if isUnavailable(v) {
			// Redis down: the refusal closes the connection, so that the
			// client reconnects and subscribes again.
			checkClosedAfterRefusal(s, c, w.id, "SUBSCRIBE "+w.book.name)
			return
		}
		// Any other refused SUBSCRIBE must leave an ordinary connection
		// behind.
		checkPlainAfterRefusal(s, c, w.id, w.key, w.keyVal(), "SUBSCRIBE "+w.book.name)
		return
	}
	if !isSubscribeConfirm(v, w.book.name) {
		s.wrongReply(w.id, v, "SUBSCRIBE %s: want its confirmation", w.book.name)
		return
	}

	frames := make(chan value, 64)
	readErr := make(chan error, 1)
	stop := make(chan struct{})
	defer close(stop) // the caller closes c, which ends the read
	go func() {
		for {
			v, err := c.readNoDeadline()
			if err != nil {
				readErr <- err
				return
			}
			select {
			case frames <- v:
			case <-stop:
				return
			}
		}
	}()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var due []expectation
	for {
		select {
		case <-ctx.Done():
			return
		case err := <-readErr:
			if ctx.Err() == nil {
				s.connFailed(w.id, err, "subscribed")
			}
			return
		case <-tick.C:
			if len(due) > 0 && time.Since(due[0].sent) > hangTimeout {
				s.fail(&s.hangs, "hangs", "subscriber c%d: no reply to %s within %v", w.id, due[0].what, hangTimeout)
				return
			}
			if len(due) > 4 {
				continue
			}
			w.probe++
			tag := fmt.Sprintf("c%d:p%d", w.id, w.probe)
			cmd := []string{"PING", tag}
			e := expectation{want: tag, what: "PING " + tag, sent: time.Now()}
			if w.resp3 && w.probe%2 == 0 {
				cmd = []string{"GET", w.key}
				e = expectation{want: w.keyVal(), what: "GET " + w.key, sent: e.sent}
			}
			if err := c.send(cmd); err != nil {
				s.connFailed(w.id, err, "sending a probe")
				return
			}
			due = append(due, e)
		case v := <-frames:
			s.ops.Add(1)
			if seq, ok := w.message(v); ok {
				w.recv = append(w.recv, received{epoch: epoch, seq: seq})
				s.messages.Add(1)
				continue
			}
			if len(due) == 0 {
				s.wrongReply(w.id, v, "subscribed to %s with no reply due: want a message", w.book.name)
				return
			}
			e := due[0]
			due = due[1:]
			if v.isErr() {
				s.noteError(v)
				continue
			}
			if !w.probeReply(v, e.want) {
				s.wrongReply(w.id, v, "subscribed to %s, %s: want %q", w.book.name, e.what, e.want)
				return
			}
		}
	}
}

// message reports whether v is a pub/sub message; one for another channel
// or with an unexpected payload is counted as wrong and reported as handled.
func (w *subscriber) message(v value) (int64, bool) {
	if (v.kind != '*' && v.kind != '>') || len(v.elems) != 3 || v.elems[0].str != "message" {
		return 0, false
	}
	ch, payload := v.elems[1].str, v.elems[2].str
	prefix := fmt.Sprintf("c%d:m", w.id)
	seqText, ok := strings.CutPrefix(payload, prefix)
	seq, err := strconv.ParseInt(seqText, 10, 64)
	if ch != w.book.name || !ok || err != nil {
		w.s.wrongReply(w.id, v, "subscribed to %s: a message for another channel or client", w.book.name)
		return -1, true
	}
	return seq, true
}

// probeReply: in RESP2 a subscribed PING answers ["pong", tag]; in RESP3
// PING and GET answer as usual.
func (w *subscriber) probeReply(v value, want string) bool {
	if w.resp3 {
		return v.isBulk(want)
	}
	return v.kind == '*' && len(v.elems) == 2 && v.elems[0].str == "pong" && v.elems[1].str == want
}

func isSubscribeConfirm(v value, channel string) bool {
	return (v.kind == '*' || v.kind == '>') && len(v.elems) == 3 && v.elems[0].str == "subscribe" && v.elems[1].str == channel && v.elems[2].kind == ':'
}

// checkPlainAfterRefusal checks, after the proxy refused a command that
// needs a dedicated connection, that the client's connection still answers
// its own commands in order: ECHO (answered by the proxy) and a GET of a
// key only this client uses (answered by Redis).
func checkPlainAfterRefusal(s *suite, c *client, id int64, key, val, refused string) {
	tag := fmt.Sprintf("c%d:r%d", id, time.Now().UnixNano())
	if err := c.send([]string{"ECHO", tag}, []string{"GET", key}); err != nil {
		s.connFailed(id, err, "sending ECHO and GET after a refusal")
		return
	}
	for i, want := range []string{tag, val} {
		v, err := c.read()
		if err != nil {
			s.connFailed(id, err, "reading ECHO or GET after a refusal")
			return
		}
		s.ops.Add(1)
		if v.isErr() {
			s.noteError(v)
			continue
		}
		if !v.isBulk(want) {
			s.wrongReply(id, v, "%s was refused, then reply %d of [ECHO %s, GET %s]: want %q", refused, i+1, tag, key, want)
			return
		}
	}
}

// isUnavailable reports whether v refuses a command because the upstream
// could not be reached.
func isUnavailable(v value) bool {
	return v.isErr() && strings.Contains(v.str, "redproxy: upstream unavailable")
}

// checkClosedAfterRefusal checks that a relay refused because Redis is
// down closed the client's connection after the refusal: a reply after
// it is wrong, and so is a connection left open.
func checkClosedAfterRefusal(s *suite, c *client, id int64, refused string) {
	if err := c.send([]string{"ECHO", fmt.Sprintf("c%d:closed", id)}); err != nil {
		return // closed already
	}
	v, err := c.read()
	switch {
	case err == nil:
		s.wrongReply(id, v, "%s was refused for upstream unavailability, then a reply: want the connection closed", refused)
	case isTimeout(err):
		s.fail(&s.hangs, "hangs", "client c%d: %s was refused for upstream unavailability and the connection stayed open", id, refused)
	}
}

// checkSubscribers: every subscriber's messages are for it, none twice,
// and those the publisher saw acknowledged arrive in publishing order on
// each connection. Gaps are allowed: pub/sub delivers at most once, and a
// subscriber is gone while it reconnects.
func (s *suite) checkSubscribers(subs []*subscriber) {
	for _, w := range subs {
		b := w.book
		b.mu.Lock()
		seen := make(map[int64]bool)
		last := map[int]int64{}
		for _, r := range w.recv {
			if r.seq < 0 {
				continue // counted when received
			}
			if seen[r.seq] {
				s.fail(&s.wrong, "wrong_reply", "subscriber c%d: message m%d delivered twice", w.id, r.seq)
			}
			seen[r.seq] = true
			if r.seq >= b.next {
				s.fail(&s.wrong, "wrong_reply", "subscriber c%d: message m%d was never published", w.id, r.seq)
				continue
			}
			if b.maybe[r.seq] {
				continue // its PUBLISH may have run late, out of order
			}
			if l, ok := last[r.epoch]; ok && r.seq <= l {
				s.fail(&s.wrong, "wrong_reply", "subscriber c%d: message m%d after m%d on one connection", w.id, r.seq, l)
			}
			last[r.epoch] = r.seq
		}
		b.mu.Unlock()
	}
}
