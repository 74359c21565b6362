// Package resp frames and parses the Redis serialization protocol (RESP2 and
// RESP3) on byte buffers without copying.
//
// The proxy forwards raw bytes in both directions, so it never decodes a
// reply into values: it only needs to know where one reply ends. The reply
// scanner does exactly that, and can resume where it stopped so that a very
// large aggregate reply arriving in many reads is scanned once, not once per
// read. The request parser (request.go) turns client bytes into argument
// slices that point into the read buffer, with a cap on every size a client
// can declare.
package resp

import (
	"bytes"
	"errors"
)

// ErrProtocol is returned for bytes that are not valid RESP. The stream
// cannot be resynchronised after it, so the connection must be closed.
var ErrProtocol = errors.New("protocol error")

// MaxAggregateLen bounds the element count of one aggregate header. An
// aggregate that large would take terabytes to send, so a bigger count is
// garbage, not a reply.
const MaxAggregateLen = 1 << 40

// maxPendingElements keeps the scanner's counter from overflowing on a long
// run of huge (but individually allowed) counts.
const maxPendingElements = 1 << 62

// ReplyScanner finds the end of one complete reply in a buffer that may hold
// only a prefix of it. Scan can be called again with the same bytes plus more
// appended; it continues where it stopped. The buffer may be moved between
// calls as long as the reply's first byte stays at index 0.
//
// The scanner keeps no stack: to find where a reply ends it is enough to
// count the elements still owed, since an aggregate header of n elements
// replaces the one element it is with n new ones. So nesting depth costs
// nothing, and a reply as deep as Redis can build (a self-referencing Lua
// table returned by EVAL nests about 8000 levels before Redis stops at its
// Lua stack limit) frames like any other; the state is two integers.
type ReplyScanner struct {
	pos     int   // bytes of the reply consumed so far
	pending int64 // elements still owed; 0 before the first header

	// Consume's place inside an element: the bytes of a bulk string's
	// body still to pass, then its CRLF (crlf); or inside a simple line.
	body int64
	crlf bool
	line bool
	// started: the reply's first header is parsed. A push frame ('>')
	// after it is one Redis wrote in the middle of the reply (RESP3: DEBUG
	// PROTOCOL push queued in MULTI puts one inside EXEC's array). It is
	// no element of the aggregate it interrupts, which still owes the
	// element it came before; counted as one, the reply ended an element
	// early and its last element was taken for the next request's reply
	// (found by a probe).
	started bool
}

// Reset prepares the scanner for a new reply.
func (s *ReplyScanner) Reset() { *s = ReplyScanner{} }

// maxStreamedHeader bounds the header line of a bulk string or aggregate
// ('$', '*', ...: a type byte, at most 19 characters of length, CRLF) for
// Consume: a longer one is not RESP, and waiting for its end would hold
// bytes without bound.
const maxStreamedHeader = 32

