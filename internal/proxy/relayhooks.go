package proxy

import (
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/localcache"
	"github.com/redproxy/redproxy/internal/resp"
	"github.com/redproxy/redproxy/internal/stampede"
)

// Writes from relayed clients (rueidis after CLIENT TRACKING ON, a RESP3
// client after SUBSCRIBE) go to Redis on the relay's own connection, yet
// the local tier and the miss holds must hear of them exactly as of any
// other write: marked in flight before they are sent, released once their
// replies have arrived (C1; a held read ends when its key is written).
//
// The relay passes Redis's bytes through unparsed, so the replies are
// counted on the raw stream: a RESP3 stream separates replies from
// out-of-band data (pushes), and a RESP2 stream of a client that is
// neither subscribed nor monitoring holds replies only. Each write's marks
// are released when the stream has carried as many replies as were due up
// to the end of the write's batch (up to its EXEC, inside MULTI); the
// marks are released before the reply reaches the client, so no read
// that starts after the client saw its OK can be served from the tier.
//
// Once the stream cannot be counted (MONITOR, a subscription: see note,
// or a command that changes the protocol or mutes replies: HELLO, RESET,
// CLIENT REPLY), writes stay marked until the relay ends or hands the
// client back (relayexit.go): the written keys
// are not served from the tier meanwhile. At most maxHeldRelayWrites are
// kept that way; further writes are refused with an error rather than
// risk a stale read.
const maxHeldRelayWrites = 1024

// relayWrites tracks one relay's writes whose replies are not yet in.
type relayWrites struct {
	sess *Session
	// active: the local tier or miss holds are on, so writes matter.
	active bool

	// Session goroutine only.
	resp3 bool
	// dbs are the databases the relay's connection may be in: one, but
	// after an EXEC of a transaction that queued a SELECT, two, since the
	// relay does not read the replies and EXEC may have been aborted
	// (WATCH, a refused command), until a SELECT outside MULTI or a RESET
	// settles it. Writes are marked in each. dbsAtMulti are those when
	// MULTI was sent, which DISCARD restores; selectQueued: the
	// transaction queued a SELECT.
	dbs          []int
	dbsAtMulti   []int
	selectQueued bool
	inMulti      bool
	subscribed   bool         // has sent SUBSCRIBE, PSUBSCRIBE or SSUBSCRIBE
	due          int64        // replies due for everything sent so far
	tx           relayRelease // writes queued in MULTI, released after EXEC
	batch        relayRelease // writes of the batch being built

	mu        sync.Mutex
	countable bool
	pending   []relayRelease // by due, oldest first
	held      []relayRelease // released when the relay ends
	heldN     int

	// Reader goroutine only.
	counter replyCounter
	got     int64 // replies seen
}

type relayRelease struct {
	due    int64
	tier   []localcache.Writes
	flight []stampede.Writes
	n      int
}

func (r *relayRelease) empty() bool { return r.n == 0 }

func (r *relayRelease) add(o relayRelease) {
	r.tier = append(r.tier, o.tier...)
	r.flight = append(r.flight, o.flight...)
	r.n += o.n
}

func newRelayWrites(sess *Session) *relayWrites {
	fs := sess.srv.flight.Load()
	active := sess.srv.tier != nil || fs != nil && fs.TracksWrites()
	return &relayWrites{sess: sess, active: active, countable: active, resp3: sess.resp3, dbs: []int{sess.db}}
}

// errHeldWrites refuses a write the relay could no longer track.
const errHeldWrites = "ERR redproxy: too many writes on a connection in MONITOR or pub/sub mode; write on another connection"

