package proxy

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/resp"
	"github.com/tidwall/redcon"
)

// A client that unsubscribes from everything leaves Redis's subscribed
// mode (RESP2: it may send any command again) and is a normal client:
// Jedis and redis-py hand such a connection back to their pools. Its relay (stateful.go) then hands
// the client back to the shared connections, so that its commands meet
// routes, cluster slots, the local tier and stampede protection again, and
// the dedicated connection is given back.
//
// Only Redis knows when the last subscription is gone (an UNSUBSCRIBE
// without arguments names channels the proxy never counted), and only
// once every reply before that point has reached the client may the
// client's next command go elsewhere. So when a client that has sent an
// unsubscribe (or that Redis Cluster unsubscribed from a sharded channel
// whose slot moved, or refused with MOVED or ASK: it will subscribe again,
// on the new owner; relayRedirect) sends
// anything more (the rest of the write the unsubscribe came in, cut there
// by segment, or its next batch), the relay holds it and asks Redis:
//
//	redproxy-exit-<token>   an unknown command, answered with an error
//	                        quoting its name in any state (busy,
//	                        subscribed), on every Redis version
//	PING <token>            RESP2: answered ["pong", token] on a subscribed
//	                        connection, the bulk string token on any other,
//	                        or an error (-BUSY while a script runs)
//	CLIENT INFO             RESP3, where PING's answer does not tell: the
//	                        connection's flags, P while subscribed
//
// The relay's reader frames the stream, takes both answers out of it (the
// first error naming the token, then the first reply after it that is not
// a pub/sub message or push), and the relay leaves only when the second
// says the connection is not subscribed and nothing came after it: every
// reply and message the client was owed has then been passed on.
// Otherwise what it held is relayed as before, and the relay asks again
// after the next unsubscribe (or, after an error, before the next batch).
// The first batch, the one that started the relay, is relayed whole.
//
// A relay leaves only if the dedicated connection carries no state the
// session does not: a command that may change the connection's state
// (SELECT, MULTI, WATCH, CLIENT SETNAME, HELLO, AUTH, RESET, READONLY, an
// unknown command; see relayKeepsState) keeps the client on its relay for
// good, as before.

// relayExit is one pub/sub relay's way out.
type relayExit struct {
	// Session goroutine only.
	asked bool // an unsubscribe was relayed since the last check
	// never: the relay stays, because the connection may hold state the
	// session does not, or Redis will not answer the question (an error
	// other than -BUSY or -LOADING), or a question was abandoned (the
	// relay is ending).
	never bool

	// off tells the reader that the relay will not leave (never, set with
	// it by stayForGood): it stops framing once no question is open.
	off atomic.Bool
	// state is exitIdle, or exitAsked while the session waits for the
	// answers, or exitAbandoned when it gave up waiting (the answers are
	// still taken out of the stream, and the relay stays).
	state atomic.Int32
	// q is the open question; written by the session before state becomes
	// exitAsked, read by the reader after it sees that.
	q relayQuestion
	// result carries the reader's finding to the waiting session: the
	// second answer (answerUnsubscribed: the reader has stopped and the
	// relay may leave).
	result chan int
	// readerDone is closed when the reader stops for any reason.
	readerDone chan struct{}

	// pushed: Redis unsubscribed the client itself (a sunsubscribe for a
	// slot that moved), or refused a command with MOVED or ASK (a
	// SSUBSCRIBE the stale slot map sent to the wrong node), after which
	// the client may be subscribed to nothing; set by the reader, taken by
	// the session.
	pushed atomic.Bool

	// Reader goroutine only.
	framer  relayFramer
	framing bool // false once off took effect: chunks pass through raw
}

const (
	exitIdle int32 = iota
	exitAsked
	exitAbandoned
)

