package proxy

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/redproxy/redproxy/internal/cluster"
	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/mirror"
	"github.com/redproxy/redproxy/internal/resp"
	"github.com/redproxy/redproxy/internal/sentinel"
	"github.com/redproxy/redproxy/internal/upstream"
)

// Mirroring ([mirror], internal/mirror) wired into the session. Which
// commands are mirrored is decided as they are dispatched (mirrorNote,
// called where a command's reply slot is recorded for the shared path:
// forwardCommand, guardStep, flightStep); what they are sent with is read
// at the end of flush, once the primary's replies are in, so a write the
// primary refused is not mirrored and a sampled read can be compared, and
// the client waits for nothing of the mirror's. With mirroring off, each
// step costs one nil check.

// mirrorState is a session's part of mirroring: the batch's commands noted
// for the mirror, and the batch they are copied from at flush.
type mirrorState struct {
	marks []mirrorMark
	batch mirror.Batch
	parts [][]byte // scratch: the parts of a wrapped write
	tx    mirrorTx
	cmd   []byte // scratch: a blocking command's non-blocking form
	// effects holds the batch's nondeterministic writes as rebuilt from
	// their replies (mirrorEffect), until Enqueue copies them.
	effects []byte
	args    [][]byte // scratch
}

// mirrorMark is one command of the batch to be mirrored: the reply slot
// the session recorded for it, and for a read, its first key.
type mirrorMark struct {
	slot    int
	hidden  int // fix-ups following it on a pinned connection (under WATCH)
	name    string
	raw     []byte // the client's bytes (a read answered by a coalesced fetch)
	key     []byte
	read    bool
	compare bool
	script  bool
	exec    bool // the EXEC of a transaction with writes (mirrorTx)
	nondet  bool // a write flagged nondeterministic: mirrored as its effect (mirrorEffect)
}

// mirrorTx is the client's open transaction as the mirror will see it:
// the writes queued since MULTI, as sent (with the guard's rewrites and
// fix-ups), and the SELECTs between them, kept across batches until EXEC.
// A transaction that ran is mirrored as MULTI, these, EXEC in one queue
// entry, so the mirror applies it atomically too; one that did not run
// mirrors nothing.
type mirrorTx struct {
	buf      []byte
	ends     []int
	selected bool // a SELECT is among them: the mirror's connection selects back after EXEC
	// crossDB: a write among them may change another database (MOVE,
	// COPY, ...), so the transaction runs alone on the mirror, as such a
	// write does outside one (mirror.CrossesDatabases).
	crossDB bool
	over    bool // larger than mirror.queue_bytes: dropped (too_large) at EXEC
}

func (tx *mirrorTx) part(i int) []byte {
	start := 0
	if i > 0 {
		start = tx.ends[i-1]
	}
	return tx.buf[start:tx.ends[i]]
}

// add keeps one command of the transaction, as sent; past max bytes the
// queue could never take the transaction, and nothing more is kept.
func (tx *mirrorTx) add(raw []byte, max int) {
	switch {
	case tx.over:
	case len(tx.buf)+len(raw) > max:
		tx.over, tx.buf, tx.ends = true, nil, nil
	default:
		tx.buf = append(tx.buf, raw...)
		tx.ends = append(tx.ends, len(tx.buf))
	}
}

func (tx *mirrorTx) reset() {
	if cap(tx.buf) > 64<<10 {
		tx.buf = nil // a large transaction's copy is not kept for an idle client
	}
	*tx = mirrorTx{buf: tx.buf[:0], ends: tx.ends[:0]}
}

// initMirror starts the mirror when [mirror] names an upstream.
func initMirror(s *Server) error {
	u, ok := s.cfg.MirrorUpstream()
	if !ok {
		return nil
	}
	dial, err := mirrorTarget(s, s.cfg.Mirror.Upstream, u)
	if err != nil {
		return err
	}
	address, databases := u.Address, u.Databases
	switch u.Mode {
	case config.ModeSentinel:
		address = "sentinel " + u.MasterName + " via " + strings.Join(u.Sentinels, ",")
	case config.ModeCluster:
		address, databases = "cluster via "+strings.Join(u.Seeds, ","), 1
	}
	s.mirror = mirror.New(mirror.Options{
		Config: s.cfg.Mirror, Dial: dial, Address: address, Databases: databases, Logger: s.log,
	})
	s.mirror.RegisterMetrics(s.metrics.Registry)
	return nil
}

