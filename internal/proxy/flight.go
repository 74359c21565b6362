package proxy

import (
	"bytes"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/resp"
	"github.com/redproxy/redproxy/internal/stampede"
	"github.com/redproxy/redproxy/internal/upstream"
)

// flightState is stampede protection's part of a Server: the coalescing
// group (which the local tier's fills share: one mechanism), the miss hold
// and early refresh rules, and the writes whose replies those rules wait for.
type flightState struct {
	group    *stampede.Group
	metrics  *stampede.Metrics
	coalesce bool
	misses   *stampede.Misses // nil when no hold or early refresh rule is configured
	eligible map[*commands.Command]bool
	calls    sync.Pool // *upstream.Call, for fetches
	*writeMarks
}

// writeMarks are the writes of keys under a rule, by session, from
// writeForwarded until their replies are in (batchFlushed). npending counts
// the sessions in the map so that batchFlushed costs nothing when it is
// empty. They belong with misses: both are about keys, not the upstream,
// so an upstream switch carries them to the new flightState.
type writeMarks struct {
	mu       sync.Mutex
	pending  map[*Session][]pendingWrite
	npending atomic.Int32
}

type pendingWrite struct {
	db    int
	key   []byte
	match stampede.Match
}

func initFlight(s *Server) error {
	s.flight.Store(newFlightState(s.cfg.Stampede, s.table, stampede.NewMetrics(s.metrics.Registry)))
	return nil
}

// newFlightState builds stampede protection for c. A reload builds a new
// one with the same metrics; reads and holds in flight on the old one
// finish there (a read held by an old rule waits at most its timeout).
func newFlightState(c stampede.Config, table *commands.Table, m *stampede.Metrics) *flightState {
	fs := &flightState{
		group:      stampede.NewGroup(stampede.Options{MaxWaiters: c.MaxWaiters, Metrics: m}),
		metrics:    m,
		coalesce:   c.Coalesce,
		misses:     stampede.NewMisses(c, m),
		eligible:   map[*commands.Command]bool{},
		writeMarks: &writeMarks{pending: map[*Session][]pendingWrite{}},
	}
	fs.calls.New = func() any { return upstream.NewCall() }
	for _, cmd := range table.Commands() {
		if coalescable(cmd) {
			fs.eligible[cmd] = true
		}
	}
	return fs
}

// coalescable reports whether identical calls of cmd may share one reply:
// read-only, deterministic, never blocking, and with a reply that does not
// depend on when it is asked (TTLs count down). Subcommands (OBJECT ...,
// MEMORY USAGE) and scripts are left alone. The single-key condition is
// checked per call.
func coalescable(cmd *commands.Command) bool {
	if !cmd.Is(commands.ReadOnly) || cmd.Flags&(commands.Write|commands.Nondeterministic|commands.Blocking|commands.CatScripting) != 0 {
		return false
	}
	switch cmd.Name {
	case "ttl", "pttl", "expiretime", "pexpiretime", "randomkey", "srandmember", "hrandfield", "zrandmember",
		"scan", "sscan", "hscan", "zscan", "touch":
		return false
	}
	return true
}

// flightStep lets a read join a coalesced fetch. alone is true when the
// command is the only one in its batch: a coalesced read runs at the
// fetch's time, possibly on another connection, so any other command of the
// same batch could be reordered around it (see package stampede).
func (sess *Session) flightStep(cmd *commands.Command, req *resp.Request, m *metrics.Command, alone bool) bool {
	fs := sess.srv.flight.Load()
	// The session does not call this in MULTI, under WATCH or when relayed;
	// the pin check is a second line of defence.
	if fs == nil || !alone || sess.pin.pipe != nil || !fs.eligible[cmd] || cmd.IsBlocking(req.Args) {
		return false
	}
	var kb [2]int
	keys := cmd.Keys(req.Args, kb[:0])
	if len(keys) != 1 {
		return false
	}
	key := req.Args[keys[0]]
	match := stampede.Match{}
	isGet := cmd.Name == "get" && len(req.Args) == 2
	if isGet && fs.misses != nil {
		match = fs.misses.Match(key)
	}
	if !fs.coalesce && !match.Any() {
		return false
	}
	reply, err := sess.flightRead(fs, req.Raw, key, match)
	if errors.Is(err, stampede.ErrTooManyWaiters) {
		return false // go upstream alone, with the rest of the data path
	}
	if err != nil {
		sess.replyLocal(m, errorReply(err))
		return true
	}
	sess.replyLocal(m, reply)
	return true
}

// flightRead answers one read through the group, applying the miss hold
// and early refresh rules of match.
func (sess *Session) flightRead(fs *flightState, raw, key []byte, match stampede.Match) ([]byte, error) {
	db, resp3 := sess.db, sess.resp3
	pool := sess.backend().Pool(db, resp3)
	if match.Hold() {
		if h := fs.misses.Held(db, key, match, sess.id); h != nil {
			return fs.heldRead(h, sess.backend(), db, key, resp3, match, sess.id)
		}
	}
	var reply []byte
	var ttl time.Duration
	var err error
	if match.Refresh() {
		// The PTTL travels in the same Call, right behind the GET on the
		// same connection; the client never sees it.
		both, _, err := fs.group.Do(flightKey('t', db, resp3, raw), func() ([]byte, error) {
			return fs.fetch(pool, raw, pttlCommand(key))
		})
		if err != nil {
			return nil, err
		}
		reply, ttl = splitTTL(both)
	} else {
		reply, _, err = fs.group.Do(flightKey('r', db, resp3, raw), func() ([]byte, error) {
			return fs.fetch(pool, raw)
		})
		if err != nil || !match.Any() {
			return reply, err
		}
	}
	if isNilReply(reply) {
		if h := fs.misses.Missed(db, key, match, sess.id, true); h != nil {
			return fs.heldRead(h, sess.backend(), db, key, resp3, match, sess.id)
		}
		return reply, nil
	}
	if fs.misses.Early(db, key, match, sess.id, ttl) {
		return nilReply(resp3), nil
	}
	return reply, nil
}

