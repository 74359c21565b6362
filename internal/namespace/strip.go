package namespace

import (
	"bytes"
	"errors"
	"strconv"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/resp"
)

// StripReply appends reply to dst with the namespace's prefix taken off
// the key or channel names where kind says Redis puts them. Replies of
// another shape (errors, nulls, anything unexpected) are appended as they
// are: stripping only ever shortens a name the namespace itself created.
func (ns *Namespace) StripReply(dst []byte, kind Strip, reply []byte) []byte {
	if len(reply) > 0 && reply[0] == '-' {
		if kind == StripNone {
			return append(dst, reply...)
		}
		return ns.stripGroupError(dst, reply)
	}
	switch kind {
	case StripBulk:
		return ns.appendName(dst, reply, false)
	case StripKeys:
		return ns.stripEach(dst, reply, false, 1)
	case StripChannels:
		return ns.stripEach(dst, reply, true, 1)
	case StripPairs:
		return ns.stripEach(dst, reply, true, 2)
	case StripScan:
		typ, n, hdr := header(reply)
		if typ != '*' || n != 2 {
			break
		}
		cur := elemLen(reply[hdr:])
		if cur <= 0 {
			break
		}
		dst = append(dst, reply[:hdr+cur]...)
		return ns.stripEach(dst, reply[hdr+cur:], false, 1)
	case StripFirst:
		typ, n, hdr := header(reply)
		if !isArray(typ) || n < 1 {
			break
		}
		k := elemLen(reply[hdr:])
		if k <= 0 {
			break
		}
		dst = append(dst, reply[:hdr]...)
		dst = ns.appendName(dst, reply[hdr:hdr+k], false)
		return append(dst, reply[hdr+k:]...)
	case StripStreams:
		typ, n, hdr := header(reply)
		switch {
		case typ == '%':
			return ns.stripEach(dst, reply, false, 2)
		case isArray(typ) && n > 0:
			// [[name, entries], ...]: each element's first is a stream.
			start := len(dst)
			dst = append(dst, reply[:hdr]...)
			rest := reply[hdr:]
			for i := int64(0); i < n; i++ {
				e := elemLen(rest)
				if e <= 0 {
					return append(dst[:start], reply...)
				}
				dst = ns.StripReply(dst, StripFirst, rest[:e])
				rest = rest[e:]
			}
			return dst
		}
	}
	return append(dst, reply...)
}

// Where a NOGROUP error quotes the stream's name: first in XREADGROUP's,
// XPENDING's, XCLAIM's and XAUTOCLAIM's ("No such key 'K' or consumer
// group 'G'"), after the group in XGROUP's and XINFO CONSUMERS' ("No such
// consumer group 'G' for key name 'K'").
var (
	noGroupKeyFirst = []byte("-NOGROUP No such key '")
	noGroupKeyAfter = []byte("' for key name '")
)

// stripGroupError appends a NOGROUP error with the prefix taken off the
// stream's name, so the client reads the name it sent; any other error
// is appended as it is (Redis's other errors about streams quote no key).
func (ns *Namespace) stripGroupError(dst, reply []byte) []byte {
	at := -1
	switch {
	case bytes.HasPrefix(reply, noGroupKeyFirst):
		at = len(noGroupKeyFirst)
	case bytes.HasPrefix(reply, []byte("-NOGROUP ")):
		if i := bytes.Index(reply, noGroupKeyAfter); i >= 0 {
			at = i + len(noGroupKeyAfter)
		}
	}
	if at < 0 || !bytes.HasPrefix(reply[at:], []byte(ns.prefix)) {
		return append(dst, reply...)
	}
	dst = append(dst, reply[:at]...)
	return append(dst, reply[at+len(ns.prefix):]...)
}

