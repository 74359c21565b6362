package proxy

import (
	"bytes"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/upstream"
	"github.com/tidwall/redcon"
)

// userState is the proxy users' part of a Server ([[users]]). Without
// users, clients authenticate with the upstream password (if any) and all
// share s.backend.
type userState struct {
	users *auth.Users
	// backends holds one set of upstream pools per distinct upstream
	// credential, so a user's commands only ever run with that user's
	// Redis rights; users without an upstream credential use s.backend.
	backends map[auth.Credential]*upstream.Backend
	limiter  *auth.FailLimiter
	failures *prometheus.CounterVec // by reason: wrongpass, ratelimited
	// failLog limits the warning for failed AUTHs: the client's address
	// is where an operator finds who guesses passwords, or locked itself
	// out (Redis's ACL LOG has it; AUTH answered here never reaches
	// Redis, and only the counter said anything: found by a probe).
	failLog logLimiter
	denied  *prometheus.CounterVec // NOPERM refusals, by kind: command, key, channel
}

func initUsers(s *Server) error {
	if err := config.ExposureError(s.cfg); err != nil {
		return fmt.Errorf("refusing to start: %w", err)
	}
	us, err := auth.New(s.cfg.Users, s.cmdSet().table)
	if err != nil {
		return err
	}
	st := &userState{
		users:    us,
		backends: map[auth.Credential]*upstream.Backend{},
		limiter:  auth.NewFailLimiter(),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "redproxy_auth_failures_total", Help: "Failed AUTH and HELLO AUTH attempts, by reason (wrongpass, ratelimited)."}, []string{"reason"}),
		denied:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "redproxy_acl_denied_total", Help: "Commands refused by a proxy user's ACL, by kind (command, key, channel)."}, []string{"kind"}),
	}
	s.metrics.Registry.MustRegister(st.failures, st.denied)
	for _, name := range us.ScriptsBeyondRules(s.cmdSet().table) {
		s.log.Warn("users: this user may run scripts, whose calls Redis checks against [upstream]'s credential, not against the user's acl; "+
			"give it an upstream_user whose Redis ACL has the same rules, or deny it @scripting",
			"user", name)
	}
	for _, u := range us.List() {
		if u.Upstream.User == "" || st.backends[u.Upstream] != nil {
			continue
		}
		o := s.backendOptions(s.cfg, s.upstreamAddr)
		o.Username, o.Password = u.Upstream.User, u.Upstream.Password
		o.NoDialWait = s.startSilent // one silent dial each held the start back
		st.backends[u.Upstream] = upstream.NewBackend(o)
	}
	s.users = st
	return nil
}

// closeUsers closes the per-credential pools.
func (s *Server) closeUsers() {
	if s.users == nil {
		return
	}
	for _, b := range s.users.backends {
		b.Close()
	}
}

// backendMove is one pool's move to new options (a new address, after a
// failover; new pool options, after a reload).
type backendMove struct {
	b   *upstream.Backend
	opt upstream.BackendOptions
}

// userMoves are the moves of the per-credential pools to addr under
// next's options.
func (s *Server) userMoves(next *config.Config, addr string) []backendMove {
	if s.users == nil {
		return nil
	}
	moves := make([]backendMove, 0, len(s.users.backends))
	for cred, b := range s.users.backends {
		moves = append(moves, backendMove{b, s.userBackendOptions(next, addr, cred)})
	}
	return moves
}

// moveBackends cuts every pool of moves over (Backend.FailoverUnsettled
// after a failover, Backend.SwitchUnsettled otherwise), and only then waits
// for their first dials, all at once. Moved and settled one after the
// other, the k-th pool's clients went on writing to a demoted primary for
// k dial times, and those acknowledged writes were lost (found by a probe:
// 75 per failover for the users' credentials where the proxy's lost 6);
// against an upstream that does not answer, the k-th waited k dial
// timeouts under reloadMu.
func moveBackends(failover bool, moves []backendMove) {
	settles := make([]func(), len(moves))
	for i, m := range moves {
		if failover {
			settles[i] = m.b.FailoverUnsettled(m.opt)
		} else {
			settles[i] = m.b.SwitchUnsettled(m.opt)
		}
	}
	var wg sync.WaitGroup
	for _, settle := range settles {
		wg.Go(settle)
	}
	wg.Wait()
}