// relayQuestion is what the relay sends to find out whether it may leave,
// and the answers it looks for.
type relayQuestion struct {
	resp3 bool   // the second question is CLIENT INFO, not PING
	tag   []byte // the random part of the unknown command's name, which its error quotes
	plain []byte // PING's answer on a connection not subscribed
	pong  []byte // PING's answer on a subscribed RESP2 connection
}

// newRelayExit returns the way out of a relay of kind, or nil for a relay
// that stays for the client's life.
func (sess *Session) newRelayExit(kind relayKind) *relayExit {
	if kind != relayPubSub {
		return nil
	}
	ex := &relayExit{q: relayQuestion{resp3: sess.resp3}, result: make(chan int, 1), readerDone: make(chan struct{}), framing: true}
	if sess.srv.router != nil && sess.relayNode != "" {
		ex.framer.redirect = sess.relayRedirect(sess.relayNode) // cluster_relay.go
	}
	return ex
}

// note looks at one request the relay is about to send.
func (ex *relayExit) note(cmd *commands.Command) {
	if ex.never {
		return
	}
	if relayKeepsState(cmd) {
		ex.stayForGood()
		return
	}
	if isUnsubscribe(cmd.Name) {
		ex.asked = true
	}
}

// segment returns how many of reqs, the rest of a client's batch, the
// relay sends before it next asks whether it may leave: up to the last
// unsubscribe before the first command that is not a pub/sub one (or
// PING). Commands sent in one write behind the last unsubscribe are then
// served as Redis serves a client no longer subscribed (routed, from the
// local tier), where before they were relayed with it, and refused when
// another upstream or node owned their keys. What the relay serves as
// well as the shared connections (more (un)subscribes, PINGs) is not cut
// off: a run of 5000 UNSUBSCRIBEs cut at each took 0.5 s on loopback
// (found by review) where it takes 10 ms whole. The price left: a round
// trip to Redis for the question after each unsubscribe with other
// commands behind it in the same write.
func (ex *relayExit) segment(table *commands.Table, reqs []resp.Request) int {
	if ex.never {
		return len(reqs)
	}
	cut := -1
	for k := range reqs {
		name := ""
		if cmd := table.Lookup(reqs[k].Args); cmd != nil {
			name = cmd.Name
		}
		switch {
		case isUnsubscribe(name):
			cut = k
		case isSubscribe(name), name == "ping":
		case cut >= 0:
			return cut + 1
		}
	}
	return len(reqs)
}

// wantsToLeave reports whether the relay is to ask Redis, before the
// client's next batch, whether it may leave: the client unsubscribed, or
// Redis unsubscribed it.
func (ex *relayExit) wantsToLeave() bool {
	if ex.never {
		return false
	}
	if ex.pushed.Load() && ex.pushed.Swap(false) {
		ex.asked = true
	}
	return ex.asked
}

// relayKeepsState reports whether cmd may leave the relay's connection in
// a state the session would not know of (or is unknown, and so may): the
// commands the table marks as changing connection state, but for the
// subscriptions themselves, which the question to Redis settles.
func relayKeepsState(cmd *commands.Command) bool {
	return cmd == nil || cmd.Flags&commands.ConnState != 0 && !isSubscribe(cmd.Name)
}

// relayAsking is what asking whether the relay may leave came to.
type relayAsking uint8

const (
	relayStays  relayAsking = iota // subscribed still, or the answer unclear
	relayLeaves                    // the reader has stopped; leave
	relayEnds                      // the relay's connection is gone, or the session interrupted
	// relayClientLeft: the client closed (or half-closed) its side while
	// the relay asked. What it sent before is sent on, and the relay's
	// connection half-closed: Redis runs it and frees the connection as
	// it would the client's own (a BLPOP before the question is not left
	// to pop for nobody, nor does anything behind it run), and a client
	// that still reads gets every reply.
	relayClientLeft
)

// markerWait is how often a session waiting for the answers looks whether
// the client is gone or it was interrupted (shutdown, CLIENT KILL). The
// answers themselves may take as long as the commands before them do (a
// BLPOP 0 relayed before the last UNSUBSCRIBE): there is no time limit, as
// Redis would answer the held batch no sooner.
const markerWait = 50 * time.Millisecond

