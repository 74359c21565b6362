package cluster

import (
	"math/rand/v2"
	"strconv"

	"github.com/redproxy/redproxy/internal/resp"
	"github.com/tidwall/redcon"
)

// reply builds command i's reply from its sub-commands' replies.
//
// Split commands fail as a whole with the first error (in the client's key
// order) any part got, though the other parts ran: docs/COMPATIBILITY.md.
func (b *batch) reply(i int) []byte {
	o := &b.ops[i]
	if o.local != nil {
		return o.local
	}
	if o.merge == mergeOne || o.n == 1 && o.merge != mergeScan && o.merge != mergeMGET {
		return b.subReply(o.first)
	}
	replies := make([][]byte, o.n)
	for k := range replies {
		replies[k] = b.subReply(o.first + k)
	}
	if o.merge != mergeFirstNonNull {
		if err := resp.FirstError(replies); err != nil {
			return err
		}
	}
	switch o.merge {
	case mergeMGET:
		return resp.MergeMGET(replies, o.pos, errUnexpected)
	case mergeSum:
		return resp.MergeSum(replies, errUnexpected)
	case mergeAllOK:
		return replies[0]
	case mergeConcat:
		return resp.MergeConcat(replies, errUnexpected)
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

// scanReply rewrites a node's SCAN reply so its cursor names the node:
// the node's next cursor, or, when the node is done, the next primary in
// slot order from its start, or 0 when every primary has been walked.
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
	var cursor uint64
	switch {
	case nodeCursor > maxNodeCursor:
		return []byte("-ERR redproxy: a node's SCAN cursor is too large to carry the node in cluster mode\r\n")
	case nodeCursor != 0:
		cursor = scanCursor(o.scanMap, o.scanSlot, nodeCursor)
	default:
		// The next node in the order of the map the walk was planned
		// with: a cursor of another map's order would skip nodes.
		m := o.scanMap
		addr := b.subs[o.first].sentTo
		ps := m.Primaries()
		for k, p := range ps {
			if p == addr && k+1 < len(ps) {
				cursor = scanCursor(m, m.lowestSlot(ps[k+1]), 0)
			}
		}
	}
	out := redcon.AppendArray(nil, 2)
	out = redcon.AppendBulkString(out, strconv.FormatUint(cursor, 10))
	return append(out, e[1]...)
}

func errUnexpected(r []byte) []byte {
	return []byte("-ERR redproxy: unexpected reply from a cluster node: " + strconv.Quote(string(r[:min(len(r), 64)])) + "\r\n")
}
