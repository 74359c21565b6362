package mirror

import "github.com/redproxy/redproxy/internal/resp"

// Batch collects the commands of one client batch that are to be mirrored.
// A session keeps one and reuses it, so collecting allocates nothing once
// its slices have grown; until Enqueue copies them, they point into the
// client's buffers and the batch's replies.
type Batch struct {
	parts  [][]byte
	cmds   []pendingCmd
	ticket uint64 // Begin's (order.go); 0: none
	// held is the id of the last of the session's entries put in the held
	// list (order.go); kept across Reset: while that entry is held, the
	// session's later ones are held behind it.
	held    uint64
	crossDB bool // a command reaches another database (crossesDatabases)
}

type pendingCmd struct {
	parts      int
	name       string
	read       bool
	compare    bool
	primaryErr bool
	reply, key []byte
}

// Write adds a write the primary ran: its parts, one or more RESP commands
// sent back to back (a command wrapped in MULTI/EXEC with the guard's
// fix-ups is mirrored wrapped the same way). primaryErr says the primary
// answered it with an error (a script that failed after writing), so the
// mirror's error is not counted against it.
func (b *Batch) Write(name string, primaryErr bool, parts ...[]byte) {
	b.crossDB = b.crossDB || CrossesDatabases(name)
	b.parts = append(b.parts, parts...)
	b.cmds = append(b.cmds, pendingCmd{parts: len(parts), name: name, primaryErr: primaryErr})
}

// WriteCrossDB is Write for a write that reaches another database than
// its client's in a way its name does not say: a transaction with a SELECT.
func (b *Batch) WriteCrossDB(name string, primaryErr bool, parts ...[]byte) {
	b.crossDB = true
	b.Write(name, primaryErr, parts...)
}

// CrossesDatabases reports whether a write named name may change another
// database than the one it was sent in (COPY only with its DB option, but
// it is rare enough to take as a whole). Scripts are not counted: one
// that MOVEs is rare, and cutting the sender's round at every script
// would slow the mirror for the many that do not (docs/COMPATIBILITY.md).
func CrossesDatabases(name string) bool {
	switch name {
	case "move", "copy", "swapdb", "flushall":
		return true
	}
	return false
}

// Read adds a sampled read, raw as sent to the primary, with the primary's
// reply and the read's first key; compare asks for the mirror's reply to be
// compared with reply.
func (b *Batch) Read(name string, raw, reply, key []byte, compare bool) {
	b.parts = append(b.parts, raw)
	p := pendingCmd{parts: 1, name: name, read: true, compare: compare, primaryErr: resp.IsError(reply)}
	if compare {
		p.reply, p.key = reply, key
	}
	b.cmds = append(b.cmds, p)
}

// Len is the number of commands collected.
func (b *Batch) Len() int { return len(b.cmds) }

// Reset empties the batch, keeping its slices' memory but nothing of the
// client's.
func (b *Batch) Reset() {
	clear(b.parts)
	clear(b.cmds)
	b.parts, b.cmds = b.parts[:0], b.cmds[:0]
	b.crossDB = false
}

// size is what the batch takes in the queue: its bytes and, for each
// command, a little bookkeeping.
func (b *Batch) size() int64 {
	var n int64
	for _, p := range b.parts {
		n += int64(len(p)) + 8
	}
	for _, c := range b.cmds {
		n += int64(len(c.reply)+len(c.key)) + 64
	}
	return n
}

// copyOut copies the batch into a queue entry: one buffer for every byte.
func (b *Batch) copyOut(db int, resp3 bool, size int64) *entry {
	var total int
	for _, p := range b.parts {
		total += len(p)
	}
	for _, c := range b.cmds {
		total += len(c.reply) + len(c.key)
	}
	e := &entry{db: db, resp3: resp3, size: size, crossDB: b.crossDB, buf: make([]byte, 0, total),
		ends: make([]int, 0, len(b.parts)), cmds: make([]command, len(b.cmds))}
	for _, p := range b.parts {
		e.buf = append(e.buf, p...)
		e.ends = append(e.ends, len(e.buf))
	}
	for i, c := range b.cmds {
		e.cmds[i] = command{parts: c.parts, name: c.name, read: c.read, compare: c.compare, primaryErr: c.primaryErr}
		if c.compare {
			e.cmds[i].reply[0] = len(e.buf)
			e.buf = append(e.buf, c.reply...)
			e.cmds[i].reply[1] = len(e.buf)
			e.cmds[i].key[0] = len(e.buf)
			e.buf = append(e.buf, c.key...)
			e.cmds[i].key[1] = len(e.buf)
		}
	}
	return e
}
