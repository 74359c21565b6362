package localcache

import (
	"strconv"

	"github.com/redproxy/redproxy/internal/commands"
)

// Fill connections speak RESP3, because invalidation pushes need it on the
// same connection as the reads they invalidate. A RESP2 client must get the
// bytes Redis would have sent it over RESP2. For most replies that is a
// mechanical rewrite, the same one Redis applies: a map becomes a flat array
// of twice its length, a set an array, a null the null bulk string. Types
// whose RESP2 form is not mechanical are refused, and such a command is then
// never filled for RESP2 clients: doubles (RESP2 sends them as bulk strings
// formatted per command, and ZRANGE WITHSCORES even changes shape), big
// numbers, booleans, verbatim strings, attributes. Which null a RESP2 reply
// carries ($-1 or *-1) depends on the command: among the commands the tier
// caches, GEOPOS marks a missing member with the null array *-1 (Redis's
// addReplyNullArray), and XRANGE and XREVRANGE answer a COUNT of 0 or
// less with it, where RESP3 sends _ for both. A GEOPOS whose members are
// all missing has no doubles to refuse, so its nulls are converted per
// command (toRESP2For; TestRESP2ConversionMatchesRedis and
// TestGeoposNullsMatchRedis compare both protocols on a real server).

// toRESP2For is toRESP2 with the command's own null shape.
func toRESP2For(cmd *commands.Command, b []byte) ([]byte, bool) {
	if cmd != nil {
		switch cmd.Name {
		case "geopos":
			return toRESP2Nulls(b, nullArrayElements)
		case "xrange", "xrevrange":
			return toRESP2Nulls(b, nullArrayReply)
		}
	}
	return toRESP2(b)
}

// nullShape says how a RESP3 null becomes a RESP2 one.
type nullShape uint8

const (
	nullBulk          nullShape = iota // every _ becomes $-1
	nullArrayElements                  // an _ element of the top-level array becomes *-1
	nullArrayReply                     // an _ reply (not within an array) becomes *-1
)

// toRESP2 rewrites one RESP3 reply; ok is false when it cannot be done
// exactly.
func toRESP2(b []byte) (out []byte, ok bool) { return toRESP2Nulls(b, nullBulk) }

func toRESP2Nulls(b []byte, nulls nullShape) (out []byte, ok bool) {
	out = make([]byte, 0, len(b)+8)
	out, n, ok := convert2(out, b, nulls, 0)
	if !ok || n != len(b) {
		return nil, false
	}
	return out, true
}

// convert2 appends the RESP2 form of the reply at b[0:], found at the given
// nesting depth, and returns how many bytes of b it consumed.
func convert2(dst, b []byte, nulls nullShape, depth int) ([]byte, int, bool) {
	if len(b) < 3 {
		return dst, 0, false
	}
	line := 1
	for line < len(b) && b[line] != '\r' {
		line++
	}
	if line+1 >= len(b) {
		return dst, 0, false
	}
	hdr := b[1:line]
	next := line + 2
	switch b[0] {
	case '+', '-', ':':
		return append(dst, b[:next]...), next, true
	case '_':
		if nulls == nullArrayElements && depth == 1 || nulls == nullArrayReply && depth == 0 {
			return append(dst, "*-1\r\n"...), next, true
		}
		return append(dst, "$-1\r\n"...), next, true
	case '$':
		n, err := strconv.Atoi(string(hdr))
		if err != nil {
			return dst, 0, false
		}
		end := next
		if n >= 0 {
			end += n + 2
		}
		if end > len(b) {
			return dst, 0, false
		}
		return append(dst, b[:end]...), end, true
	case '*', '~', '%':
		n, err := strconv.Atoi(string(hdr))
		if err != nil {
			return dst, 0, false
		}
		elems := n
		if b[0] == '%' {
			elems = 2 * n
		}
		if n < 0 {
			return append(dst, b[:next]...), next, true
		}
		dst = append(dst, '*')
		dst = strconv.AppendInt(dst, int64(elems), 10)
		dst = append(dst, '\r', '\n')
		pos := next
		for range elems {
			var k int
			var ok bool
			dst, k, ok = convert2(dst, b[pos:], nulls, depth+1)
			if !ok {
				return dst, 0, false
			}
			pos += k
		}
		return dst, pos, true
	}
	return dst, 0, false
}

// isEmptyReply reports whether a reply says "nothing there": a null, a zero,
// or an empty aggregate. Only such a reply may be kept for a key that does
// not exist (negative caching); a value paired with PTTL -2 means the key
// expired between the read and the PTTL.
func isEmptyReply(b []byte) bool {
	switch string(b) {
	case "_\r\n", "$-1\r\n", "*-1\r\n", ":0\r\n", "*0\r\n", "%0\r\n", "~0\r\n":
		return true
	}
	return false
}