func (s *Server) userBackendOptions(next *config.Config, addr string, cred auth.Credential) upstream.BackendOptions {
	o := s.backendOptions(next, addr)
	o.Username, o.Password = cred.User, cred.Password
	return o
}

// usersOn reports whether clients authenticate as proxy users.
func (s *Server) usersOn() bool { return s.users != nil && s.users.users.Len() > 0 }

// needsAuth reports whether a new client starts unauthenticated.
func (s *Server) needsAuth() bool { return s.usersOn() || s.cfg.Upstream.Password != "" }

// backend is the upstream pools the client's commands run on: its user's
// credential, or the proxy's. It changes only on AUTH, which is refused
// while the client holds a dedicated connection, so a connection is always
// given back to the pools it came from.
func (sess *Session) backend() *upstream.Backend {
	if sess.user != nil && sess.user.Upstream.User != "" {
		if b := sess.srv.users.backends[sess.user.Upstream]; b != nil {
			return b
		}
	}
	return sess.srv.backend
}

// sharesUpstream reports whether the session's traffic runs with the
// proxy's own upstream credential. The local tier and stampede protection
// share replies between clients and fill with that credential, so a user
// with an upstream credential of its own never takes part in them: its
// reads always reach Redis under its own rights (Redis's ACL, not a reply
// fetched for someone else, decides what it sees).
func (sess *Session) sharesUpstream() bool {
	return sess.user == nil || sess.user.Upstream.User == ""
}

// userName is who the client is, for CLIENT LIST, CLIENT KILL USER and the
// policy's scopes: its proxy user, else the upstream's user.
func (sess *Session) userName() string { return sess.srv.nameOf(sess.user) }

// nameOf is the name of a client authenticated as u (nil: as no proxy
// user): u's, else the upstream's user.
func (s *Server) nameOf(u *auth.User) string {
	if u != nil {
		return u.Name
	}
	return s.userName()
}

var errAuthRateLimited = []byte("-ERR redproxy: too many failed AUTH attempts from this address; try again later\r\n")

// clientHost is the client's address without the port: the unit failed
// AUTH attempts are limited by, so that new connections do not reset it.
func (sess *Session) clientHost() string {
	a := sess.nc.RemoteAddr().String()
	if h, _, err := net.SplitHostPort(a); err == nil {
		return h
	}
	return a
}

// authenticate checks AUTH or HELLO AUTH credentials and, on success, makes
// the client that user. It returns the error reply, or nil. A wrong
// password and an unknown or disabled user get the same reply.
func (sess *Session) authenticate(user, pass []byte) []byte {
	st := sess.srv.users
	host := sess.clientHost()
	// The snapshot in force now: a reload of the limit or its exemptions
	// applies to the next AUTH.
	sc := &sess.srv.Config().Server
	limited := sc.AuthLimited(host)
	logFailure := func(reason string) {
		if suppressed, ok := st.failLog.allow(); ok {
			name := "default"
			if user != nil {
				name = string(user[:min(len(user), 64)])
			}
			sess.logger().Warn("AUTH failed", "reason", reason, "user", name, "failures_not_logged", suppressed)
		}
	}
	if limited && !st.limiter.Allowed(host, sc.AuthFailureLimit) {
		st.failures.WithLabelValues("ratelimited").Inc()
		logFailure("ratelimited")
		return errAuthRateLimited
	}
	failed := func() {
		if limited {
			st.limiter.Failed(host, sc.AuthFailureLimit)
		}
		st.failures.WithLabelValues("wrongpass").Inc()
		logFailure("wrongpass")
	}
	if !sess.srv.usersOn() {
		e := sess.checkUpstreamAuth(user, pass)
		if e != nil && !bytes.Equal(e, errNoPassword) {
			failed()
		}
		return e
	}
	if user == nil {
		user = []byte("default")
	}
	u := st.users.Authenticate(user, pass)
	if u == nil {
		failed()
		return errWrongPass
	}
	if u != sess.user && sess.pin.pipe != nil {
		// The dedicated connection belongs to the current user's pools
		// and runs with its rights.
		return []byte("-ERR redproxy: AUTH as another user while WATCH is active is not supported; UNWATCH first\r\n")
	}
	if u != sess.user {
		if !u.Acquire() {
			// The client stays who it was (unauthenticated, or its
			// previous user), as after any failed AUTH.
			return maxUserConnsReply(u.Name)
		}
		// Commands already in the batch run as the user who sent them.
		sess.flush(time.Now())
		sess.setUser(u)
	}
	sess.setAuthed(true)
	return nil
}