// ask sends the question and waits for the reader's finding. Its two
// commands are counted by relayWrites (asked) before it is sent.
func (ex *relayExit) ask(sess *Session, up net.Conn) relayAsking {
	ex.asked = false
	var raw [16]byte
	rand.Read(raw[:])
	tag := hex.EncodeToString(raw[:])
	token := "redproxy-relay-exit-" + tag
	// In the unknown command's name, which every error for it quotes
	// (Redis 7 'so', Redis 6 `so`, some servers without the arguments):
	// matched bare.
	ex.q.tag = append(ex.q.tag[:0], tag...)
	ex.q.plain = redcon.AppendBulkString(ex.q.plain[:0], token)
	ex.q.pong = append(append(ex.q.pong[:0], "*2\r\n$4\r\npong\r\n"...), ex.q.plain...)
	ex.state.Store(exitAsked)
	msg := resp.AppendCommandStrings(nil, "redproxy-exit-"+tag)
	if ex.q.resp3 {
		msg = resp.AppendCommandStrings(msg, "CLIENT", "INFO")
	} else {
		msg = resp.AppendCommandStrings(msg, "PING", token)
	}
	if _, err := up.Write(msg); err != nil {
		ex.abandon()
		return relayEnds
	}
	tick := time.NewTicker(markerWait)
	defer tick.Stop()
	for {
		select {
		case a := <-ex.result:
			return ex.answered(a)
		case <-ex.readerDone:
			select {
			case a := <-ex.result:
				if a == answerUnsubscribed {
					return relayLeaves
				}
			default:
			}
			ex.abandon()
			return relayEnds // the reader recorded why
		case <-tick.C:
			// As a blocked client's wait (blocking): a client gone must not
			// leave a BLPOP sent before the question to pop for nobody.
			interrupted := sess.interrupted.Load()
			if interrupted || clientGone(sess.nc) {
				if !ex.state.CompareAndSwap(exitAsked, exitAbandoned) {
					// Answered meanwhile: the reader sends the answer,
					// or stops without it when it failed to queue what
					// came before.
					select {
					case a := <-ex.result:
						if a == answerUnsubscribed && !interrupted {
							return relayLeaves // what it held runs on the shared path
						}
					case <-ex.readerDone:
					}
				}
				ex.stayForGood()
				sess.closing(metrics.CloseClient) // or the interruption's reason
				if interrupted {
					return relayEnds
				}
				return relayClientLeft
			}
		}
	}
}

// answered turns the reader's finding into what the relay does.
func (ex *relayExit) answered(a int) relayAsking {
	switch a {
	case answerUnsubscribed:
		return relayLeaves
	case answerRetry:
		// Redis could not say for now (-BUSY while a script runs,
		// -LOADING): ask again before the next batch.
		ex.asked = true
	case answerError:
		// It will not say (CLIENT INFO denied by the upstream user's
		// ACL, unknown before Redis 6.2; an answer past maxClientInfo):
		// asking before every batch would cost a round trip each time.
		ex.stayForGood()
	}
	return relayStays
}

// abandon stops waiting for the answers for good: the reader may still be
// looking for them, so no other question may follow.
func (ex *relayExit) abandon() {
	ex.state.Store(exitAbandoned)
	ex.stayForGood()
}

// stayForGood keeps the relay for the connection's life: no question is
// asked again, and the reader stops framing once the open one, if any, is
// answered.
func (ex *relayExit) stayForGood() {
	ex.never = true
	ex.off.Store(true)
}

