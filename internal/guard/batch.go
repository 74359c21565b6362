package guard

import (
	"slices"
	"strconv"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/resp"
)

// Batch is one client connection's guard state: the decisions for the batch
// of requests it is answering, and the buffers reused from batch to batch so
// that a connection whose commands break no rule allocates nothing. It is
// not safe for concurrent use.
type Batch struct {
	reqs []policy.Request
	dec  []policy.Decision
	// cmds are the batch's commands as the table found them (nil:
	// unknown), for the session to take instead of looking each up again.
	cmds []*commands.Command

	// scratch holds re-encoded commands and fix-ups. They are queued for
	// Redis by slices until the batch is flushed, so a full chunk is
	// replaced, never grown in place under them.
	scratch []byte
	fixups  [][]byte

	// joined[i] says requests i-1 and i must reach Redis in one part of
	// the batch: a write before i has its TTL from a request at or after
	// i (Decision.TTLFrom). Empty when no write depends on a later one.
	joined []bool
}

// Batches larger than this do not keep their buffers for the next one.
const keepRequests = 4096

// Trim drops the buffers a large batch grew, for a client gone idle.
func (b *Batch) Trim() {
	if cap(b.scratch) > 64<<10 {
		b.scratch = nil
	}
}

// Prepare decides reqs under p (nil p allows everything). user and listener
// select the policy's scope. denied, when not nil, says whether the proxy
// refuses write i before it runs (the user's ACL): the look-ahead must not
// trust a TTL from a command that will not run. The requests' bytes must
// stay valid while the decisions are used.
func (b *Batch) Prepare(p *policy.Policy, table *commands.Table, reqs []resp.Request, user, listener string, denied func(i int, cmd *commands.Command, args [][]byte) bool) {
	b.PrepareTx(p, table, reqs, user, listener, denied, nil, nil)
}

// PrepareTx is Prepare for a batch that goes on with a client's
// transaction, whose earlier batches left TTL requirements open for the
// keys open (policy.CheckTx): it sets settled[j] where this batch settles
// open[j], and reports whether the batch closes what is left.
func (b *Batch) PrepareTx(p *policy.Policy, table *commands.Table, reqs []resp.Request, user, listener string, denied func(i int, cmd *commands.Command, args [][]byte) bool, open [][]byte, settled []bool) (closed bool) {
	if cap(b.reqs) > keepRequests && len(reqs) <= keepRequests {
		b.reqs, b.dec, b.joined, b.cmds = nil, nil, nil, nil
	}
	if cap(b.scratch) > 1<<20 {
		b.scratch = nil
	}
	b.scratch = b.scratch[:0]
	clear(b.fixups)
	b.fixups = b.fixups[:0]
	b.reqs = b.reqs[:0]
	b.cmds = b.cmds[:0]
	for i := range reqs {
		args := reqs[i].Args
		cmd := table.Lookup(args)
		// Only writes can give a key its TTL; the ACL is checked for them
		// alone. Keys are left for the policy to find, for the few rules
		// that need the list: listing them here cost a million-key MGET
		// megabytes that nothing read (found by review).
		no := denied != nil && cmd != nil && cmd.Is(commands.Write) && denied(i, cmd, args)
		b.reqs = append(b.reqs, policy.Request{Cmd: cmd, Args: args, User: user, Listener: listener, Denied: no})
		b.cmds = append(b.cmds, cmd)
	}
	b.dec, closed = p.CheckTx(b.reqs, b.dec, open, settled)
	clear(b.reqs) // keep no references to the client's buffer past its use
	b.joined = b.joined[:0]
	reach := 0 // the furthest request an earlier write's TTL comes from
	for i := range b.dec {
		if i > 0 && reach >= i {
			if len(b.joined) == 0 {
				b.joined = slices.Grow(b.joined, len(b.dec))[:len(b.dec)]
				clear(b.joined)
			}
			b.joined[i] = true
		}
		reach = max(reach, b.dec[i].TTLFrom)
	}
	return closed
}

// CutOff reports whether a write of the batch would get a TTL fix-up or
// a refusal only because the batch ended: what the client sent after it
// may set the TTL (policy.Decision.CutOff).
func (b *Batch) CutOff() bool {
	for i := range b.dec {
		if b.dec[i].CutOff {
			return true
		}
	}
	return false
}

// Command returns request i's command as Prepare looked it up in its table
// (nil: not a known command); ok is false when the batch has no request i.
func (b *Batch) Command(i int) (cmd *commands.Command, ok bool) {
	if i >= len(b.cmds) {
		return nil, false
	}
	return b.cmds[i], true
}