// note is called for every request of a relayed client before it is sent,
// with the arguments that will be sent (refused: a refusal is sent
// instead). It marks the request's writes in flight and counts the
// replies due. It returns false when the request must be refused.
func (rw *relayWrites) note(cmd *commands.Command, args [][]byte, refused bool) bool {
	if !rw.active {
		return true
	}
	name := ""
	if cmd != nil {
		name = cmd.Name
	}
	replies := int64(1)
	switch {
	case refused:
	case name == "reset":
		// Redis leaves MULTI and goes back to DB 0. What was queued never
		// runs; its marks are released with this batch.
		rw.uncountable()
		rw.dbs = append(rw.dbs[:0], 0)
		rw.endMulti()
	case name == "monitor", name == "hello", name == "client|reply":
		rw.uncountable()
	case isSubscribe(name):
		if !strings.HasSuffix(name, "unsubscribe") {
			rw.subscribed = true
		}
		// RESP2: the subscribed stream holds messages, not replies. RESP3:
		// confirmed with pushes only, but refused (-BUSY, -CROSSSLOT,
		// -NOPERM, -MOVED) with one error, which the stream alone cannot
		// tell from the reply of the command after it: counted as none,
		// it made a later write's marks go one reply early (found by
		// review: a stale tier hit after the write's OK).
		rw.uncountable()
	case name == "select" && len(args) == 2:
		if n, isInt := resp.ParseInt(args[1]); isInt && n >= 0 && n < int64(rw.sess.srv.Config().Upstream.Databases) {
			db := int(n)
			// Inside MULTI, the commands queued after it run in db if
			// EXEC runs them.
			rw.dbs = append(rw.dbs[:0], db)
			rw.selectQueued = rw.selectQueued || rw.inMulti
		}
	case name == "multi":
		if !rw.inMulti {
			rw.dbsAtMulti = append(rw.dbsAtMulti[:0], rw.dbs...)
			rw.selectQueued = false
		}
		rw.inMulti = true
		if rw.subscribed {
			// A message a subscribed client publishes to itself inside
			// MULTI comes inside EXEC's array, as an element its length
			// does not count (Redis 7.0), while the pushes of a SUBSCRIBE
			// queued there are counted: EXEC's reply cannot be framed
			// from the stream alone.
			rw.uncountable()
		}
	case name == "discard" && rw.inMulti:
		rw.dbs = append(rw.dbs[:0], rw.dbsAtMulti...)
		rw.endMulti()
	case name == "exec" && rw.inMulti:
		if rw.selectQueued {
			// Run: the SELECT's database; aborted: the one before MULTI.
			for _, db := range rw.dbsAtMulti {
				if !slices.Contains(rw.dbs, db) {
					rw.dbs = append(rw.dbs, db)
				}
			}
		}
		rw.endMulti()
	}
	rw.due += replies
	if refused || !mayWrite(cmd) {
		return true
	}
	rw.mu.Lock()
	full := !rw.countable && rw.heldN+rw.batch.n+rw.tx.n >= maxHeldRelayWrites
	rw.mu.Unlock()
	if full {
		return false
	}
	w := rw.start(cmd, args)
	if rw.inMulti {
		rw.tx.add(w)
	} else {
		rw.batch.add(w)
	}
	return true
}

// endMulti ends a transaction: its writes are released with the batch.
func (rw *relayWrites) endMulti() {
	rw.inMulti, rw.selectQueued = false, false
	rw.batch.add(rw.tx)
	rw.tx = relayRelease{}
}

// start runs the write hooks for one write and takes its marks.
func (rw *relayWrites) start(cmd *commands.Command, args [][]byte) relayRelease {
	sess := rw.sess
	var w relayRelease
	for _, db := range rw.dbs {
		if t := sess.srv.tier; t != nil {
			var tw localcache.Writes
			t.cache.WriteStart(&tw, db, cmd, args, rw.inMulti)
			w.tier = append(w.tier, tw)
		}
		if fs := sess.srv.flight.Load(); fs != nil && fs.TracksWrites() {
			var fw stampede.Writes
			fs.WriteStart(&fw, db, cmd, args)
			w.flight = append(w.flight, fw)
		}
	}
	w.n = 1
	return w
}

// sending is called once a batch's requests have been noted, before they
// are written to Redis.
func (rw *relayWrites) sending() {
	if rw.batch.empty() {
		return
	}
	r := rw.batch
	rw.batch = relayRelease{}
	r.due = rw.due
	rw.mu.Lock()
	if rw.countable {
		rw.pending = append(rw.pending, r)
	} else {
		rw.held = append(rw.held, r)
		rw.heldN += r.n
	}
	rw.mu.Unlock()
}

func (rw *relayWrites) uncountable() {
	rw.mu.Lock()
	if rw.countable {
		rw.countable = false
		for _, r := range rw.pending {
			rw.heldN += r.n
		}
		rw.held = append(rw.held, rw.pending...)
		rw.pending = nil
	}
	rw.mu.Unlock()
}

