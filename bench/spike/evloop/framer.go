package main

// A minimal RESP framer for the spike: it finds where one request or one
// reply ends and nothing more. The proxy's real reader lives in
// internal/resp, which a separate module cannot import (Go's internal rule),
// and the spike must not pull gnet into the main module; so this is a small
// stand-in, good enough to forward redis-benchmark's traffic and to refuse
// what a shared pipe cannot carry. It is spike code, not a parser to keep.

import (
	"errors"
)

const (
	// maxMultibulk and maxBulk follow redis-server's own limits (1M-element
	// requests from an unauthenticated client are refused there too, and
	// proto-max-bulk-len defaults to 512 MB), so the spike refuses nothing
	// Redis would accept and a client cannot make it buffer more.
	maxMultibulk = 1024 * 1024
	maxBulk      = 512 * 1024 * 1024
	// maxInline is redis-server's PROTO_INLINE_MAX_SIZE.
	maxInline = 64 * 1024
)

// Protocol errors, worded as redis-server words them.
var (
	errInvalidMultibulk = errors.New("ERR Protocol error: invalid multibulk length")
	errInvalidBulk      = errors.New("ERR Protocol error: invalid bulk length")
	errExpectedBulk     = errors.New("ERR Protocol error: expected '$'")
	errInlineTooBig     = errors.New("ERR Protocol error: too big inline request")
	errBadReply         = errors.New("upstream sent a malformed reply")
)

// readLine returns the line starting at off (without CRLF) and the offset
// after it; ok is false when no full line is buffered yet.
func readLine(b []byte, off int) (line []byte, next int, ok bool) {
	for i := off; i+1 < len(b); i++ {
		if b[i] == '\r' && b[i+1] == '\n' {
			return b[off:i], i + 2, true
		}
	}
	return nil, 0, false
}

// parseInt parses a RESP length; ok is false for anything but an optional
// minus sign and up to 18 digits.
func parseInt(b []byte) (n int, ok bool) {
	neg := false
	if len(b) > 0 && b[0] == '-' {
		neg, b = true, b[1:]
	}
	if len(b) == 0 || len(b) > 18 {
		return 0, false
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	if neg {
		n = -n
	}
	return n, true
}

// frameRequest finds the first request in b. n is its length in bytes, 0
// while it is incomplete; then need is the fewest bytes b must hold before
// it can be complete (0 when unknown), so a large value is not rescanned on
// every read. name is the command name (a sub-slice of b); an empty name
// with n > 0 is a request Redis ignores without a reply (an empty inline
// line, "*0"), which the caller drops. inline tells that the request is an
// inline command, forwarded as is: Redis parses those itself.
func frameRequest(b []byte) (n int, name []byte, inline bool, need int, err error) {
	if len(b) == 0 {
		return 0, nil, false, 0, nil
	}
	if b[0] != '*' {
		for i, c := range b {
			if c == '\n' {
				return i + 1, firstWord(b[:i]), true, 0, nil
			}
		}
		if len(b) > maxInline {
			return 0, nil, true, 0, errInlineTooBig
		}
		return 0, nil, true, 0, nil
	}
	line, off, ok := readLine(b, 1)
	if !ok {
		if len(b) > 32 {
			return 0, nil, false, 0, errInvalidMultibulk
		}
		return 0, nil, false, 0, nil
	}
	count, ok := parseInt(line)
	if !ok || count > maxMultibulk {
		return 0, nil, false, 0, errInvalidMultibulk
	}
	if count <= 0 {
		return off, nil, false, 0, nil
	}
	for i := 0; i < count; i++ {
		if off >= len(b) {
			return 0, nil, false, 0, nil
		}
		if b[off] != '$' {
			return 0, nil, false, 0, errExpectedBulk
		}
		line, next, ok := readLine(b, off+1)
		if !ok {
			if len(b)-off > 32 {
				return 0, nil, false, 0, errInvalidBulk
			}
			return 0, nil, false, 0, nil
		}
		size, ok := parseInt(line)
		if !ok || size < 0 || size > maxBulk {
			return 0, nil, false, 0, errInvalidBulk
		}
		end := next + size + 2
		if end > len(b) {
			return 0, nil, false, end, nil
		}
		if i == 0 {
			name = b[next : next+size]
		}
		off = end
	}
	return off, name, false, 0, nil
}

func firstWord(line []byte) []byte {
	start := 0
	for start < len(line) && (line[start] == ' ' || line[start] == '\t' || line[start] == '\r') {
		start++
	}
	end := start
	for end < len(line) && line[end] != ' ' && line[end] != '\t' && line[end] != '\r' {
		end++
	}
	return line[start:end]
}

// frameReply finds the first complete reply in b (RESP2 or RESP3) and
// returns its length, or 0 while it is incomplete (with need as in
// frameRequest). It walks nested aggregates with a counter of values still
// expected instead of recursion, so deep nesting costs nothing.
func frameReply(b []byte) (n int, need int, err error) {
	off, pending := 0, 1
	for pending > 0 {
		if off >= len(b) {
			return 0, 0, nil
		}
		t := b[off]
		line, next, ok := readLine(b, off+1)
		if !ok {
			return 0, 0, nil
		}
		pending--
		switch t {
		case '+', '-', ':', '_', ',', '#', '(':
			off = next
		case '$', '!', '=':
			size, ok := parseInt(line)
			if !ok {
				return 0, 0, errBadReply
			}
			if size < 0 {
				off = next
				break
			}
			end := next + size + 2
			if end > len(b) {
				return 0, end, nil
			}
			off = end
		case '*', '~', '>', '%', '|':
			count, ok := parseInt(line)
			if !ok {
				return 0, 0, errBadReply
			}
			if count < 0 {
				count = 0
			}
			switch t {
			case '%':
				pending += 2 * count
			case '|':
				// Attributes come before the value they describe.
				pending += 2*count + 1
			default:
				pending += count
			}
			off = next
		default:
			return 0, 0, errBadReply
		}
	}
	return off, 0, nil
}
