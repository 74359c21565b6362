package proxy

import (
	"bytes"
	"strconv"
	"strings"
	"time"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/resp"
	"github.com/tidwall/redcon"
)

// isProxyAnswered lists commands without connection-state flags that the
// proxy still answers itself because they need no Redis round trip.
func isProxyAnswered(cmd *commands.Command) bool {
	switch cmd.Name {
	case "ping", "echo":
		return true
	}
	return false
}

// special handles commands that change connection state, block, subscribe,
// or that the proxy answers itself. It reports false when the command
// should simply be forwarded.
func (sess *Session) special(cmd *commands.Command, req *resp.Request, m *metrics.Command) bool {
	args := req.Args
	if !cmd.ArityOK(len(args)) && cmd.Parent == nil && cmd.Subcommands == nil {
		// Same words as Redis, so client libraries that match them work.
		sess.replyLocal(m, errArity(cmd.Name))
		return true
	}
	switch cmd.Name {
	case "ping":
		if len(args) == 1 {
			sess.replyLocal(m, pong)
		} else {
			b, start := sess.localBuf()
			sess.finishLocal(m, redcon.AppendBulk(b, args[1]), start)
		}
	case "echo":
		b, start := sess.localBuf()
		sess.finishLocal(m, redcon.AppendBulk(b, args[1]), start)
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
		sess.authed = sess.srv.cfg.Upstream.Password == ""
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
	default:
		if cmd.Is(commands.PubSub) && !isSubscribe(cmd.Name) {
			return false // PUBLISH, PUBSUB ...: ordinary request/reply commands
		}
		if cmd.Flags&(commands.ConnState) == 0 && !cmd.IsBlocking(args) {
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
	pong          = []byte("+PONG\r\n")
	errNotInteger = []byte("-ERR value is not an integer or out of range\r\n")
	errDBRange    = []byte("-ERR DB index is out of range\r\n")
	errWrongPass  = []byte("-WRONGPASS invalid username-password pair or user is disabled.\r\n")
	errNoPassword = []byte("-ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?\r\n")
)

func errArity(name string) []byte {
	return []byte("-ERR wrong number of arguments for '" + strings.ReplaceAll(name, "|", " ") + "' command\r\n")
}

// appendNull appends the null of the session's protocol.
func (sess *Session) appendNull(b []byte) []byte {
	if sess.resp3 {
		return append(b, "_\r\n"...)
	}
	return redcon.AppendNull(b)
}

// checkAuth compares credentials with the upstream's: clients of the proxy
// authenticate exactly as they would with Redis, and the proxy never opens a
// password-protected Redis to clients without the password.
func (sess *Session) checkAuth(user, pass []byte) []byte {
	up := sess.srv.cfg.Upstream
	if up.Password == "" {
		return errNoPassword
	}
	wantUser := up.Username
	if wantUser == "" {
		wantUser = "default"
	}
	if string(user) != wantUser || string(pass) != up.Password {
		return errWrongPass
	}
	sess.authed = true
	return nil
}

func (sess *Session) auth(m *metrics.Command, args [][]byte) {
	var e []byte
	switch len(args) {
	case 1:
		e = sess.checkAuth([]byte("default"), args[0])
	case 2:
		e = sess.checkAuth(args[0], args[1])
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
			if e := sess.checkAuth(args[i+1], args[i+2]); e != nil {
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

// infoLine renders the session like a line of Redis's CLIENT LIST.
func (sess *Session) infoLine() string {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	var b bytes.Buffer
	age := int(time.Since(sess.createdAt).Seconds())
	proto := 2
	if sess.resp3 {
		proto = 3
	}
	last := ""
	if c := sess.lastCmd.Load(); c != nil {
		last = c.Name
	}
	b.WriteString("id=" + strconv.FormatInt(sess.id, 10))
	b.WriteString(" addr=" + sess.nc.RemoteAddr().String())
	b.WriteString(" laddr=" + sess.nc.LocalAddr().String())
	b.WriteString(" name=" + sess.name)
	b.WriteString(" age=" + strconv.Itoa(age))
	b.WriteString(" db=" + strconv.Itoa(sess.db))
	b.WriteString(" flags=N")
	b.WriteString(" cmd=" + last)
	b.WriteString(" resp=" + strconv.Itoa(proto))
	b.WriteString(" lib-name=" + sess.libName)
	b.WriteString(" lib-ver=" + sess.libVer)
	return b.String()
}

// clientList lists the proxy's own clients, not its upstream connections:
// those are shared and belong to no client.
func (s *Server) clientList() string {
	s.mu.Lock()
	sessions := make([]*Session, 0, len(s.sessions))
	for sess := range s.sessions {
		sessions = append(sessions, sess)
	}
	s.mu.Unlock()
	var b strings.Builder
	for _, sess := range sessions {
		b.WriteString(sess.infoLine())
		b.WriteByte('\n')
	}
	return b.String()
}
