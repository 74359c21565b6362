package resp

import (
	"io"
	"iter"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/redproxy/redproxy/internal/bufpool"
	"github.com/tidwall/redcon"
)

// Limits caps what one client may declare or send. Every cap is checked on
// the declared size, before any memory is committed to it, and the read
// buffer grows as bytes actually arrive: to at most eagerFactor times what
// has come.
type Limits struct {
	MaxArgs    int   // arguments in one multibulk request
	MaxBulk    int64 // bytes in one argument (Redis: proto-max-bulk-len)
	MaxRequest int64 // bytes in one whole request, headers included
	MaxInline  int   // bytes in one inline (telnet-style) request line
	// MaxBatch caps the requests one ReadBatch returns (0: no cap). The
	// rest stay buffered for the next batch, so a client cannot make the
	// proxy keep bookkeeping for millions of requests at once.
	MaxBatch int
}

// DefaultLimits mirror Redis's own defaults: proto-max-bulk-len for an
// argument, client-query-buffer-limit for a request, which must hold the
// largest argument and the rest of its command.
var DefaultLimits = Limits{
	MaxArgs:    1024 * 1024,
	MaxBulk:    512 << 20,
	MaxRequest: 1 << 30,
	MaxInline:  64 << 10,
	MaxBatch:   DefaultMaxBatch,
}

// DefaultMaxBatch is enough to keep the round trips of a deep pipeline
// amortised; beyond it a batch only costs memory.
const DefaultMaxBatch = 1024

// MaxExtendedBatch bounds a batch that Extend grew past its cap.
const MaxExtendedBatch = 2 * DefaultMaxBatch

// ProtocolError is a request the proxy cannot frame. As in Redis, the client
// gets "-ERR Protocol error: ..." and the connection is closed, because the
// rest of the stream can no longer be split into requests reliably.
type ProtocolError struct{ Msg string }

func (e *ProtocolError) Error() string { return "Protocol error: " + e.Msg }

// Is lets errors.Is(err, ErrProtocol) match every ProtocolError.
func (e *ProtocolError) Is(target error) bool { return target == ErrProtocol }

var (
	errMultibulkLen = &ProtocolError{"invalid multibulk length"}
	errBulkLen      = &ProtocolError{"invalid bulk length"}
	errInlineLen    = &ProtocolError{"too big inline request"}
	errQuotes       = &ProtocolError{"unbalanced quotes in request"}
	errInlineNUL    = &ProtocolError{"NUL in inline request"}
)

// Request is one client command. Args and Raw point into the Reader's
// buffers and stay valid only until the next ReadBatch.
type Request struct {
	Args [][]byte
	// Raw is the request as RESP multibulk bytes, ready to forward. For a
	// multibulk request these are the client's own bytes; an inline request
	// is re-encoded.
	Raw []byte
}

// headerWindow bounds how far we look for the end of a "*N" or "$N" line: a
// longer line cannot hold a valid length, so waiting for more would only let
// a client grow the buffer without limit.
const headerWindow = 32

// minBuffer is the read buffer of a client that is sending. Buffers of this
// size come from a pool and go back to it while their client is idle.
const minBuffer = 16 << 10

var bufPool = sync.Pool{New: func() any { return new([minBuffer]byte) }}

