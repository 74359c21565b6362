package proxy

import (
	"bytes"
	"strings"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/metrics"
)

// Redis's replies to a command it does not know, as redis-server 7.0
// formats them (commandCheckExistence): the strings are printed as C
// strings, so each is cut at its first NUL byte; the name is cut at 128
// bytes, the arguments are quoted until their text reaches 128 bytes; \r
// and \n become spaces, and no other byte is replaced.

// unknownCommandMsg is Redis's error text, without the leading '-', for
// the unknown command args.
func unknownCommandMsg(args [][]byte) string {
	var sb strings.Builder
	sb.WriteString("ERR unknown command '")
	if len(args) > 0 {
		sb.Write(cString(args[0], 128))
	}
	sb.WriteString("', with args beginning with: ")
	n := 0 // the length of the arguments' text
	for _, a := range args[min(1, len(args)):] {
		if n >= 128 {
			break
		}
		a = cString(a, 128-n)
		sb.WriteByte('\'')
		sb.Write(a)
		sb.WriteString("' ")
		n += len(a) + 3
	}
	return noNewlines(sb.String())
}

// unknownSubcommandMsg is Redis's error text, without the leading '-', for
// the unknown subcommand args[1] of the container args[0].
func unknownSubcommandMsg(args [][]byte) string {
	return noNewlines("ERR unknown subcommand '" + string(cString(args[1], 128)) + "'. Try " +
		strings.ToUpper(string(cString(args[0], len(args[0])))) + " HELP.")
}

// errUnknownCommand is Redis's reply to a command it does not know.
func errUnknownCommand(args [][]byte) []byte {
	return []byte("-" + unknownCommandMsg(args) + "\r\n")
}

// cString is b as C's "%.<max>s" prints it: up to its first NUL byte, at
// most max bytes.
func cString(b []byte, max int) []byte {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	if len(b) > max {
		b = b[:max]
	}
	return b
}

// noNewlines replaces \r and \n with spaces, byte by byte (strings.Map
// would also replace bytes that are not UTF-8, which Redis leaves alone).
func noNewlines(s string) string {
	if strings.IndexAny(s, "\r\n") < 0 {
		return s
	}
	b := []byte(s)
	for i, c := range b {
		if c == '\r' || c == '\n' {
			b[i] = ' '
		}
	}
	return string(b)
}

// nulNameMsg is the error text, without the leading '-', that answers a
// command whose name, or whose subcommand's name, has a NUL byte
// (commands.NULName: Redis might run it as another command); "" for any
// other command. cmd is what the table's Lookup found for args.
func nulNameMsg(cmd *commands.Command, args [][]byte) string {
	switch commands.NULName(cmd, args) {
	case 0:
		return unknownCommandMsg(args)
	case 1:
		return unknownSubcommandMsg(args)
	}
	return ""
}

// nulNameStep answers, and never forwards, a command whose name or
// subcommand name has a NUL byte: Redis hashes the whole name to find the
// command but compares names with strcasecmp, which stops at the NUL, so
// "SELECT\x00<suffix> 9" or "KEYS\x00<suffix> *" runs as SELECT or KEYS
// whenever the whole name lands in that command's hash bucket, while the
// proxy, comparing whole names, took it for an unknown command and
// forwarded it unchecked: past the guard's deny list, and (SELECT) onto a
// connection other clients share (found by review). It is answered as
// Redis answers when the name misses: an unknown command (or subcommand)
// error, with the name cut at the NUL.
//
// dispatch calls it first, before the auth check as Redis does, on the
// command classify looked up: every command of a batch is looked up there
// once, whatever path it then takes (shared, pinned or in MULTI,
// blocking, cluster, routes, namespaces). Inside a transaction it fails
// EXEC as Redis's queue-time error does. A relayed client's commands do
// not go through dispatch: relayDenied refuses them the same way.
func (sess *Session) nulNameStep(r *request) bool {
	msg := nulNameMsg(r.cmd, r.Args)
	if msg == "" {
		return false
	}
	sess.refusedInMulti()
	sess.replyLocal(r.m, []byte("-"+msg+"\r\n"))
	return true
}

// crossProtocolStep closes the client, without a reply and without running
// anything it sent after, when it sends a command named POST or Host: (up
// to a NUL byte, case-insensitive): the first line or a header of an HTTP
// request, which a web page can make a browser send to any address
// (cross-protocol scripting). Redis does the same (securityWarningCommand,
// before the auth check); the proxy forwarded the name as an unknown
// command, so the rest of an HTTP body ran as Redis commands, and on a
// shared upstream connection Redis's close failed other clients' requests
// in flight on it (found by review). What the client sent before it in
// the same batch runs and is answered.
func (sess *Session) crossProtocolStep(r *request) bool {
	if r.cmd != nil || len(r.Args) == 0 || !isCrossProtocolName(r.Args[0]) {
		return false
	}
	if n, ok := sess.srv.crossProtocolLog.allow(); ok {
		sess.logger().Warn("closing client: POST or Host: sent as a command, likely an HTTP request aimed at this port (cross-protocol scripting)",
			"reason", metrics.CloseCrossProtocol, "suppressed", n)
	}
	sess.closing(metrics.CloseCrossProtocol)
	sess.quitting = true
	return true
}

// isCrossProtocolName reports whether name is POST or Host: as Redis
// compares it (strcasecmp: up to the first NUL byte).
func isCrossProtocolName(name []byte) bool {
	name = cString(name, len(name))
	return bytes.EqualFold(name, []byte("post")) || bytes.EqualFold(name, []byte("host:"))
}
