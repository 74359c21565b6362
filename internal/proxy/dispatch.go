package proxy

import (
	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/resp"
)

// request is one command of the batch being answered, classified once (by
// classify) and handed to every step that needs to know what it is, so no
// step looks the command up again.
type request struct {
	*resp.Request                   // the client's bytes: Raw and Args
	i             int               // index in the batch, for the guard's decisions and relays
	cmd           *commands.Command // nil: not in the command table
	name          string            // cmd.Name; "" when cmd is nil
	m             *metrics.Command
	// blocking: the command blocks when run outside MULTI (BLPOP, WAIT,
	// XREAD with BLOCK), so it must not share a pipelined connection.
	blocking bool
	// toPrimary: no replica may answer it (read_from), as the local tier
	// decided (tierStep).
	toPrimary bool
	// entry is how the proxy handles the command itself; nil for the
	// commands it just forwards (GET, SET, ...), which is most of them.
	entry *cmdEntry
}

// wrongArity reports whether Redis would refuse r for its number of
// arguments, before anything else (slots, routes, transactions): a known
// command, not a container, with an arity it does not meet.
func (r *request) wrongArity() bool {
	return r.cmd != nil && !r.cmd.ArityOK(len(r.Args)) && r.cmd.Subcommands == nil
}

// classify looks up the session's command i and fills sess.cur with what
// the rest of dispatch needs to know about it.
func (sess *Session) classify(i int, req *resp.Request) *request {
	// The guard looked the batch's commands up in the same table
	// (prepareBatch), after any namespace rewrite.
	cmd, ok := sess.guard.Command(i)
	if !ok {
		cmd = sess.cmds.table.Lookup(req.Args)
	}
	// A pipeline mostly repeats one command: its metric and handler entry
	// are those of the one before (both fixed per *Command, and a table
	// read later has Commands of its own: cmdtable.go), which saves a
	// lookup by name and one by pointer.
	c := &sess.lastClass
	if cmd != c.cmd || c.m == nil {
		*c = classMemo{cmd: cmd, m: sess.metricFor(cmd)}
		if cmd != nil {
			c.entry = sess.cmds.handlers[cmd]
		}
	}
	r := &sess.cur
	*r = request{Request: req, i: i, cmd: cmd, m: c.m}
	if cmd != nil {
		r.name = cmd.Name
		r.blocking = cmd.IsBlocking(req.Args)
		r.entry = c.entry
		if r.entry == nil && r.blocking {
			r.entry = &blockingEntry
		}
	}
	return r
}

// classMemo is what classify found for the last command it saw.
type classMemo struct {
	cmd   *commands.Command
	m     *metrics.Command
	entry *cmdEntry
}

// cmdHandler handles one command the proxy takes care of itself, with the
// command's reply slot recorded (replyLocal, forward, ...). It reports
// false when the command is to go on through the data path after all,
// like any other (to the guard, then upstream).
type cmdHandler func(sess *Session, r *request) bool

// cmdEntry is what the session does with one command before the guard, the
// local tier and coalescing see it. Built once per Server (newHandlers).
type cmdEntry struct {
	// answer handles the command outside a transaction, after its arity
	// was checked. nil: nothing to do (the command is forwarded).
	answer cmdHandler
	// watched: answer also applies while the client holds a WATCH (on a
	// pinned connection, before MULTI). Blocking commands, relays and
	// HELLO are dealt with before (dispatchWatched); the rest of the
	// commands the proxy handles only outside a transaction (SHUTDOWN, a
	// non-blocking XREAD) go to the pinned connection as they are.
	watched bool
	// pinned has the first say while the client holds a pinned connection
	// (MULTI or WATCH); nil: the ordinary pinned handling (dispatchPinned).
	pinned cmdHandler
}