// Reader splits a client's byte stream into requests. It parses on its read
// buffer without copying; a request cut by a read boundary is resumed from
// the last complete argument, so a request with many arguments arriving in
// many reads is parsed once.
//
// A client that has nothing buffered holds no read buffer: on a socket the
// Reader waits for readability without one (see readRaw), so ten thousand
// idle clients do not hold ten thousand buffers.
type Reader struct {
	rd  io.Reader
	lim Limits
	// unauth: the client has not authenticated where it must
	// (SetUnauthenticated).
	unauth bool
	// batchCap, when set, lowers lim.MaxBatch while it holds a smaller
	// positive value (SetBatchCap).
	batchCap *atomic.Int32
	// extendTo, while Extend parses, is the batch's cap in its place
	// (0: the usual one).
	extendTo int
	// parses counts parseAll's runs, for tests of how often a batch is
	// parsed again.
	parses int
	// raw is rd's socket, read directly so that the wait for an idle
	// client needs no buffer; nil when rd has none, and then the buffer is
	// kept once taken.
	raw     syscall.RawConn
	readFn  func(fd uintptr) bool // r.readRaw, bound once: a read allocates nothing
	readN   int                   // what the last readFn call read
	readErr error                 // and the error it ended with (io.EOF on end of stream)
	// nextRead and stopReads drive reads, the coroutine that reads the
	// socket (see reads); nil until the Reader has made
	// readsBeforeCoroutine reads without it (plainReads counts them), and
	// after Release.
	nextRead   func() (struct{}, bool)
	stopReads  func()
	plainReads uint8
	// short: the last read returned less than it asked for (reads).
	short bool
	// readFirst: after a short read, read again before waiting
	// (SetReadFirst).
	readFirst bool
	// afterFull: the last read filled the space it had, so the short
	// read that ends the run is read after once more before the wait
	// (reads).
	afterFull bool
	buf       []byte
	pooled    *[minBuffer]byte // the pool buffer behind buf, if it is one
	large     bool             // buf came from bufpool (grow), and goes back there
	// need is how many bytes, from its first, the request being parsed
	// needs buffered before its argument being read is whole: grow
	// makes room for that in larger steps than doubling (eagerFactor).
	need int
	// idleBytes, set by WaitSmall, is what an idle client's wait reads
	// into when there is no socket to wait on.
	idleBytes []byte
	r, w      int // unread bytes are buf[r:w]
	// received counts the bytes read from the connection (Received).
	received uint64
	onIdle   func()

	// State of a multibulk request whose arguments are not all buffered yet.
	// Offsets are relative to the request's first byte, so they survive the
	// buffer being compacted or grown.
	partial bool
	nargs   int
	pos     int
	offs    []int

	args      [][]byte
	reqs      []Request
	inlineRaw []byte

	// batchStart is where in buf the batch ReadBatch last returned
	// begins, for Extend to parse it again with what follows it.
	batchStart int
}

// NewReader returns a Reader with the given limits. When rd is a
// syscall.Conn (a TCP or Unix connection, or a wrapper forwarding
// SyscallConn) its socket is read directly and rd.Read is never called, so
// a wrapper that changes the bytes it reads must not forward SyscallConn.
// On a socket the Reader may hold the socket's read side between calls
// (see reads): its owner calls Close when done with it, before closing the
// socket, which would otherwise wait for the Reader.
func NewReader(rd io.Reader, lim Limits) *Reader {
	r := &Reader{rd: rd, lim: lim}
	if sc, ok := rd.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil && rawReadable {
			r.raw = raw
			r.readFn = r.readRaw
		}
	}
	return r
}

// OnIdle sets f to run, on the goroutine calling ReadBatch, whenever the
// Reader has given back its buffer because the client has nothing more to
// send, just before waiting for it: the moment for the caller to give back
// its own per-batch buffers too. It runs only on a socket (see NewReader)
// or after WaitSmall.
func (r *Reader) OnIdle(f func()) { r.onIdle = f }

// idleWaitBytes is what WaitSmall reads into: a short request fits.
const idleWaitBytes = 64

// WaitSmall is for a source that is not a socket but keeps what it decoded
// and was not asked for (a *tls.Conn, which decrypts whole records): with
// nothing buffered, the Reader gives its buffer back and waits with a read
// of a few bytes, then takes a buffer and reads the rest, which the source
// returns without waiting. An idle client then holds no read buffer here,
// at the price of a second Read per batch whose request is longer than
// idleWaitBytes. It has no effect on a socket, which is waited on directly.
func (r *Reader) WaitSmall() {
	if r.raw == nil {
		r.idleBytes = make([]byte, idleWaitBytes)
	}
}

// Parkable reports whether the client's next bytes can only be in its
// socket: the Reader reads the socket directly (see NewReader) and holds
// none of its bytes, not even part of a request. Only then may the caller
// wait for the socket's readiness instead of in ReadBatch.
func (r *Reader) Parkable() bool { return r.raw != nil && r.r == r.w && !r.partial }

