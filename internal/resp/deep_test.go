package resp

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// redisDeepReply is what Redis 7 sends for
// EVAL "local a = {}; local b = {a}; a[1] = b; return a" 0: a chain of
// single-element arrays about 8000 deep that ends where Redis hit its Lua
// stack limit. A proxy must pass it on like any other reply.
func redisDeepReply(depth int) string {
	return strings.Repeat("*1\r\n", depth) + "-ERR reached lua stack limit\r\n"
}

func TestScanReplyFramesDeepReplies(t *testing.T) {
	for _, depth := range []int{1025, 7995, 100000} {
		r := redisDeepReply(depth)
		b := []byte(r + "+NEXT\r\n")
		if n, err := ScanReply(b); err != nil || n != len(r) {
			t.Fatalf("depth %d: got %d, %v; want %d", depth, n, err, len(r))
		}
	}
	// Deep maps and attributes on the way down, then nulls on the way up.
	var b bytes.Buffer
	for range 5000 {
		b.WriteString("%1\r\n|1\r\n+ttl\r\n:1\r\n+k\r\n")
	}
	b.WriteString("_\r\n")
	if n, err := ScanReply(b.Bytes()); err != nil || n != b.Len() {
		t.Fatalf("deep maps: got %d, %v; want %d", n, err, b.Len())
	}
}

// A deep reply arriving a few bytes at a time resumes exactly where the
// previous read stopped, and a trailing reply stays unconsumed.
func TestScanReplyDeepResumed(t *testing.T) {
	r := redisDeepReply(7995)
	all := []byte(r + ":1\r\n")
	var s ReplyScanner
	got := 0
	for end := 3; end <= len(all); end += 3 {
		n, err := s.Scan(all[:end])
		if err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			got = n
			break
		}
	}
	if got != len(r) {
		t.Fatalf("got %d want %d", got, len(r))
	}
	// The scanner is ready for the next reply.
	if n, err := s.Scan(all[len(r):]); err != nil || n != 4 {
		t.Fatalf("next reply: %d %v", n, err)
	}
}

// Counts no reply can have are refused, so the counter cannot overflow.
func TestScanReplyHugeCountsRefused(t *testing.T) {
	if _, err := ScanReply([]byte("%999999999999999999\r\n")); !errors.Is(err, ErrProtocol) {
		t.Fatalf("got %v, want ErrProtocol", err)
	}
	// A large but possible count is simply incomplete.
	if n, err := ScanReply([]byte(strings.Repeat("*1099511627776\r\n", 1000) + ":1\r\n")); n != 0 || err != nil {
		t.Fatalf("got %d %v, want incomplete", n, err)
	}
}

// refScan is a straightforward recursive framer, used as the reference the
// fuzzer compares the counting scanner with. It returns 0, nil when b holds
// only part of a reply.
func refScan(b []byte) (int, error) {
	n, err := refElem(b, 0, 0)
	if errors.Is(err, errRefShort) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return n, nil
}

var errRefShort = errors.New("short")

func refElem(b []byte, pos, depth int) (int, error) {
	if depth > 10000 {
		return 0, errors.New("reference framer: too deep for a test")
	}
	if pos >= len(b) {
		return 0, errRefShort
	}
	nl := indexCRLF(b, pos+1)
	if nl == -2 {
		return 0, ErrProtocol
	}
	if nl < 0 {
		return 0, errRefShort
	}
	typ, line, next := b[pos], b[pos+1:nl], nl+2
	switch typ {
	case '+', '-', ':', ',', '#', '(':
		return next, nil
	case '_':
		if len(line) != 0 {
			return 0, ErrProtocol
		}
		return next, nil
	case '$', '!', '=':
		n, ok := parseInt(line)
		if !ok || n < -1 || (n == -1 && typ != '$') {
			return 0, ErrProtocol
		}
		if n == -1 {
			return next, nil
		}
		end := int64(next) + n + 2
		if end > int64(len(b)) {
			return 0, errRefShort
		}
		if b[end-2] != '\r' || b[end-1] != '\n' {
			return 0, ErrProtocol
		}
		return int(end), nil
	case '*', '~', '>', '%', '|':
		n, ok := parseInt(line)
		if !ok || n < -1 || (n == -1 && typ != '*') || n > MaxAggregateLen {
			return 0, ErrProtocol
		}
		if typ == '%' || typ == '|' {
			n *= 2
		}
		if n > int64(len(b)) {
			// More elements than bytes: it cannot complete in this buffer.
			// (The scanner keeps counting instead; both say "incomplete".)
			for p := next; ; {
				k, err := refElem(b, p, depth+1)
				if err != nil {
					return 0, err
				}
				p = k
			}
		}
		p := next
		for i := int64(0); i < n; i++ {
			k, err := refElem(b, p, depth+1)
			if err != nil {
				return 0, err
			}
			p = k
		}
		if typ == '|' || typ == '>' && pos > 0 {
			// An attribute, or a push frame inside a reply, is followed by
			// the element it is no part of.
			return refElem(b, p, depth)
		}
		return p, nil
	}
	return 0, ErrProtocol
}
