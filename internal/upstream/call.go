// Package upstream owns the proxy's connections to Redis.
//
// A Pipe is one shared, pipelined connection: any number of clients hand it
// Calls (one client's batch of commands), a single writer goroutine writes
// whatever is queued and flushes when the queue drains, and a single reader
// goroutine frames replies and hands them to Calls strictly in the order the
// commands were written. Redis answers a connection's commands in order, so
// FIFO matching is exact; a reply with no Call waiting for it is a bug, and
// the connection is closed, as soon as the reply begins, rather than
// guessing.
//
// Only the reader completes Calls. When a connection fails for any reason
// (read or write error, reply timeout, mismatch) the socket is closed, the
// writer is waited for, and the reader fails every Call still pending, so a
// reply can never reach a Call other than the one whose command produced it,
// and a client's buffers are never read after its Call has returned.
//
// A Pool spreads Calls over its pipes and bounds what Redis holds for each:
// Redis keeps the replies the reader has not taken in the connection's
// output buffer, without limit for a normal client, and a shared
// connection carries every client's commands. Replies cannot be sized
// before they come, so the Pool remembers large ones by command
// (replySizes) and holds a Call expected to take every pipe past
// backlogMax until one has room (Pool.Send).
package upstream

import (
	"errors"
	"hash/maphash"
	"math"
	"slices"
	"strconv"
	"sync/atomic"

	"github.com/redproxy/redproxy/internal/bufpool"
)

type timeoutError struct{}

func (timeoutError) Error() string { return "redproxy: upstream reply timeout" }
func (timeoutError) Timeout() bool { return true }

// Errors a Call can end with. Their text goes to clients after "-ERR ", so
// it says what happened in Redis's own style.
var (
	// ErrUnavailable: no connection to Redis is up right now; nothing was sent.
	ErrUnavailable = errors.New("redproxy: upstream unavailable")
	// ErrConnLost: the connection failed after the command was sent; it may or
	// may not have been executed.
	ErrConnLost = errors.New("redproxy: upstream connection lost")
	// ErrTimeout: no reply within the reply timeout; the connection was closed
	// because its reply order could no longer be trusted. It is a timeout
	// (its Timeout method), as net's are.
	ErrTimeout error = timeoutError{}
	// ErrClientLeft: the client left while its dedicated connection was
	// being dialled (Backend.AcquirePipeFor); nobody is told.
	ErrClientLeft = errors.New("redproxy: the client left while its connection was dialled")
	// ErrClosed: the proxy is shutting down.
	ErrClosed = errors.New("redproxy: upstream closed")
	// ErrOutputLimit: the Call's replies exceeded its reply limit; this
	// reply and every later one were dropped as they arrived.
	ErrOutputLimit = errors.New("redproxy: replies exceed the client output limit")
	// ErrDigested: the reply was longer than the Call's SetMaxReply and
	// was not kept; Call.Digest describes it.
	ErrDigested = errors.New("redproxy: reply too long to keep, digested")
	// errMismatch: Redis sent a reply nobody was waiting for.
	errMismatch = errors.New("redproxy: upstream sent an unexpected reply")
	// errPushTooLong: Redis sent a push frame longer than the
	// connection's reply limit (Options.ReplyLimit).
	errPushTooLong = errors.New("redproxy: upstream sent a push longer than the reply limit")
)

// Call is a batch of commands from one client, written as one unit and
// answered in order. A Call is reused by its owner: Reset, Add, Send, Wait,
// read the replies, repeat.
type Call struct {
	parts [][]byte // raw RESP commands; they may point into the client's read buffer
	reads int      // how many of parts came through AddRead
	size  int      // bytes of parts
	// heavy: its commands or a reply of it are large (heavyMin), counted
	// in its Pipe's heavy while it is pending.
	heavy bool
	// expect is the bytes of reply its commands are expected to take,
	// from the sizes the Pool has seen for them (replySizes); counted in
	// its Pipe's expected while it is pending. 0 for every command not
	// seen with a large reply.
	expect int64
	// out holds the replies back to back; ends[i] is where reply i ends.
	out  []byte
	ends []int
	err  error
	sent int64  // monotonic nanoseconds when queued, for the reply timeout
	seq  uint64 // its place in its Pipe's write order (Pipe.written)
	done chan struct{}

	// NoTimeout exempts the Call from the reply timeout: a blocking command
	// (BLPOP 0) may legitimately wait forever, on a connection of its own.
	NoTimeout bool

	// limit caps the bytes of replies the Call keeps (0: none set, and a
	// Pipe's Send gives it the connection's Options.ReplyLimit, so no
	// Call on a Pipe keeps replies of any size). Replies beyond it are
	// dropped as they arrive, from dropped on: the reader of a shared
	// connection must keep reading, whoever the replies are for.
	limit    int
	dropped  int // index of the first dropped reply, if overflow
	overflow bool
	// budget, when set, is shared with the other Calls one request was
	// split into (cluster nodes, routes): together they keep at most limit
	// bytes, not limit each (SetReplyBudget).
	budget *atomic.Int64

	// maxReply: replies longer than this are digested, not kept
	// (SetMaxReply; 0: every reply is kept). digests are theirs, in
	// reply order; each keeps its first bytes in out, as its reply.
	maxReply int
	digests  []digest

	onDone func(*Call) // SetOnDone
}

