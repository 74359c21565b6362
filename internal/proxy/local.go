package proxy

import (
	"bytes"
	"cmp"
	"github.com/redproxy/redproxy/internal/auth"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/namespace"
	"github.com/redproxy/redproxy/internal/resp"
	"github.com/tidwall/redcon"
)

// The handlers of the commands the proxy answers itself (proxyCommands in
// dispatch.go). PING is not one of them: its answer is how clients and
// health checks learn that Redis is busy (-BUSY), loading or paused, so
// Redis gives it.

func cmdEcho(sess *Session, r *request) bool {
	b, start := sess.localBuf()
	sess.finishLocal(r.m, redcon.AppendBulk(b, r.Args[1]), start)
	return true
}

func cmdInfo(sess *Session, r *request) bool { return sess.info(r.Args, r.Raw, r.m) }

func cmdQuit(sess *Session, r *request) bool {
	sess.replyLocal(r.m, ok)
	sess.closing(metrics.CloseQuit)
	sess.quitting = true
	return true
}

// cmdOK accepts a command that has nothing to change in the proxy.
// (CLIENT NO-EVICT: client eviction protects Redis from its own clients'
// memory; the proxy's shared connections are never evicted for one
// client's sake.)
func cmdOK(sess *Session, r *request) bool {
	sess.replyLocal(r.m, ok)
	return true
}

// cmdForward sends the command on as any other.
func cmdForward(*Session, *request) bool { return false }

// cmdOther handles the commands with connection-state, blocking or
// allow-busy flags, and subcommands, that have no handler of their own.
func cmdOther(sess *Session, r *request) bool {
	switch {
	case r.blocking:
		sess.blocking(r)
	case runsAlone(r.cmd):
		sess.runAlone(r)
	case r.cmd.Flags&commands.ConnState != 0:
		sess.replyLocal(r.m, []byte("-ERR redproxy: '"+strings.ToUpper(strings.ReplaceAll(r.name, "|", " "))+"' is not supported by this proxy yet\r\n"))
	default:
		return false
	}
	return true
}

// cmdReplication refuses SYNC, PSYNC and REPLCONF: a replica connects to
// Redis itself.
func cmdReplication(sess *Session, r *request) bool {
	sess.replyLocal(r.m, []byte("-ERR redproxy: "+strings.ToUpper(r.name)+" is for replicas, which must connect to Redis itself, not through the proxy\r\n"))
	return true
}

// cmdScriptDebug refuses SCRIPT DEBUG YES and SYNC (scriptDebugRefusal)
// and answers SCRIPT DEBUG NO itself: no connection of the proxy's ever
// has the debugger on, so NO changes nothing and is answered +OK, as
// Redis answers it (refusing it would only break clients that reset the
// mode out of habit). Any other mode gets Redis's error. The command is
// one of the connection-state commands (commands.connStateCommands), so
// inside MULTI it is refused as they are (queueInMulti, clusterPlacer);
// on a relay relayDenied refuses YES and SYNC.
func cmdScriptDebug(sess *Session, r *request) bool {
	if sess.repliesPending() {
		// Redis refuses SCRIPT DEBUG, whatever its mode, while replies to
		// the client's earlier commands are still to be written, and the
		// mode stays as it was: with YES refused here instead, the EVAL
		// behind it, which Redis runs, was refused as one the debugger
		// would have run (found by review).
		sess.replyLocal(r.m, []byte("-ERR SCRIPT DEBUG must be called outside a pipeline\r\n"))
		return true
	}
	refusal := scriptDebugRefusal(r.Args)
	switch {
	case strings.EqualFold(string(r.Args[2]), "no"):
		sess.scriptDebug = false
		sess.replyLocal(r.m, ok)
	case refusal != "":
		sess.scriptDebug = true
		sess.replyLocal(r.m, redcon.AppendError(nil, refusal))
	default:
		sess.replyLocal(r.m, []byte("-ERR Use SCRIPT DEBUG YES/SYNC/NO\r\n"))
	}
	return true
}

// repliesPending reports whether the batch holds a reply the client is
// still to be sent (Redis's clientHasPendingReplies, for a client whose
// earlier commands came in the same read).
func (sess *Session) repliesPending() bool {
	if len(sess.out) > 0 {
		return true
	}
	for _, sl := range sess.slots {
		if !sl.mute && sl.kind != slotHidden && sl.kind != slotRefusal {
			return true
		}
	}
	return false
}

