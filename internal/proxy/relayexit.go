package proxy

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"net"
	"sync/atomic"
	"time"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/resp"
	"github.com/tidwall/redcon"
)

// A RESP2 client that unsubscribes from everything leaves Redis's
// subscribed mode and may send any command again: Jedis and redis-py hand
// such a connection back to their pools. Its relay (stateful.go) then hands
// the client back to the shared connections, so that its commands meet
// routes, cluster slots, the local tier and stampede protection again, and
// the dedicated connection is given back.
//
// Only Redis knows when the last subscription is gone (an UNSUBSCRIBE
// without arguments names channels the proxy never counted), and only
// once every reply before that point has reached the client may the
// client's next command go elsewhere. So when a client that has sent an
// unsubscribe (or that Redis Cluster unsubscribed from a sharded channel
// whose slot moved: it will subscribe again, on the new owner) sends its
// next batch, the relay holds the batch and sends
// PING <token> alone: Redis answers a subscribed RESP2 connection with
// ["pong", token] and any other with the bulk string token. The relay's
// reader frames the stream while the relay may leave, takes that answer out
// of it, and the relay leaves only on the bulk form with nothing after it:
// every reply the client was owed has then been passed on. Otherwise the
// held batch is relayed as before.
//
// A relay leaves only if the dedicated connection carries no state the
// session does not: a command that may change the connection's state
// (SELECT, MULTI, WATCH, CLIENT ..., HELLO, AUTH, RESET, READONLY; see
// relayKeepsState) keeps the client on its relay for good, as before.
// RESP3 relays do not leave: there Redis's answer to PING does not tell
// whether the connection is subscribed.

// relayExit is one pub/sub relay's way out.
type relayExit struct {
	// Session goroutine only.
	asked  bool // an unsubscribe was relayed since the last check
	sticky bool // the connection may hold state the session does not

	// off tells the reader that the relay will not leave: it stops framing.
	off atomic.Bool
	// state is exitIdle, or exitAsked while the session waits for the
	// answer to the marker, or exitAbandoned when it gave up waiting (the
	// answer is still taken out of the stream, and the relay stays).
	state atomic.Int32
	// plain and pong are the marker's two possible answers; written by the
	// session before state becomes exitAsked.
	plain, pong []byte
	// result carries the reader's finding to the waiting session: true,
	// the reader has stopped and the relay may leave.
	result chan bool
	// readerDone is closed when the reader stops for any reason.
	readerDone chan struct{}

	// pushed: Redis unsubscribed the client itself (a sunsubscribe for a
	// slot that moved); set by the reader, taken by the session.
	pushed atomic.Bool

	// Reader goroutine only.
	framer relayFramer
}

const (
	exitIdle int32 = iota
	exitAsked
	exitAbandoned
)

// newRelayExit returns the way out of a relay of kind, or nil for a relay
// that stays for the client's life.
func (sess *Session) newRelayExit(kind relayKind) *relayExit {
	if kind != relayPubSub || sess.resp3 {
		return nil
	}
	return &relayExit{result: make(chan bool, 1), readerDone: make(chan struct{})}
}

// note looks at one request the relay is about to send.
func (ex *relayExit) note(cmd *commands.Command) {
	if ex.sticky {
		return
	}
	if relayKeepsState(cmd) {
		ex.sticky = true
		ex.off.Store(true)
		return
	}
	switch cmd.Name {
	case "unsubscribe", "punsubscribe", "sunsubscribe":
		ex.asked = true
	}
}

// wantsToLeave reports whether the relay is to ask Redis, before the
// client's next batch, whether it may leave: the client unsubscribed, or
// Redis unsubscribed it.
func (ex *relayExit) wantsToLeave() bool {
	if ex.sticky {
		return false
	}
	if ex.pushed.Load() && ex.pushed.Swap(false) {
		ex.asked = true
	}
	return ex.asked
}

// relayKeepsState reports whether cmd may leave the relay's connection in
// a state the session would not know of (or is unknown, and so may).
func relayKeepsState(cmd *commands.Command) bool {
	if cmd == nil {
		return true
	}
	name := cmd.Name
	if cmd.Parent != nil {
		name = cmd.Parent.Name
	}
	switch name {
	case "select", "hello", "auth", "reset", "client", "multi", "exec", "discard",
		"watch", "unwatch", "readonly", "readwrite", "asking", "monitor", "quit":
		return true
	}
	return false
}

// markerWait is how often a session waiting for the marker's answer looks
// whether it was interrupted (shutdown, CLIENT KILL). The answer itself
// may take as long as the commands before it do (a BLPOP 0 sent after the
// last UNSUBSCRIBE): there is no time limit, as Redis would answer the
// held batch no sooner.
const markerWait = 100 * time.Millisecond