// SetReadFirst makes the Reader read the socket again before it waits
// after a short read, for an owner that has no other way to notice a
// client gone. A short read takes the bytes that came with the client's
// FIN, and the FIN raises no new readiness: without this the wait that
// follows lasts until a deadline (found by review: a client that sent its
// last command and half-closed stayed connected). The read costs one
// system call per batch (the empty read the coroutine saves at -P 1), so
// the proxy asks for it only for sessions its parking sweeper never looks
// at.
func (r *Reader) SetReadFirst(on bool) { r.readFirst = on }

// Release drops everything the Reader keeps between batches (its read
// buffer and request bookkeeping), for a client parked for a while; the
// next ReadBatch takes what it needs again. Only when Parkable.
func (r *Reader) Release() {
	r.Close()
	r.plainReads = 0 // an idle client starts over without the coroutine
	r.releaseBuffer()
	r.offs, r.args, r.reqs, r.inlineRaw = nil, nil, nil, nil
}

// BufferCap is the capacity of the read buffer the Reader holds: 0 while
// its client is idle on a socket.
func (r *Reader) BufferCap() int { return cap(r.buf) }

// ReadBatch returns the complete requests that are buffered, at most
// MaxBatch of them, reading from the connection first if there is none. All
// returned slices are invalidated by the next call. On a ProtocolError the
// requests parsed before the bad one are returned with it, so their replies
// can still be sent in order.
func (r *Reader) ReadBatch() ([]Request, error) {
	// Cleared, not just truncated: the buffer they point into may go back
	// to the pool, or be a large one that must not be kept alive.
	clear(r.reqs)
	clear(r.args)
	r.reqs = r.reqs[:0]
	r.args = r.args[:0]
	r.inlineRaw = r.inlineRaw[:0]
	// Compact only when more must be read: a buffer holding many batches
	// would otherwise be copied once per batch.
	r.batchStart = r.r
	if err := r.parseAll(); len(r.reqs) > 0 || err != nil {
		return r.reqs, err
	}
	r.compact()
	for {
		r.batchStart = r.r
		err := r.parseAll()
		if len(r.reqs) > 0 || err != nil {
			return r.reqs, err
		}
		if r.w == len(r.buf) {
			r.grow()
		}
		if err := r.fill(); err != nil {
			return nil, err
		}
	}
}

// Extend is for a caller whose decisions about a batch depend on what the
// client sent after it (the policy's look-ahead, which trusts a later
// EXPIRE for an earlier write's TTL): one write of a client can be split
// over batches wherever a read ends or the batch's cap falls, and a
// pipeline past the read buffer's 16 KB always is. When the client has
// sent more than the last batch that ReadBatch or Extend returned (part of
// a request is buffered, or the last read filled the buffer), Extend
// returns that batch again with the requests that follow it, all parsed
// anew: those already buffered if there are any, else those that reads
// bring, read until at least one request is whole (a large argument
// arrives over several reads: found by a probe, whose 70 KB value between
// a write and its EXPIRE ended the look-ahead at the first read); more
// reports whether there are any. The batch may grow past its cap by
// extra requests (0: not past it), to MaxExtendedBatch at most: a write
// and its EXPIRE on either side of the cap's boundary were decided apart
// (found by the same probe). A nil reqs means nothing was done and the
// batch stands: no sign of more, or the batch already holds maxBytes or
// as many requests as it may. Otherwise the slices returned before are
// invalidated, as by ReadBatch, and reqs replaces them. A read that ends
// in an error, or at the read deadline the caller sets to bound the wait,
// ends the reading (the error comes again at the next read). Only right
// after ReadBatch or Extend, before anything else reads the connection.
func (r *Reader) Extend(maxBytes, extra int) (reqs []Request, more bool) {
	n := len(r.reqs)
	if limit := r.batchLimit(); extra > 0 && limit > 0 {
		r.extendTo = min(max(limit, n+extra), MaxExtendedBatch)
		defer func() { r.extendTo = 0 }()
	}
	if r.r == r.w && r.w < len(r.buf) || r.w-r.batchStart >= maxBytes || r.batchFull() {
		return nil, false
	}
	// The batch again from its first byte, with what complete requests
	// are buffered after it (a batch cut by a load cap that has lifted
	// since): a read would wait for a client that is waiting for its
	// replies (found by review).
	r.rewind()
	if _ = r.parseAll(); len(r.reqs) > n {
		return r.reqs, true
	}
	// Nothing complete after it: read more, and parse the batch again from
	// its first byte (a request cut short is parsed from its start rather
	// than resumed), once the argument being read can be whole: parsed
	// again after every read, a value trickled in tiny pieces cost a parse
	// of the whole batch per piece (found by review: 1.6 s of CPU for
	// 20 KB sent a byte at a time behind 1,000 requests).
	r.rewind()
	for {
		if r.w == len(r.buf) {
			r.grow() // compacts first: the batch moves to the front
		}
		r.batchStart = r.r
		err := r.fill() // an error ends the reading, and comes again
		if err == nil && r.w-r.batchStart < min(r.need, maxBytes) {
			continue // need counts from the batch's start (rewind)
		}
		perr := r.parseAll()
		if err != nil || perr != nil || len(r.reqs) > n || r.w-r.batchStart >= maxBytes {
			// (A protocol error, too, comes again at the next ReadBatch.)
			return r.reqs, len(r.reqs) > n
		}
		r.rewind()
	}
}