// mirrorTarget is the one place the mirror's connections are built, for
// the named upstream u, with u's own credentials and TLS (never a client's
// or [upstream]'s): a Backend of a standalone upstream; a Backend that a
// Sentinel watcher moves to each new primary, as for a named Sentinel
// upstream (routes.go); a cluster Router, as for a named cluster upstream.
// The mirror dials it on its own goroutine, so a mirror that is down
// delays neither the start nor a client.
func mirrorTarget(s *Server, name string, u config.Upstream) (func(stop <-chan struct{}) mirror.Target, error) {
	tlsConf, err := u.ClientTLS()
	if err != nil {
		return nil, err
	}
	log := s.log.With("upstream", name, "mirror", true)
	opt := func(addr string) upstream.BackendOptions {
		return upstream.BackendOptions{
			Addr:         addr,
			Username:     u.Username,
			Password:     u.Password,
			TLS:          tlsConf,
			Connections:  u.Connections,
			MaxPinned:    u.MaxPinned,
			Databases:    u.Databases,
			DialTimeout:  u.DialTimeout.Duration,
			ReplyTimeout: u.ReplyTimeout.Duration,
			DeadTimeout:  u.DeadTimeout.Duration,
			ReconnectMin: u.ReconnectMin.Duration,
			ReconnectMax: u.ReconnectMax.Duration,
			Logger:       log,
			ReplyLimit:   int(s.Config().Server.ClientOutputLimit),
		}
	}
	switch u.Mode {
	case config.ModeCluster:
		return func(<-chan struct{}) mirror.Target {
			r := cluster.New(cluster.Options{Seeds: u.Seeds, Backend: opt(""), Tables: s.tableInForce, Logger: log})
			return mirror.RouterTarget(r)
		}, nil
	case config.ModeSentinel:
		return func(stop <-chan struct{}) mirror.Target {
			so := sentinelOptions(&config.Config{Upstream: u}, log)
			var b *upstream.Backend
			switched := make(chan struct{})
			so.OnSwitch = func(primary string) {
				<-switched // b is set
				b.Failover(opt(primary))
				log.Warn("mirror: switched to the new primary", "primary", primary)
			}
			w := sentinel.New(so)
			ctx, cancel := context.WithTimeout(context.Background(), 3*u.DialTimeout.Duration*time.Duration(len(u.Sentinels)))
			type found struct {
				addr string
				err  error
			}
			done := make(chan found, 1)
			go func() {
				addr, _, err := w.Discover(ctx, "", -1)
				done <- found{addr, err}
			}()
			var f found
			select {
			case f = <-done:
				cancel()
			case <-stop:
				// The mirror is closing: no Target, and no wait for
				// Sentinels that do not answer, which held Shutdown past
				// its timeout (found by review: 10 s for a 1 s one). The
				// search ends within its own timeout, then the watcher.
				cancel()
				go func() { <-done; w.Close() }()
				return nil
			}
			addr, err := f.addr, f.err
			if err != nil {
				log.Warn("mirror: no primary found at start; mirrored commands are dropped (unavailable) until one is", "master_name", u.MasterName, "err", err)
			}
			b = upstream.NewBackend(opt(addr))
			close(switched)
			w.Start(addr)
			return mirror.BackendTarget(b, w.Close)
		}, nil
	}
	return func(<-chan struct{}) mirror.Target {
		return mirror.BackendTarget(upstream.NewBackend(opt(u.Address)), nil)
	}, nil
}

// Mirror returns the running mirror; nil when mirroring is off.
func (s *Server) Mirror() *mirror.Mirror { return s.mirror }

// MirrorHandler serves /debug/mirror for the admin server.
func (s *Server) MirrorHandler() http.Handler {
	if s.mirror == nil {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "mirroring is off (mirror.upstream)", http.StatusNotFound)
		})
	}
	return s.mirror.Handler()
}