// received is called by the relay's reader with every chunk Redis sent,
// before it is passed on to the client.
func (rw *relayWrites) received(b []byte) {
	if !rw.active {
		return
	}
	rw.mu.Lock()
	countable, waiting := rw.countable, len(rw.pending) > 0
	rw.mu.Unlock()
	if !countable {
		return
	}
	n, ok := rw.counter.feed(b)
	rw.got += n
	if !ok {
		rw.uncountable()
		return
	}
	if !waiting {
		return
	}
	var done []relayRelease
	rw.mu.Lock()
	for len(rw.pending) > 0 && rw.pending[0].due <= rw.got {
		done = append(done, rw.pending[0])
		rw.pending = rw.pending[1:]
	}
	rw.mu.Unlock()
	for i := range done {
		rw.release(&done[i])
	}
}

// end releases everything still marked: the relay's connection is closed.
func (rw *relayWrites) end() {
	rw.mu.Lock()
	rest := append(rw.pending, rw.held...)
	rest = append(rest, rw.batch, rw.tx)
	rw.pending, rw.held = nil, nil
	rw.mu.Unlock()
	for i := range rest {
		rw.release(&rest[i])
	}
}

func (rw *relayWrites) release(r *relayRelease) {
	srv := rw.sess.srv
	if srv.tier != nil {
		for i := range r.tier {
			srv.tier.cache.WriteDone(&r.tier[i])
		}
	}
	for i := range r.flight {
		r.flight[i].Done()
	}
}

// replyCounter counts the top-level replies in a RESP stream fed in
// arbitrary pieces, without buffering them: pushes ('>') are not replies.
type replyCounter struct {
	// stack holds, per open aggregate, the elements it still needs.
	stack []int64
	push  bool  // the top-level frame being read is a push
	skip  int64 // payload bytes (with CRLF) of a bulk still to skip
	line  []byte
}

// feed consumes b and returns the replies it completed; ok is false for
// bytes that are not RESP the counter understands.
func (c *replyCounter) feed(b []byte) (n int64, ok bool) {
	for len(b) > 0 {
		if c.skip > 0 {
			k := min(c.skip, int64(len(b)))
			c.skip -= k
			b = b[k:]
			if c.skip == 0 {
				n += c.finish()
			}
			continue
		}
		i := 0
		for i < len(b) && b[i] != '\n' {
			i++
		}
		if len(c.line) < 64 {
			c.line = append(c.line, b[:min(i, 64-len(c.line))]...)
		}
		if i == len(b) {
			return n, true
		}
		b = b[i+1:]
		k, good := c.header()
		if !good {
			return n, false
		}
		n += k
	}
	return n, true
}

// header handles one complete header line (the type byte and what follows
// up to CR; a simple value's text beyond 64 bytes is not kept).
func (c *replyCounter) header() (int64, bool) {
	line := c.line
	c.line = c.line[:0]
	if len(line) > 0 && line[len(line)-1] == '\r' {
		line = line[:len(line)-1]
	}
	if len(line) == 0 {
		return 0, false
	}
	typ := line[0]
	if len(c.stack) == 0 {
		c.push = typ == '>'
	}
	switch typ {
	case '+', '-', ':', '_', ',', '#', '(':
		return c.finish(), true
	case '$', '!', '=':
		size, err := strconv.ParseInt(string(line[1:]), 10, 64)
		if err != nil || size < -1 {
			return 0, false
		}
		if size < 0 {
			return c.finish(), true
		}
		c.skip = size + 2
		return 0, true
	case '*', '%', '~', '>', '|':
		size, err := strconv.ParseInt(string(line[1:]), 10, 64)
		if err != nil || size < -1 || typ == '|' {
			return 0, false // attributes are never sent to the proxy's clients
		}
		if typ == '%' {
			size *= 2
		}
		if size <= 0 {
			return c.finish(), true
		}
		c.stack = append(c.stack, size)
		return 0, true
	}
	return 0, false
}

// finish completes one element; it returns 1 if that completed a
// top-level reply.
func (c *replyCounter) finish() int64 {
	for len(c.stack) > 0 {
		top := len(c.stack) - 1
		c.stack[top]--
		if c.stack[top] > 0 {
			return 0
		}
		c.stack = c.stack[:top]
	}
	if c.push {
		return 0
	}
	return 1
}