// NewCall returns an empty Call.
func NewCall() *Call {
	return &Call{done: make(chan struct{}, 1)}
}

// Reset empties the Call for reuse.
func (c *Call) Reset() {
	clear(c.parts)
	c.parts = c.parts[:0]
	c.reads, c.size, c.heavy, c.expect = 0, 0, false, 0
	c.out = c.out[:0]
	c.ends = c.ends[:0]
	c.err = nil
	c.NoTimeout = false
	c.limit, c.dropped, c.overflow = 0, 0, false
	c.budget = nil
	c.maxReply = 0
	c.digests = c.digests[:0]
	c.onDone = nil
	if cap(c.out) > 1<<20 {
		// Do not keep a huge reply buffer alive for an idle client.
		c.dropOut()
	}
}

// dropOut gives the reply buffer up, to bufpool when it is of a pooled
// size. Only between uses: replies read from the Call (Reply, Digest)
// are valid until its next Reset, Trim or Release, as they always were
// (the next use overwrites them).
func (c *Call) dropOut() {
	bufpool.Put(c.out)
	c.out = nil
}

// Trim drops the reply buffer if it grew past keep bytes, for a client
// going idle. Only between uses, like Reset.
func (c *Call) Trim(keep int) {
	if cap(c.out) > keep {
		c.dropOut()
	}
}

// Release drops every buffer the Call keeps for reuse, for a client that
// is parked (idle for a while). Only between uses, like Reset.
func (c *Call) Release() {
	c.dropOut()
	c.parts, c.ends, c.digests = nil, nil, nil
}

// Add appends one raw RESP command. The bytes must stay unchanged until Wait
// returns.
func (c *Call) Add(raw []byte) {
	c.parts = append(c.parts, raw)
	c.size += len(raw)
}

// AddRead is Add for a command that only reads, which Redis answers during
// CLIENT PAUSE WRITE (its table flags it readonly, not write): a Call of
// nothing else may go to a pool's spare connection (Pool.Send).
func (c *Call) AddRead(raw []byte) {
	c.parts = append(c.parts, raw)
	c.size += len(raw)
	c.reads++
}

// OnlyReads reports whether every command of c came through AddRead.
func (c *Call) OnlyReads() bool { return len(c.parts) > 0 && c.reads == len(c.parts) }

// CopyParts copies the commands into buf (from its length on) and points
// the Call at the copies, for a caller that will change the bytes it added
// before the Call completes. It returns buf with the copies.
func (c *Call) CopyParts(buf []byte) []byte {
	start := len(buf)
	for _, part := range c.parts {
		buf = append(buf, part...)
	}
	for i, part := range c.parts {
		end := start + len(part)
		c.parts[i] = buf[start:end:end]
		start = end
	}
	return buf
}

// SetOnDone makes f run when the Call completes (every reply in, or the
// Call failed), on the goroutine that completes it (a Pipe's reader), just
// before Wait returns. f runs where every later Call on the connection
// waits for it, so it must not block. Reset clears it.
func (c *Call) SetOnDone(f func(*Call)) { c.onDone = f }

// Len is the number of commands in the Call.
func (c *Call) Len() int { return len(c.parts) }

// ReplyBytes is the length of the replies kept so far, all together: for
// a router that copies them on, to make room for them at once.
func (c *Call) ReplyBytes() int { return len(c.out) }

// Wait blocks until every reply has arrived or the Call failed.
func (c *Call) Wait() { <-c.done }

// Done is signalled (once) when the Call completes; receiving from it takes
// the place of Wait.
func (c *Call) Done() <-chan struct{} { return c.done }

