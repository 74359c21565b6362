package cluster

import (
	"bytes"
	"errors"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/upstream"
)

// ErrSlotUnserved: no node of the slot map owns the slot a client needs a
// connection for.
var ErrSlotUnserved = errors.New("CLUSTERDOWN Hash slot not served")

// BackendFor is the connections of the node owning slot, or of a primary
// when slot is -1: where a client that needs a connection of its own
// (a transaction, a blocking command) takes one.
func (r *Router) BackendFor(slot int) (*upstream.Backend, error) {
	m := r.m.Load()
	if m == nil {
		if err := r.Refresh(); err != nil {
			return nil, err
		}
		m = r.m.Load()
	}
	var addr string
	if slot >= 0 {
		addr = m.Owner(slot)
	} else {
		addr = r.keylessNode(m)
	}
	if addr == "" {
		r.refreshSoon()
		return nil, ErrSlotUnserved
	}
	return r.backend(addr), nil
}

// NodeBackend is the connections of the node at addr, dialled on first
// use; for a client that needs every primary (MONITOR).
func (r *Router) NodeBackend(addr string) *upstream.Backend { return r.backend(addr) }

// Redirected reports whether reply, read from the node at from, is a MOVED
// or ASK, and which slot it names. A MOVED updates the slot map, so the
// next connection taken for the slot is on its new owner. A client holding
// a connection of its own cannot follow it (the connection's transaction
// or blocking command stays on the old node): it gets an error instead.
func (r *Router) Redirected(reply []byte, from string) (slot int, ok bool) {
	moved := bytes.HasPrefix(reply, prefixMoved)
	if !moved && !bytes.HasPrefix(reply, prefixAsk) {
		return 0, false
	}
	slot, addr, ok := parseRedirect(reply, from)
	if !ok {
		return 0, false
	}
	if moved {
		r.moved.Add(1)
		for {
			m := r.m.Load()
			if m == nil || m.Owner(slot) == addr || r.m.CompareAndSwap(m, m.withOwner(slot, addr)) {
				break
			}
		}
		r.refreshSoon()
	} else {
		r.asked.Add(1)
		r.noteAsk(slot, from)
	}
	return slot, true
}

// Whole reports whether the command named name (as the command table
// names it) concerns the whole keyspace, so that no one node can run it
// for a client: the router sends it to every primary, or walks them.
func Whole(name string) bool {
	_, ok := fanOut[name]
	return ok || name == "scan"
}

// SlotArgs appends the indices of the arguments of args that decide which
// node serves the command: its keys, or the channels of the sharded
// pub/sub commands, which Redis hashes like keys but the command table
// does not list as keys.
func SlotArgs(cmd *commands.Command, args [][]byte, dst []int) []int {
	switch cmd.Name {
	case "ssubscribe", "sunsubscribe":
		for i := 1; i < len(args); i++ {
			dst = append(dst, i)
		}
		return dst
	case "spublish":
		if len(args) > 1 {
			dst = append(dst, 1)
		}
		return dst
	}
	return cmd.Keys(args, dst)
}

// CrossSlot is Redis Cluster's reply to keys of different slots.
func CrossSlot() []byte { return errCrossSlot }
