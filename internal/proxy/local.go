package proxy

import (
	"bytes"
	"crypto/subtle"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/resp"
	"github.com/tidwall/redcon"
)

// isProxyAnswered lists commands without connection-state flags that the
// proxy still answers itself because they need no Redis round trip. PING is
// not one of them: its answer is how clients and health checks learn that
// Redis is busy (-BUSY), loading or paused, so Redis gives it.
func isProxyAnswered(cmd *commands.Command) bool {
	switch cmd.Name {
	case "echo", "info":
		return true
	}
	return false
}

// special handles commands that change connection state, block, subscribe,
// or that the proxy answers itself. It reports false when the command
// should simply be forwarded.
func (sess *Session) special(cmd *commands.Command, req *resp.Request, m *metrics.Command) bool {
	args := req.Args
	if !cmd.ArityOK(len(args)) && cmd.Subcommands == nil {
		// Same words as Redis, so client libraries that match them work.
		sess.replyLocal(m, errArity(cmd.Name))
		return true
	}
	switch cmd.Name {
	case "echo":
		b, start := sess.localBuf()
		sess.finishLocal(m, redcon.AppendBulk(b, args[1]), start)
	case "info":
		return sess.info(args, req.Raw, m)
	case "quit":
		sess.replyLocal(m, ok)
		sess.quitting = true
	case "select":
		db, err := strconv.Atoi(string(args[1]))
		switch {
		case err != nil:
			sess.replyLocal(m, errNotInteger)
		case db < 0 || db >= sess.srv.cfg.Upstream.Databases:
			sess.replyLocal(m, errDBRange)
		default:
			// Commands already in the batch belong to the old DB.
			sess.flush(time.Now())
			sess.mu.Lock()
			sess.db = db
			sess.mu.Unlock()
			sess.replyLocal(m, ok)
		}
	case "auth":
		sess.auth(m, args[1:])
	case "hello":
		sess.hello(m, args)
	case "reset":
		sess.flush(time.Now())
		sess.mu.Lock()
		sess.db, sess.resp3, sess.name = 0, false, ""
		sess.mu.Unlock()
		sess.replyOff, sess.replySkip, sess.curMute = false, false, false
		sess.abort = txAbort{}
		sess.deauthenticate()
		sess.replyLocal(m, []byte("+RESET\r\n"))
	case "client|setname":
		name := args[2]
		if !validClientName(name) {
			sess.replyLocal(m, []byte("-ERR Client names cannot contain spaces, newlines or special characters.\r\n"))
		} else {
			sess.mu.Lock()
			sess.name = string(name)
			sess.mu.Unlock()
			sess.replyLocal(m, ok)
			if sess.pin.pipe != nil && !sess.pin.inMulti {
				sess.namePin(sess.name)
			}
		}
	case "client|getname":
		b, start := sess.localBuf()
		if sess.name == "" {
			b = sess.appendNull(b)
		} else {
			b = redcon.AppendBulkString(b, sess.name)
		}
		sess.finishLocal(m, b, start)
	case "client|id":
		b, start := sess.localBuf()
		sess.finishLocal(m, redcon.AppendInt(b, sess.id), start)
	case "client|info":
		b, start := sess.localBuf()
		sess.finishLocal(m, redcon.AppendBulkString(b, sess.infoLine()+"\n"), start)
	case "client|list":
		b, start := sess.localBuf()
		sess.finishLocal(m, redcon.AppendBulkString(b, sess.srv.clientList()), start)
	case "client|setinfo":
		switch strings.ToLower(string(args[2])) {
		case "lib-name":
			sess.mu.Lock()
			sess.libName = string(args[3])
			sess.mu.Unlock()
		case "lib-ver":
			sess.mu.Lock()
			sess.libVer = string(args[3])
			sess.mu.Unlock()
		default:
			sess.replyLocal(m, []byte("-ERR Unrecognized option '"+string(args[2])+"'\r\n"))
			return true
		}
		sess.replyLocal(m, ok)
	case "client|getredir":
		sess.replyLocal(m, []byte(":-1\r\n"))
	case "client|no-evict":
		// Client eviction protects Redis from its own clients' memory; the
		// proxy's shared connections are never evicted for one client's
		// sake, so the flag is accepted and has nothing to change.
		sess.replyLocal(m, ok)
	case "readonly", "readwrite", "asking":
		return false // answered by Redis; harmless on a standalone server
	case "multi", "watch":
		sess.pinFor(cmd, req, m)
	case "unwatch":
		sess.replyLocal(m, ok) // nothing is watched outside a pinned connection
	case "exec", "discard":
		return false // Redis answers "... without MULTI"; no state is touched
	case "subscribe", "psubscribe", "ssubscribe":
		return sess.startRelay(relayPubSub, sess.batchReqs[sess.curIndex:], m)
	case "unsubscribe", "punsubscribe", "sunsubscribe":
		sess.unsubscribeNone(m, cmd.Name, args[1:])
	case "monitor":
		return sess.startRelay(relayMonitor, sess.batchReqs[sess.curIndex:], m)
	case "client|tracking":
		if trackingRedirect(args) {
			sess.replyLocal(m, []byte("-"+errTrackingRedirect+"\r\n"))
			return true
		}
		if strings.EqualFold(string(args[2]), "on") {
			// The client keeps its own cache coherent with Redis's pushes:
			// give it a connection of its own and relay them.
			return sess.startRelay(relayTracking, sess.batchReqs[sess.curIndex:], m)
		}
		sess.replyLocal(m, ok)
	case "client|no-touch":
		if strings.EqualFold(string(args[2]), "on") {
			return sess.startRelay(relayTracking, sess.batchReqs[sess.curIndex:], m)
		}
		sess.replyLocal(m, ok)
	case "client|caching":
		sess.replyLocal(m, []byte("-ERR CLIENT CACHING can be called only when the client is in tracking mode with OPTIN or OPTOUT mode enabled\r\n"))
	case "client|trackinginfo":
		b, start := sess.localBuf()
		if sess.resp3 {
			b = append(b, "%3\r\n"...)
		} else {
			b = redcon.AppendArray(b, 6)
		}
		b = redcon.AppendBulkString(b, "flags")
		b = redcon.AppendArray(b, 1)
		b = redcon.AppendBulkString(b, "off")
		b = redcon.AppendBulkString(b, "redirect")
		b = redcon.AppendInt(b, -1)
		b = redcon.AppendBulkString(b, "prefixes")
		b = redcon.AppendArray(b, 0)
		sess.finishLocal(m, b, start)
	case "client|reply":
		switch strings.ToLower(string(args[2])) {
		case "on":
			sess.replyOff, sess.curMute = false, false
			sess.replyLocal(m, ok)
		case "off":
			sess.replyOff, sess.curMute = true, true
			sess.replyLocal(m, ok)
		case "skip":
			sess.replySkip, sess.curMute = true, true
			sess.replyLocal(m, ok)
		default:
			sess.replyLocal(m, []byte("-ERR syntax error\r\n"))
		}
	case "client|kill":
		sess.replyLocal(m, sess.srv.clientKill(sess, args[2:]))
	case "client|unblock":
		return sess.unblock(args, m)
	default:
		if cmd.Is(commands.PubSub) && !isSubscribe(cmd.Name) {
			return false // PUBLISH, PUBSUB ...: ordinary request/reply commands
		}
		if cmd.IsBlocking(args) {
			sess.blocking(cmd, req, m)
			return true
		}
		if runsAlone(cmd) {
			sess.runAlone(cmd, req, m)
			return true
		}
		if cmd.Flags&(commands.ConnState) == 0 {
			return false
		}
		sess.replyLocal(m, []byte("-ERR redproxy: '"+strings.ToUpper(strings.ReplaceAll(cmd.Name, "|", " "))+"' is not supported by this proxy yet\r\n"))
	}
	return true
}

