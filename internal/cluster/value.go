package cluster

import (
	"errors"
	"strconv"
)

// errBadReply: a topology reply that does not have the documented shape.
var errBadReply = errors.New("redproxy: malformed cluster topology reply")

// replyError is an error reply inside a parsed value.
type replyError string

func (e replyError) Error() string { return string(e) }

// parseValue decodes one whole RESP2 or RESP3 reply into strings, int64s,
// []any (maps flattened to key, value, ...), nil and replyError. It is only
// for the small topology replies (CLUSTER SHARDS, CLUSTER SLOTS), never the
// data path.
func parseValue(b []byte) (any, error) {
	v, n, err := parseAt(b, 0)
	if err != nil {
		return nil, err
	}
	if n != len(b) {
		return nil, errBadReply
	}
	return v, nil
}

func parseAt(b []byte, depth int) (any, int, error) {
	if depth > 16 || len(b) < 3 {
		return nil, 0, errBadReply
	}
	end := indexLine(b)
	if end < 1 {
		return nil, 0, errBadReply
	}
	line := string(b[1:end])
	next := end + 2
	switch b[0] {
	case '+':
		return line, next, nil
	case '-':
		return replyError(line), next, nil
	case ':':
		n, err := strconv.ParseInt(line, 10, 64)
		return n, next, err
	case '_':
		return nil, next, nil
	case '$':
		n, err := strconv.Atoi(line)
		if err != nil {
			return nil, 0, errBadReply
		}
		if n < 0 {
			return nil, next, nil
		}
		if next+n+2 > len(b) {
			return nil, 0, errBadReply
		}
		return string(b[next : next+n]), next + n + 2, nil
	case '*', '%', '~':
		n, err := strconv.Atoi(line)
		if err != nil || n > len(b) {
			return nil, 0, errBadReply
		}
		if n < 0 {
			return nil, next, nil
		}
		if b[0] == '%' {
			n *= 2
		}
		out := make([]any, 0, n)
		for range n {
			v, k, err := parseAt(b[next:], depth+1)
			if err != nil {
				return nil, 0, err
			}
			out = append(out, v)
			next += k
		}
		return out, next, nil
	}
	return nil, 0, errBadReply
}

func indexLine(b []byte) int {
	for i := 0; i+1 < len(b); i++ {
		if b[i] == '\r' && b[i+1] == '\n' {
			return i
		}
	}
	return -1
}