// Joined reports whether requests i-1 and i must be sent to Redis in the
// same part of the batch, because the look-ahead trusted a request at or
// after i to give an earlier write's key its TTL. A session that answers a
// batch in parts must not split it there: should the client be closed
// between the parts, the write would have run and its TTL not.
func (b *Batch) Joined(i int) bool { return i < len(b.joined) && b.joined[i] }

// Decision returns the decision on request i, or nil when it broke no rule.
func (b *Batch) Decision(i int) *policy.Decision {
	if i >= len(b.dec) || len(b.dec[i].Violations) == 0 {
		return nil
	}
	return &b.dec[i]
}

// Encode returns args as a RESP command, valid until the next Prepare.
func (b *Batch) Encode(args [][]byte) []byte {
	n := 16
	for _, a := range args {
		n += len(a) + 16
	}
	b.reserve(n)
	start := len(b.scratch)
	b.scratch = resp.AppendCommand(b.scratch, args...)
	return b.scratch[start:len(b.scratch):len(b.scratch)]
}

// Fixups returns the RESP encodings of EXPIRE key seconds NX for each of
// exps, valid until the next Prepare. It is for commands whose keys are all
// in the current database: a fix-up for a key in another database is left
// out (use FixupsIn).
func (b *Batch) Fixups(exps []policy.Expire) [][]byte { return b.FixupsIn(exps, -1, 0) }

// FixupsIn is Fixups for a connection whose current database is db, on a
// server with databases databases. A fix-up for a key in another database
// (COPY ... DB n) becomes SELECT n, EXPIRE key seconds NX, SELECT db, so
// the connection ends where it was. When n is not a database the server has
// (or db < 0), Redis refuses the command itself and there is nothing to
// fix; the fix-up is left out rather than run its EXPIRE in the wrong
// database.
func (b *Batch) FixupsIn(exps []policy.Expire, db, databases int) [][]byte {
	start := len(b.fixups)
	for _, e := range exps {
		var num [20]byte
		secs := strconv.AppendInt(num[:0], e.Seconds, 10)
		mode := nxName
		if e.LT {
			mode = ltName
		}
		if e.DB != nil {
			n, err := strconv.Atoi(string(e.DB))
			// Redis takes the number as string2ll does: "01" and "+1"
			// are refused, COPY fails, and the fix-up's SELECT would fail
			// too, running its EXPIRE in the client's own database (found
			// by review).
			if err != nil || n < 0 || n >= databases || db < 0 || strconv.Itoa(n) != string(e.DB) {
				continue
			}
			var cur [20]byte
			b.fixup(selectName, e.DB)
			b.fixup(expireName, e.Key, secs, mode)
			b.fixup(selectName, strconv.AppendInt(cur[:0], int64(db), 10))
			continue
		}
		b.fixup(expireName, e.Key, secs, mode)
	}
	return b.fixups[start:len(b.fixups):len(b.fixups)]
}

func (b *Batch) fixup(args ...[]byte) {
	n := 16
	for _, a := range args {
		n += len(a) + 16
	}
	b.reserve(n)
	s := len(b.scratch)
	b.scratch = resp.AppendCommand(b.scratch, args...)
	b.fixups = append(b.fixups, b.scratch[s:len(b.scratch):len(b.scratch)])
}

var (
	expireName = []byte("EXPIRE")
	nxName     = []byte("NX")
	ltName     = []byte("LT")
	selectName = []byte("SELECT")
)

func (b *Batch) reserve(n int) {
	if cap(b.scratch)-len(b.scratch) < n {
		b.scratch = make([]byte, 0, max(2*cap(b.scratch), n, 512))
	}
}

// AppendRefusal appends the error reply for a refused command: "-" and the
// violation's message (which starts with "ERR redproxy policy: "). Line
// breaks, which would end the reply early, cannot come from a client's key
// (keys are quoted) but are replaced to be sure.
func AppendRefusal(dst []byte, v *policy.Violation) []byte { return AppendError(dst, v.Message()) }

// AppendError appends msg as an error reply, line breaks replaced.
func AppendError(dst []byte, msg string) []byte {
	dst = append(dst, '-')
	start := len(dst)
	dst = append(dst, msg...)
	for i := start; i < len(dst); i++ {
		if dst[i] == '\r' || dst[i] == '\n' {
			dst[i] = ' '
		}
	}
	return append(dst, '\r', '\n')
}

// RefusedInMulti is forwarded in place of a command refused inside a
// client's MULTI. Redis rejects it at queue time like any unknown command,
// which makes the client's EXEC fail with EXECABORT, as it would if Redis
// itself had rejected the refused command: a transaction runs whole or not
// at all. Its reply is hidden from the client.
var RefusedInMulti = resp.AppendCommandStrings(nil, "redproxy-policy-refused")