func (s *Server) closeMirror() {
	if s.mirror != nil {
		s.mirror.Close()
	}
}

// mirrorsAsWrite: the commands mirrored as writes, mirroredWrite's and
// SCRIPT LOAD, so that the application's EVALSHA finds its script on the
// mirror.
func mirrorsAsWrite(cmd *commands.Command) bool {
	return mirroredWrite(cmd) || cmd.Name == "script|load"
}

// mirroredWrite: the writes the mirror copies. Scripts and functions may
// write any key (mayWrite). DEBUG, which mayWrite counts for the local
// tier (DEBUG RELOAD), is not: the mirror must not sleep, reload its own
// file or crash on the primary's account (found by review).
func mirroredWrite(cmd *commands.Command) bool {
	return mayWrite(cmd) && cmd.Name != "debug"
}

// uncomparable are reads whose replies legitimately differ between two
// servers holding the same data: remaining times (the mirror's EXPIRE ran
// a moment later), access statistics and encodings.
var uncomparable = map[string]bool{
	"ttl": true, "pttl": true, "expiretime": true, "pexpiretime": true,
	"object|idletime": true, "object|freq": true, "object|encoding": true, "object|refcount": true,
	"memory|usage": true,
}

// mirrorNote notes the command being dispatched for the mirror, once its
// reply slot is recorded (the session's last slot, or the last before its
// fix-ups on a pinned connection): every write, and the sampled share of
// reads of keys. Inside MULTI the writes are kept for EXEC (mirrorQueued).
func (sess *Session) mirrorNote(r *request) {
	mr := sess.srv.mirror
	if mr == nil || r.cmd == nil || len(sess.slots) == 0 {
		return
	}
	if sess.pin.inMulti {
		sess.mirrorQueued(r)
		return
	}
	slot, hidden := sess.mirrorCommandSlot()
	mk := mirrorMark{slot: slot, hidden: hidden, name: r.name, raw: r.Raw}
	switch {
	case mirrorsAsWrite(r.cmd):
		if !mr.Writes() {
			return
		}
		mk.script = r.cmd.Parent == nil && r.cmd.Is(commands.CatScripting) // EVAL, EVALSHA, FCALL
		mk.nondet = r.cmd.Is(commands.Nondeterministic)
	case r.cmd.Is(commands.ReadOnly):
		var kb [1]int
		keys := r.cmd.KeysAtMost(r.Args, kb[:0], 1)
		if len(keys) == 0 || !mr.SampleRead() {
			return
		}
		mk.read, mk.key = true, r.Args[keys[0]]
		mk.compare = mr.Compare() && !uncomparable[r.name] && !r.cmd.Is(commands.Nondeterministic) && !r.cmd.Is(commands.NondeterministicOrder)
	default:
		return
	}
	ms := sess.mirrorState()
	if !mk.read {
		ms.batch.Begin(mr) // before the write is sent (mirror/order.go)
	}
	ms.marks = append(ms.marks, mk)
}

// mirrorState is the session's mirror state, allocated on first use: most
// sessions never mirror anything, and an idle one should hold no more
// than it must (park.go).
func (sess *Session) mirrorState() *mirrorState {
	if sess.mirrorS == nil {
		sess.mirrorS = &mirrorState{}
	}
	return sess.mirrorS
}

// mirrorCommandSlot finds the slot of the command just dispatched: the
// last one, unless fix-ups (hidden slots) follow it, as they do on a
// pinned connection; hidden is how many.
func (sess *Session) mirrorCommandSlot() (slot, hidden int) {
	slot = len(sess.slots) - 1
	for slot > 0 && sess.slots[slot].kind == slotHidden {
		slot--
	}
	return slot, len(sess.slots) - 1 - slot
}

// mirrorQueued keeps a write queued inside the client's MULTI (and any
// SELECT, which decides where the writes after it land) for EXEC: copied,
// as the transaction may span batches. Reads inside a transaction are not
// sampled.
func (sess *Session) mirrorQueued(r *request) { sess.mirrorQueuedCmd(r.name, r.cmd) }