// received passes one chunk of Redis's stream through the framer on the
// reader goroutine. It returns the bytes to pass on (the chunk without the
// answers to the question); found: the answers are in the chunk and the
// session waits for them, to be sent answer on ex.result once the bytes
// are queued; answer is the second one (PING's or CLIENT INFO's),
// answerUnsubscribed only if nothing came after it (then the reader
// stops). err: the stream is not RESP, and the relay must
// end.
func (ex *relayExit) received(chunk []byte) (out []byte, found bool, answer int, err error) {
	answer = answerNone
	if !ex.framing {
		return chunk, false, answer, nil
	}
	state := ex.state.Load()
	if ex.off.Load() && state == exitIdle && ex.framer.stage == askNone {
		// No question will come: pass the rest raw, after what the
		// framer still holds of a reply cut by a read.
		ex.framing = false
		if rest := ex.framer.pending(); len(rest) > 0 {
			return append(rest, chunk...), false, answer, nil
		}
		return chunk, false, answer, nil
	}
	if state != exitIdle && ex.framer.stage == askNone {
		ex.framer.ask(&ex.q)
	}
	out, which, rest, err := ex.framer.feed(chunk)
	if ex.framer.sunsubscribed || ex.framer.redirected {
		ex.framer.sunsubscribed, ex.framer.redirected = false, false
		ex.pushed.Store(true)
	}
	if err != nil || which == answerNone {
		return out, false, answer, err
	}
	if which == answerUnsubscribed && rest {
		which = answerSubscribed // not what Redis sends after it: stay
	}
	if ex.state.CompareAndSwap(exitAsked, exitIdle) {
		return out, true, which, nil // the reader tells the session
	}
	ex.state.Store(exitIdle) // abandoned (the relay is ending): the answers are taken out
	return out, false, answer, nil
}

// The framer's progress through the answers to one question.
const (
	askNone = iota // no question open
	askTag         // looking for the unknown command's error naming the token
	askPing        // looking for the second answer, the next reply but messages
)

// What the second question (PING, or CLIENT INFO on RESP3) was answered
// with.
const (
	answerNone         = -1
	answerUnsubscribed = 0 // not subscribed
	answerSubscribed   = 1 // subscribed
	answerRetry        = 2 // an error that passes: -BUSY, -LOADING
	answerError        = 3 // any other error, or an answer past maxClientInfo
)

// maxTagError bounds the unknown-command error that may carry the tag:
// Redis quotes at most 128 bytes of the arguments. maxClientInfo bounds
// CLIENT INFO's answer (a long client name makes it longer; then it is
// taken out all the same, and the relay stays for good).
const (
	maxTagError   = 512
	maxClientInfo = 4096
)

// sunsubscribeReply starts the sunsubscribe Redis Cluster sends, unasked,
// to a subscriber whose channel's slot has left the node. The client
// then subscribes again, to be served by the new owner, which a relay on
// the old node refuses: so this too makes the relay ask whether it may
// leave (relayExit.pushed).
const sunsubscribeReply = "*3\r\n$12\r\nsunsubscribe\r\n"

// sunsubscribePush is the same for a RESP3 subscriber.
const sunsubscribePush = ">3\r\n$12\r\nsunsubscribe\r\n"

// pubsubMessages start the replies Redis sends a subscriber unasked; one
// may come between the two answers.
var pubsubMessages = [...]string{
	"*3\r\n$7\r\nmessage\r\n",
	"*4\r\n$8\r\npmessage\r\n",
	"*3\r\n$8\r\nsmessage\r\n",
	sunsubscribeReply,
}