// proxyCommands are the commands the proxy answers itself, or sends
// somewhere other than the shared connections, by name (subcommands as
// "container|sub", like Redis 7). To take over another command, add its
// handler here. Commands with connection-state flags that are not listed
// are refused as unsupported (cmdUnsupported): forwarded, they would
// change a connection other clients share.
var proxyCommands = map[string]cmdHandler{
	"echo":   cmdEcho,
	"info":   cmdInfo,
	"quit":   cmdQuit,
	"select": cmdSelect,
	"auth":   cmdAuth,
	"hello":  cmdHello,
	"reset":  cmdReset,

	"client|setname":      cmdClientSetname,
	"client|getname":      cmdClientGetname,
	"client|id":           cmdClientID,
	"client|info":         cmdClientInfo,
	"client|list":         cmdClientList,
	"client|setinfo":      cmdClientSetinfo,
	"client|getredir":     cmdClientGetredir,
	"client|no-evict":     cmdClientNoEvict,
	"client|tracking":     cmdClientTracking,
	"client|no-touch":     cmdClientNoTouch,
	"client|caching":      cmdClientCaching,
	"client|trackinginfo": cmdClientTrackinginfo,
	"client|reply":        cmdClientReply,
	"client|kill":         cmdClientKill,
	"client|unblock":      cmdClientUnblock,

	"script|debug": cmdScriptDebug,

	// Answered by Redis; harmless on a standalone server.
	"readonly":  cmdForward,
	"readwrite": cmdForward,
	"asking":    cmdForward,

	"multi":   cmdPin,
	"watch":   cmdPin,
	"unwatch": cmdOK, // nothing is watched outside a pinned connection
	// Redis answers "... without MULTI"; no state is touched.
	"exec":    cmdForward,
	"discard": cmdForward,

	"subscribe":    cmdSubscribe,
	"psubscribe":   cmdSubscribe,
	"ssubscribe":   cmdSubscribe,
	"unsubscribe":  cmdUnsubscribe,
	"punsubscribe": cmdUnsubscribe,
	"sunsubscribe": cmdUnsubscribe,
	"monitor":      cmdMonitor,

	// A replica's handshake: Redis would turn the connection into a
	// replication stream, which on a shared connection reaches no one it
	// is for and cannot be framed as replies.
	"sync":     cmdReplication,
	"psync":    cmdReplication,
	"replconf": cmdReplication,
}

// pinnedCommands have a handling of their own while the client holds a
// pinned connection (stateful.go); their handler reports false to fall
// back to the ordinary pinned handling.
var pinnedCommands = map[string]cmdHandler{
	"exec":    pinnedExec,
	"discard": pinnedDiscard,
	"multi":   pinnedMulti,
	"unwatch": pinnedUnwatch,
	"quit":    cmdQuit,
	"reset":   pinnedReset,
	"select":  pinnedSelect,

	"client|setname": pinnedClientSetname,
}

// blockingEntry handles a command the table does not flag, which blocks
// with the arguments it was given.
var blockingEntry = cmdEntry{answer: cmdOther}

// newHandlers resolves the handler tables for the commands of table.
func newHandlers(table *commands.Table) map[*commands.Command]*cmdEntry {
	h := map[*commands.Command]*cmdEntry{}
	var add func(cmd *commands.Command)
	add = func(cmd *commands.Command) {
		if e := newEntry(cmd); e != nil {
			h[cmd] = e
		}
		for _, sub := range cmd.Subcommands {
			add(sub)
		}
	}
	for _, cmd := range table.Commands() {
		add(cmd)
	}
	return h
}

// newEntry decides how the proxy handles cmd; nil when it only forwards it.
func newEntry(cmd *commands.Command) *cmdEntry {
	e := cmdEntry{pinned: pinnedCommands[cmd.Name]}
	answer, named := proxyCommands[cmd.Name]
	switch {
	case named:
		e.answer = answer
	case cmd.Is(commands.PubSub):
		e.answer = cmdForward // PUBLISH, PUBSUB ...: ordinary request/reply commands
	case cmd.Flags&(commands.ConnState|commands.Blocking|commands.AllowBusy) != 0 || cmd.Parent != nil:
		e.answer = cmdOther
	}
	e.watched = cmd.Name != "watch" && (cmd.Name == "echo" || cmd.Name == "info" || cmd.Parent != nil || cmd.Flags&(commands.ConnState|commands.PubSub) != 0)
	if e.answer == nil && e.pinned == nil {
		return nil
	}
	return &e
}

// answer runs the proxy's own handling of r outside a transaction.
func (sess *Session) answer(r *request) bool {
	if r.wrongArity() {
		// Same words as Redis, so client libraries that match them work.
		if r.name == "exec" {
			// Redis answers an EXEC it refuses as an aborted transaction,
			// even without MULTI.
			sess.replyLocal(r.m, errExecArity)
			return true
		}
		sess.replyLocal(r.m, errArity(r.name))
		return true
	}
	return r.entry.answer(sess, r)
}