// Consume frames a reply the caller does not hold whole: it parses what b
// holds and reports how much of it the caller may drop, so a reply of any
// size (a 512 MB string, an aggregate of millions of elements) passes
// through a buffer of fixed size. b starts at the first byte the scanner
// has not released: the reply's first byte (also after Scan calls that
// found it incomplete: Consume continues where they stopped), or the byte
// after the n the last Consume released. It returns n, the bytes of b the
// caller may drop (the next call starts after them), and done when b[:n]
// ends the reply; the scanner is then reset. What it does not release is
// at most a header line (maxStreamedHeader), the '\r' of a line whose
// '\n' has not arrived, or a bulk string's CRLF.
//
// It frames exactly as Scan does and refuses what Scan refuses, and also
// a header line longer than any valid one (Scan would wait for its end).
// Once Consume is called for a reply, only Consume may continue it.
func (s *ReplyScanner) Consume(b []byte) (n int, done bool, err error) {
	if s.pending == 0 {
		s.pending = 1
	}
	for {
		var children int64
		switch {
		case s.body > 0:
			k := min(s.body, int64(len(b)-s.pos))
			s.pos += int(k)
			s.body -= k
			if s.body > 0 {
				return s.release(), false, nil
			}
			continue // to its CRLF (s.crlf is set)
		case s.crlf:
			if len(b)-s.pos < 2 {
				return s.release(), false, nil
			}
			if b[s.pos] != '\r' || b[s.pos+1] != '\n' {
				return 0, false, ErrProtocol
			}
			s.pos += 2
			s.crlf = false
		case s.line:
			i := bytes.IndexByte(b[s.pos:], '\r')
			if i < 0 {
				s.pos = len(b)
				return s.release(), false, nil
			}
			s.pos += i
			if s.pos+1 == len(b) {
				return s.release(), false, nil // the '\r' waits for what follows it
			}
			if b[s.pos+1] != '\n' {
				return 0, false, ErrProtocol
			}
			s.pos += 2
			s.line = false
		default:
			if s.pos >= len(b) {
				return s.release(), false, nil
			}
			typ := b[s.pos]
			switch typ {
			case '+', '-', ':', ',', '#', '(':
				// A line of any length: streamed to its CRLF.
				s.pos++
				s.line = true
				continue
			}
			end := min(len(b), s.pos+maxStreamedHeader)
			nl := indexCRLF(b[:end], s.pos+1)
			if nl == -2 {
				return 0, false, ErrProtocol
			}
			if nl < 0 {
				if end-s.pos == maxStreamedHeader {
					return 0, false, ErrProtocol
				}
				return s.release(), false, nil
			}
			line := b[s.pos+1 : nl]
			switch typ {
			case '_':
				if len(line) != 0 {
					return 0, false, ErrProtocol
				}
			case '$', '!', '=':
				n, ok := parseInt(line)
				if !ok || n < -1 || (n == -1 && typ != '$') {
					return 0, false, ErrProtocol
				}
				if n >= 0 {
					s.pos = nl + 2
					s.body, s.crlf = n, true
					continue
				}
			case '*', '~', '>', '%', '|':
				n, ok := parseInt(line)
				if !ok || n < -1 || (n == -1 && typ != '*') || n > MaxAggregateLen {
					return 0, false, ErrProtocol
				}
				if n > 0 {
					children = n
					if typ == '%' || typ == '|' {
						children = 2 * n
					}
				}
				if typ == '|' || typ == '>' && s.started {
					children++ // as in Scan
				}
			default:
				return 0, false, ErrProtocol
			}
			s.pos = nl + 2
		}
		s.started = true
		// One element parsed whole, with children elements owed for it.
		s.pending += children - 1
		if s.pending > maxPendingElements {
			return 0, false, ErrProtocol
		}
		if s.pending == 0 {
			n := s.pos
			s.Reset()
			return n, true, nil
		}
	}
}

// release hands the bytes parsed so far back to the caller (Consume).
func (s *ReplyScanner) release() int {
	n := s.pos
	s.pos = 0
	return n
}

// Scan returns the length of the complete reply at b[0:], or 0 if b holds
// only part of it (call again with more bytes). A push frame ('>') is framed
// like any aggregate; callers inspect b[0] to route it.
func (s *ReplyScanner) Scan(b []byte) (int, error) {
	if s.pos == 0 {
		s.pending = 1
	}
	for {
		// Parse one element header starting at s.pos.
		if s.pos >= len(b) {
			return 0, nil
		}
		nl := indexCRLF(b, s.pos+1)
		if nl == -2 {
			return 0, ErrProtocol
		}
		if nl < 0 {
			return 0, nil
		}
		typ := b[s.pos]
		line := b[s.pos+1 : nl]
		next := nl + 2
		var children int64
		switch typ {
		case '+', '-', ':', '_', ',', '#', '(':
			if typ == '_' && len(line) != 0 {
				return 0, ErrProtocol
			}
		case '$', '!', '=':
			n, ok := parseInt(line)
			if !ok || n < -1 || (n == -1 && typ != '$') {
				return 0, ErrProtocol
			}
			if n >= 0 {
				end := int64(next) + n + 2
				if end > int64(len(b)) {
					return 0, nil
				}
				if b[end-2] != '\r' || b[end-1] != '\n' {
					return 0, ErrProtocol
				}
				next = int(end)
			}
		case '*', '~', '>', '%', '|':
			n, ok := parseInt(line)
			if !ok || n < -1 || (n == -1 && typ != '*') || n > MaxAggregateLen {
				return 0, ErrProtocol
			}
			if n > 0 {
				children = n
				if typ == '%' || typ == '|' {
					children = 2 * n
				}
			}
			if typ == '|' || typ == '>' && s.started {
				// An attribute describes the reply that follows it and is
				// not an element on its own: the element it is attached to
				// is still owed. So is the one a push frame inside the
				// reply came before (started).
				children++
			}
		default:
			return 0, ErrProtocol
		}
		s.started = true
		s.pos = next
		s.pending += children - 1
		if s.pending > maxPendingElements {
			return 0, ErrProtocol
		}
		if s.pending == 0 {
			n := s.pos
			s.Reset()
			return n, nil
		}
	}
}

// ScanReply is the one-shot form of ReplyScanner.Scan for callers that hold
// the whole buffer. It returns 0 when b holds only part of a reply.
func ScanReply(b []byte) (int, error) {
	var s ReplyScanner
	return s.Scan(b)
}