// rewind undoes the parse of the batch that starts at batchStart.
func (r *Reader) rewind() {
	if r.need > 0 {
		// need counts from where the parse stopped, the start of the
		// request cut short; grow reads it from the batch's start (found
		// by review: taken as is, Extend grew the buffer smaller than
		// what it held, and the session panicked).
		r.need += r.r - r.batchStart
	}
	clear(r.reqs)
	clear(r.args)
	r.reqs, r.args, r.inlineRaw = r.reqs[:0], r.args[:0], r.inlineRaw[:0]
	r.r = r.batchStart
	r.partial, r.nargs, r.pos, r.offs = false, 0, 0, r.offs[:0]
}

// Received is how many bytes the Reader has read from its connection: a
// caller whose read ended at a deadline tells a client that sent nothing
// from one still sending a request.
func (r *Reader) Received() uint64 { return r.received }

// Buffered reports whether the Reader holds bytes it has not returned as
// requests: part of a request, or requests past a batch's limit.
func (r *Reader) Buffered() bool { return r.r < r.w }

// batchFull reports whether the batch holds as many requests as one may.
func (r *Reader) batchFull() bool {
	limit := r.batchLimit()
	return limit > 0 && len(r.reqs) >= limit || r.unauth
}

// batchLimit is how many requests a batch may hold now (0: no cap).
func (r *Reader) batchLimit() int {
	if r.extendTo > 0 {
		return r.extendTo
	}
	limit := r.lim.MaxBatch
	if r.batchCap != nil {
		if c := int(r.batchCap.Load()); c > 0 && (limit <= 0 || c < limit) {
			limit = c
		}
	}
	return limit
}

// fill reads once from the connection into buf[w:]. It returns an error
// only when nothing was read.
func (r *Reader) fill() error {
	if r.raw == nil {
		if r.idleBytes != nil && r.w == 0 {
			return r.fillIdle()
		}
		n, err := r.rd.Read(r.buf[r.w:])
		r.w += n
		r.received += uint64(n)
		if n == 0 && err != nil {
			return err
		}
		return nil
	}
	r.readN, r.readErr = 0, nil
	if r.nextRead == nil {
		if r.plainReads < readsBeforeCoroutine {
			r.plainReads++
			return r.fillPlain()
		}
		r.nextRead, r.stopReads = iter.Pull(r.reads)
	}
	r.nextRead()
	r.w += r.readN
	r.received += uint64(r.readN)
	if r.readN == 0 {
		return r.readErr
	}
	return nil
}

// readsBeforeCoroutine is how many reads a Reader on a socket makes with a
// RawConn.Read of their own (fillPlain) before it starts the coroutine
// (reads). The coroutine is a goroutine, and the runtime never frees a
// goroutine's record (480 bytes): it keeps every one the process ever had
// at once for reuse, so a burst of clients that each send a request or two
// and go idle would leave two records each. Most clients of a pool do just
// that; they now never start one. A client that keeps sending pays the
// empty read the coroutine saves twice more, once per Reader (a client
// resumed after parking has a new one).
const readsBeforeCoroutine = 2

