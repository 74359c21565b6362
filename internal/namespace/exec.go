package namespace

import "github.com/redproxy/redproxy/internal/resp"

// TxStrip is what one command queued in a transaction needs of EXEC's
// reply: Kind applied to element Pos, its position in the transaction's
// queue as Redis counts it (proxy-added commands included).
type TxStrip struct {
	Pos  int
	Kind Strip
}

// StripExec appends EXEC's reply to dst with each command's names
// stripped (StripReply) in its own element. strips are in increasing Pos.
// A reply that is not an array (nil when a WATCHed key changed,
// EXECABORT or another error) is appended as it is; so is the whole reply
// when it does not parse, which only shortens names the namespace itself
// created anyway. An element that is an error (the command failed when it
// ran) loses the prefix only where NOGROUP quotes the stream's name.
func (ns *Namespace) StripExec(dst, reply []byte, strips []TxStrip) []byte {
	typ, n, hdr := header(reply)
	if typ != '*' || n <= 0 || len(strips) == 0 {
		return append(dst, reply...)
	}
	start := len(dst)
	dst = append(dst, reply[:hdr]...)
	rest := reply[hdr:]
	s := 0
	for i := 0; int64(i) < n; i++ {
		// A push frame Redis wrote inside the reply is no element; it
		// passes as it came (resp.ScanElement).
		push, e, err := resp.ScanElement(rest)
		if err != nil || e <= 0 {
			return append(dst[:start], reply...)
		}
		dst = append(dst, rest[:push]...)
		rest = rest[push:]
		for s < len(strips) && strips[s].Pos < i {
			s++ // (positions out of order: never applied twice)
		}
		if s < len(strips) && strips[s].Pos == i {
			dst = ns.StripReply(dst, strips[s].Kind, rest[:e])
		} else {
			dst = append(dst, rest[:e]...)
		}
		rest = rest[e:]
	}
	return append(dst, rest...)
}