// scriptDebugStep answers, for a client whose SCRIPT DEBUG YES or SYNC
// was refused, the scripts Redis would have run in the debugger: EVAL and
// EVAL_RO are refused (the debugging session they would start ends the
// mode, on Redis too), EVALSHA and EVALSHA_RO get Redis's own error in that
// mode, which keeps it. Found by review: redis-cli --ldb throws SCRIPT
// DEBUG's reply away and sends the EVAL, so through the proxy the script
// ran for real and kept its writes, where Redis's debugging session rolls
// them back (and each "restart" ran it again). Inside MULTI the refusal is
// at queue time and EXEC aborts (on Redis the EVAL is queued and EXEC
// starts the debugger).
func (sess *Session) scriptDebugStep(r *request) bool {
	var msg string
	ends := false // the EVAL that Redis would debug ends the mode
	switch r.name {
	case "eval", "eval_ro":
		ends = true
		msg = "ERR redproxy: the script was not run: this connection turned the Lua debugger on (SCRIPT DEBUG), which is not supported through the proxy, and the script would have run in it; the debugger mode is off again. Debug scripts against Redis directly (" + ldbCommand + ")"
	case "evalsha", "evalsha_ro":
		msg = "ERR Please use EVAL instead of EVALSHA for debugging"
	default:
		return false
	}
	if r.wrongArity() {
		return false // Redis's arity error comes first
	}
	if ends {
		sess.scriptDebug = false
	}
	sess.refusedInMulti()
	sess.replyLocal(r.m, redcon.AppendError(nil, msg))
	return true
}

// scriptDebugRefusal is the refusal of SCRIPT DEBUG YES or SYNC (args are
// the client's, in any case), "" for any other command. Either sets a
// flag on the Redis connection it arrives on, and the next EVAL on that
// connection runs in the Lua debugger: YES forks a child that then owns
// the socket, SYNC blocks the whole server while the session lasts.
// Through the proxy that connection is a shared one, or a pinned one that
// goes back to the pool, so another client's EVAL was run in the debugger
// and answered with its output (found by review); on a relay the
// debugger's conversation cannot work through the proxy either. A
// debugging session needs a connection of its own to Redis.
func scriptDebugRefusal(args [][]byte) string {
	if len(args) != 3 || !strings.EqualFold(string(args[0]), "script") || !strings.EqualFold(string(args[1]), "debug") {
		return ""
	}
	if mode := string(args[2]); !strings.EqualFold(mode, "yes") && !strings.EqualFold(mode, "sync") {
		return ""
	}
	return "ERR redproxy: SCRIPT DEBUG is not supported through the proxy: it would start the Lua debugger on a Redis connection other clients share; debug scripts against Redis directly (" + ldbCommand + ")"
}

// ldbCommand is how both refusals tell the user to debug a script.
const ldbCommand = "redis-cli --ldb -h <redis host> -p <redis port> --eval script.lua"

func cmdSelect(sess *Session, r *request) bool {
	n, isInt := resp.ParseInt(r.Args[1])
	db := int(n)
	switch {
	case !isInt:
		sess.replyLocal(r.m, errNotInteger)
	case n != int64(int32(n)):
		// Redis reads the index as a C int before it checks it as a
		// database (found by review: the proxy answered errDBRange).
		sess.replyLocal(r.m, errIntRange)
	case db < 0 || db >= sess.srv.cfg.Upstream.Databases:
		sess.replyLocal(r.m, errDBRange)
	default:
		// Commands already in the batch belong to the old DB.
		sess.flush(time.Now())
		sess.mu.Lock()
		sess.db = db
		sess.mu.Unlock()
		sess.replyLocal(r.m, ok)
	}
	return true
}

func cmdAuth(sess *Session, r *request) bool {
	sess.auth(r.m, r.Args[1:])
	return true
}

func cmdHello(sess *Session, r *request) bool {
	sess.hello(r.m, r.Args)
	return true
}

func cmdReset(sess *Session, r *request) bool {
	// RESET ends CLIENT REPLY OFF and a pending SKIP, but a SKIP sent just
	// before it mutes RESET's own reply, as in Redis (a +RESET the client
	// did not expect shifted every later reply by one; found by review).
	// SKIP is ignored while OFF, so a muted RESET with OFF unset was
	// skipped.
	skipped := sess.curMute && !sess.replyOff
	sess.flush(time.Now())
	sess.mu.Lock()
	sess.db, sess.resp3, sess.name = 0, false, ""
	sess.mu.Unlock()
	sess.replyOff, sess.replySkip, sess.curMute = false, false, skipped
	sess.abort = txAbort{}
	sess.deauthenticate()
	sess.replyLocal(r.m, []byte("+RESET\r\n"))
	return true
}

func cmdClientSetname(sess *Session, r *request) bool {
	name := r.Args[2]
	if !validClientName(name) {
		sess.replyLocal(r.m, []byte("-ERR Client names cannot contain spaces, newlines or special characters.\r\n"))
		return true
	}
	sess.mu.Lock()
	sess.name = string(name)
	sess.mu.Unlock()
	sess.replyLocal(r.m, ok)
	if sess.pin.pipe != nil && !sess.pin.inMulti {
		sess.namePin(sess.name)
	}
	return true
}

func cmdClientGetname(sess *Session, r *request) bool {
	b, start := sess.localBuf()
	if sess.name == "" {
		b = sess.appendNull(b)
	} else {
		b = redcon.AppendBulkString(b, sess.name)
	}
	sess.finishLocal(r.m, b, start)
	return true
}

func cmdClientID(sess *Session, r *request) bool {
	b, start := sess.localBuf()
	sess.finishLocal(r.m, redcon.AppendInt(b, sess.id), start)
	return true
}