// fillPlain is fill without the coroutine: one RawConn.Read, which reads
// at once and waits only for an empty socket (readRaw).
func (r *Reader) fillPlain() error {
	err := r.raw.Read(r.readFn)
	r.afterFull = r.readN > 0 && !r.short
	r.short = false
	if err != nil {
		return err // a deadline or close ended the wait: nothing was read
	}
	r.w += r.readN
	r.received += uint64(r.readN)
	if r.readN == 0 {
		return r.readErr
	}
	return nil
}

// reads is the coroutine behind fill on a socket: each step reads once
// into buf[w:] and yields, leaving readN and readErr for fill.
//
// It exists to save the read(2) that finds the socket empty (EAGAIN) before
// every wait: a client at -P 1 has sent nothing more when its reply goes
// out, so reading again first, as a fresh RawConn.Read must, costs one
// wasted system call per request. Here a read that returned less than it
// asked for yields from inside the RawConn.Read callback, and when fill
// asks for more the callback returns false, so RawConn.Read waits for
// readability without reading first.
//
// Why that misses nothing. RawConn.Read (internal/poll.FD.RawRead) clears
// the descriptor's read readiness once, when it starts (prepareRead), then
// calls the callback, and each time the callback returns false waits
// (waitRead) until the runtime's edge-triggered epoll has reported the
// socket readable since that clearing or since the last wait returned. A
// short read emptied the socket at that moment; bytes the client sends
// later raise a new edge, which the poller records, or delivers to the
// waiting goroutine, and nothing clears it before the wait: the readiness
// is cleared only by prepareRead, before the first read, and by the wait
// that consumes it. A fresh RawConn.Read would clear readiness recorded
// after the short read, so the wait must happen inside the same call,
// hence the coroutine. A read that filled the space may have left bytes
// with no new edge: that call ends (yielding outside it) and the next read
// starts a fresh call, which reads first. The wait may also return for
// bytes a read already took; the read then finds the socket empty and the
// callback waits again.
//
// Between batches that followed a short read the coroutine holds the
// descriptor's read lock and a reference to it: no one else may read the
// socket through RawConn.Read meanwhile (the session peeks with Control),
// and Close takes effect when the coroutine ends, which Close and Release
// make it do. Deadlines and Close still end every wait, as before, since
// every read after a yield is preceded by prepareRead or waitRead.
func (r *Reader) reads(yield func(struct{}) bool) {
	for {
		stopped := false
		err := r.raw.Read(func(fd uintptr) bool {
			for {
				if !r.readFn(fd) {
					return false // empty: wait
				}
				if r.readN == 0 || !r.short {
					r.afterFull = r.readN > 0
					return true // an error, the end, or a full read: yield outside
				}
				if !yield(struct{}{}) {
					stopped = true
					return true
				}
				r.short = false
				if !r.readFirst && !r.afterFull {
					r.waiting()
					return false // fill wants more: wait, without reading first
				}
				// A run of reads that filled the buffer (a pipeline
				// longer than it) ended with this short one: a FIN that
				// came with its last bytes raised no edge of its own, so
				// read once more (found by review: a client half-closing
				// behind 1,200 commands or more waited until its session
				// parked, 2 s, for the end). Pipelines that fit the
				// buffer, every -P 1 or -P 16 client, pay nothing.
				r.afterFull = false
			}
		})
		if stopped {
			return
		}
		r.short = false
		if err != nil {
			r.readN, r.readErr = 0, err
		}
		if !yield(struct{}{}) {
			return
		}
	}
}

// Close ends the Reader's use of its socket (see reads); it is for the
// Reader's owner, when it is done with it. ReadBatch must not be called
// after it.
func (r *Reader) Close() {
	if r.stopReads != nil {
		r.stopReads()
		r.nextRead, r.stopReads = nil, nil
	}
}

// fillIdle is fill with nothing buffered and no socket: the wait for the
// client's next bytes holds only idleBytes (WaitSmall).
func (r *Reader) fillIdle() error {
	r.releaseBuffer()
	r.idle()
	n, err := r.rd.Read(r.idleBytes)
	if n == 0 {
		return err
	}
	r.takeBuffer()
	r.w = copy(r.buf, r.idleBytes[:n])
	r.received += uint64(n)
	return nil
}

