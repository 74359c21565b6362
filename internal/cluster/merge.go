package cluster

import (
	"bytes"
	"math/rand/v2"
	"strconv"

	"github.com/redproxy/redproxy/internal/resp"
	"github.com/redproxy/redproxy/internal/upstream"
	"github.com/tidwall/redcon"
)

// addReply adds command i's reply, built from its sub-commands' replies,
// to c. MGET's and KEYS's, which may be large, are written straight into
// c (resp.Merged); every other reply is built by reply.
func (b *batch) addReply(c *upstream.Call, i int) {
	o := &b.ops[i]
	if o.local != nil || !(o.merge == mergeMGET || o.merge == mergeConcat && o.n > 1) {
		c.AddReply(b.reply(i))
		return
	}
	m, reply := resp.PlanArrays(b.subReplies(o), o.pos, o.merge == mergeConcat, errUnexpected)
	if reply != nil {
		c.AddReply(reply)
		return
	}
	c.AddReplyAppend(m.Len(), m.AppendTo)
}

// subReplies are op o's sub-commands' replies, in order.
func (b *batch) subReplies(o *op) [][]byte {
	replies := make([][]byte, o.n)
	for k := range replies {
		replies[k] = b.subReply(o.first + k)
	}
	return replies
}

// reply builds command i's reply from its sub-commands' replies, but a
// split MGET's or KEYS's (addReply).
//
// Split commands fail as a whole with the first error (in the client's key
// order) any part got, though the other parts ran: docs/COMPATIBILITY.md.
func (b *batch) reply(i int) []byte {
	o := &b.ops[i]
	if o.local != nil {
		return o.local
	}
	if o.merge == mergeOne || o.n == 1 && o.merge != mergeScan {
		return b.subReply(o.first)
	}
	replies := b.subReplies(o)
	if o.merge != mergeFirstNonNull {
		if err := resp.FirstError(replies); err != nil {
			return err
		}
	}
	switch o.merge {
	case mergeSum:
		return resp.MergeSum(replies, errUnexpected)
	case mergeAllOK:
		return replies[0]
	case mergeFirstNonNull:
		// A random start: RANDOMKEY should not favour the first node.
		return resp.MergeFirstNonNull(replies, rand.IntN(len(replies)))
	case mergeAllOnes:
		return resp.MergeAllOnes(replies, errUnexpected)
	case mergeScan:
		return b.scanReply(o, replies[0])
	}
	return replies[0]
}

// scanReply rewrites a node's SCAN reply so its cursor names the walk:
// the node's next cursor, or, when the node is done, the start of the
// next node's, or 0 when it was the last. With a base, the keys of slots
// below it are left out.
func (b *batch) scanReply(o *op, r []byte) []byte {
	if resp.IsError(r) {
		return r
	}
	e, ok := resp.ArrayElements(r)
	if !ok || len(e) != 2 {
		return errUnexpected(r)
	}
	v, err := parseValue(e[0])
	s, _ := v.(string)
	nodeCursor, perr := strconv.ParseUint(s, 10, 64)
	if err != nil || perr != nil {
		return errUnexpected(r)
	}
	keys := e[1]
	if o.scan.base > 0 {
		if keys, ok = o.scan.filter(keys); !ok {
			return errUnexpected(r)
		}
	}
	var cursor uint64
	switch {
	case nodeCursor > maxNodeCursor:
		return []byte("-ERR redproxy: a node's SCAN cursor is too large to carry the node in cluster mode\r\n")
	case nodeCursor != 0:
		cursor = o.scan.cursor(nodeCursor)
	default:
		cursor = o.scan.next()
	}
	out := redcon.AppendArray(nil, 2)
	out = redcon.AppendBulkString(out, strconv.FormatUint(cursor, 10))
	return append(out, keys...)
}

// filter is the array of keys a node's SCAN page holds, less those w
// does not keep; false if it is not an array of bulk strings.
func (w scanWalk) filter(page []byte) ([]byte, bool) {
	keys, ok := resp.ArrayElements(page)
	if !ok {
		return nil, false
	}
	kept := keys[:0]
	for _, k := range keys {
		nl := bytes.IndexByte(k, '\n')
		if k[0] != '$' || nl < 0 || len(k) < nl+3 {
			return nil, false
		}
		if w.keeps(k[nl+1 : len(k)-2]) {
			kept = append(kept, k)
		}
	}
	if len(kept) == len(keys) {
		return page, true
	}
	out := redcon.AppendArray(nil, len(kept))
	for _, k := range kept {
		out = append(out, k...)
	}
	return out, true
}

func errUnexpected(r []byte) []byte {
	return []byte("-ERR redproxy: unexpected reply from a cluster node: " + strconv.Quote(string(r[:min(len(r), 64)])) + "\r\n")
}
