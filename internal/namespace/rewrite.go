package namespace

import (
	"bytes"

	"github.com/redproxy/redproxy/internal/commands"
)

// chunkSize is the size of a fresh arena chunk; larger arguments get a
// chunk of their own.
const chunkSize = 8 << 10

// keepChunk is the largest chunk kept from one batch to the next, so one
// huge batch does not pin its memory for the connection's lifetime.
const keepChunk = 32 << 10

// Rewriter rewrites commands for one Namespace. It is not safe for
// concurrent use: each client connection has its own. The argument slices
// it returns stay valid until Reset.
type Rewriter struct {
	ns *Namespace
	// buf and args are arenas: rewritten arguments are carved from them
	// and never moved, so slices handed out earlier in the batch stay
	// valid when a new chunk is started.
	buf    []byte
	args   [][]byte
	keyIdx []int
}

// NewRewriter returns a Rewriter for ns.
func NewRewriter(ns *Namespace) *Rewriter { return &Rewriter{ns: ns} }

// Namespace returns the rewriter's namespace.
func (w *Rewriter) Namespace() *Namespace { return w.ns }

// Reset makes the memory of everything rewritten so far reusable. Call it
// when no earlier result is referenced any more (between batches).
func (w *Rewriter) Reset() {
	if cap(w.buf) > keepChunk {
		w.buf = nil
	}
	if cap(w.args) > keepChunk/8 {
		w.args = nil
	}
	w.buf = w.buf[:0]
	w.args = w.args[:0]
}

// Release drops the arenas, for a connection that goes idle (a parked
// session holds no buffers); the next batch allocates afresh.
func (w *Rewriter) Release() {
	w.buf, w.args, w.keyIdx = nil, nil, nil
}

// alloc returns n bytes of arena.
func (w *Rewriter) alloc(n int) []byte {
	if cap(w.buf)-len(w.buf) < n {
		w.buf = make([]byte, 0, max(chunkSize, n))
	}
	b := w.buf[len(w.buf) : len(w.buf)+n : len(w.buf)+n]
	w.buf = w.buf[:len(w.buf)+n]
	return b
}

// allocArgs returns a copy of args with room for extra more, from the arena.
func (w *Rewriter) allocArgs(args [][]byte, extra int) [][]byte {
	n := len(args) + extra
	if cap(w.args)-len(w.args) < n {
		w.args = make([][]byte, 0, max(256, n))
	}
	out := w.args[len(w.args) : len(w.args)+len(args) : len(w.args)+n]
	w.args = w.args[:len(w.args)+n]
	copy(out, args)
	return out
}

// prefixed returns the prefix followed by b, from the arena.
func (w *Rewriter) prefixed(b []byte) []byte {
	p := w.ns.prefix
	out := w.alloc(len(p) + len(b))
	copy(out, p)
	copy(out[len(p):], b)
	return out
}

// Encode returns args as a RESP command, from the arena.
func (w *Rewriter) Encode(args [][]byte) []byte {
	n := 1 + digits(len(args)) + 2
	for _, a := range args {
		n += 1 + digits(len(a)) + 2 + len(a) + 2
	}
	out := w.alloc(n)[:0]
	out = appendHeader(out, '*', len(args))
	for _, a := range args {
		out = appendHeader(out, '$', len(a))
		out = append(out, a...)
		out = append(out, '\r', '\n')
	}
	return out
}

func digits(n int) int {
	d := 1
	for n >= 10 {
		n /= 10
		d++
	}
	return d
}

func appendHeader(dst []byte, typ byte, n int) []byte {
	dst = append(dst, typ)
	var tmp [20]byte
	i := len(tmp)
	for {
		i--
		tmp[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			break
		}
	}
	dst = append(dst, tmp[i:]...)
	return append(dst, '\r', '\n')
}