// SetReplyLimit caps the bytes of replies the Call keeps; set it before
// Send. A client's replies are held here until the whole Call is answered,
// so this is what bounds the memory one client's pipeline can take. A
// Call sent with none gets its Pipe's Options.ReplyLimit.
func (c *Call) SetReplyLimit(n int) { c.limit = max(n, 1) }

// SetMaxReply makes the Call keep no reply longer than n bytes (0: keep
// every reply, the default): of a longer reply it keeps a Digest (its
// length, a hash of all its bytes, its first DigestHead bytes), and a Pipe
// reads it through its read buffer without ever holding it whole, so a
// reply of any size costs a bounded amount of memory. For a caller that
// only compares or classifies replies (the mirror), never one that
// forwards them. Set it before Send; Reply answers ErrDigested for those
// replies.
func (c *Call) SetMaxReply(n int) { c.maxReply = max(n, 0) }

// Overflowed reports whether replies were dropped for the reply limit.
func (c *Call) Overflowed() bool { return c.overflow }

// Dropped is the index of the first reply dropped for the reply limit,
// past every reply's when none was.
func (c *Call) Dropped() int {
	if !c.overflow {
		return math.MaxInt
	}
	return c.dropped
}

// MaxReply is the size of the largest reply the Call holds.
func (c *Call) MaxReply() int {
	largest, start := 0, 0
	for _, end := range c.ends {
		largest = max(largest, end-start)
		start = end
	}
	return largest
}

// addReply stores one framed reply, unless the reply limit has been
// reached, or its digest if it is longer than maxReply.
func (c *Call) addReply(frame []byte) {
	if c.maxReply > 0 && len(frame) > c.maxReply {
		c.addDigest(int64(len(frame)), maphash.Bytes(digestSeed, frame), frame[:min(len(frame), DigestHead)])
		return
	}
	if !c.overflow && c.limit > 0 && c.over(len(frame)) {
		c.overflow, c.dropped = true, len(c.ends)
	}
	if !c.overflow {
		c.out = append(c.out, frame...)
	}
	c.ends = append(c.ends, len(c.out))
}

// reserve returns the reply buffer with room for n more bytes, grown into
// one from bufpool if it lacked it: a client at -P 1 goes idle after
// every reply and drops a buffer this large each time (Trim), and the next
// reply finds it in the pool. Only the Pipe's reader, or a router adding
// the Call's replies (AddReplyAppend), calls it, before the Call
// completes, so the old buffer holds only replies nobody has read.
func (c *Call) reserve(n int) []byte {
	if cap(c.out)-len(c.out) >= n {
		return c.out
	}
	out := bufpool.Get(len(c.out) + n)[:len(c.out)]
	bufpool.Copy(out, c.out)
	bufpool.Put(c.out)
	return out
}

// over reports whether n more bytes pass the reply limit, counting them
// against the shared budget if there is one.
func (c *Call) over(n int) bool {
	if len(c.out)+n > c.limit {
		return true
	}
	return c.budget != nil && c.budget.Add(int64(n)) > int64(c.limit)
}

// addDigest stores the digest of a reply longer than maxReply: n bytes
// long, sum their hash, head the first of them. Its head counts against
// the reply limit.
func (c *Call) addDigest(n int64, sum uint64, head []byte) {
	if !c.overflow && c.limit > 0 && c.over(len(head)) {
		c.overflow, c.dropped = true, len(c.ends)
	}
	if !c.overflow {
		c.digests = append(c.digests, digest{i: len(c.ends), n: n, sum: sum})
		c.out = append(c.out, head...)
	}
	c.ends = append(c.ends, len(c.out))
}

// addDropped stands for a reply the Pipe read past without keeping it:
// the Call had overflowed its reply limit.
func (c *Call) addDropped() { c.ends = append(c.ends, len(c.out)) }

// DigestHead is how many of a digested reply's first bytes its Digest
// keeps: enough to tell an error and its code.
const DigestHead = 64

// Digest stands for a reply longer than the Call's SetMaxReply, which
// was not kept.
type Digest struct {
	Len int64  // the reply's length in bytes
	Sum uint64 // a hash of all of them (hash/maphash, one seed per process)
	// Head is the reply's first DigestHead bytes (all of them if
	// shorter); valid until Reset.
	Head []byte
}

type digest struct {
	i   int // the reply's index
	n   int64
	sum uint64
}

// digestSeed is the process's seed for Digest.Sum, so that the digest of
// a reply read from Redis and DigestOf of bytes held compare.
var digestSeed = maphash.MakeSeed()