// readRaw tries one non-blocking read of the socket. On an empty socket it
// gives the buffer back if it holds nothing, and reports false so that
// RawConn.Read waits for bytes; the buffer is taken again when they come.
func (r *Reader) readRaw(fd uintptr) bool {
	if r.buf == nil {
		r.takeBuffer()
	}
	for {
		n, err := readFD(fd, r.buf[r.w:])
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
			r.waiting()
			return false
		case err != nil:
			r.readErr = &os.SyscallError{Syscall: "read", Err: err}
		case n == 0:
			r.readErr = io.EOF
		default:
			r.readN = n
			r.short = n < len(r.buf)-r.w
		}
		return true
	}
}

// waiting is called before waiting for the socket to become readable: a
// Reader that holds none of the client's bytes gives its buffer back.
func (r *Reader) waiting() {
	if r.w == 0 {
		r.releaseBuffer()
		r.idle()
	}
}

// idleKeepArgs is how many arguments' bookkeeping an idle Reader keeps.
// One request of a million arguments grows offs and args to tens of
// megabytes; Release (parking) drops them, but a client that cannot park
// (TLS, under WATCH or in MULTI, idle_park_after = 0) kept them for as
// long as it stayed connected.
const idleKeepArgs = 4096

// idle runs with nothing buffered, before the wait for the client's next
// bytes: no request refers to offs or args any more.
func (r *Reader) idle() {
	if cap(r.offs) > 2*idleKeepArgs {
		r.offs = nil
	}
	if cap(r.args) > idleKeepArgs {
		r.args = nil
	}
	if r.onIdle != nil {
		r.onIdle()
	}
}

func (r *Reader) takeBuffer() {
	r.pooled = bufPool.Get().(*[minBuffer]byte)
	r.buf = r.pooled[:]
}

// releaseBuffer drops the buffer, which must hold nothing: a pool buffer
// goes back to the pool, one grown for a large request to the collector.
func (r *Reader) releaseBuffer() {
	r.dropBuffer()
	r.buf = nil
	r.r, r.w = 0, 0
}

// dropBuffer gives buf back to the pool it came from, if any; the caller
// replaces buf.
func (r *Reader) dropBuffer() {
	if r.pooled != nil {
		bufPool.Put(r.pooled)
		r.pooled = nil
	}
	if r.large {
		bufpool.Put(r.buf)
		r.large = false
	}
}

// compact moves unread bytes to the front, and gives back a buffer that a
// large request grew once it is no longer needed, so a client holds only
// minBuffer.
func (r *Reader) compact() {
	if r.r == 0 {
		return
	}
	if r.r == r.w && (r.raw != nil || r.idleBytes != nil) {
		// Nothing buffered: readRaw gives the buffer back if the client
		// has nothing more to send right now.
		r.r, r.w = 0, 0
		if r.pooled == nil {
			r.releaseBuffer() // a grown one: do not keep it for the next batch
		}
		return
	}
	n := bufpool.Copy(r.buf, r.buf[r.r:r.w])
	r.r, r.w = 0, n
	if len(r.buf) > 4*minBuffer && n <= minBuffer {
		large, fromPool := r.buf, r.large
		r.large = false
		r.takeBuffer()
		copy(r.buf, large[:n])
		if fromPool {
			bufpool.Put(large)
		}
	}
}

// grow makes room to read more of a request that fills the buffer, or
// takes a buffer if there is none. The parser has already checked the
// request's declared sizes against the limits, so this growth is bounded by
// MaxRequest (or MaxInline).
//
// A request waiting for the rest of a large argument gets room for up to
// eagerFactor times the bytes buffered, or all it needs if less: a 100 KB
// argument takes two steps (64 KB, then its size) instead of a doubling
// per 16, 32, 64 KB... read, from bufpool, and arrives in fewer reads.
// Room is never more than eagerFactor times what the client has sent (and
// a quarter more past bufpool's classes), so
// a client declaring a huge argument and sending little holds little
// (found by review: sized to the declaration up to 256 KB, 200 clients
// that each sent 20 KB of a declared 10 MB made the proxy hold 52 MB).
func (r *Reader) grow() {
	if r.buf == nil {
		// On a socket, readRaw takes one once there are bytes to read;
		// after WaitSmall, fillIdle does.
		if r.raw == nil && r.idleBytes == nil {
			r.takeBuffer()
		}
		return
	}
	if r.r > 0 {
		r.compact()
		if r.w < len(r.buf) {
			return
		}
	}
	size := 2 * len(r.buf)
	if r.need > r.w {
		// Room for the argument being read and no more: doubling a
		// full 256 MB buffer for the last 35 bytes of a 256 MB SET
		// took 512 MB. Past bufpool's classes (whose rounding up would
		// double it again) nor a step that leaves a sliver to grow for
		// again (another copy of all that came).
		size = max(size, eagerFactor*r.w)
		if r.need < size || r.need > bufpool.MaxSize && r.need < size+size/4 {
			size = r.need
		}
	}
	nb := bufpool.Get(size)
	bufpool.Copy(nb, r.buf[:r.w])
	r.dropBuffer()
	r.buf, r.large = nb, bufpool.Pooled(cap(nb))
}