// Rewrite returns args with every key (and channel name, and key pattern)
// moved into the namespace, and what to do with the result. args is never
// modified. A command the table does not know (nil cmd) is refused: it
// may be a module command whose keys the proxy cannot find.
//
// Whatever Rewrite forwards satisfies the invariant the fuzz test checks:
// every argument cmd.Keys reports for the rewritten arguments starts with
// the prefix. A command whose keys cannot all be found (a key spec Redis
// itself marks incomplete, other than SORT's and MIGRATE's, which Keys
// handles) is refused rather than forwarded half-confined.
func (w *Rewriter) Rewrite(cmd *commands.Command, args [][]byte) ([][]byte, Result) {
	if len(args) == 0 {
		return args, Result{}
	}
	if cmd == nil {
		return args, Result{Action: Refuse, Err: "ERR redproxy: unknown command '" + printable(args[0]) + "' cannot be confined to a namespace"}
	}
	if !cmd.ArityOK(len(args)) {
		// Redis refuses it before looking at any argument.
		return args, Result{}
	}
	if why := refusal(cmd); why != "" {
		return args, Result{Action: Refuse, Err: RefusalError(cmd.Name, why)}
	}
	var res Result
	var out [][]byte
	switch cmd.Name {
	case "scan":
		if len(args)%2 != 0 {
			// An option without its value: Redis answers a syntax error
			// before scanning anything.
			return args, Result{}
		}
		out = w.scan(args)
		res.Strip = StripScan
	case "keys":
		out = w.allocArgs(args, 0)
		if len(out) > 1 {
			out[1] = w.prefixed(out[1])
		}
		res.Strip = StripKeys
	case "randomkey":
		return args, Result{Action: RandomKey, Strip: StripBulk}
	case "flushdb":
		return args, Result{Action: FlushDB}
	case "publish", "spublish":
		// Publishing to a keyevent channel would reach every namespace's
		// subscribers as if Redis had sent it; it stays in the namespace.
		out = w.allocArgs(args, 0)
		if len(out) > 1 {
			out[1] = w.prefixedChannel(out[1])
		}
	case "subscribe", "ssubscribe", "unsubscribe", "sunsubscribe", "psubscribe", "punsubscribe":
		if cmd.Name == "psubscribe" && anyUnconfinedKeyspace(args[1:]) {
			return args, Result{Action: Refuse, Err: RefusalError(cmd.Name, errKeyspacePattern)}
		}
		out = w.channels(args, 1, len(args))
	case "pubsub|channels", "pubsub|shardchannels":
		if len(args) > 2 && anyUnconfinedKeyspace(args[2:3]) {
			return args, Result{Action: Refuse, Err: RefusalError(cmd.Name, errKeyspacePattern)}
		}
		out = w.allocArgs(args, 1)
		if len(out) > 2 {
			out[2] = w.channel(out[2])
		} else if len(out) == 2 {
			out = append(out, w.ns.matchAll)
		}
		res.Strip = StripChannels
	case "pubsub|numsub", "pubsub|shardnumsub":
		out = w.channels(args, 2, len(args))
		res.Strip = StripPairs
	default:
		for i := range cmd.KeySpecs {
			if s := &cmd.KeySpecs[i]; !s.Complete() && s.Flags&commands.KeyNotKey == 0 &&
				cmd.Name != "sort" && cmd.Name != "sort_ro" && cmd.Name != "migrate" {
				return args, Result{Action: Refuse, Err: RefusalError(cmd.Name, "has keys the proxy cannot find")}
			}
		}
		out = w.keys(cmd, args)
		switch cmd.Name {
		case "sort", "sort_ro":
			w.sortPatterns(out)
		case "blpop", "brpop", "bzpopmin", "bzpopmax", "blmpop", "bzmpop", "lmpop", "zmpop":
			res.Strip = StripFirst
		case "xread", "xreadgroup":
			res.Strip = StripStreams
		case "xpending", "xclaim", "xautoclaim", "xinfo|consumers",
			"xgroup|setid", "xgroup|destroy", "xgroup|createconsumer", "xgroup|delconsumer":
			res.Strip = StripGroupError
		}
	}
	if !w.confined(cmd, out) {
		return args, Result{Action: Refuse, Err: RefusalError(cmd.Name, "has arguments that read as keys outside the namespace once rewritten")}
	}
	return out, res
}

// keys prefixes the arguments the command table says are keys.
func (w *Rewriter) keys(cmd *commands.Command, args [][]byte) [][]byte {
	w.keyIdx = cmd.Keys(args, w.keyIdx[:0])
	if len(w.keyIdx) == 0 {
		return args
	}
	out := w.allocArgs(args, 0)
	for _, i := range w.keyIdx {
		// A key reported twice (overlapping specs) is prefixed once.
		if sameSlice(out[i], args[i]) {
			out[i] = w.prefixed(args[i])
		}
	}
	return out
}

// sameSlice reports whether a and b are the same slice (not a copy).
func sameSlice(a, b []byte) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// confined reports whether every key cmd.Keys finds in args starts with the
// prefix. Prefixing moves no argument, but a keyword search (XREAD's
// STREAMS, GEORADIUS's STORE) may read the rewritten arguments differently
// from the original ones; such a command is refused, never sent.
func (w *Rewriter) confined(cmd *commands.Command, args [][]byte) bool {
	w.keyIdx = cmd.Keys(args, w.keyIdx[:0])
	for _, i := range w.keyIdx {
		if !bytes.HasPrefix(args[i], []byte(w.ns.prefix)) {
			return false
		}
	}
	return true
}