// mirrorQueuedCmd is mirrorQueued for the command of the batch's last
// non-hidden slot: also a held command replayed at EXEC (placeHeld).
func (sess *Session) mirrorQueuedCmd(name string, cmd *commands.Command) {
	mr := sess.srv.mirror
	if !mr.Writes() || !mirrorsAsWrite(cmd) && name != "select" {
		return
	}
	slot, _ := sess.mirrorCommandSlot()
	if sess.slots[slot].kind != slotUpstream {
		return // answered by the proxy: not part of the transaction
	}
	tx := &sess.mirrorState().tx
	if tx.over {
		return
	}
	for p := sess.slots[slot].i; p < sess.call.Len(); p++ {
		tx.add(sess.call.Part(p), mr.MaxBytes())
	}
	if tx.over {
		return
	}
	tx.selected = tx.selected || name == "select"
	tx.crossDB = tx.crossDB || mirror.CrossesDatabases(name)
}

// mirrorQueuedFixup notes a policy fix-up queued in the client's MULTI
// apart from the write it fixes (fixDue), for the mirror's copy of the
// transaction.
func (sess *Session) mirrorQueuedFixup(raw []byte) {
	mr := sess.srv.mirror
	if mr == nil || !mr.Writes() {
		return
	}
	sess.mirrorState().tx.add(raw, mr.MaxBytes())
}

// mirrorWrapped mirrors one MULTI/command/fix-ups/EXEC group of the
// proxy's own (slot sl) if its EXEC ran and the command succeeded.
func (sess *Session) mirrorWrapped(call *upstream.Call, sl slot, mk mirrorMark) {
	ms, mr := sess.mirrorS, sess.srv.mirror
	exec, err := call.Reply(sl.end)
	if err != nil || !execRan(exec) || resp.IsError(firstElement(exec)) {
		mr.Skipped(mirror.SkipPrimaryError)
		return
	}
	ms.parts = ms.parts[:0]
	for p := sl.i - 1; p <= sl.end; p++ {
		ms.parts = append(ms.parts, call.Part(p))
	}
	if mk.nondet {
		// Inside the same MULTI and EXEC: the command's reply is EXEC's
		// first element.
		ms.writeEffect(&ms.batch, mr, mk.name, 1, firstElement(exec))
		return
	}
	ms.batch.Write(mk.name, false, ms.parts...)
}

// mirrorExecQueued notes the client's EXEC, just added to the batch, for
// the mirror when its transaction has writes: whether they are mirrored
// depends on EXEC's reply (mirrorExec).
func (sess *Session) mirrorExecQueued() {
	ms := sess.mirrorS
	if ms == nil || len(ms.tx.ends) == 0 && !ms.tx.over {
		return
	}
	ms.batch.Begin(sess.srv.mirror) // before EXEC is sent (mirror/order.go)
	ms.marks = append(ms.marks, mirrorMark{slot: len(sess.slots) - 1, name: "exec", exec: true})
}

// mirrorTxEnded forgets the transaction's writes when its pinned
// connection goes back: after EXEC they were queued (or not) already;
// after DISCARD, RESET or a lost connection they never ran.
func (sess *Session) mirrorTxEnded() {
	if sess.mirrorS != nil {
		sess.mirrorS.tx.reset()
	}
}