func cmdClientInfo(sess *Session, r *request) bool {
	b, start := sess.localBuf()
	sess.finishLocal(r.m, sess.appendText(b, []byte(sess.infoLine()+"\n")), start)
	return true
}

// cmdClientList answers CLIENT LIST [TYPE type | ID id ...] with the
// proxy's own clients, filters checked and applied as Redis does (they
// were ignored: "CLIENT LIST TYPE pubsub" listed everyone).
func cmdClientList(sess *Session, r *request) bool {
	keep := func(*Session) bool { return true }
	switch args := r.Args[2:]; {
	case len(args) == 2 && strings.EqualFold(string(args[0]), "type"):
		typ, known := clientType(string(args[1]))
		if !known {
			// AppendError turns line breaks into spaces, as Redis does:
			// the client's text must not end the error early.
			sess.replyLocal(r.m, redcon.AppendError(nil, "ERR Unknown client type '"+string(args[1])+"'"))
			return true
		}
		keep = func(c *Session) bool { return c.clientType() == typ }
	case len(args) > 1 && strings.EqualFold(string(args[0]), "id"):
		ids := make([]int64, 0, len(args)-1)
		for _, a := range args[1:] {
			id, isInt := resp.ParseInt(a)
			if !isInt {
				sess.replyLocal(r.m, []byte("-ERR Invalid client ID\r\n"))
				return true
			}
			ids = append(ids, id)
		}
		b, start := sess.localBuf()
		sess.finishLocal(r.m, sess.appendText(b, []byte(sess.srv.clientListByID(sess.effectiveNamespace(), ids))), start)
		return true
	case len(args) != 0:
		sess.replyLocal(r.m, errSyntax)
		return true
	}
	b, start := sess.localBuf()
	sess.finishLocal(r.m, sess.appendText(b, []byte(sess.srv.clientList(sess.effectiveNamespace(), keep))), start)
	return true
}

// clientType parses a client type as CLIENT LIST and CLIENT KILL take it;
// "replica" and "slave" are one.
func clientType(name string) (typ string, known bool) {
	switch typ = strings.ToLower(name); typ {
	case "normal", "pubsub", "master", "replica":
		return typ, true
	case "slave":
		return "replica", true
	}
	return "", false
}

// clientType is the session's type as Redis would give its connection:
// pubsub while subscribed (relayed), normal otherwise (a MONITOR or
// tracking client too). The proxy has no master or replica clients.
func (sess *Session) clientType() string {
	if sess.list.subscribed() {
		return "pubsub"
	}
	return "normal"
}

func cmdClientSetinfo(sess *Session, r *request) bool {
	// As Redis 7.2 checks them: a space or newline in a value would forge
	// fields, or whole lines, in other clients' CLIENT LIST (found by
	// review; SETNAME was checked, SETINFO was not).
	if !validClientName(r.Args[3]) {
		sess.replyLocal(r.m, redcon.AppendError(nil, "ERR "+string(r.Args[2])+" cannot contain spaces, newlines or special characters."))
		return true
	}
	switch strings.ToLower(string(r.Args[2])) {
	case "lib-name":
		sess.mu.Lock()
		sess.libName = string(r.Args[3])
		sess.mu.Unlock()
	case "lib-ver":
		sess.mu.Lock()
		sess.libVer = string(r.Args[3])
		sess.mu.Unlock()
	default:
		sess.replyLocal(r.m, redcon.AppendError(nil, "ERR Unrecognized option '"+string(r.Args[2])+"'"))
		return true
	}
	sess.replyLocal(r.m, ok)
	return true
}

func cmdClientGetredir(sess *Session, r *request) bool {
	sess.replyLocal(r.m, []byte(":-1\r\n"))
	return true
}

// cmdClientTracking: a client that turns tracking on keeps its own cache
// coherent with Redis's pushes: it gets a connection of its own, relayed.
func cmdClientTracking(sess *Session, r *request) bool {
	if trackingRedirect(r.Args) {
		sess.replyLocal(r.m, []byte("-"+errTrackingRedirect+"\r\n"))
		return true
	}
	if !trackingSyntaxOK(r.Args) {
		sess.replyLocal(r.m, errSyntax)
		return true
	}
	if strings.EqualFold(string(r.Args[2]), "on") {
		return sess.startRelay(relayTracking, r)
	}
	sess.replyLocal(r.m, ok)
	return true
}

// trackingSyntaxOK reports whether CLIENT TRACKING's arguments parse as
// Redis parses them: ON or OFF, then options, each checked even with OFF,
// which the proxy answers itself (it answered +OK to "CLIENT TRACKING
// maybe", found by the differential test).
func trackingSyntaxOK(args [][]byte) bool {
	_, ok := trackingOptions(args)
	return ok
}

// trackingOpts are the options of a CLIENT TRACKING that parses.
type trackingOpts struct{ optin, optout, bcast, prefix bool }