// eagerFactor bounds grow's room by the bytes that have come.
const eagerFactor = 4

// SetUnauthenticated applies Redis's limits for a client that has yet to
// authenticate: at most 10 arguments and 16 KB per argument, a protocol
// error past them, so that nobody who cannot log in can make the proxy
// buffer a huge request. Meanwhile each batch holds one request, so the
// limits lift from the request after a successful AUTH or HELLO on, as in
// Redis, which parses a request only once it has run the one before.
func (r *Reader) SetUnauthenticated(on bool) { r.unauth = on }

// Redis's limits for clients that have not authenticated
// (networking.c: processMultibulkBuffer).
const (
	unauthMaxArgs = 10
	unauthMaxBulk = 16 * 1024
)

var (
	errUnauthMultibulkLen = &ProtocolError{"unauthenticated multibulk length"}
	errUnauthBulkLen      = &ProtocolError{"unauthenticated bulk length"}
)

// SetBatchCap makes the Reader read a cap on its batches from c, which
// its owner may change at any time: a server under load gives every
// client smaller batches, so the bookkeeping each keeps per request stays
// small however many are served at once.
func (r *Reader) SetBatchCap(c *atomic.Int32) { r.batchCap = c }

func (r *Reader) parseAll() error {
	r.parses++
	r.need = 0
	limit := r.batchLimit()
	for r.r < r.w && (limit <= 0 || len(r.reqs) < limit) && !(r.unauth && len(r.reqs) > 0) {
		b := r.buf[r.r:r.w]
		var n int
		var err error
		if b[0] == '*' || r.partial {
			n, err = r.parseMultibulk(b)
		} else {
			n, err = r.parseInline(b)
		}
		if err != nil || n == 0 {
			return err
		}
		r.r += n
	}
	return nil
}