// mirrorFlushed hands the batch's noted commands to the mirror, with what
// the primary answered; flush calls it once every reply is in, before the
// slots and the Call are reset.
func (sess *Session) mirrorFlushed(call *upstream.Call) {
	ms := sess.mirrorS
	mr := sess.srv.mirror
	b := &ms.batch
	for _, mk := range ms.marks {
		sl := sess.slots[mk.slot]
		var raw, reply []byte
		var err error
		byReplica := false
		if mk.exec {
			sess.mirrorExec(call, sl)
			continue
		}
		switch sl.kind {
		case slotUpstream:
			raw = call.Part(sl.i)
			reply, err = call.Reply(sl.i)
			byReplica = sess.reads.answered
			if mk.hidden > 0 && !mk.read {
				// Under WATCH its fix-ups follow it, unwrapped, as on the
				// primary.
				ms.parts = ms.parts[:0]
				for p := sl.i; p <= sl.i+mk.hidden; p++ {
					ms.parts = append(ms.parts, call.Part(p))
				}
				switch {
				case err != nil && !errors.Is(err, upstream.ErrOutputLimit) || err == nil && resp.IsError(reply):
					mr.Skipped(mirror.SkipPrimaryError)
				case !mk.nondet:
					b.Write(mk.name, false, ms.parts...)
				case err == nil:
					ms.writeEffect(b, mr, mk.name, 0, reply) // its fix-ups behind it
				default:
					mr.Skipped(mirror.SkipNondeterministic) // its reply, which says its effect, was dropped
				}
				continue
			}
		case slotLocal:
			raw, reply = mk.raw, sess.local[sl.i:sl.end]
		case slotWrapped:
			// MULTI, the command, its fix-ups, EXEC: mirrored the same way,
			// so the mirror's keys get the same TTLs. A command split in
			// parts (forwardWithFixups) is marked at its last part; each
			// part that ran is mirrored (only the last one was, found in
			// the read-back of the change that split it).
			first := mk.slot
			for j := mk.slot - 1; j >= 0; j-- {
				if ps := sess.slots[j]; ps.kind == slotWrapped && ps.part {
					first = j
				} else if ps.kind != slotHidden {
					break
				}
			}
			for j := first; j <= mk.slot; j++ {
				if ps := sess.slots[j]; ps.kind == slotWrapped {
					sess.mirrorWrapped(call, ps, mk)
				}
			}
			continue
		default:
			continue
		}
		switch {
		case mk.read:
			if err == nil {
				compare := mk.compare
				if compare && byReplica {
					// A replica answered the read (read_from): it may lag
					// the primary, so its reply is no measure of the
					// mirror's. Compared as the primary's, a stale one
					// counted a mismatch that did not exist (found by
					// review). Still mirrored, for the load.
					compare = false
					mr.Skipped(mirror.SkipReplicaRead)
				}
				b.Read(mk.name, raw, reply, mk.key, compare)
			}
		case errors.Is(err, upstream.ErrOutputLimit) && mk.nondet:
			// It ran, but its reply, which says what it did, was dropped.
			mr.Skipped(mirror.SkipNondeterministic)
		case errors.Is(err, upstream.ErrOutputLimit):
			// It ran; only its reply was dropped, past the client's
			// output limit.
			b.Write(mk.name, false, raw)
		case err != nil || resp.IsError(reply) && (!mk.script || scriptNotRun(reply)):
			// Not run on the primary, so not on the mirror either. A
			// script's error may come after it wrote, so it goes, unless
			// it is one Redis gives before running any script.
			mr.Skipped(mirror.SkipPrimaryError)
		case mk.nondet:
			ms.parts = append(ms.parts[:0], raw)
			ms.writeEffect(b, mr, mk.name, 0, reply)
		default:
			b.Write(mk.name, resp.IsError(reply), raw)
		}
	}
	clear(ms.parts)
	clear(ms.marks)
	ms.marks = ms.marks[:0]
	mr.Enqueue(sess.db, sess.resp3, b)
	b.Reset()
	if cap(ms.effects) > 64<<10 {
		ms.effects = nil // a large SPOP's members are not kept for an idle client
	}
	ms.effects = ms.effects[:0]
}

// writeEffect writes the mirror's form of the nondeterministic write
// ms.parts[at] (its wrapping around it in ms.parts), rebuilt from its reply
// (effect): replaced by its effect, left out when it did nothing, skipped
// and counted when its effect cannot be told.
func (ms *mirrorState) writeEffect(b *mirror.Batch, mr *mirror.Mirror, name string, at int, reply []byte) {
	mirrored, cmd, ok := ms.effect(name, ms.parts[at], reply)
	switch {
	case !ok:
		mr.Skipped(mirror.SkipNondeterministic)
	case cmd != nil:
		ms.parts[at] = cmd
		b.Write(mirrored, false, ms.parts...)
	}
}