// stripEach strips every every-th element of an aggregate (maps count
// their keys and values as elements), starting with the first.
func (ns *Namespace) stripEach(dst, reply []byte, channel bool, every int64) []byte {
	typ, n, hdr := header(reply)
	if typ == '%' {
		n *= 2
	} else if !isArray(typ) {
		return append(dst, reply...)
	}
	start := len(dst)
	dst = append(dst, reply[:hdr]...)
	rest := reply[hdr:]
	for i := int64(0); i < n; i++ {
		e := elemLen(rest)
		if e <= 0 {
			return append(dst[:start], reply...)
		}
		if i%every == 0 {
			dst = ns.appendName(dst, rest[:e], channel)
		} else {
			dst = append(dst, rest[:e]...)
		}
		rest = rest[e:]
	}
	return append(dst, rest...)
}

func isArray(typ byte) bool { return typ == '*' || typ == '~' || typ == '>' }

// header parses an aggregate header: its type, element count and length.
// typ is 0 when reply does not start with a complete header.
func header(reply []byte) (typ byte, n int64, hdrLen int) {
	nl := bytes.IndexByte(reply, '\n')
	if len(reply) < 4 || nl < 2 || reply[nl-1] != '\r' {
		return 0, 0, 0
	}
	v, err := strconv.ParseInt(string(reply[1:nl-1]), 10, 64)
	if err != nil {
		return 0, 0, 0
	}
	return reply[0], v, nl + 1
}

// elemLen is the length of the complete element at b's start, or 0.
func elemLen(b []byte) int {
	n, err := resp.ScanReply(b)
	if err != nil {
		return 0
	}
	return n
}

// name returns the text of a bulk or simple string element.
func name(e []byte) ([]byte, bool) {
	if len(e) < 3 {
		return nil, false
	}
	switch e[0] {
	case '+':
		return e[1 : len(e)-2], true
	case '$':
		nl := bytes.IndexByte(e, '\n')
		if nl < 0 || e[1] == '-' {
			return nil, false
		}
		return e[nl+1 : len(e)-2], true
	}
	return nil, false
}

// appendName appends element e with the namespace taken off its name.
func (ns *Namespace) appendName(dst, e []byte, channel bool) []byte {
	s, ok := name(e)
	if !ok {
		return append(dst, e...)
	}
	var out []byte
	if channel {
		out, ok = ns.StripChannel(s)
	} else {
		out, ok = ns.StripKey(s)
	}
	if !ok {
		return append(dst, e...)
	}
	if e[0] == '+' {
		dst = append(dst, '+')
		dst = append(dst, out...)
		return append(dst, '\r', '\n')
	}
	dst = appendHeader(dst, '$', len(out))
	dst = append(dst, out...)
	return append(dst, '\r', '\n')
}

// StripKey returns key without the prefix; ok is false when key is not in
// the namespace.
func (ns *Namespace) StripKey(key []byte) (stripped []byte, ok bool) {
	if !bytes.HasPrefix(key, []byte(ns.prefix)) {
		return key, false
	}
	return key[len(ns.prefix):], true
}

// StripChannel undoes the rewriting of a channel name or pattern; ok is
// false when ch is not in the namespace (a keyevent channel, for one,
// which is shared).
func (ns *Namespace) StripChannel(ch []byte) ([]byte, bool) {
	if bytes.HasPrefix(ch, keyspacePrefix) {
		if at := bytes.Index(ch[len(keyspacePrefix):], notifySep); at >= 0 {
			at += len(keyspacePrefix) + len(notifySep)
			if !bytes.HasPrefix(ch[at:], []byte(ns.prefix)) {
				return ch, false
			}
			// A fresh slice: ch belongs to the reply being rewritten.
			out := make([]byte, 0, len(ch)-len(ns.prefix))
			out = append(out, ch[:at]...)
			return append(out, ch[at+len(ns.prefix):]...), true
		}
	}
	return ns.StripKey(ch)
}

// ErrFrameTooLarge is returned by PubSubFilter for one message that does
// not fit its limit.
var ErrFrameTooLarge = errors.New("namespace: pub/sub message larger than the output limit")