// trackingOptions parses CLIENT TRACKING's arguments as Redis does (see
// trackingSyntaxOK); ok is false when Redis answers a syntax error.
func trackingOptions(args [][]byte) (o trackingOpts, ok bool) {
	for i := 3; i < len(args); i++ {
		switch strings.ToLower(string(args[i])) {
		case "prefix":
			o.prefix = true
			fallthrough
		case "redirect":
			i++
			if i == len(args) {
				return o, false
			}
		case "bcast":
			o.bcast = true
		case "optin":
			o.optin = true
		case "optout":
			o.optout = true
		case "noloop":
		default:
			return o, false
		}
	}
	return o, onOff(args[2])
}

func onOff(arg []byte) bool {
	return strings.EqualFold(string(arg), "on") || strings.EqualFold(string(arg), "off")
}

// cmdClientNoEvict answers CLIENT NO-EVICT: the shared connections are
// the proxy's, so the mode has nothing to apply to, but its argument is
// checked as Redis checks it.
func cmdClientNoEvict(sess *Session, r *request) bool {
	if !onOff(r.Args[2]) {
		sess.replyLocal(r.m, errSyntax)
		return true
	}
	sess.replyLocal(r.m, ok)
	return true
}

func cmdClientNoTouch(sess *Session, r *request) bool {
	if !onOff(r.Args[2]) {
		sess.replyLocal(r.m, errSyntax)
		return true
	}
	if strings.EqualFold(string(r.Args[2]), "on") {
		return sess.startRelay(relayTracking, r)
	}
	sess.replyLocal(r.m, ok)
	return true
}

func cmdClientCaching(sess *Session, r *request) bool {
	sess.replyLocal(r.m, []byte("-ERR CLIENT CACHING can be called only when the client is in tracking mode with OPTIN or OPTOUT mode enabled\r\n"))
	return true
}

func cmdClientTrackinginfo(sess *Session, r *request) bool {
	b, start := sess.localBuf()
	if sess.resp3 {
		b = append(b, "%3\r\n"...)
	} else {
		b = redcon.AppendArray(b, 6)
	}
	b = redcon.AppendBulkString(b, "flags")
	if sess.resp3 {
		b = append(b, "~1\r\n"...) // a set, as Redis sends it
	} else {
		b = redcon.AppendArray(b, 1)
	}
	b = redcon.AppendBulkString(b, "off")
	b = redcon.AppendBulkString(b, "redirect")
	b = redcon.AppendInt(b, -1)
	b = redcon.AppendBulkString(b, "prefixes")
	b = redcon.AppendArray(b, 0)
	sess.finishLocal(r.m, b, start)
	return true
}

func cmdClientReply(sess *Session, r *request) bool {
	switch strings.ToLower(string(r.Args[2])) {
	case "on":
		sess.replyOff, sess.curMute = false, false
		sess.replyLocal(r.m, ok)
	case "off":
		sess.replyOff, sess.curMute = true, true
		sess.replyLocal(r.m, ok)
	case "skip":
		// Redis ignores SKIP while replies are off, so a RESET or ON
		// after it is answered.
		sess.replySkip = !sess.replyOff
		sess.curMute = true
		sess.replyLocal(r.m, ok)
	default:
		sess.replyLocal(r.m, errSyntax)
	}
	return true
}

func cmdClientKill(sess *Session, r *request) bool {
	sess.replyLocal(r.m, sess.srv.clientKill(sess, r.Args[2:]))
	return true
}

func cmdClientUnblock(sess *Session, r *request) bool { return sess.unblock(r.Args, r.m) }

func cmdPin(sess *Session, r *request) bool {
	sess.pinFor(r)
	return true
}

func cmdSubscribe(sess *Session, r *request) bool { return sess.startRelay(relayPubSub, r) }

func cmdMonitor(sess *Session, r *request) bool { return sess.startRelay(relayMonitor, r) }

func cmdUnsubscribe(sess *Session, r *request) bool {
	sess.unsubscribeNone(r.m, r.name, sess.clientArgs(r.i, r.Args)[1:])
	return true
}

func isSubscribe(name string) bool {
	switch name {
	case "subscribe", "psubscribe", "ssubscribe", "unsubscribe", "punsubscribe", "sunsubscribe":
		return true
	}
	return false
}

// isUnsubscribe reports whether name is one of the unsubscribe commands.
func isUnsubscribe(name string) bool {
	switch name {
	case "unsubscribe", "punsubscribe", "sunsubscribe":
		return true
	}
	return false
}

var (
	ok            = []byte("+OK\r\n")
	zero          = []byte(":0\r\n")
	one           = []byte(":1\r\n")
	errNotInteger = []byte("-ERR value is not an integer or out of range\r\n")
	errSyntax     = []byte("-ERR syntax error\r\n")
	errDBRange    = []byte("-ERR DB index is out of range\r\n")
	errIntRange   = []byte("-ERR value is out of range, value must between -2147483648 and 2147483647\r\n") // sic, Redis 7.0's text
	errWrongPass  = []byte("-WRONGPASS invalid username-password pair or user is disabled.\r\n")
	errNoPassword = []byte("-ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?\r\n")
)

func errArity(name string) []byte {
	return []byte("-ERR wrong number of arguments for '" + name + "' command\r\n")
}