// tryLeave sends the marker and waits for the reader's finding. It reports
// whether the relay may leave; the reader has then stopped after passing
// on every reply before the marker's.
func (ex *relayExit) tryLeave(sess *Session, up net.Conn) bool {
	ex.asked = false
	var raw [16]byte
	rand.Read(raw[:])
	token := "redproxy-relay-exit-" + hex.EncodeToString(raw[:])
	ex.plain = redcon.AppendBulkString(ex.plain[:0], token)
	ex.pong = append(append(ex.pong[:0], "*2\r\n$4\r\npong\r\n"...), ex.plain...)
	ex.state.Store(exitAsked)
	if _, err := up.Write(resp.AppendCommandStrings(nil, "PING", token)); err != nil {
		ex.abandon()
		return false
	}
	tick := time.NewTicker(markerWait)
	defer tick.Stop()
	for {
		select {
		case left := <-ex.result:
			return left
		case <-ex.readerDone:
			select {
			case left := <-ex.result:
				return left
			default:
			}
			ex.abandon()
			return false
		case <-tick.C:
			if sess.interrupted.Load() && ex.state.CompareAndSwap(exitAsked, exitAbandoned) {
				ex.sticky = true
				return false
			}
		}
	}
}

// abandon stops waiting for the marker's answer for good: the reader may
// still be looking for it, so no other marker may replace it.
func (ex *relayExit) abandon() {
	ex.state.Store(exitAbandoned)
	ex.sticky = true
}

// received frames one chunk of Redis's stream on the reader goroutine. It
// returns the bytes to pass on (the chunk without the marker's answer);
// found: the answer is in the chunk and the session waits for it, to be
// sent leave on ex.result once the bytes are queued; leave: the answer was
// the bulk form with nothing after it. err: the stream is not RESP, and
// the relay must end.
func (ex *relayExit) received(chunk []byte) (out []byte, found, leave bool, err error) {
	state := ex.state.Load()
	var marker [2][]byte
	if state != exitIdle {
		marker = [2][]byte{ex.plain, ex.pong}
	}
	out, which, rest, err := ex.framer.feed(chunk, marker)
	if ex.framer.sunsubscribed {
		ex.framer.sunsubscribed = false
		ex.pushed.Store(true)
	}
	if err != nil || which < 0 {
		return out, false, false, err
	}
	leave = which == 0 && !rest
	if ex.state.CompareAndSwap(exitAsked, exitIdle) {
		return out, true, leave, nil // the reader tells the session
	}
	ex.state.Store(exitIdle) // abandoned: the answer is taken out, the relay stays
	return out, false, false, nil
}

// relayFramer frames a relay's stream from Redis in pieces of any size,
// without holding more than a few bytes of any reply, and takes out the
// marker's answer. A reply that starts while a marker is asked is held
// back until it is known not to be the answer (longer than it, or
// complete and different).
type relayFramer struct {
	sc    resp.ReplyScanner
	carry []byte // bytes the scanner did not release, fed again first
	held  []byte // the reply being framed, while it may be the answer
	size  int    // bytes of the reply being framed so far
	hold  bool   // the reply being framed is held back
	out   []byte
	// head is the start of the reply being framed, enough to tell Redis's
	// own sunsubscribe (sunsubscribed: one was seen).
	head          [len(sunsubscribeReply)]byte
	sunsubscribed bool
}

// sunsubscribeReply starts the sunsubscribe Redis Cluster sends, unasked,
// to a RESP2 subscriber whose channel's slot has left the node. The client
// then subscribes again, to be served by the new owner, which a relay on
// the old node refuses: so this too makes the relay ask whether it may
// leave (relayExit.asked).
const sunsubscribeReply = "*3\r\n$12\r\nsunsubscribe\r\n"

// feed consumes chunk and returns what to pass on. which is the index in
// marker of the answer found in it (then rest reports bytes after it), or
// -1. marker is empty when no marker is asked.
func (f *relayFramer) feed(chunk []byte, marker [2][]byte) (out []byte, which int, rest bool, err error) {
	which = -1
	longest := max(len(marker[0]), len(marker[1]))
	data := chunk
	if len(f.carry) > 0 {
		f.carry = append(f.carry, chunk...)
		data = f.carry
	}
	out = f.out[:0]
	for len(data) > 0 {
		if f.size == 0 {
			f.hold = longest > 0
		}
		n, done, cerr := f.sc.Consume(data)
		if cerr != nil {
			return out, -1, false, cerr
		}
		if n == 0 && !done {
			break
		}
		part := data[:n]
		data = data[n:]
		if f.size < len(f.head) {
			copy(f.head[f.size:], part)
		}
		f.size += n
		switch {
		case !f.hold:
			out = append(out, part...)
		case f.size > longest:
			out = append(append(out, f.held...), part...)
			f.held, f.hold = f.held[:0], false
		default:
			f.held = append(f.held, part...)
		}
		if !done {
			continue
		}
		if f.hold {
			switch {
			case bytes.Equal(f.held, marker[0]) && which < 0:
				which = 0
			case bytes.Equal(f.held, marker[1]) && which < 0:
				which = 1
			default:
				out = append(out, f.held...)
			}
			if which >= 0 {
				longest = 0 // one answer per marker
			}
		} else if which >= 0 {
			rest = true
		}
		if f.size >= len(f.head) && string(f.head[:]) == sunsubscribeReply {
			f.sunsubscribed = true
		}
		f.held, f.hold, f.size = f.held[:0], false, 0
		if which >= 0 && len(data) > 0 {
			rest = true
		}
	}
	// What the scanner has not released is fed again with the next chunk;
	// copy first: data may be part of carry itself.
	f.carry = append(f.carry[:0:0], data...)
	f.out = out
	if len(f.out) > 64<<10 {
		f.out = nil // do not keep a big chunk's copy for the relay's life
	}
	return out, which, rest, nil
}