// PubSubFilter rewrites the byte stream a subscribed connection receives
// from Redis: channel names and patterns in messages and (un)subscribe
// confirmations lose the prefix, and keyevent notifications about other
// namespaces' keys are dropped. Frames that are not pub/sub messages pass
// unchanged. It is used by one goroutine.
type PubSubFilter struct {
	ns      *Namespace
	pending []byte
	scan    resp.ReplyScanner
	limit   int
}

// NewPubSubFilter returns a filter that holds at most limit bytes of one
// incomplete frame.
func NewPubSubFilter(ns *Namespace, limit int) *PubSubFilter {
	return &PubSubFilter{ns: ns, limit: limit}
}

// Filter appends to dst the client's view of every frame completed by in.
func (f *PubSubFilter) Filter(dst, in []byte) ([]byte, error) {
	f.pending = append(f.pending, in...)
	for len(f.pending) > 0 {
		n, err := f.scan.Scan(f.pending)
		if err != nil {
			return dst, err
		}
		if n == 0 {
			if len(f.pending) > f.limit {
				return dst, ErrFrameTooLarge
			}
			break
		}
		dst = f.ns.appendPubSub(dst, f.pending[:n])
		f.pending = f.pending[n:]
	}
	if len(f.pending) == 0 {
		f.pending = f.pending[:0:0] // drop the consumed buffer
	}
	return dst, nil
}

// appendPubSub appends one frame from a subscribed connection.
func (ns *Namespace) appendPubSub(dst, frame []byte) []byte {
	typ, n, hdr := header(frame)
	if !isArray(typ) || n < 3 || n > 4 {
		return append(dst, frame...)
	}
	var el [4][]byte
	rest := frame[hdr:]
	for i := int64(0); i < n; i++ {
		e := elemLen(rest)
		if e <= 0 {
			return append(dst, frame...)
		}
		el[i], rest = rest[:e], rest[e:]
	}
	kind, ok := name(el[0])
	if !ok {
		return append(dst, frame...)
	}
	switch {
	case n == 3 && (commands.EqualFold("message", kind) || commands.EqualFold("smessage", kind)):
		return ns.appendMessage(dst, frame[:hdr], el[0], nil, el[1], el[2])
	case n == 4 && commands.EqualFold("pmessage", kind):
		return ns.appendMessage(dst, frame[:hdr], el[0], el[1], el[2], el[3])
	case n == 3 && isSubscription(kind):
		dst = append(dst, frame[:hdr]...)
		dst = append(dst, el[0]...)
		dst = ns.appendName(dst, el[1], true)
		return append(dst, el[2]...)
	}
	return append(dst, frame...)
}

// appendMessage appends a (p)message. On a keyevent channel the message is
// a key: one of another namespace is dropped, one of this namespace loses
// its prefix.
func (ns *Namespace) appendMessage(dst, hdr, kind, pattern, channel, payload []byte) []byte {
	if ch, ok := name(channel); ok && bytes.HasPrefix(ch, keyeventPrefix) {
		key, ok := name(payload)
		if !ok {
			return dst
		}
		if _, ok := ns.StripKey(key); !ok {
			return dst
		}
		dst = append(dst, hdr...)
		dst = append(dst, kind...)
		if pattern != nil {
			dst = ns.appendName(dst, pattern, true)
		}
		dst = append(dst, channel...)
		return ns.appendName(dst, payload, false)
	}
	dst = append(dst, hdr...)
	dst = append(dst, kind...)
	if pattern != nil {
		dst = ns.appendName(dst, pattern, true)
	}
	dst = ns.appendName(dst, channel, true)
	return append(dst, payload...)
}

func isSubscription(kind []byte) bool {
	for _, k := range [...]string{"subscribe", "unsubscribe", "psubscribe", "punsubscribe", "ssubscribe", "sunsubscribe"} {
		if commands.EqualFold(k, kind) {
			return true
		}
	}
	return false
}