// appendNull appends the null of the session's protocol.
func (sess *Session) appendNull(b []byte) []byte {
	if sess.resp3 {
		return append(b, "_\r\n"...)
	}
	return redcon.AppendNull(b)
}

// checkUpstreamAuth compares credentials with the upstream's: clients of the proxy
// authenticate exactly as they would with Redis, and the proxy never opens a
// password-protected Redis to clients without the password.
func (sess *Session) checkUpstreamAuth(user, pass []byte) []byte {
	up := sess.srv.cfg.Upstream
	if up.Password == "" {
		// As Redis with no requirepass: its default user takes any
		// password; AUTH <password> alone is a configuration mistake.
		switch {
		case user == nil:
			return errNoPassword
		case string(user) == "default" && up.Username == "":
			return nil
		}
		return errWrongPass
	}
	if user == nil {
		user = []byte("default")
	}
	wantUser := up.Username
	if wantUser == "" {
		wantUser = "default"
	}
	if string(user) != wantUser || !auth.SecretEqual(pass, []byte(up.Password)) {
		return errWrongPass
	}
	sess.setAuthed(true)
	return nil
}

func (sess *Session) auth(m *metrics.Command, args [][]byte) {
	var e []byte
	switch len(args) {
	case 1:
		e = sess.authenticate(nil, args[0]) // nil: the one-argument form
	case 2:
		e = sess.authenticate(args[0], args[1])
	default:
		e = errSyntax
	}
	if e != nil {
		sess.replyLocal(m, e)
		return
	}
	sess.replyLocal(m, ok)
}

// helloNoAuth is HELLO's refusal before the client authenticated, in the
// words of the upstream's Redis version (found by review: the proxy sent
// 7.2's text in front of a 7.0 server, and clients and tests match it).
// The version is the one the proxy learnt at startup (UpstreamVersion,
// "7.0.0" when it never learnt one): 7.2 and later name "HELLO <proto>
// AUTH", 7.0 "HELLO AUTH".
func helloNoAuth(version string) []byte {
	if versionAtLeast(version, 7, 2) {
		return []byte("-NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time\r\n")
	}
	return []byte("-NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time\r\n")
}

// versionAtLeast reports whether the Redis version v ("7.2.4") is at
// least major.minor; a version it cannot read is taken as older.
func versionAtLeast(v string, major, minor int) bool {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return false
	}
	maj, err1 := strconv.Atoi(parts[0])
	mnr, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return false
	}
	return maj > major || maj == major && mnr >= minor
}

// hello implements HELLO [protover [AUTH user pass] [SETNAME name]].
func (sess *Session) hello(m *metrics.Command, args [][]byte) {
	proto := 0
	if len(args) > 1 {
		// Any int64 is a version, if not a supported one (NOPROTO), as
		// on Redis; a 19-digit one was "not an integer" (resp.ParseInt).
		n, isInt := resp.ParseInt(args[1])
		if !isInt {
			sess.replyLocal(m, []byte("-ERR Protocol version is not an integer or out of range\r\n"))
			return
		}
		if n != 2 && n != 3 {
			sess.replyLocal(m, []byte("-NOPROTO unsupported protocol version\r\n"))
			return
		}
		proto = int(n)
	}
	var name []byte
	setName := false
	for i := 2; i < len(args); i++ {
		opt := strings.ToLower(string(args[i]))
		switch {
		case opt == "auth" && i+2 < len(args):
			if e := sess.authenticate(args[i+1], args[i+2]); e != nil {
				sess.replyLocal(m, e)
				return
			}
			i += 2
		case opt == "setname" && i+1 < len(args):
			name, setName = args[i+1], true
			if !validClientName(name) {
				sess.replyLocal(m, []byte("-ERR Client names cannot contain spaces, newlines or special characters.\r\n"))
				return
			}
			i++
		default:
			sess.replyLocal(m, redcon.AppendError(nil, "ERR Syntax error in HELLO option '"+string(args[i])+"'"))
			return
		}
	}
	if !sess.authed {
		sess.replyLocal(m, helloNoAuth(sess.srv.UpstreamVersion()))
		return
	}
	if proto != 0 && (proto == 3) != sess.resp3 {
		// Later commands travel on connections of the new protocol.
		sess.flush(time.Now())
		sess.mu.Lock()
		sess.resp3 = proto == 3
		sess.mu.Unlock()
	}
	if setName {
		sess.mu.Lock()
		sess.name = string(name)
		sess.mu.Unlock()
	}
	b, start := sess.localBuf()
	if sess.resp3 {
		b = append(b, "%7\r\n"...)
	} else {
		b = redcon.AppendArray(b, 14)
	}
	p := 2
	if sess.resp3 {
		p = 3
	}
	b = redcon.AppendBulkString(b, "server")
	b = redcon.AppendBulkString(b, "redis")
	b = redcon.AppendBulkString(b, "version")
	b = redcon.AppendBulkString(b, sess.srv.UpstreamVersion())
	b = redcon.AppendBulkString(b, "proto")
	b = redcon.AppendInt(b, int64(p))
	b = redcon.AppendBulkString(b, "id")
	b = redcon.AppendInt(b, sess.id)
	b = redcon.AppendBulkString(b, "mode")
	b = redcon.AppendBulkString(b, "standalone")
	b = redcon.AppendBulkString(b, "role")
	b = redcon.AppendBulkString(b, "master")
	b = redcon.AppendBulkString(b, "modules")
	b = redcon.AppendArray(b, 0)
	sess.finishLocal(m, b, start)
}