// effect rebuilds a write flagged nondeterministic (its effect chosen by
// the server) from the primary's reply, as Redis's replication does, so
// that the mirror applies the same effect: before, SPOP and XADD * were
// mirrored as sent, the mirror popped other members and gave entries
// other IDs, and the two drifted apart (TestMirrorNondeterministicWritesDiverge).
//
//	SPOP key [count]            the members popped   SREM key member...
//	XADD key [options] * f v    the ID chosen         XADD key [options] ID f v
//	XTRIM key MAXLEN|MINID = n  (exact)               as sent
//
// A reply that says nothing was done (SPOP of a missing key, XADD
// NOMKSTREAM of one) mirrors nothing: cmd is nil and ok true. ok is false
// for the rest (XCLAIM, XAUTOCLAIM, XTRIM ~, MIGRATE, or an argument or
// reply not understood), which are not mirrored (SkipNondeterministic).
// cmd points into ms.effects, kept until the batch is queued.
func (ms *mirrorState) effect(name string, raw, reply []byte) (mirrored string, cmd []byte, ok bool) {
	args, err := resp.SplitCommand(raw, ms.args[:0])
	ms.args = args
	defer func() { clear(ms.args) }()
	if err != nil || len(args) < 2 || resp.IsError(reply) {
		return "", nil, false
	}
	start := len(ms.effects)
	switch name {
	case "spop":
		if resp.IsNull(reply) {
			return name, nil, true
		}
		// SREM's arguments: the key, then the members popped.
		srem := append(args[:0], args[1])
		switch len(args) {
		case 2:
			m, ok := bulkString(reply)
			if !ok {
				return "", nil, false
			}
			srem = append(srem, m)
		case 3:
			el, ok := resp.ArrayElements(reply)
			if !ok {
				return "", nil, false
			}
			for _, e := range el {
				m, ok := bulkString(e)
				if !ok {
					return "", nil, false
				}
				srem = append(srem, m)
			}
		default:
			return "", nil, false
		}
		ms.args = srem
		if len(srem) == 1 {
			return name, nil, true // popped nothing
		}
		ms.effects = resp.AppendCommandNamed(ms.effects, "SREM", srem...)
		return "srem", ms.effects[start:], true
	case "xadd":
		if resp.IsNull(reply) {
			return name, nil, true // NOMKSTREAM of a missing key
		}
		id, ok := bulkString(reply)
		at, _ := streamTrimOptions(args, 2)
		if !ok || at < 0 || at+3 > len(args) {
			return "", nil, false
		}
		args[at] = id
		ms.effects = resp.AppendCommand(ms.effects, args...)
		return name, ms.effects[start:], true
	case "xtrim":
		if at, approx := streamTrimOptions(args, 2); at == len(args) && !approx {
			return name, raw, true
		}
	}
	return "", nil, false
}

// streamTrimOptions skips XADD's and XTRIM's options from args[i] on
// (NOMKSTREAM, MAXLEN|MINID [=|~] threshold, LIMIT count, in any order, as
// Redis parses them), returning the index of the first argument past them
// (XADD's ID) and whether the trimming asked is approximate (~); -1 when
// an option lacks its argument.
func streamTrimOptions(args [][]byte, i int) (next int, approx bool) {
	for i < len(args) {
		switch a := args[i]; {
		case commands.EqualFold("nomkstream", a):
			i++
		case commands.EqualFold("maxlen", a), commands.EqualFold("minid", a):
			i++
			// Redis tests next[0] == '~' && next[1] == '\0': up to a NUL,
			// as every option word (commands.EqualFold).
			if i < len(args) && (commands.EqualFold("~", args[i]) || commands.EqualFold("=", args[i])) {
				approx = approx || commands.EqualFold("~", args[i])
				i++
			}
			i++ // the threshold
		case commands.EqualFold("limit", a):
			i += 2
		default:
			return i, approx
		}
	}
	if i > len(args) {
		return -1, approx
	}
	return i, approx
}

