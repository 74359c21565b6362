package resp

import (
	"bytes"
	"strconv"
)

// Helpers for code that takes commands and replies apart again on the
// upstream side (cluster and route splitting): both handle bytes the
// proxy framed itself, or a reply Redis sent, already checked whole.

// SplitCommand returns the arguments of one raw multibulk command, which
// is how every request reaches the upstream side (the Reader re-encodes
// inline requests), appended to dst. The arguments point into raw.
func SplitCommand(raw []byte, dst [][]byte) ([][]byte, error) {
	line := func(b []byte) int { return bytes.Index(b, []byte("\r\n")) }
	if len(raw) < 4 || raw[0] != '*' {
		return dst, ErrProtocol
	}
	end := line(raw)
	if end < 0 {
		return dst, ErrProtocol
	}
	n, err := strconv.Atoi(string(raw[1:end]))
	if err != nil || n < 0 || n > len(raw) {
		return dst, ErrProtocol
	}
	pos := end + 2
	for range n {
		if pos >= len(raw) || raw[pos] != '$' {
			return dst, ErrProtocol
		}
		e := line(raw[pos:])
		if e < 0 {
			return dst, ErrProtocol
		}
		l, err := strconv.Atoi(string(raw[pos+1 : pos+e]))
		pos += e + 2
		if err != nil || l < 0 || pos+l+2 > len(raw) || raw[pos+l] != '\r' || raw[pos+l+1] != '\n' {
			return dst, ErrProtocol
		}
		dst = append(dst, raw[pos:pos+l])
		pos += l + 2
	}
	return dst, nil
}

// ArrayElements splits an array reply (RESP2 '*' or RESP3 '*' / '~') into
// its framed elements.
func ArrayElements(r []byte) ([][]byte, bool) {
	if len(r) < 4 || r[0] != '*' && r[0] != '~' {
		return nil, false
	}
	nl := bytes.IndexByte(r, '\n')
	if nl < 2 {
		return nil, false
	}
	n, err := strconv.Atoi(string(r[1 : nl-1]))
	if err != nil || n < 0 {
		return nil, false
	}
	out, pos, ok := scanElements(r, nl+1, n)
	return out, ok && pos == len(r)
}

// scanElements frames the n elements of an aggregate reply r that start
// at pos, and returns them and where they end.
func scanElements(r []byte, pos, n int) ([][]byte, int, bool) {
	out := make([][]byte, 0, min(n, 1024))
	for range n {
		push, k, err := ScanElement(r[pos:])
		if err != nil || k == 0 {
			return nil, pos, false
		}
		pos += push // a push frame inside the reply is no element (ScanElement)
		out = append(out, r[pos:pos+k])
		pos += k
	}
	return out, pos, true
}

// IsNull reports whether r is a null reply of either protocol.
func IsNull(r []byte) bool {
	return bytes.Equal(r, []byte("$-1\r\n")) || bytes.Equal(r, []byte("_\r\n")) || bytes.Equal(r, []byte("*-1\r\n"))
}