// setAuthed records whether the client has authenticated, and gives its
// Reader the limits that go with it.
func (sess *Session) setAuthed(on bool) {
	sess.authed = on
	if sess.rd != nil {
		sess.rd.SetUnauthenticated(!on)
	}
}

// maxUserConnsReply is AUTH's answer for a user at its max_connections.
// Redis has no such limit; the message follows max_clients' (COMPATIBILITY.md).
func maxUserConnsReply(name string) []byte {
	return redcon.AppendError(nil, "ERR max number of connections for user '"+name+"' reached")
}

// setUser makes the client u (nil: no user), giving back the previous
// user's connection count; u's is already taken.
func (sess *Session) setUser(u *auth.User) {
	if sess.user != nil {
		sess.user.Release()
	}
	sess.mu.Lock()
	sess.user = u
	sess.mu.Unlock()
	sess.applyNamespace()
}

// deauthenticate is RESET's part: back to no user.
func (sess *Session) deauthenticate() {
	sess.setUser(nil)
	sess.setAuthed(!sess.srv.needsAuth())
}

// aclRefused answers a command the client's user may not run and reports
// whether it did. Inside MULTI the refusal also makes EXEC fail, as
// Redis's does.
func (sess *Session) aclRefused(r *request) bool {
	if r.name == "exec" && r.wrongArity() {
		return false // Redis checks the arity first: EXECABORT for it
	}
	msg := sess.aclDenied(r.cmd, sess.clientArgs(r.i, r.Args))
	if msg == "" {
		return false
	}
	if r.name == "exec" {
		sess.execRefused(r, msg)
		return true
	}
	sess.refusedInMulti()
	b, start := sess.localBuf()
	sess.finishLocal(r.m, redcon.AppendError(b, msg), start)
	sess.flightWriteRefused(r.cmd, r.Args)
	return true
}

// redisRefusesFirst is the error Redis answers cmd (Lookup's for args)
// with before it checks the ACL, or "": unknown command, unknown
// subcommand of a container, wrong number of arguments. d is the ACL's
// refusal. A command the table lacks is unknown to Redis too (the table
// is Redis's COMMAND), but for a user whose command rules would allow it
// and whose key patterns cannot be checked (DeniedKey) it is NOPERM: the
// table may be the built-in one standing in for a newer Redis, which has
// it (TestUnknownCommandNeedsEveryKey).
func redisRefusesFirst(cmd *commands.Command, args [][]byte, d auth.Denial) string {
	switch {
	case len(args) == 0:
		return ""
	case cmd == nil:
		if d != auth.DeniedCmd {
			return ""
		}
		return unknownCommandMsg(args)
	case cmd.Subcommands != nil && len(args) > 1:
		return unknownSubcommandMsg(args)
	case !cmd.ArityOK(len(args)):
		return strings.TrimSuffix(strings.TrimPrefix(string(errArity(cmd.Name)), "-"), "\r\n")
	}
	return ""
}

// execRefused answers an EXEC the client's user may not run as Redis does:
// the transaction is discarded, and with it any WATCH, and EXEC answers
// EXECABORT quoting the refusal, in MULTI or not. Answered NOPERM with the
// transaction kept open (found by review), the client's next commands were
// answered QUEUED where Redis runs them, and a DISCARD +OK where Redis
// says there is no MULTI.
func (sess *Session) execRefused(r *request, msg string) {
	reply := redcon.AppendError(nil, execAbortPrefix+strings.TrimPrefix(msg, "-"))
	pin := &sess.pin
	switch {
	case sess.cmulti.open:
		sess.endHeld()
	case pin.pipe != nil:
		end := cmdUnwatch
		if pin.inMulti {
			end = cmdDiscard
		}
		sess.discardPin(end, r.m, reply)
		return
	}
	sess.replyLocal(r.m, reply)
}

// execAbortPrefix is how Redis answers an EXEC it refuses before it runs.
const execAbortPrefix = "EXECABORT Transaction discarded because of: "