// DigestOf is the Digest of a reply held whole: equal to a digested
// reply's if and only if (but for a 64-bit hash collision) the bytes are.
func DigestOf(frame []byte) Digest {
	return Digest{Len: int64(len(frame)), Sum: maphash.Bytes(digestSeed, frame), Head: frame[:min(len(frame), DigestHead)]}
}

// Digest returns the digest of reply i, if it was digested (Reply
// answered ErrDigested).
func (c *Call) Digest(i int) (Digest, bool) {
	k, ok := slices.BinarySearchFunc(c.digests, i, func(d digest, i int) int { return d.i - i })
	if !ok || c.overflow && i >= c.dropped {
		return Digest{}, false
	}
	d := c.digests[k]
	start := 0
	if i > 0 {
		start = c.ends[i-1]
	}
	return Digest{Len: d.n, Sum: d.sum, Head: c.out[start:c.ends[i]]}, true
}

// Reply returns reply i, or the error that ended the Call before reply i
// arrived. The bytes are valid until Reset.
func (c *Call) Reply(i int) ([]byte, error) {
	if c.overflow && i >= c.dropped && i < len(c.ends) {
		return nil, ErrOutputLimit
	}
	if len(c.digests) > 0 && i < len(c.ends) {
		if _, ok := slices.BinarySearchFunc(c.digests, i, func(d digest, i int) int { return d.i - i }); ok {
			return nil, ErrDigested
		}
	}
	if i < len(c.ends) {
		start := 0
		if i > 0 {
			start = c.ends[i-1]
		}
		return c.out[start:c.ends[i]], nil
	}
	if c.err != nil {
		return nil, c.err
	}
	return nil, errors.New("redproxy: reply " + strconv.Itoa(i) + " missing")
}

// Err is the error that ended the Call early, or nil if all replies came.
func (c *Call) Err() error { return c.err }

// Fail ends a Call that could not be sent, as if it had failed in flight.
func (c *Call) Fail(err error) { c.err = err }

func (c *Call) complete(err error) {
	c.err = err
	if c.onDone != nil {
		c.onDone(c)
	}
	c.done <- struct{}{}
}

// Part returns command i as it was added. A router that spreads one
// client's Call over several connections (cluster mode) reads the commands
// with it and fills the Call's replies with AddReply.
func (c *Call) Part(i int) []byte { return c.parts[i] }

// AddReply appends one whole reply frame as the Call's next reply, under
// the reply limit like a reply read from Redis. Only for a Call that is not
// sent on a Pipe, whose replies its owner fills in itself.
func (c *Call) AddReply(frame []byte) { c.addReply(frame) }

// AddReplyAppend is AddReply of a frame of n bytes that appendTo appends
// to the buffer it is given, so a large reply a router merges (a split
// MGET's, resp.Merged) is written once, where it is kept, rather than
// built apart and copied in.
func (c *Call) AddReplyAppend(n int, appendTo func(dst []byte) []byte) {
	if c.maxReply > 0 && n > c.maxReply {
		c.addReply(appendTo(nil)) // digested (the mirror's comparisons): rare
		return
	}
	if !c.overflow && c.limit > 0 && c.over(n) {
		c.overflow, c.dropped = true, len(c.ends)
	}
	if !c.overflow {
		if cap(c.out)-len(c.out) < n {
			// With room to spare, as append leaves: grown by n alone,
			// a pipeline of large merged replies copied all it held
			// for each (past bufpool.MaxSize reserve's buffer is exact;
			// 120 replies of 500 KB allocated 3.4 GB, found by review).
			c.out = c.reserve(max(n, len(c.out)/4))
		}
		c.out = appendTo(c.out)
	}
	c.ends = append(c.ends, len(c.out))
}

// SetReplyBudget makes the Call count the bytes it keeps in b as well,
// shared with the other Calls a router split one client's Call into: its
// reply limit then caps them all together. Without it each of n node
// calls could keep the whole limit, and one MGET across three nodes held
// 120 MB for a client limited to 16 MB (found by review). Set it with the
// limit, before the Call is sent; Reset clears it.
func (c *Call) SetReplyBudget(b *atomic.Int64) { c.budget = b }

// ReplyLimit is the cap SetReplyLimit set (0: none; once sent on a Pipe,
// the connection's if none was set), for a router that spreads the Call
// over other Calls and must cap those too.
func (c *Call) ReplyLimit() int { return c.limit }

// Overflow marks the Call as over its reply limit from its next reply on,
// as if that reply had not fitted: for a router whose own Calls overflowed.
func (c *Call) Overflow() {
	if !c.overflow {
		c.overflow, c.dropped = true, len(c.ends)
	}
}