// mirrorExec queues the client's transaction for the mirror when EXEC's
// reply says it ran: MULTI, its writes as queued, EXEC, in one entry.
func (sess *Session) mirrorExec(call *upstream.Call, sl slot) {
	mr := sess.srv.mirror
	ms := sess.mirrorS
	tx := &ms.tx
	defer tx.reset()
	reply, err := call.Reply(sl.i)
	switch {
	case errors.Is(err, upstream.ErrOutputLimit):
		// It ran; only its reply was dropped, past the client's output
		// limit.
	case err != nil || !execRan(reply):
		mr.Skipped(mirror.SkipTransaction)
		return
	}
	if tx.over {
		mr.Dropped(mirror.DropTooLarge, 1)
		return
	}
	ms.parts = append(ms.parts[:0], cmdMulti)
	for i := range tx.ends {
		ms.parts = append(ms.parts, tx.part(i))
	}
	ms.parts = append(ms.parts, cmdExec)
	if tx.selected {
		// The mirror's connection serves the session's database: EXEC's
		// SELECT moved it.
		ms.parts = append(ms.parts, resp.AppendCommandStrings(nil, "SELECT", strconv.Itoa(sess.db)))
	}
	if tx.selected || tx.crossDB {
		ms.batch.WriteCrossDB("exec", false, ms.parts...)
	} else {
		ms.batch.Write("exec", false, ms.parts...)
	}
}

// mirrorSkipRelayed counts a relayed client's write, forwarded to a
// connection that runs it, as not mirrored: the relay is raw bytes whose
// replies the mirror does not see. Writes the proxy refused, or sent where
// Redis refuses every write, are not counted (a second review found them
// counted as missed).
func (sess *Session) mirrorSkipRelayed(cmd *commands.Command) {
	if cmd != nil && mirroredWrite(cmd) {
		sess.srv.mirror.Skipped(mirror.SkipRelayed)
	}
}

// scriptRefusals are the errors Redis answers a script with before running
// it (processCommand's checks): the script wrote nothing. A review found
// a script refused with -BUSY by the primary run on the mirror alone.
// -OOM is not one: a script without flags meets it at its first write,
// after what it wrote before. They are Redis's texts (7.0 and 7.2), not
// just their codes: a script that wrote and then returned an error of its
// own with one of these codes (redis.error_reply("BUSY ...")) was not
// mirrored (found by a probe).
var scriptRefusals = [][]byte{
	[]byte("-NOSCRIPT No matching script"),
	[]byte("-BUSY Redis is busy running a script"),
	[]byte("-BUSY Redis is busy running a module command"),
	[]byte("-LOADING Redis is loading the dataset in memory"),
	[]byte("-MASTERDOWN Link with MASTER is down"),
	[]byte("-NOPERM this user has no permissions to"), // 7.0
	[]byte("-NOPERM User "),                           // 7.2: "User app has no permissions to run ..."
	[]byte("-NOPERM No permissions to access a"),      // 7.2: a key, a channel
	[]byte("-MISCONF Redis is configured to save RDB snapshots"),
	[]byte("-MISCONF Errors writing to the AOF file"),
	[]byte("-READONLY You can't write against a read only replica."),
	[]byte("-NOREPLICAS Not enough good replicas to write."),
}

// scriptNotRun reports whether a script's error reply says it never ran.
func scriptNotRun(reply []byte) bool {
	for _, p := range scriptRefusals {
		if bytes.HasPrefix(reply, p) {
			return true
		}
	}
	return false
}

// execRan reports whether an EXEC reply is the results of a transaction
// that ran (not an error, not a null for a failed WATCH).
func execRan(reply []byte) bool { return len(reply) > 1 && reply[0] == '*' && reply[1] != '-' }