func isSubscribe(name string) bool {
	switch name {
	case "subscribe", "psubscribe", "ssubscribe", "unsubscribe", "punsubscribe", "sunsubscribe":
		return true
	}
	return false
}

var (
	ok            = []byte("+OK\r\n")
	zero          = []byte(":0\r\n")
	errNotInteger = []byte("-ERR value is not an integer or out of range\r\n")
	errDBRange    = []byte("-ERR DB index is out of range\r\n")
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
		return errNoPassword
	}
	wantUser := up.Username
	if wantUser == "" {
		wantUser = "default"
	}
	if string(user) != wantUser || subtle.ConstantTimeCompare(pass, []byte(up.Password)) != 1 {
		return errWrongPass
	}
	sess.authed = true
	return nil
}

func (sess *Session) auth(m *metrics.Command, args [][]byte) {
	var e []byte
	switch len(args) {
	case 1:
		e = sess.authenticate([]byte("default"), args[0])
	case 2:
		e = sess.authenticate(args[0], args[1])
	default:
		e = []byte("-ERR syntax error\r\n")
	}
	if e != nil {
		sess.replyLocal(m, e)
		return
	}
	sess.replyLocal(m, ok)
}

// hello implements HELLO [protover [AUTH user pass] [SETNAME name]].
func (sess *Session) hello(m *metrics.Command, args [][]byte) {
	proto := 0
	if len(args) > 1 {
		v, err := strconv.Atoi(string(args[1]))
		if err != nil {
			sess.replyLocal(m, []byte("-ERR Protocol version is not an integer or out of range\r\n"))
			return
		}
		if v != 2 && v != 3 {
			sess.replyLocal(m, []byte("-NOPROTO unsupported protocol version\r\n"))
			return
		}
		proto = v
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
			sess.replyLocal(m, []byte("-ERR Syntax error in HELLO option '"+string(args[i])+"'\r\n"))
			return
		}
	}
	if !sess.authed {
		sess.replyLocal(m, []byte("-NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time\r\n"))
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
	active atomic.Int64  // when the last batch began, Unix nanoseconds
	multi  atomic.Int32  // commands queued in MULTI, plus one; 0: not in MULTI
	relay  atomic.Uint32 // relayKind plus one; 0: not a relay
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
	age := int64(now.Sub(sess.createdAt).Seconds())
	idle := age
	if a := sess.list.active.Load(); a != 0 {
		idle = int64(now.Sub(time.Unix(0, a)).Seconds())
	}
	proto := 2
	if sess.resp3 {
		proto = 3
	}
	last := "NULL"
	if c := sess.lastCmd.Load(); c != nil {
		last = c.Name
	}
	flags := ""
	switch sess.list.relay.Load() {
	case uint32(relayPubSub) + 1:
		flags += "P"
	case uint32(relayMonitor) + 1:
		flags += "O"
	case uint32(relayTracking) + 1:
		flags += "t"
	}
	multi := int(sess.list.multi.Load()) - 1
	if multi >= 0 {
		flags += "x"
	}
	if sess.block.id.Load() != 0 {
		flags += "b"
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
	sc, ok := nc.(syscall.Conn)
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

// clientList lists the proxy's own clients, not its upstream connections:
// those are shared and belong to no client.
func (s *Server) clientList() string {
	var b strings.Builder
	for _, sess := range s.sessionList() {
		b.WriteString(sess.infoLine())
		b.WriteByte('\n')
	}
	return b.String()
}

// unsubscribeNone answers an UNSUBSCRIBE family command from a client that
// is not subscribed, as Redis does: one confirmation per channel (or one
// with a null channel), each with a subscription count of 0.
func (sess *Session) unsubscribeNone(m *metrics.Command, name string, channels [][]byte) {
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
			if sess.nc.RemoteAddr().String() == addr {
				sess.kill()
				return ok
			}
		}
		return []byte("-ERR No such client\r\n")
	}
	if len(args)%2 != 0 {
		return []byte("-ERR syntax error\r\n")
	}
	var id int64 = -1
	var addr, laddr, user, typ string
	var maxAge int64 = -1
	skipMe := true
	for i := 0; i < len(args); i += 2 {
		v := string(args[i+1])
		switch strings.ToLower(string(args[i])) {
		case "id":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n <= 0 {
				return []byte("-ERR client-id should be greater than 0\r\n")
			}
			id = n
		case "addr":
			addr = v
		case "laddr":
			laddr = v
		case "user":
			user = v
		case "type":
			typ = strings.ToLower(v)
			if typ != "normal" && typ != "pubsub" && typ != "master" && typ != "replica" && typ != "slave" {
				return []byte("-ERR Unknown client type '" + v + "'\r\n")
			}
		case "skipme":
			switch strings.ToLower(v) {
			case "yes":
				skipMe = true
			case "no":
				skipMe = false
			default:
				return []byte("-ERR syntax error\r\n")
			}
		case "maxage":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return errNotInteger
			}
			maxAge = n
		default:
			return []byte("-ERR syntax error\r\n")
		}
	}
	killed := 0
	for _, sess := range s.sessionList() {
		switch {
		case skipMe && sess == self,
			id >= 0 && sess.id != id,
			addr != "" && sess.nc.RemoteAddr().String() != addr,
			laddr != "" && sess.nc.LocalAddr().String() != laddr,
			user != "" && user != sess.lockedUserName(),
			typ == "master" || typ == "replica" || typ == "slave",
			maxAge >= 0 && time.Since(sess.createdAt) < time.Duration(maxAge)*time.Second:
			continue
		}
		sess.kill()
		killed++
	}
	return redcon.AppendInt(nil, int64(killed))
}

// userName is the user every client of the proxy acts as upstream.
func (s *Server) userName() string {
	if s.cfg.Upstream.Username != "" {
		return s.cfg.Upstream.Username
	}
	return "default"
}

// sessionByID returns the client with the proxy id, or nil.
func (s *Server) sessionByID(id int64) *Session {
	s.mu.Lock()
	defer s.mu.Unlock()
	for sess := range s.sessions {
		if sess.id == id {
			return sess
		}
	}
	return nil
}

func (s *Server) sessionList() []*Session {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*Session, 0, len(s.sessions))
	for sess := range s.sessions {
		out = append(out, sess)
	}
	return out
}

// kill closes the client's connection; its goroutine notices and cleans up.
func (sess *Session) kill() {
	sess.interrupted.Store(true)
	sess.nc.Close()
}
