package proxy

import (
	"bytes"
	"errors"
	"net/http"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/mirror"
	"github.com/redproxy/redproxy/internal/resp"
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
}

// mirrorMark is one command of the batch to be mirrored: the reply slot
// the session recorded for it, and for a read, its first key.
type mirrorMark struct {
	slot    int
	name    string
	raw     []byte // the client's bytes (a read answered by a coalesced fetch)
	key     []byte
	read    bool
	compare bool
	script  bool
}

// initMirror starts the mirror when [mirror] names an upstream.
func initMirror(s *Server) error {
	u, ok := s.cfg.MirrorUpstream()
	if !ok {
		return nil
	}
	dial, err := mirrorBackend(s, s.cfg.Mirror.Upstream, u)
	if err != nil {
		return err
	}
	s.mirror = mirror.New(mirror.Options{
		Config: s.cfg.Mirror, Dial: dial, Address: u.Address, Databases: u.Databases, Logger: s.log,
	})
	s.mirror.RegisterMetrics(s.metrics.Registry)
	return nil
}

// mirrorBackend is the one place the mirror's connections are built: a
// Backend of the named upstream u, with u's own credentials and TLS (never
// a client's or [upstream]'s). Standalone only, as config checks. The
// mirror dials it on its own goroutine, so a mirror that is down delays
// neither the start nor a client.
func mirrorBackend(s *Server, name string, u config.Upstream) (func() *upstream.Backend, error) {
	tlsConf, err := u.ClientTLS()
	if err != nil {
		return nil, err
	}
	opt := upstream.BackendOptions{
		Addr:         u.Address,
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
		Logger:       s.log.With("upstream", name),
	}
	return func() *upstream.Backend { return upstream.NewBackend(opt) }, nil
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

// mirrorsAsWrite: the commands mirrored as writes. Scripts and functions
// may write any key (mayWrite); SCRIPT LOAD goes too, so that the
// application's EVALSHA finds its script on the mirror.
func mirrorsAsWrite(cmd *commands.Command) bool {
	return mayWrite(cmd) || cmd.Name == "script|load"
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
// reply slot is recorded (the session's last slot): every write, and the
// sampled share of reads of keys. Commands on a pinned connection
// (transactions, WATCH) are not mirrored; their writes are counted by
// mirrorWriteSkipped.
func (sess *Session) mirrorNote(r *request) {
	mr := sess.srv.mirror
	if mr == nil || r.cmd == nil || sess.pin.pipe != nil || len(sess.slots) == 0 {
		return
	}
	mk := mirrorMark{slot: len(sess.slots) - 1, name: r.name, raw: r.Raw}
	switch {
	case mirrorsAsWrite(r.cmd):
		if !mr.Writes() {
			return
		}
		mk.script = r.cmd.Parent == nil && r.cmd.Is(commands.CatScripting) // EVAL, EVALSHA, FCALL
	case r.cmd.Is(commands.ReadOnly):
		var kb [4]int
		keys := r.cmd.Keys(r.Args, kb[:0])
		if len(keys) == 0 || !mr.SampleRead() {
			return
		}
		mk.read, mk.key = true, r.Args[keys[0]]
		mk.compare = mr.Compare() && !uncomparable[r.name] && !r.cmd.Is(commands.Nondeterministic) && !r.cmd.Is(commands.NondeterministicOrder)
	default:
		return
	}
	if sess.mirrorS == nil {
		// Allocated on first use: most sessions never mirror anything,
		// and an idle one should hold no more than it must (park.go).
		sess.mirrorS = &mirrorState{}
	}
	sess.mirrorS.marks = append(sess.mirrorS.marks, mk)
}

// mirrorWriteSkipped counts a write that leaves on a dedicated connection
// and so is not mirrored: a blocking command, or a write in a transaction
// (at EXEC) or under WATCH.
func (sess *Session) mirrorWriteSkipped() {
	mr := sess.srv.mirror
	switch {
	case mr == nil || !mr.Writes():
	case sess.cur.blocking:
		mr.Skipped(mirror.SkipBlocking)
	case sess.pin.pipe != nil:
		mr.Skipped(mirror.SkipTransaction)
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
		switch sl.kind {
		case slotUpstream:
			raw = call.Part(sl.i)
			reply, err = call.Reply(sl.i)
		case slotLocal:
			raw, reply = mk.raw, sess.local[sl.i:sl.end]
		case slotWrapped:
			// MULTI, the command, its fix-ups, EXEC: mirrored the same way,
			// so the mirror's keys get the same TTLs.
			exec, err := call.Reply(sl.end)
			if err != nil || !execRan(exec) || resp.IsError(firstElement(exec)) {
				mr.Skipped(mirror.SkipPrimaryError)
				continue
			}
			ms.parts = ms.parts[:0]
			for p := sl.i - 1; p <= sl.end; p++ {
				ms.parts = append(ms.parts, call.Part(p))
			}
			b.Write(mk.name, false, ms.parts...)
			continue
		default:
			continue
		}
		switch {
		case mk.read:
			if err == nil {
				b.Read(mk.name, raw, reply, mk.key, mk.compare)
			}
		case errors.Is(err, upstream.ErrOutputLimit):
			// It ran; only its reply was dropped, past the client's
			// output limit.
			b.Write(mk.name, false, raw)
		case err != nil || resp.IsError(reply) && (!mk.script || bytes.HasPrefix(reply, noScript)):
			// Not run on the primary, so not on the mirror either. A
			// script's error may come after it wrote, so it goes.
			mr.Skipped(mirror.SkipPrimaryError)
		default:
			b.Write(mk.name, resp.IsError(reply), raw)
		}
	}
	clear(ms.parts)
	clear(ms.marks)
	ms.marks = ms.marks[:0]
	mr.Enqueue(sess.db, sess.resp3, b)
	b.Reset()
}

var noScript = []byte("-NOSCRIPT")

// execRan reports whether an EXEC reply is the results of a transaction
// that ran (not an error, not a null for a failed WATCH).
func execRan(reply []byte) bool { return len(reply) > 1 && reply[0] == '*' && reply[1] != '-' }