// aclRefuses reports whether the user's ACL refuses request i of the batch
// (cmd with args, as the guard sees them), as aclRefused will, without
// counting or answering it.
func (sess *Session) aclRefuses(i int, cmd *commands.Command, args [][]byte) bool {
	return sess.aclCheck(cmd, sess.clientArgs(i, args)) != auth.Allowed
}

// aclCheck is the client's user's ACL decision on cmd with args; Allowed
// without a user.
func (sess *Session) aclCheck(cmd *commands.Command, args [][]byte) auth.Denial {
	if sess.user == nil {
		return auth.Allowed
	}
	d, scratch := sess.user.ACL.Check(cmd, args, sess.aclKeys)
	sess.aclKeys = scratch
	return d
}

// aclDenied returns the error text for a command the client's user may
// not run, or "": NOPERM, or, as Redis looks a command up and checks its
// arity before its ACL, the unknown-command, unknown-subcommand or
// arity error where the command fails those (found by a probe: NOPERM for
// NOSUCHCMD, CLIENT FOO, SET k; not counted as an ACL refusal). Answered
// by the proxy, never forwarded: the table may lack a command Redis has
// (a module's), which the user must not reach.
func (sess *Session) aclDenied(cmd *commands.Command, args [][]byte) string {
	d := sess.aclCheck(cmd, args)
	if d == auth.Allowed {
		return ""
	}
	if early := redisRefusesFirst(cmd, args, d); early != "" {
		return early
	}
	u := sess.user
	kind := "command"
	switch d {
	case auth.DeniedKey, auth.DeniedSortBy, auth.DeniedSortGet:
		kind = "key"
	case auth.DeniedChannel:
		kind = "channel"
	}
	sess.srv.users.denied.WithLabelValues(kind).Inc()
	name := ""
	if len(args) > 0 {
		name = string(args[0])
	}
	return auth.NoPermError(u.Name, cmd, name, d)
}

// relayDenied is the check for a command of a relayed client (pub/sub,
// MONITOR, tracking): its user's ACL, and, with proxy users, no AUTH or
// HELLO, which would re-authenticate the relay's upstream connection
// behind the proxy's back.
//
// RESET is refused too whenever the relay's connection was authenticated
// (proxy users, or an upstream password): Redis would log it in again as
// its default user, which may need no password and may reach what the
// upstream credential's ACL, the backstop for scripts, does not (found by
// review: a script run after RESET wrote outside the user's keys).
//
// SCRIPT DEBUG YES and SYNC are refused on every connection (local.go,
// scriptDebugRefusal), on a relay here.
//
// A command whose name or subcommand name has a NUL byte is refused with
// Redis's unknown command error (nulNameStep): on a relay it would still
// bypass the guard's deny list, and a SELECT spelled so would move the
// relay's connection to a database the proxy does not know of.
//
// args are the command as the client sent it, which the ACL checks; sent
// is as Redis gets it, with a namespace's prefix, which routes match (as
// on every other path: routed by the client's names, a namespaced
// subscriber's GET went to another upstream than the one its keys are on,
// and its SET stored a key there; found by a probe).
func (sess *Session) relayDenied(args, sent [][]byte) string {
	if msg := nulNameMsg(sess.cmds.table.Lookup(args), args); msg != "" {
		return msg
	}
	if msg := scriptDebugRefusal(args); msg != "" {
		return msg
	}
	if msg := sess.routeRelayDenied(sent); msg != "" {
		return msg
	}
	if !sess.srv.needsAuth() && sess.srv.cfg.Upstream.Username == "" {
		return ""
	}
	cmd := sess.cmds.table.Lookup(args)
	if cmd != nil && cmd.Name == "reset" {
		return "ERR redproxy: RESET is not supported on a connection in subscribed, tracking or MONITOR mode when Redis needs credentials; close the connection instead"
	}
	if !sess.srv.usersOn() {
		return ""
	}
	if cmd != nil && (cmd.Name == "auth" || cmd.Name == "hello") {
		return "ERR redproxy: " + cmd.Name + " is not supported on a connection in subscribed, tracking or MONITOR mode"
	}
	if cmd != nil && cmd.Name == "exec" && !cmd.ArityOK(len(args)) {
		return "" // Redis checks the arity first, and discards (aclRefused)
	}
	return sess.aclDenied(cmd, args)
}

// lockedUserName is userName for another session's goroutine.
func (sess *Session) lockedUserName() string {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	return sess.userName()
}