// heldRead waits for a miss hold to end and then reads the key with the
// other reads it held, in one fetch. A read that is held once is never held
// again: if the key is still missing it gets the nil (and may become the
// next filler).
//
// The pool is taken when the hold ends: a reload may have switched the
// upstream meanwhile and closed the one in use when the read began.
func (fs *flightState) heldRead(h *stampede.Hold, be *upstream.Backend, db int, key []byte, resp3 bool, match stampede.Match, owner int64) ([]byte, error) {
	h.Wait()
	get := getCommand(key)
	reply, err := h.Fetch(resp3, fs.metrics, func() ([]byte, error) { return fs.fetch(be.Pool(db, resp3), get) })
	if err == nil && isNilReply(reply) {
		fs.misses.Missed(db, key, match, owner, false)
	}
	return reply, err
}

// fetch sends cmds on a Call of its own, so it does not depend on the
// leader's connection or buffers beyond cmds, and returns their replies
// back to back in a new slice (the Call is reused).
func (fs *flightState) fetch(pool *upstream.Pool, cmds ...[]byte) ([]byte, error) {
	c := fs.calls.Get().(*upstream.Call)
	defer func() {
		c.Reset()
		fs.calls.Put(c)
	}()
	for _, cmd := range cmds {
		c.Add(cmd)
	}
	pool.Do(c)
	var out []byte
	for i := range cmds {
		r, err := c.Reply(i)
		if err != nil {
			return nil, err
		}
		out = append(out, r...)
	}
	return out, nil
}

// flightKey identifies identical reads: DB, protocol and the exact command
// bytes, plus the kind of fetch ('r' plain, 't' with PTTL).
func flightKey(kind byte, db int, resp3 bool, raw []byte) string {
	var b strings.Builder
	b.Grow(len(raw) + 8)
	b.WriteByte(kind)
	if resp3 {
		b.WriteByte('3')
	} else {
		b.WriteByte('2')
	}
	b.WriteString(strconv.Itoa(db))
	b.WriteByte(':')
	b.Write(raw)
	return b.String()
}

func getCommand(key []byte) []byte { return resp.AppendCommandNamed(nil, "GET", key) }

func pttlCommand(key []byte) []byte { return resp.AppendCommandNamed(nil, "PTTL", key) }

// splitTTL separates a GET reply from the PTTL reply behind it. ttl is 0
// when the key has no expiry (or the PTTL reply is not a number).
func splitTTL(both []byte) (reply []byte, ttl time.Duration) {
	n, err := resp.ScanReply(both)
	if err != nil || n == 0 {
		return both, 0
	}
	rest := both[n:]
	if len(rest) < 4 || rest[0] != ':' {
		return both[:n], 0
	}
	ms, err := strconv.ParseInt(string(bytes.TrimSuffix(rest[1:], []byte("\r\n"))), 10, 64)
	if err != nil || ms <= 0 {
		return both[:n], 0
	}
	return both[:n], time.Duration(ms) * time.Millisecond
}

var (
	nilRESP2 = []byte("$-1\r\n")
	nilRESP3 = []byte("_\r\n")
)

func isNilReply(r []byte) bool { return bytes.Equal(r, nilRESP2) || bytes.Equal(r, nilRESP3) }

func nilReply(resp3 bool) []byte {
	if resp3 {
		return nilRESP3
	}
	return nilRESP2
}

// flightWriteForwarded remembers writes of keys under a hold or early
// refresh rule: when their replies are in, holds end and δ is sampled.
func (sess *Session) flightWriteForwarded(cmd *commands.Command, args [][]byte) {
	fs := sess.srv.flight.Load()
	if fs == nil || fs.misses == nil {
		return
	}
	var kb [8]int
	for _, i := range cmd.Keys(args, kb[:0]) {
		match := fs.misses.Match(args[i])
		if !match.Any() {
			continue
		}
		w := pendingWrite{db: sess.db, key: bytes.Clone(args[i]), match: match}
		fs.mu.Lock()
		p, ok := fs.pending[sess]
		if !ok {
			fs.npending.Add(1)
		}
		fs.pending[sess] = append(p, w)
		fs.mu.Unlock()
	}
}

// flightBatchFlushed tells the rules about the writes whose replies are
// now in: only then may held reads fetch again and see them.
func (sess *Session) flightBatchFlushed() {
	fs := sess.srv.flight.Load()
	if fs == nil || fs.npending.Load() == 0 {
		return
	}
	p := fs.takePending(sess)
	for _, w := range p {
		fs.misses.Written(w.db, w.key, w.match)
	}
}

func (fs *flightState) takePending(sess *Session) []pendingWrite {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	p, ok := fs.pending[sess]
	if ok {
		delete(fs.pending, sess)
		fs.npending.Add(-1)
	}
	return p
}

// flightSessionClosed ends the holds and early refreshes this client was
// filling: it will not write them now, and its waiters must not wait for
// the timeout.
func (sess *Session) flightSessionClosed() {
	fs := sess.srv.flight.Load()
	if fs == nil || fs.misses == nil {
		return
	}
	fs.takePending(sess)
	fs.misses.OwnerClosed(sess.id)
}