func validClientName(name []byte) bool {
	for _, c := range name {
		if c < '!' || c > '~' {
			return false
		}
	}
	return true
}

// listState is what CLIENT INFO/LIST show of a session that only its own
// goroutine knows otherwise; other sessions read it without locks.
type listState struct {
	active atomic.Int64 // when the last batch began, Unix nanoseconds
	multi  atomic.Int32 // commands queued in MULTI, plus one; 0: not in MULTI
	// relay is relayKind plus one (0: not a relay) in its low byte, and
	// the alsoPubSub and alsoTracking bits (one word: the Session keeps to
	// its size class).
	relay atomic.Uint32
}

// The bits of listState.relay past its kind: alsoPubSub, a tracking relay
// whose client subscribed; alsoTracking, a RESP3 pub/sub relay whose
// client turned tracking on. Redis shows such a client flags=Pt, of TYPE
// pubsub (found by a probe: the proxy showed t alone, and CLIENT KILL
// TYPE pubsub left it).
const (
	relayKindBits uint32 = 0xff
	alsoPubSub    uint32 = 1 << 8
	alsoTracking  uint32 = 1 << 9
)

// relayOf is the relay's kind plus one, 0 when the client is no relay.
func (l *listState) relayOf() uint32 { return l.relay.Load() & relayKindBits }

// setAlso sets or clears bit (alsoPubSub, alsoTracking).
func (l *listState) setAlso(bit uint32, on bool) {
	if on {
		l.relay.Or(bit)
	} else {
		l.relay.And(^bit)
	}
}

// subscribed reports whether the client is a subscriber, for CLIENT
// LIST's P flag and TYPE pubsub.
func (l *listState) subscribed() bool {
	r := l.relay.Load()
	return r&relayKindBits == uint32(relayPubSub)+1 || r&alsoPubSub != 0
}

// tracking reports whether the client has tracking on, for the t flag.
func (l *listState) tracking() bool {
	r := l.relay.Load()
	return r&relayKindBits == uint32(relayTracking)+1 || r&alsoTracking != 0
}

// infoLine renders the session like a line of Redis's CLIENT LIST, with
// every field Redis 7.2 prints, in its order, so tools that parse the
// lines work. Fields about Redis's own buffers (qbuf, argv-mem, rbs, omem,
// tot-mem, ...) are 0: the proxy does not account memory per client that
// way. sub/psub/ssub are 0 too: a subscriber's subscriptions live on its
// relay connection (Redis's own CLIENT LIST shows them).
func (sess *Session) infoLine() string {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	var b bytes.Buffer
	now := time.Now()
	age := int64(now.Sub(time.Unix(0, sess.createdAt)).Seconds())
	idle := int64(now.Sub(time.Unix(0, sess.lastActive())).Seconds())
	proto := 2
	if sess.resp3 {
		proto = 3
	}
	last := "NULL"
	if c := sess.lastCmd.Load(); c != nil {
		last = c.Name
	}
	// In Redis's order: O, P, x, b, t.
	flags := ""
	if sess.list.relayOf() == uint32(relayMonitor)+1 {
		flags += "O"
	}
	if sess.list.subscribed() {
		flags += "P"
	}
	multi := int(sess.list.multi.Load()) - 1
	if multi >= 0 {
		flags += "x"
	}
	if sess.block.id.Load() != 0 {
		flags += "b"
	}
	if sess.list.tracking() {
		flags += "t"
	}
	if flags == "" {
		flags = "N"
	}
	field := func(k, v string) {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(v)
	}
	field("id", strconv.FormatInt(sess.id, 10))
	field("addr", sess.nc.RemoteAddr().String())
	field("laddr", sess.nc.LocalAddr().String())
	field("fd", strconv.Itoa(connFD(sess.nc)))
	field("name", sess.name)
	field("age", strconv.FormatInt(age, 10))
	field("idle", strconv.FormatInt(idle, 10))
	field("flags", flags)
	field("db", strconv.Itoa(sess.db))
	for _, k := range []string{"sub", "psub", "ssub"} {
		field(k, "0")
	}
	field("multi", strconv.Itoa(multi))
	for _, k := range []string{"qbuf", "qbuf-free", "argv-mem", "multi-mem", "rbs", "rbp", "obl", "oll", "omem", "tot-mem"} {
		field(k, "0")
	}
	field("events", "r")
	field("cmd", last)
	field("user", sess.userName())
	field("redir", "-1")
	field("resp", strconv.Itoa(proto))
	field("lib-name", sess.libName)
	field("lib-ver", sess.libVer)
	return b.String()
}