// relayFramer frames a relay's stream from Redis in pieces of any size,
// without holding more than a few hundred bytes of any reply, and takes
// the answers to an open question out of it. A reply that may be an
// answer is held back until it is known not to be one (longer than any
// answer, or complete and different); the rest passes on as it comes.
type relayFramer struct {
	sc    resp.ReplyScanner
	carry []byte // bytes the scanner did not release, fed again first
	held  []byte // the reply being framed, while it may be an answer
	size  int    // bytes of the reply being framed so far
	hold  bool   // the reply being framed is held back
	limit int    // ... while it is no longer than this
	take  bool   // ... and is surely the answer: past limit, dropped
	drop  bool   // the reply being framed is the answer, dropped unread
	out   []byte

	q     *relayQuestion
	stage int
	// head is the start of the reply being framed, enough to tell a
	// pub/sub message or Redis's own sunsubscribe.
	head          [24]byte
	sunsubscribed bool

	// redirect, on a relay in cluster mode, turns a MOVED or ASK from the
	// relay's node into the error the client gets (relayRedirect), which
	// the framer passes on in its place; redirected says it did. Errors
	// are held back for it while no question is open (begin).
	redirect   func(reply []byte) ([]byte, bool)
	redirected bool
}

// ask opens a question: the framer looks for its answers from the next
// reply on (one being framed now came before them).
func (f *relayFramer) ask(q *relayQuestion) {
	f.q, f.stage = q, askTag
}

// pending returns what the framer has taken in and not passed on, of a
// reply cut by a read, and forgets it.
func (f *relayFramer) pending() []byte {
	rest := append(append([]byte(nil), f.held...), f.carry...)
	f.held, f.carry, f.hold = nil, nil, false
	return rest
}

// begin decides, for a reply that starts with first, whether it is held
// back (and up to how long), or dropped, at the current stage.
func (f *relayFramer) begin(first byte) {
	f.hold, f.take, f.drop, f.limit = false, false, false, 0
	switch {
	case f.stage == askTag:
		f.hold, f.limit = first == '-', maxTagError
	case f.stage != askPing:
		// No question open: an error may be a MOVED or ASK to replace.
		f.hold, f.limit = first == '-' && f.redirect != nil, maxTagError
	case first == '-':
		f.drop = true // only the second answer may be an error here
	case f.q.resp3:
		// Anything but a push is CLIENT INFO's answer.
		f.hold, f.take, f.limit = first != '>', true, maxClientInfo
	default:
		f.hold, f.limit = first == '$' || first == '*', max(len(f.q.plain), len(f.q.pong))
	}
}

// feed consumes chunk and returns what to pass on: chunk itself when
// nothing in it is held back or taken out. which is PING's answer when
// both answers were found in it (then rest reports bytes after them), or
// answerNone.
func (f *relayFramer) feed(chunk []byte) (out []byte, which int, rest bool, err error) {
	which = answerNone
	data := chunk
	if len(f.carry) > 0 {
		f.carry = append(f.carry, chunk...)
		data = f.carry
	}
	// direct: what is passed on is data[:done] so far, with no copy.
	direct := len(f.carry) == 0
	done := 0
	out = f.out[:0]
	diverge := func() {
		if direct {
			out = append(out, data[:done]...)
			direct = false
		}
	}
	for done < len(data) {
		if f.size == 0 {
			f.begin(data[done])
		}
		n, end, cerr := f.sc.Consume(data[done:])
		if cerr != nil {
			return out, answerNone, false, cerr
		}
		if n == 0 && !end {
			break
		}
		part := data[done : done+n]
		if f.size < len(f.head) {
			copy(f.head[f.size:], part)
		}
		f.size += n
		switch {
		case f.drop:
			diverge()
		case !f.hold:
			if !direct {
				out = append(out, part...)
			}
		case f.size > f.limit && f.take:
			diverge()
			f.held, f.hold, f.drop = f.held[:0], false, true
		case f.size > f.limit:
			diverge()
			out = append(append(out, f.held...), part...)
			f.held, f.hold = f.held[:0], false
		default:
			diverge()
			f.held = append(f.held, part...)
		}
		done += n
		if !end {
			continue
		}
		if which != answerNone {
			rest = true
		}
		switch a := f.answer(); {
		case a == answerTag:
			f.stage = askPing
		case a >= 0:
			which, f.stage = a, askNone
		case f.hold:
			out = append(out, f.replaced(f.held)...)
		}
		if f.size >= len(sunsubscribeReply) {
			if h := string(f.head[:len(sunsubscribeReply)]); h == sunsubscribeReply || h == sunsubscribePush {
				f.sunsubscribed = true
			}
		}
		f.held, f.hold, f.take, f.drop, f.size = f.held[:0], false, false, false, 0
	}
	if which != answerNone && (f.size > 0 || done < len(data)) {
		rest = true // part of a reply after the answers
	}
	if direct {
		out = data[:done]
	}
	// What the scanner has not released is fed again with the next chunk;
	// copied: data may be carry itself.
	f.carry = append([]byte(nil), data[done:]...)
	if len(f.carry) == 0 {
		f.carry = nil
	}
	if !direct {
		f.out = out
		if cap(f.out) > 64<<10 {
			f.out = nil // do not keep a big chunk's copy for the relay's life
		}
	}
	return out, which, rest, nil
}