// parseMultibulk parses "*N\r\n" followed by N "$len\r\ndata\r\n" arguments.
// It returns the number of bytes consumed, or 0 when more bytes are needed.
func (r *Reader) parseMultibulk(b []byte) (int, error) {
	if !r.partial {
		nl := indexCRLF(b, 1)
		if nl < 0 {
			if nl == -2 || len(b) > headerWindow {
				return 0, errMultibulkLen
			}
			return 0, nil
		}
		n, ok := parseInt(b[1:nl])
		if !ok || n > int64(r.lim.MaxArgs) {
			return 0, errMultibulkLen
		}
		if r.unauth && n > unauthMaxArgs {
			return 0, errUnauthMultibulkLen
		}
		if n <= 0 {
			// Redis treats "*0" and "*-1" as an empty request and ignores it.
			return nl + 2, nil
		}
		r.partial = true
		r.nargs = int(n)
		r.pos = nl + 2
		r.offs = r.offs[:0]
	}
	if left := 2*r.nargs - len(r.offs); cap(r.offs)-len(r.offs) < left {
		// Grown for the arguments the buffered bytes can hold (each takes
		// six bytes at least), or to twice what it holds, never past what
		// the header claims: appending one pair at a time reallocated 5
		// times the final size on a million-argument request (an MGET of
		// 7 MB cost 200 MB). Doubling keeps a request arriving in many
		// reads from being copied once per read; what a connection kept
		// from an earlier request bounds what doubling it costs.
		r.offs = slices.Grow(r.offs, min(left, max(2*((len(b)-r.pos)/6+1), cap(r.offs))))
	}
	for len(r.offs) < 2*r.nargs {
		if r.pos >= len(b) {
			return 0, nil
		}
		if b[r.pos] != '$' {
			r.partial = false
			return 0, &ProtocolError{"expected '$', got '" + printable(b[r.pos]) + "'"}
		}
		nl := indexCRLF(b, r.pos+1)
		if nl < 0 {
			if nl == -2 || len(b)-r.pos > headerWindow {
				r.partial = false
				return 0, errBulkLen
			}
			return 0, nil
		}
		size, ok := parseInt(b[r.pos+1 : nl])
		if !ok || size < 0 || size > r.lim.MaxBulk {
			r.partial = false
			return 0, errBulkLen
		}
		if r.unauth && size > unauthMaxBulk {
			r.partial = false
			return 0, errUnauthBulkLen
		}
		start := nl + 2
		end := int64(start) + size
		if end+2 > r.lim.MaxRequest {
			r.partial = false
			return 0, &ProtocolError{"request exceeds " + strconv.FormatInt(r.lim.MaxRequest, 10) + " bytes (server.max_request_bytes)"}
		}
		if end+2 > int64(len(b)) {
			r.need = int(end + 2)
			return 0, nil
		}
		if b[end] != '\r' || b[end+1] != '\n' {
			// Redis takes the size's bytes and skips the next two without
			// looking at them, so "$4\r\nPINGxx" is PING there. Answered
			// alike, and with Raw made the request Redis read (the buffer
			// is ours), so whatever forwards or parses Raw again agrees.
			b[end], b[end+1] = '\r', '\n'
		}
		r.offs = append(r.offs, start, int(end))
		r.pos = int(end) + 2
	}
	r.partial = false
	first := len(r.args)
	r.args = slices.Grow(r.args, len(r.offs)/2)
	for i := 0; i < len(r.offs); i += 2 {
		r.args = append(r.args, b[r.offs[i]:r.offs[i+1]:r.offs[i+1]])
	}
	r.reqs = append(r.reqs, Request{Args: r.args[first:len(r.args):len(r.args)], Raw: b[:r.pos:r.pos]})
	return r.pos, nil
}

// parseInline parses a telnet-style line such as `SET k "v 1"`, following
// the quoting rules of redis-cli and Redis's own inline parser.
func (r *Reader) parseInline(b []byte) (int, error) {
	// As Redis (processInlineBuffer): refused once more than MaxInline
	// bytes are buffered with no newline among them, so a line of
	// MaxInline bytes before its '\n' is taken (found by review: the
	// newline at byte 65,537 was refused, which Redis always accepts).
	nl := -1
	limit := len(b)
	if limit > r.lim.MaxInline+1 {
		limit = r.lim.MaxInline + 1
	}
	for i := 0; i < limit; i++ {
		if b[i] == '\n' {
			nl = i
			break
		}
		if b[i] == 0 {
			// Redis finds the line's end with strchr, which stops here:
			// it would wait for 64 KB more and then refuse. Refused now.
			return 0, errInlineNUL
		}
	}
	if nl < 0 {
		if len(b) > r.lim.MaxInline {
			return 0, errInlineLen
		}
		return 0, nil
	}
	line := b[:nl]
	if len(line) > 0 && line[len(line)-1] == '\r' {
		line = line[:len(line)-1]
	}
	words, ok := splitInline(line)
	if !ok {
		return 0, errQuotes
	}
	if len(words) == 0 {
		return nl + 1, nil
	}
	start := len(r.inlineRaw)
	r.inlineRaw = redcon.AppendArray(r.inlineRaw, len(words))
	for _, w := range words {
		r.inlineRaw = redcon.AppendBulk(r.inlineRaw, w)
	}
	raw := r.inlineRaw[start:]
	// The words were copied by splitInline into memory of their own, so the
	// arguments need not point into the re-encoded bytes.
	first := len(r.args)
	r.args = append(r.args, words...)
	r.reqs = append(r.reqs, Request{Args: r.args[first:len(r.args):len(r.args)], Raw: raw[:len(raw):len(raw)]})
	return nl + 1, nil
}

func printable(c byte) string {
	if c < 32 || c > 126 {
		return "\\x" + strconv.FormatUint(uint64(c), 16)
	}
	return string(c)
}