// scan prefixes SCAN's MATCH patterns, or adds MATCH prefix* so that the
// iteration only returns the namespace's keys.
func (w *Rewriter) scan(args [][]byte) [][]byte {
	out := w.allocArgs(args, 2)
	matched := false
	for i := 2; i+1 < len(out); i += 2 {
		if commands.EqualFold("match", out[i]) {
			out[i+1] = w.prefixed(out[i+1])
			matched = true
		}
	}
	if !matched {
		out = append(out, matchWord, w.ns.matchAll)
	}
	return out
}

var matchWord = []byte("MATCH")

// sortPatterns prefixes SORT's BY and GET patterns in place (out is the
// rewriter's own copy). "GET #" is the element itself, not a key.
func (w *Rewriter) sortPatterns(out [][]byte) {
	for opt, i := range commands.SortOptions(out) {
		switch {
		case opt == commands.SortBy:
			out[i] = w.prefixed(out[i])
		case opt == commands.SortGet && !(len(out[i]) == 1 && out[i][0] == '#'):
			out[i] = w.prefixed(out[i])
		}
	}
}

// channels moves args[from:to] into the namespace as channel names or
// patterns.
func (w *Rewriter) channels(args [][]byte, from, to int) [][]byte {
	out := w.allocArgs(args, 0)
	for i := from; i < to && i < len(out); i++ {
		out[i] = w.channel(out[i])
	}
	return out
}

// Keyspace and keyevent notification channels are named by Redis, not by
// clients: "__keyspace@<db>__:<key>" carries a key, so the prefix goes in
// front of the key; "__keyevent@<db>__:<event>" carries the key as the
// message, so the channel stays as it is and messages of other namespaces
// are dropped on the way out (PubSubFilter).
var (
	keyspacePrefix = []byte("__keyspace@")
	keyeventPrefix = []byte("__keyevent@")
	notifySep      = []byte("__:")
)

// channel returns a channel name or pattern to subscribe to, moved into
// the namespace.
func (w *Rewriter) channel(ch []byte) []byte {
	if bytes.HasPrefix(ch, keyeventPrefix) {
		return ch
	}
	return w.prefixedChannel(ch)
}

// prefixedChannel returns a channel name moved into the namespace: the
// prefix goes in front, or after a keyspace channel's "__keyspace@<db>__:"
// when <db> is a number. Anything else there could be a pattern reaching
// past the prefix: in "__keyspace@0[__:]*" the first "__:" is inside a
// character class, and in "__keyspace@*__:a:*" the "*" also matches
// "0__:b:x" (found by review: another tenant's keys were heard). Such a
// channel gets the prefix in front, like any other, and so hears only
// channels of the namespace: no keyspace notification.
func (w *Rewriter) prefixedChannel(ch []byte) []byte {
	if bytes.HasPrefix(ch, keyspacePrefix) {
		if at, ok := keyspaceKeyAt(ch); ok {
			p := w.ns.prefix
			out := w.alloc(len(ch) + len(p))
			copy(out, ch[:at])
			copy(out[at:], p)
			copy(out[at+len(p):], ch[at:])
			return out
		}
	}
	return w.prefixed(ch)
}

const errKeyspacePattern = "matches keyspace notifications of any database, which would reach past the namespace; name the database: __keyspace@0__:pattern"

// anyUnconfinedKeyspace reports whether a pattern names keyspace
// notifications with anything but a database number between "@" and
// "__:" (see prefixedChannel), which a namespace cannot confine.
func anyUnconfinedKeyspace(patterns [][]byte) bool {
	for _, ch := range patterns {
		if !bytes.HasPrefix(ch, keyspacePrefix) {
			continue
		}
		if _, ok := keyspaceKeyAt(ch); !ok {
			return true
		}
	}
	return false
}

// keyspaceKeyAt returns where the key starts in a keyspace channel
// "__keyspace@<db>__:<key>", and whether <db> is a database number.
func keyspaceKeyAt(ch []byte) (int, bool) {
	rest := ch[len(keyspacePrefix):]
	at := bytes.Index(rest, notifySep)
	if at <= 0 || !allDigits(rest[:at]) {
		return 0, false
	}
	return len(keyspacePrefix) + at + len(notifySep), true
}

func allDigits(b []byte) bool {
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// printable returns a command name for an error message: at most 64
// bytes, without control characters that would break the reply line.
func printable(b []byte) string {
	if len(b) > 64 {
		b = b[:64]
	}
	out := make([]byte, len(b))
	for i, c := range b {
		if c < ' ' || c == 0x7f {
			c = '?'
		}
		out[i] = c
	}
	return string(out)
}
