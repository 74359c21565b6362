package proxy

import (
	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/guard"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/resp"
)

func init() { featureInits = append(featureInits, initGuard) }

// serverGuard is the guard's part of a Server.
type serverGuard struct {
	*guard.Guard
	// user is who every session is, for the policy's scopes: clients
	// authenticate as the upstream's user or not at all (NOAUTH stops them
	// before the guard).
	user string
	// listener names the listener for scopes: the configured listen address.
	listener string
}

func initGuard(s *Server) error {
	g, err := guard.New(s.cfg.Policy, guard.Options{Logger: s.log, Registerer: s.metrics.Registry})
	if err != nil {
		return err
	}
	user := s.cfg.Upstream.Username
	if user == "" {
		user = "default"
	}
	s.guard = &serverGuard{Guard: g, user: user, listener: s.cfg.Server.Listen}
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
	sess.guardBatch().Prepare(sg.Policy(), sess.srv.table, reqs, sg.user, sg.listener)
}

// guardStep applies the guard's decision for request i: a refusal is
// answered here; a rewrite or a TTL fix-up is forwarded here; a command only
// reported goes on unchanged.
func (sess *Session) guardStep(i int, cmd *commands.Command, req *resp.Request, m *metrics.Command) bool {
	b := sess.guardBatch()
	d := b.Decision(i)
	if d == nil {
		return false
	}
	sess.recordViolations(d)
	if d.Refuse != nil {
		sess.refuse(d, m)
		return true
	}
	if d.Args == nil && len(d.Expires) == 0 {
		return false // only reported
	}
	raw, args := req.Raw, req.Args
	if d.Args != nil {
		args = d.Args
		raw = b.Encode(args)
	}
	if mayWrite(cmd) {
		if sess.pin.inMulti {
			// Queued: it takes effect at EXEC, where the write hooks hear
			// of it (dispatchPinned).
			sess.pin.txWrites = append(sess.pin.txWrites, txWrite{cmd: cmd, args: copyArgs(args)})
		} else {
			sess.writeForwarded(cmd, args)
		}
	}
	if len(d.Expires) > 0 {
		sess.forwardWithFixups(raw, b.Fixups(d.Expires), m)
	} else {
		sess.forward(raw, m)
	}
	return true
}

// guardRefused answers request i with the guard's refusal, if it has one,
// and reports whether it did. Commands the proxy handles itself (MONITOR,
// SUBSCRIBE, blocking commands) never reach guardStep; calling this first
// in dispatch makes a denied MONITOR refused like any other command. A
// request it did not refuse still goes to guardStep.
func (sess *Session) guardRefused(i int, m *metrics.Command) bool {
	d := sess.guardBatch().Decision(i)
	if d == nil || d.Refuse == nil {
		return false
	}
	sess.recordViolations(d)
	sess.refuse(d, m)
	return true
}

func (sess *Session) recordViolations(d *policy.Decision) {
	sg := sess.srv.guard
	for j := range d.Violations {
		sg.Record(&d.Violations[j], sess.nc.RemoteAddr(), sg.user)
	}
}

// refuse answers with d's refusal. Inside the client's MULTI it also queues
// guard.RefusedInMulti, so the client's EXEC fails with EXECABORT.
func (sess *Session) refuse(d *policy.Decision, m *metrics.Command) {
	if sess.pin.inMulti {
		sess.forwardHidden(guard.RefusedInMulti)
	}
	buf, start := sess.localBuf()
	sess.finishLocal(m, guard.AppendRefusal(buf, d.Refuse), start)
}

// hiddenFailed is told when a fix-up the client never sees failed.
func (sess *Session) hiddenFailed(reply []byte, err error) {
	sess.srv.guard.FixupFailed(reply, err, sess.nc.RemoteAddr())
}