// mirrorBlocked mirrors what a blocking command that may write did, once
// its reply is in: the non-blocking command that has the same effect on a
// mirror holding the same data, with the guard's fix-ups behind it. A
// null reply (the timeout) or an error did nothing, and mirrors nothing.
//
//	BLPOP, BRPOP        [key, value]        LPOP key / RPOP key
//	BZPOPMIN, BZPOPMAX  [key, member, score] ZPOPMIN key / ZPOPMAX key
//	BLMOVE, BRPOPLPUSH  the element          LMOVE / RPOPLPUSH, same arguments
//	BLMPOP, BZMPOP      [key, [elements]]    LMPOP / ZMPOP 1 key dir COUNT n
//
// A blocking XREADGROUP is not mirrored (counted, SkipBlocking): replaying
// it as a non-blocking read would deliver whatever the mirror's group has
// next, which is only the same entries if the group's state already is.
func (sess *Session) mirrorBlocked(name string, args [][]byte, reply []byte, fixups [][]byte) {
	mr := sess.srv.mirror
	if mr == nil || !mr.Writes() || resp.IsError(reply) || resp.IsNull(reply) {
		return
	}
	ms := sess.mirrorState()
	cmd, mirrored := blockingEquivalent(ms.cmd[:0], name, args, reply)
	if cmd == nil {
		if name == "xreadgroup" {
			mr.Skipped(mirror.SkipBlocking)
		}
		return
	}
	ms.cmd = cmd
	ms.parts = append(ms.parts[:0], cmd)
	ms.parts = append(ms.parts, fixups...)
	ms.batch.Write(mirrored, false, ms.parts...)
	clear(ms.parts)
	// After the writes that woke it, which other clients' sessions may
	// not have queued yet (mirror/order.go).
	mr.EnqueueAfterWrites(sess.db, sess.resp3, &ms.batch)
	ms.batch.Reset()
}

// blockingEquivalent appends to dst the non-blocking command with the
// effect a blocking one had, given its arguments and its (non-null) reply;
// nil when there is none. mirrored is its name, for the mirror's counts.
func blockingEquivalent(dst []byte, name string, args [][]byte, reply []byte) (cmd []byte, mirrored string) {
	switch name {
	case "blmove":
		if len(args) != 6 {
			return nil, ""
		}
		return resp.AppendCommandNamed(dst, "LMOVE", args[1:5]...), "lmove"
	case "brpoplpush":
		if len(args) != 4 {
			return nil, ""
		}
		return resp.AppendCommandNamed(dst, "RPOPLPUSH", args[1:3]...), "rpoplpush"
	}
	el, ok := resp.ArrayElements(reply)
	if !ok || len(el) < 2 {
		return nil, ""
	}
	key, ok := bulkString(el[0])
	if !ok {
		return nil, ""
	}
	switch name {
	case "blpop":
		return resp.AppendCommandNamed(dst, "LPOP", key), "lpop"
	case "brpop":
		return resp.AppendCommandNamed(dst, "RPOP", key), "rpop"
	case "bzpopmin":
		return resp.AppendCommandNamed(dst, "ZPOPMIN", key), "zpopmin"
	case "bzpopmax":
		return resp.AppendCommandNamed(dst, "ZPOPMAX", key), "zpopmax"
	case "blmpop", "bzmpop":
		dir, ok := mpopWhere(args)
		if !ok {
			return nil, ""
		}
		popped, ok := resp.ArrayElements(el[1])
		if !ok || len(popped) == 0 {
			return nil, ""
		}
		count := strconv.AppendInt(nil, int64(len(popped)), 10)
		if name == "blmpop" {
			return resp.AppendCommandNamed(dst, "LMPOP", []byte("1"), key, dir, []byte("COUNT"), count), "lmpop"
		}
		return resp.AppendCommandNamed(dst, "ZMPOP", []byte("1"), key, dir, []byte("COUNT"), count), "zmpop"
	}
	return nil, ""
}

// mpopWhere is the LEFT|RIGHT (BLMPOP) or MIN|MAX (BZMPOP) of a blocking
// multi-pop's args: "BLMPOP timeout numkeys key [key ...] LEFT|RIGHT
// [COUNT count]".
func mpopWhere(args [][]byte) ([]byte, bool) {
	if len(args) < 5 {
		return nil, false
	}
	numkeys, err := strconv.Atoi(string(args[2]))
	if err != nil || numkeys < 1 || 3+numkeys >= len(args) {
		return nil, false
	}
	return args[3+numkeys], true
}

// bulkString returns the contents of a bulk string reply (a key in a
// blocking pop's reply).
func bulkString(r []byte) ([]byte, bool) {
	if len(r) < 4 || r[0] != '$' {
		return nil, false
	}
	nl := bytes.IndexByte(r, '\n')
	if nl < 2 {
		return nil, false
	}
	n, err := strconv.Atoi(string(r[1 : nl-1]))
	if err != nil || n < 0 || nl+1+n+2 != len(r) {
		return nil, false
	}
	return r[nl+1 : nl+1+n], true
}
