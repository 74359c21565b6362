package resp

import "strconv"

// Commands the proxy composes itself (GET and PTTL for a shared fetch,
// EXPIRE fix-ups, CLIENT SETNAME, handshakes) are written here, in the one
// form Redis reads requests in: an array of bulk strings. Each function
// appends to dst and allocates only when dst must grow, so a caller that
// reuses its buffer writes commands without allocating.
//
// Replies are not written here: the proxy forwards Redis's replies as they
// came, and the few it answers itself use redcon's reply writers.

// AppendCommand appends the command args[0] args[1:]...
func AppendCommand(dst []byte, args ...[]byte) []byte {
	dst = appendCount(dst, '*', len(args))
	for _, a := range args {
		dst = appendCount(dst, '$', len(a))
		dst = append(dst, a...)
		dst = append(dst, '\r', '\n')
	}
	return dst
}

// AppendCommandNamed appends the command name args..., for the common case
// of a name the proxy knows as a string and arguments that came from a
// client (keys), which would cost a copy to turn into strings.
func AppendCommandNamed(dst []byte, name string, args ...[]byte) []byte {
	dst = appendCount(dst, '*', 1+len(args))
	dst = appendCount(dst, '$', len(name))
	dst = append(dst, name...)
	dst = append(dst, '\r', '\n')
	for _, a := range args {
		dst = appendCount(dst, '$', len(a))
		dst = append(dst, a...)
		dst = append(dst, '\r', '\n')
	}
	return dst
}

// AppendCommandStrings appends the command args[0] args[1:]... given as
// strings, as configured handshakes and fixed commands are.
func AppendCommandStrings(dst []byte, args ...string) []byte {
	dst = appendCount(dst, '*', len(args))
	for _, a := range args {
		dst = appendCount(dst, '$', len(a))
		dst = append(dst, a...)
		dst = append(dst, '\r', '\n')
	}
	return dst
}

// appendCount appends a header line: typ, n in decimal, CRLF.
func appendCount(dst []byte, typ byte, n int) []byte {
	dst = append(dst, typ)
	dst = strconv.AppendInt(dst, int64(n), 10)
	return append(dst, '\r', '\n')
}

// Ping is the PING request, which the proxy sends as a probe and a fence.
var Ping = AppendCommandStrings(nil, "PING")