// replaced is what the client is sent for a held reply that is not an
// answer: itself, or for a MOVED or ASK on a cluster relay the error
// relayRedirect makes of it. A client never sees MOVED or ASK (it could
// not follow them, and its connection would stay on the old node).
func (f *relayFramer) replaced(held []byte) []byte {
	if f.redirect == nil || len(held) == 0 || held[0] != '-' {
		return held
	}
	if out, ok := f.redirect(held); ok {
		f.redirected = true
		return out
	}
	return held
}

// answerTag: the reply just framed is the unknown command's error.
const answerTag = -2

// answer classifies the reply just framed: answerTag, an answer of PING
// (answerUnsubscribed, answerSubscribed, answerError), or answerNone for a reply to
// pass on (held, if it was).
func (f *relayFramer) answer() int {
	switch {
	case f.stage == askTag && f.hold:
		if bytes.Contains(f.held, f.q.tag) {
			return answerTag
		}
	case f.stage == askPing && f.drop:
		if f.retryable() {
			return answerRetry
		}
		return answerError // a lasting error, or an answer past maxClientInfo
	case f.stage == askPing && f.hold && f.q.resp3:
		return clientInfoAnswer(f.held)
	case f.stage == askPing && f.hold:
		switch {
		case bytes.Equal(f.held, f.q.plain):
			return answerUnsubscribed
		case bytes.Equal(f.held, f.q.pong):
			return answerSubscribed
		}
		if !f.isMessage() {
			// Nothing but messages may come between the answers, and
			// PING's are matched above: a reply the framer cannot place.
			return answerError
		}
	}
	return answerNone
}

// retryable reports whether the error just framed (f.head holds its start)
// is one Redis stops giving by itself.
func (f *relayFramer) retryable() bool {
	h := string(f.head[:min(f.size, len(f.head))])
	return strings.HasPrefix(h, "-BUSY") || strings.HasPrefix(h, "-LOADING")
}

// clientInfoAnswer reads CLIENT INFO's answer: answerUnsubscribed when the
// connection is in no pub/sub context and has no subscription left.
func clientInfoAnswer(info []byte) int {
	field := func(name string) (string, bool) {
		i := bytes.Index(info, []byte(" "+name+"="))
		if i < 0 {
			return "", false
		}
		v := info[i+len(name)+2:]
		if j := bytes.IndexAny(v, " \r\n"); j >= 0 {
			v = v[:j]
		}
		return string(v), true
	}
	flags, ok := field("flags")
	if !ok {
		return answerError
	}
	if bytes.IndexByte([]byte(flags), 'P') >= 0 {
		return answerSubscribed
	}
	for _, n := range [...]string{"sub", "psub", "ssub"} {
		if v, ok := field(n); ok && v != "0" {
			return answerSubscribed
		}
	}
	return answerUnsubscribed
}

// isMessage reports whether the reply just framed is one Redis sends a
// subscriber unasked.
func (f *relayFramer) isMessage() bool {
	for _, m := range pubsubMessages {
		if f.size >= len(m) && string(f.head[:len(m)]) == m {
			return true
		}
	}
	return false
}