// ScanElement frames the next element of an aggregate reply at b[0:]: the
// push frames Redis wrote before it (push bytes, out of band: no element
// of the aggregate) and then the element itself (n bytes after them). n is
// 0 when b holds only part of it.
func ScanElement(b []byte) (push, n int, err error) {
	for len(b) > push && b[push] == '>' {
		k, err := ScanReply(b[push:])
		if err != nil || k == 0 {
			return push, 0, err
		}
		push += k
	}
	n, err = ScanReply(b[push:])
	return push, n, err
}

// IsError reports whether a framed reply is an error (simple or RESP3 bulk).
func IsError(reply []byte) bool {
	return len(reply) > 0 && (reply[0] == '-' || reply[0] == '!')
}

// IsPush reports whether a framed reply is a RESP3 out-of-band push.
func IsPush(reply []byte) bool {
	return len(reply) > 0 && reply[0] == '>'
}

// indexCRLF returns the index of the '\r' of the first "\r\n" at or after
// from, -1 if the line is not complete yet, or -2 if a '\r' is followed by
// anything but '\n' (no RESP line may contain a bare '\r').
func indexCRLF(b []byte, from int) int {
	if from > len(b) {
		return -1
	}
	i := bytes.IndexByte(b[from:], '\r')
	if i < 0 {
		return -1
	}
	i += from
	if i+1 >= len(b) {
		return -1
	}
	if b[i+1] != '\n' {
		return -2
	}
	return i
}

// BulkHeader reads the "$N\r\n" line at the start of b: the bulk string's
// length N and the line's length. ok is false when b does not start with
// a complete header of a bulk string of length 0 or more (a null "$-1",
// another type, a line not yet whole, or one ScanReply refuses).
func BulkHeader(b []byte) (size int64, header int, ok bool) {
	if len(b) < 4 || b[0] != '$' {
		return 0, 0, false
	}
	nl := indexCRLF(b[:min(len(b), maxStreamedHeader)], 1)
	if nl < 0 {
		return 0, 0, false
	}
	size, ok = parseInt(b[1:nl])
	if !ok || size < 0 {
		return 0, 0, false
	}
	return size, nl + 2, true
}

// Integer returns the value of a framed integer reply (":N\r\n").
func Integer(reply []byte) (int64, bool) {
	if len(reply) < 4 || reply[0] != ':' {
		return 0, false
	}
	return parseInt(reply[1 : len(reply)-2])
}

// ParseInt parses a client's integer argument as Redis's string2ll does
// (SELECT, HELLO, CLIENT UNBLOCK): optional '-', digits, no '+', no
// leading zero but in "0" itself, no "-0". strconv.Atoi takes "01" and
// "+1", which Redis refuses; the proxy then disagreed with Redis on what
// the client asked (SELECT 01 answered OK). It takes all of int64, as
// string2ll does: stopping at 18 digits, as parseInt does, answered
// "not an integer" where Redis took a 19-digit number (HELLO
// 1000000000000000000 is -NOPROTO on Redis, SELECT of it "out of range").
func ParseInt(b []byte) (int64, bool) {
	if n, ok := parseInt(b); ok {
		return n, true
	}
	// Up to 18 digits parseInt's refusal stands; over 19 cannot fit.
	neg := len(b) > 0 && b[0] == '-'
	d := b
	if neg {
		d = d[1:]
	}
	if len(d) != 19 || d[0] == '0' {
		return 0, false
	}
	var u uint64 // 19 digits fit in a uint64
	for _, c := range d {
		if c < '0' || c > '9' {
			return 0, false
		}
		u = u*10 + uint64(c-'0')
	}
	switch {
	case neg && u <= 1<<63:
		return int64(-u), true // -(1<<63) wraps to math.MinInt64
	case !neg && u <= 1<<63-1:
		return int64(u), true
	}
	return 0, false
}

// parseInt parses a decimal integer as RESP writes it: optional '-', digits,
// nothing else, at most 18 digits so it cannot overflow.
func parseInt(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 19 {
		return 0, false
	}
	neg := false
	if b[0] == '-' {
		neg = true
		b = b[1:]
		if len(b) == 0 || len(b) > 18 {
			return 0, false
		}
	} else if len(b) > 18 {
		return 0, false
	}
	// As Redis's string2ll: no leading zero but in "0" itself, so no
	// "-0". Redis drops a connection that sends one ("*01"), so a
	// request it would refuse must not be forwarded on a shared one.
	if b[0] == '0' && (len(b) > 1 || neg) {
		return 0, false
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if neg {
		n = -n
	}
	return n, true
}