// connFD returns the client socket's file descriptor, or -1.
func connFD(nc net.Conn) int {
	if cc, ok := nc.(*clientConn); ok && cc.Conn == nil {
		return int(cc.parked.fd) // parked (park.go); its caller holds sess.mu
	}
	sc, ok := socketOf(nc).(syscall.Conn)
	if !ok {
		return -1
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return -1
	}
	fd := -1
	rc.Control(func(f uintptr) { fd = int(f) })
	return fd
}

// clientList is CLIENT LIST's text: the proxy's own clients, not its
// upstream connections (those are shared and belong to no client); for a
// client in namespace ns, only the clients in the same namespace (found by
// review: a tenant saw the others' names, addresses, users and last
// commands).
func (s *Server) clientList(ns *namespace.Namespace, keep func(*Session) bool) string {
	var b strings.Builder
	for _, sess := range s.sessionList() {
		if ns != nil && sess.lockedNamespace() != ns || !keep(sess) {
			continue
		}
		b.WriteString(sess.infoLine())
		b.WriteByte('\n')
	}
	return b.String()
}

// clientListByID is CLIENT LIST ID's text: one line per ID in the order
// given, an ID given twice listed twice, unknown IDs skipped, as Redis
// answers it.
func (s *Server) clientListByID(ns *namespace.Namespace, ids []int64) string {
	byID := make(map[int64]*Session, len(ids))
	for _, sess := range s.sessionList() {
		if ns == nil || sess.lockedNamespace() == ns {
			byID[sess.id] = sess
		}
	}
	var b strings.Builder
	for _, id := range ids {
		if sess := byID[id]; sess != nil {
			b.WriteString(sess.infoLine())
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// unsubscribeNone answers an UNSUBSCRIBE family command from a client that
// is not subscribed, as Redis does: one confirmation per channel (or one
// with a null channel), each with a subscription count of 0. CLIENT REPLY
// OFF or SKIP does not mute them: Redis sends pub/sub confirmations as
// pushes, which it never mutes, on RESP2 connections too (found by the
// differential test).
func (sess *Session) unsubscribeNone(m *metrics.Command, name string, channels [][]byte) {
	sess.curMute = false
	b, start := sess.localBuf()
	emit := func(ch []byte) {
		if sess.resp3 {
			b = append(b, ">3\r\n"...)
		} else {
			b = redcon.AppendArray(b, 3)
		}
		b = redcon.AppendBulkString(b, name)
		if ch == nil {
			b = sess.appendNull(b)
		} else {
			b = redcon.AppendBulk(b, ch)
		}
		b = redcon.AppendInt(b, 0)
	}
	if len(channels) == 0 {
		emit(nil)
	}
	for _, ch := range channels {
		emit(ch)
	}
	sess.finishLocal(m, b, start)
}

// clientKill implements CLIENT KILL for the proxy's own clients: the old
// "CLIENT KILL addr" form and the filters ID, ADDR, LADDR, USER, SKIPME,
// TYPE and MAXAGE.
func (s *Server) clientKill(self *Session, args [][]byte) []byte {
	if len(args) == 1 {
		addr := string(args[0])
		for _, sess := range s.sessionList() {
			if remote, _ := sess.addrs(); remote == addr {
				s.awaitEnd(self, sess.killFrom(self))
				return ok
			}
		}
		return []byte("-ERR No such client\r\n")
	}
	if len(args)%2 != 0 {
		return errSyntax
	}
	var id int64 = -1
	var addr, laddr, user, typ string
	var maxAge int64 = -1
	skipMe := true
	for i := 0; i < len(args); i += 2 {
		v := string(args[i+1])
		switch strings.ToLower(string(args[i])) {
		case "id":
			// Redis's string2ll: "01" and "+1" are no ids (strconv took
			// them, and "ID 0<id>" killed that client: found by a probe).
			n, isInt := resp.ParseInt(args[i+1])
			if !isInt || n <= 0 {
				return []byte("-ERR client-id should be greater than 0\r\n")
			}
			id = n
		case "addr":
			addr = v
		case "laddr":
			laddr = v
		case "user":
			if !s.userExists(v) {
				// As Redis, at the filter, before any later one is read.
				return redcon.AppendError(nil, "ERR No such user '"+v+"'")
			}
			user = v
		case "type":
			var known bool
			if typ, known = clientType(v); !known {
				return redcon.AppendError(nil, "ERR Unknown client type '"+v+"'")
			}
		case "skipme":
			switch strings.ToLower(v) {
			case "yes":
				skipMe = true
			case "no":
				skipMe = false
			default:
				return errSyntax
			}
		case "maxage":
			if !versionAtLeast(s.UpstreamVersion(), 7, 4) {
				// Redis 7.4's filter: an older Redis refuses it as any
				// unknown filter, and kills nobody (found by review: the
				// proxy killed every client older than the age).
				return errSyntax
			}
			n, isInt := resp.ParseInt(args[i+1])
			if !isInt {
				return errNotInteger
			}
			maxAge = n
		default:
			return errSyntax
		}
	}
	killed := 0
	var ends []<-chan struct{}
	for _, sess := range s.sessionList() {
		remote, local := sess.addrs()
		switch {
		case skipMe && sess == self,
			id >= 0 && sess.id != id,
			addr != "" && remote != addr,
			laddr != "" && local != laddr,
			user != "" && user != sess.lockedUserName(),
			typ != "" && sess.clientType() != typ,
			maxAge >= 0 && time.Since(time.Unix(0, sess.createdAt)) < time.Duration(maxAge)*time.Second:
			continue
		}
		if end := sess.killFrom(self); end != nil {
			ends = append(ends, end)
		}
		killed++
	}
	s.awaitEnd(self, ends...)
	return redcon.AppendInt(nil, int64(killed))
}

// killFrom kills sess for CLIENT KILL sent by self, and returns what is
// closed once sess has ended (nil: it has already, or it is self). A
// client killing itself is closed after the kill's reply, with nothing it
// pipelined behind the kill run, as Redis does (CLOSE_AFTER_REPLY);
// killing the connection at once lost the reply and let the rest of the
// batch through (found by review).
func (sess *Session) killFrom(self *Session) <-chan struct{} {
	if sess == self {
		sess.closing(metrics.CloseKilled)
		sess.quitting = true
		return nil
	}
	end := sess.srv.endNotice(sess)
	sess.kill()
	return end
}

// killWait bounds how long CLIENT KILL waits for the clients it killed to
// end. Redis frees a killed client before it answers, so a client that
// reconnects on the kill's reply finds its user's max_connections place
// free (it found it taken while a blocked client's goroutine had not yet
// noticed: up to 50 ms). A client whose goroutine waits on Redis (a
// command on a shared connection behind a slow script) ends when that
// reply comes; the kill does not wait longer than this for it.
const killWait = time.Second

// endNotice returns a channel closed when sess ends (sessionEnded), nil
// when it has already.
func (s *Server) endNotice(sess *Session) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, alive := s.sessions[sess]; !alive {
		return nil
	}
	ch := s.endNotices[sess]
	if ch == nil {
		if s.endNotices == nil {
			s.endNotices = map[*Session]chan struct{}{}
		}
		ch = make(chan struct{})
		s.endNotices[sess] = ch
	}
	return ch
}

// awaitEnd waits, up to killWait in all, for the channels of endNotice;
// and no longer once self is killed: two clients killing each other at
// once each waited for the other until killWait, both holding their
// places (found by review).
func (s *Server) awaitEnd(self *Session, ends ...<-chan struct{}) {
	if len(ends) == 0 || len(ends) == 1 && ends[0] == nil {
		return
	}
	timer := time.NewTimer(killWait)
	defer timer.Stop()
	look := time.NewTicker(killLook)
	defer look.Stop()
	for _, end := range ends {
		for waiting := end != nil; waiting; {
			select {
			case <-end:
				waiting = false
			case <-look.C:
				if self.interrupted.Load() {
					return
				}
			case <-timer.C:
				return
			}
		}
	}
}

// killLook is how often a CLIENT KILL waiting for its victims looks
// whether it was killed itself.
const killLook = 5 * time.Millisecond

// userExists reports whether name is a user CLIENT KILL USER may name;
// Redis refuses one its ACL does not have ("No such user"), where the
// proxy answered :0 (found by review). The users that exist for the
// proxy are the names its clients can have (Session.userName, CLIENT
// LIST's user=): the configured [[users]], and for a client with no proxy
// user (none configured, or not yet authenticated) the upstream
// credential's user, or "default" without one. "default" exists always,
// as on Redis, whose default user cannot be deleted. A [[users]]
// upstream_user is a name on Redis, never one a proxy client shows, so it
// is not one. Names compare exactly, as Redis's do.
func (s *Server) userExists(name string) bool {
	return name == "default" || name == s.userName() || s.users != nil && s.users.users.Get(name) != nil
}

// userName is the user every client of the proxy acts as upstream.
func (s *Server) userName() string {
	if s.cfg.Upstream.Username != "" {
		return s.cfg.Upstream.Username
	}
	return "default"
}

// sessionByID returns the client with the proxy id, or nil (also for one
// ending: see sessionList).
func (s *Server) sessionByID(id int64) *Session {
	s.mu.Lock()
	defer s.mu.Unlock()
	for sess := range s.sessions {
		if sess.id == id && !sess.interrupted.Load() {
			return sess
		}
	}
	return nil
}

// sessionList is the proxy's clients in connection (ID) order, the order
// Redis lists its own: a map's order changed from call to call. A client
// killed (or interrupted by shutdown) and still ending, held by a slow
// reply, is left out: Redis frees a client at its kill, and a second
// CLIENT KILL ID of it answered 1, CLIENT LIST still showed it (found by
// review).
func (s *Server) sessionList() []*Session {
	s.mu.Lock()
	out := make([]*Session, 0, len(s.sessions))
	for sess := range s.sessions {
		if !sess.interrupted.Load() {
			out = append(out, sess)
		}
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b *Session) int { return cmp.Compare(a.id, b.id) })
	return out
}

// kill closes the client's connection; its goroutine notices and cleans up.
func (sess *Session) kill() {
	sess.interrupted.Store(true)
	sess.closeConn()
	sess.wake() // a parked one has no goroutine to notice
}
