package proxy

import (
	"bytes"
	"strconv"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/guard"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/resp"
)

// serverGuard is the guard's part of a Server.
type serverGuard struct {
	*guard.Guard
	// user is who every session is, for the policy's scopes: clients
	// authenticate as the upstream's user or not at all (NOAUTH stops them
	// before the guard).
	user string
}

func initGuard(s *Server) error {
	o := guard.Options{Logger: s.log, Registerer: s.metrics.Registry}
	if rs := s.routes; rs != nil {
		// Violations count under their key's upstream, as the stampede and
		// local tier counters do.
		o.Upstreams = s.cfg.UpstreamNames()
		o.UpstreamOf = func(key []byte) int {
			up, _ := rs.table.Load().Key(key)
			return up
		}
	}
	g, err := guard.New(s.cfg.Policy, o)
	if err != nil {
		return err
	}
	user := s.cfg.Upstream.Username
	if user == "" {
		user = "default"
	}
	s.guard = &serverGuard{Guard: g, user: user}
	return nil
}

// Guard returns the policy guard, for --policy-mode, reloads and the admin
// endpoints.
func (s *Server) Guard() *guard.Guard { return s.guard.Guard }

// guardBatch returns the session's guard state.
func (sess *Session) guardBatch() *guard.Batch { return &sess.guard }

// prepareBatch lets the guard see the whole batch before any command runs,
// so a write followed by its own EXPIRE in the same batch passes untouched.
func (sess *Session) prepareBatch(reqs []resp.Request) {
	sg := sess.srv.guard
	// A later EXPIRE the user's ACL refuses (aclRefused, in dispatch) will
	// not run: the look-ahead must not count on it for a write's TTL.
	var denied func(int, *commands.Command, [][]byte) bool
	if sess.user != nil {
		if sess.aclDeny == nil {
			sess.aclDeny = sess.aclRefuses
		}
		denied = sess.aclDeny
	}
	// Scopes select on the listener's name (config.Config.ClientListeners).
	sess.guardBatch().Prepare(sg.Policy(), sess.srv.table, reqs, sess.userName(), sess.listenerName(), denied)
}

// guardStep applies the guard's decision for request i: a refusal is
// answered here; a rewrite or a TTL fix-up is forwarded here; a command only
// reported goes on unchanged.
func (sess *Session) guardStep(r *request) bool {
	cmd, m := r.cmd, r.m
	b := sess.guardBatch()
	d := b.Decision(r.i)
	if d == nil {
		return false
	}
	// Recorded already (guardRecord).
	if d.Refuse != nil {
		sess.refuse(d, m)
		return true
	}
	if d.Args == nil && len(d.Expires) == 0 {
		return false // only reported
	}
	raw, args := r.Raw, r.Args
	if d.Args != nil {
		args = d.Args
		raw = b.Encode(args)
	}
	if mayWrite(cmd) {
		if sess.pin.inMulti {
			// Queued: it takes effect at EXEC, where the write hooks hear
			// of it (pinnedExec).
			sess.pin.txWrites = append(sess.pin.txWrites, txWrite{cmd: cmd, args: txWriteArgs(cmd, args)})
		} else {
			sess.writeForwarded(cmd, args)
		}
	}
	var fixups [][]byte
	if len(d.Expires) > 0 {
		fixups = b.FixupsIn(d.Expires, sess.fixupDB(), sess.srv.cfg.Upstream.Databases)
	}
	if len(fixups) > 0 {
		sess.forwardWithFixups(raw, fixups, m)
	} else {
		sess.forward(raw, m)
	}
	sess.mirrorNote(r)
	return true
}

// fixupDB is the database the command being dispatched runs in, which a
// fix-up in another database must select again after its EXPIRE: inside
// the client's MULTI, the last SELECT it queued (it runs before the
// command, at EXEC), else the session's.
func (sess *Session) fixupDB() int {
	if sess.pin.inMulti && sess.pin.txSelect >= 0 {
		return sess.pin.txSelect
	}
	return sess.db
}

// guardRecord records request i's violations, if it has any, and answers
// it with the guard's refusal, if it has one; it reports whether it did.
// dispatch calls it once per request, before any other step, so that the
// commands the proxy handles itself (SCRIPT KILL, SHUTDOWN, MONITOR,
// SUBSCRIBE, blocking commands, transactions) are refused like any other
// and, under report mode, reported like any other: the steps that apply a
// decision later (guardStep, blocking, the cluster's MULTI) record nothing.
// A request it did not refuse still goes to guardStep.
func (sess *Session) guardRecord(r *request) bool {
	d := sess.guardBatch().Decision(r.i)
	if d == nil {
		return false
	}
	sess.recordViolations(d)
	if d.Refuse == nil {
		return false
	}
	sess.refuse(d, r.m)
	return true
}

func (sess *Session) recordViolations(d *policy.Decision) {
	sg := sess.srv.guard
	for j := range d.Violations {
		sg.Record(&d.Violations[j], sess.nc.RemoteAddr(), sess.userName())
	}
}

// refuse answers with d's refusal. Inside the client's MULTI it also queues
// guard.RefusedInMulti, so the client's EXEC fails with EXECABORT.
func (sess *Session) refuse(d *policy.Decision, m *metrics.Command) {
	sess.refusedInMulti()
	buf, start := sess.localBuf()
	sess.finishLocal(m, guard.AppendRefusal(buf, d.Refuse), start)
}

// hiddenFailed is told when a fix-up the client never sees failed.
func (sess *Session) hiddenFailed(reply []byte, err error) {
	sess.srv.guard.FixupFailed(reply, err, sess.nc.RemoteAddr())
}

// wrappedFixupResults checks the EXEC reply of a command the proxy wrapped
// in MULTI/EXEC with its fix-ups (forwardWithFixups): every element after
// the first, the command's own, is a fix-up's result. A fix-up can be
// queued (+QUEUED) and still fail when EXEC runs it.
func (sess *Session) wrappedFixupResults(exec []byte) {
	execElements(exec, func(i int, elem []byte) {
		if i > 0 && resp.IsError(elem) {
			sess.hiddenFailed(elem, nil)
		}
	})
}

// txFixupResults checks the EXEC reply of the client's own transaction for
// the results of the fix-ups queued in it, at the queue positions hidden
// (ascending).
func (sess *Session) txFixupResults(exec []byte, hidden []int) {
	if len(hidden) == 0 {
		return
	}
	h := 0
	execElements(exec, func(i int, elem []byte) {
		for h < len(hidden) && hidden[h] < i {
			h++
		}
		if h < len(hidden) && hidden[h] == i && resp.IsError(elem) {
			sess.hiddenFailed(elem, nil)
		}
	})
}

// execElements calls fn with each element of an EXEC reply, and not at all
// for an error or a null reply: an aborted transaction ran nothing.
func execElements(reply []byte, fn func(i int, elem []byte)) {
	if len(reply) < 4 || reply[0] != '*' || reply[1] == '-' {
		return
	}
	nl := bytes.IndexByte(reply, '\n')
	if nl < 2 {
		return
	}
	n, err := strconv.Atoi(string(reply[1 : nl-1]))
	if err != nil {
		return
	}
	pos := nl + 1
	for i := 0; i < n; i++ {
		k, err := resp.ScanReply(reply[pos:])
		if err != nil || k == 0 {
			return
		}
		fn(i, reply[pos:pos+k])
		pos += k
	}
}
