package proxy

import (
	"strings"

	"github.com/redproxy/redproxy/internal/guard"
	"github.com/redproxy/redproxy/internal/resp"
	"github.com/redproxy/redproxy/internal/upstream"
)

// A client blocked in a pop that leaves is seen leaving at once
// (watchHangup), and its connection to Redis is closed; but an element
// pushed in the moment between the client's leaving and Redis reading
// that close is popped for nobody. On Redis directly the client's close
// reaches Redis itself, before a push sent after it: a worker that
// restarts loses no job. Seen leaving with a pop's reply in, the proxy
// puts what was popped back where it was (requeueCmd): list elements at
// the end they were taken from, sorted-set members with their scores
// unless the member was added again meanwhile. The elements reappear a
// moment later, and a consumer may take one before another popped later,
// but none is lost (found by review: 8 pushes in 10 lost when sent right
// after the worker closed, 22 in 40 with the leaving seen at once).
// BLMOVE and BRPOPLPUSH are left alone: the element is in the
// destination list, where a reliable queue's reaper finds it, and XREAD
// consumes nothing (XREADGROUP's entries wait in the pending list).
func requeueCmd(name string, args [][]byte, reply []byte) [][]byte {
	top, ok := resp.ArrayElements(reply)
	if !ok || len(top) < 2 {
		return nil // null: nothing was popped
	}
	key, ok := bulkString(top[0])
	if !ok {
		return nil
	}
	switch name {
	case "blpop", "brpop":
		elem, ok := bulkString(top[1])
		if !ok || len(top) != 2 {
			return nil
		}
		push := "LPUSH"
		if name == "brpop" {
			push = "RPUSH"
		}
		return [][]byte{[]byte(push), key, elem}
	case "bzpopmin", "bzpopmax":
		if len(top) != 3 {
			return nil
		}
		member, ok1 := bulkString(top[1])
		score, ok2 := scoreString(top[2])
		if !ok1 || !ok2 {
			return nil
		}
		return [][]byte{[]byte("ZADD"), key, []byte("NX"), score, member}
	case "blmpop", "bzmpop":
		elems, ok := resp.ArrayElements(top[1])
		if !ok || len(top) != 2 || len(elems) == 0 {
			return nil
		}
		if name == "bzmpop" {
			cmd := [][]byte{[]byte("ZADD"), key, []byte("NX")}
			for _, pair := range elems {
				ms, ok := resp.ArrayElements(pair)
				if !ok || len(ms) != 2 {
					return nil
				}
				member, ok1 := bulkString(ms[0])
				score, ok2 := scoreString(ms[1])
				if !ok1 || !ok2 {
					return nil
				}
				cmd = append(cmd, score, member)
			}
			return cmd
		}
		// Taken from the LEFT or RIGHT end, first popped first: pushed
		// back last first, so that the first is at that end again.
		where, ok := mpopWhere(args)
		if !ok {
			return nil
		}
		push := []byte("LPUSH")
		if strings.EqualFold(string(where), "right") {
			push = []byte("RPUSH")
		}
		cmd := [][]byte{push, key}
		for i := len(elems) - 1; i >= 0; i-- {
			e, ok := bulkString(elems[i])
			if !ok {
				return nil
			}
			cmd = append(cmd, e)
		}
		return cmd
	}
	return nil
}

// leftBlockRan finishes, for a client that left (or was killed) while
// blocked, a blocking command Redis had already served: what a pop took
// is put back (requeueCmd), and whatever the command or the putting back
// wrote gets its policy TTL. The pushed-back key may be one the pop had
// emptied and so deleted with its TTL; BLMOVE's destination is left as
// it is, and its fix-up was unsent. Either way a key the policy requires
// a TTL on was left without one (found by review: a CLIENT KILL right
// after Redis served a BLMOVE). fixups are the command's own, sent on a
// shared connection of b in the client's database, after the command,
// whose reply is in.
func (sess *Session) leftBlockRan(b *upstream.Backend, name string, args [][]byte, reply []byte, fixups [][]byte) {
	if resp.IsError(reply) || resp.IsNull(reply) {
		return // nothing ran, or nothing was popped
	}
	call := upstream.NewCall()
	back := requeueCmd(name, args, reply)
	if back != nil {
		call.Add(resp.AppendCommand(nil, back...))
		// A batch of its own: the session's holds fixups.
		var g guard.Batch
		g.Prepare(sess.srv.guard.Policy(), sess.cmds.table, []resp.Request{{Args: back}}, sess.userName(), sess.listenerName(), nil)
		if d := g.Decision(0); d != nil && len(d.Expires) > 0 {
			for _, f := range g.Fixups(d.Expires) {
				call.Add(f)
			}
		}
	} else {
		for _, f := range fixups {
			call.Add(f)
		}
		// What the command did stays: the mirror is told, as for an
		// answered one.
		sess.mirrorBlocked(name, args, reply, fixups)
	}
	if call.Len() == 0 {
		return
	}
	b.Pool(sess.db, false).Do(call)
	for i := range call.Len() {
		if r, err := call.Reply(i); err != nil || resp.IsError(r) {
			sess.srv.log.Warn("what a blocking command did for a client that had left could not be finished",
				"command", name, "reply", string(r), "err", err)
			return
		}
	}
}

// scoreString is a sorted-set score in a pop's reply as ZADD takes it: a
// bulk string (RESP2) or a RESP3 double.
func scoreString(e []byte) ([]byte, bool) {
	if len(e) > 3 && e[0] == ',' {
		return e[1 : len(e)-2], true
	}
	return bulkString(e)
}
