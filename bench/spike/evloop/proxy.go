package main

// The event-loop pass-through proxy of issue 10's design spike 2.
//
// One gnet engine runs one event loop per core. Each loop owns its client
// connections and its own pipes: upstream connections to Redis that the
// loop dialed and adopted with EventLoop.Register, so their readiness is
// reported to the same epoll instance and handled by the same goroutine as
// the clients'. A request is read, framed and appended to its pipe's output
// on the loop, and its reply is framed and written to the client on the
// loop: nothing changes thread and nothing waits on a channel, as in
// twemproxy. No connection owns a buffer while idle: gnet reads into one
// buffer per loop and keeps bytes for a connection only when a request or
// reply is incomplete or a socket would block.
//
// Order: a client is bound to one pipe for its life; its requests are
// appended to that pipe in the order they arrive, and the pipe keeps a FIFO
// of (client, count) runs, so the n-th reply read from Redis belongs to the
// n-th request written. Replies are never copied: a run of consecutive
// replies for one client is written to it straight from the pipe's read
// buffer.
//
// This is a spike: pass-through only, no policy, no tier, no stateful
// commands (refused with an error, in order), no TLS, no auth.

import (
	"context"
	"log/slog"
	"net"
	"sync"

	"github.com/panjf2000/gnet/v2"
)

// maxClientOutput caps the replies a client that does not read can make
// the proxy hold (redis-server's client-output-buffer-limit for normal
// clients is unlimited; the project's rule is to cap every buffer).
const maxClientOutput = 64 << 20

// maxQueryBuffer caps the unanswered request bytes a client can make the
// proxy hold (an incomplete request, or requests sent while it is stalled),
// as redis-server's client-query-buffer-limit (1 GB by default) does. A
// variable so a test can lower it.
var maxQueryBuffer = 1 << 30

var errQueryBufferLimit = []byte("-ERR client query buffer limit reached\r\n")

// flushMode says when a loop writes the requests it framed to its pipes.
type flushMode int

const (
	// flushLoop writes once per loop iteration: requests read from every
	// client readable in one epoll_wait go out in one write per pipe, as
	// twemproxy batches them. It costs one eventfd write per iteration.
	flushLoop flushMode = iota
	// flushImmediate writes at the end of each client's read.
	flushImmediate
)

type proxy struct {
	gnet.BuiltinEventEngine
	upstream  net.Addr
	pipesPer  int // pipes per loop
	flush     flushMode
	log       *slog.Logger
	mu        sync.Mutex // guards loops; taken once per accepted connection
	loops     map[gnet.EventLoop]*loop
	onBooted  func(gnet.Engine)
	refuseMsg map[string][]byte
}

// loop is the proxy's state for one gnet event loop; only that loop's
// goroutine touches it.
type loop struct {
	p           *proxy
	el          gnet.EventLoop
	pipes       []*pipe
	nextPipe    int
	flushQueued bool
	flushTask   gnet.RunnableFunc
}

// pipe is one upstream connection of a loop.
type pipe struct {
	lp      *loop
	conn    gnet.Conn // nil while dialing or after the connection was lost
	dialing bool
	out     []byte  // framed requests not yet handed to conn
	fifo    []batch // clients waiting for replies, oldest at head
	head    int
	need    int // bytes the next reply needs before it can be complete
}

// batch is count consecutive requests of one client on a pipe.
type batch struct {
	c     *client
	count int
}

type client struct {
	conn     gnet.Conn
	pipe     *pipe
	inflight int  // requests sent whose replies are not yet written
	stalled  bool // stopped at a request answered locally; resumes at inflight 0
	closed   bool
	need     int
}

func newProxy(upstream net.Addr, pipesPer int, flush flushMode, log *slog.Logger) *proxy {
	p := &proxy{
		upstream:  upstream,
		pipesPer:  pipesPer,
		flush:     flush,
		log:       log,
		loops:     make(map[gnet.EventLoop]*loop),
		refuseMsg: make(map[string][]byte),
	}
	// Everything that changes the state of a connection, or does not answer
	// one request with one reply, cannot share a pipe; the real proxy hands
	// such sessions to a pinned connection on a goroutine (see
	// bench/README.md, "Spike 2"). XREAD is refused whole, BLOCK or not.
	for _, name := range []string{
		"multi", "exec", "discard", "watch", "unwatch",
		"blpop", "brpop", "brpoplpush", "blmove", "blmpop", "bzpopmin", "bzpopmax", "bzmpop",
		"xread", "xreadgroup", "wait", "waitaof",
		"subscribe", "psubscribe", "ssubscribe", "unsubscribe", "punsubscribe", "sunsubscribe",
		"monitor", "sync", "psync", "select", "hello", "auth", "reset", "client",
		"readonly", "readwrite",
	} {
		p.refuseMsg[name] = []byte("-ERR '" + name + "' is not supported by the event-loop spike\r\n")
	}
	return p
}

func (p *proxy) OnBoot(eng gnet.Engine) gnet.Action {
	if p.onBooted != nil {
		p.onBooted(eng)
	}
	return gnet.None
}

// loopOf returns the state of the loop el, creating it on the loop's first
// connection; pipes are dialed when the first request needs them.
func (p *proxy) loopOf(el gnet.EventLoop) *loop {
	p.mu.Lock()
	defer p.mu.Unlock()
	lp := p.loops[el]
	if lp == nil {
		lp = &loop{p: p, el: el}
		for i := 0; i < p.pipesPer; i++ {
			lp.pipes = append(lp.pipes, &pipe{lp: lp})
		}
		lp.flushTask = func(context.Context) error { lp.flushPipes(); return nil }
		p.loops[el] = lp
	}
	return lp
}

func (p *proxy) OnOpen(c gnet.Conn) ([]byte, gnet.Action) {
	if pp, ok := c.Context().(*pipe); ok {
		pp.opened(c)
		return nil, gnet.None
	}
	lp := p.loopOf(c.EventLoop())
	cl := &client{conn: c, pipe: lp.pipes[lp.nextPipe]}
	lp.nextPipe = (lp.nextPipe + 1) % len(lp.pipes)
	c.SetContext(cl)
	return nil, gnet.None
}

func (p *proxy) OnClose(c gnet.Conn, err error) gnet.Action {
	switch x := c.Context().(type) {
	case *client:
		x.closed = true
	case *pipe:
		x.lost(err)
	}
	return gnet.None
}

func (p *proxy) OnTraffic(c gnet.Conn) gnet.Action {
	switch x := c.Context().(type) {
	case *client:
		return x.traffic()
	case *pipe:
		return x.traffic(c)
	}
	return gnet.Close
}

// traffic frames the client's complete requests and appends them to its
// pipe. A request the spike answers itself (refused, QUIT, protocol error)
// must come after the replies of the requests before it: the client stalls
// there, with the bytes left in gnet's buffer, until those replies are
// written, and is woken to go on.
func (cl *client) traffic() gnet.Action {
	c := cl.conn
	if c.InboundBuffered() > maxQueryBuffer {
		cl.pipe.lp.p.log.Warn("client query buffer limit reached: closing it", "addr", c.RemoteAddr())
		if cl.inflight == 0 {
			_, _ = c.Write(errQueryBufferLimit)
		}
		return gnet.Close
	}
	if cl.stalled || c.InboundBuffered() < cl.need {
		return gnet.None
	}
	buf, _ := c.Peek(-1)
	pp := cl.pipe
	off, start, count := 0, 0, 0
	cl.need = 0
	action := gnet.None
frames:
	for off < len(buf) {
		n, name, _, need, err := frameRequest(buf[off:])
		if n == 0 && err == nil {
			// need counts from off, which is where the buffer will
			// start once the bytes before it are discarded below.
			cl.need = need
			break
		}
		var local []byte
		closeAfter := false
		switch {
		case err != nil:
			local, closeAfter = []byte("-"+err.Error()+"\r\n"), true
		case len(name) == 0:
			// Ignored by Redis without a reply: drop it, keeping the run.
			pp.out = append(pp.out, buf[start:off]...)
			pp.push(cl, count)
			off += n
			start, count = off, 0
			continue
		default:
			local, closeAfter = cl.pipe.lp.p.localReply(name)
		}
		if local == nil {
			off += n
			count++
			continue
		}
		// Answered here: send what came before it, then answer it once
		// nothing is in flight.
		pp.out = append(pp.out, buf[start:off]...)
		pp.push(cl, count)
		start, count = off, 0
		if cl.inflight > 0 {
			cl.stalled = true
			break frames
		}
		_, _ = c.Write(local)
		if closeAfter {
			action = gnet.Close
			break frames
		}
		off += n
		start = off
	}
	pp.out = append(pp.out, buf[start:off]...)
	pp.push(cl, count)
	discard(c, off)
	pp.send()
	return action
}

// localReply is what the spike answers itself for a command: nil to
// forward it.
func (p *proxy) localReply(name []byte) (reply []byte, closeAfter bool) {
	if len(name) > 16 {
		return nil, false
	}
	var lower [16]byte
	for i, c := range name {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		lower[i] = c
	}
	key := lower[:len(name)]
	if string(key) == "quit" {
		return []byte("+OK\r\n"), true
	}
	return p.refuseMsg[string(key)], false
}

// push records count requests of cl, just appended to out, in the FIFO.
func (pp *pipe) push(cl *client, count int) {
	if count == 0 {
		return
	}
	cl.inflight += count
	if n := len(pp.fifo); n > pp.head && pp.fifo[n-1].c == cl {
		pp.fifo[n-1].count += count
		return
	}
	if pp.head > 0 && pp.head == len(pp.fifo) {
		pp.fifo, pp.head = pp.fifo[:0], 0
	}
	pp.fifo = append(pp.fifo, batch{c: cl, count: count})
}

// send hands out to the connection now or at the end of the loop's
// iteration, dialing it first when there is none.
func (pp *pipe) send() {
	if len(pp.out) == 0 {
		return
	}
	if pp.conn == nil {
		pp.dial()
		return
	}
	if pp.lp.p.flush == flushImmediate {
		pp.write()
		return
	}
	lp := pp.lp
	if !lp.flushQueued {
		lp.flushQueued = true
		if err := lp.el.Execute(context.Background(), lp.flushTask); err != nil {
			lp.flushQueued = false
			pp.write()
		}
	}
}

func (lp *loop) flushPipes() {
	lp.flushQueued = false
	for _, pp := range lp.pipes {
		if pp.conn != nil && len(pp.out) > 0 {
			pp.write()
		}
	}
}

// write gives out to gnet, which writes it at once or keeps a copy until
// the socket drains; either way out can be reused.
func (pp *pipe) write() {
	out := pp.out
	pp.out = pp.out[:0]
	if cap(pp.out) > 1<<20 {
		pp.out = nil // do not keep a burst's buffer while idle
	}
	_, _ = pp.conn.Write(out)
}

func (pp *pipe) dial() {
	if pp.dialing {
		return
	}
	pp.dialing = true
	lp := pp.lp
	ctx := gnet.NewContext(context.Background(), pp)
	results, err := lp.el.Register(ctx, lp.p.upstream)
	if err != nil {
		pp.dialFailed(err)
		return
	}
	go func() {
		res := <-results
		if res.Err == nil {
			return // OnOpen runs on the loop with pp as the context
		}
		_ = lp.el.Execute(context.Background(), gnet.RunnableFunc(func(context.Context) error {
			pp.dialFailed(res.Err)
			return nil
		}))
	}()
}

func (pp *pipe) opened(c gnet.Conn) {
	pp.conn, pp.dialing = c, false
	pp.lp.p.log.Info("upstream connected", "addr", c.RemoteAddr())
	pp.write()
}

// dialFailed answers every waiting request with an error: none of them
// reached Redis, so the replies keep their order.
func (pp *pipe) dialFailed(err error) {
	pp.dialing = false
	pp.lp.p.log.Warn("upstream dial failed", "err", err)
	msg := []byte("-ERR upstream unavailable\r\n")
	fifo := pp.fifo[pp.head:]
	pp.fifo, pp.head, pp.out = nil, 0, nil
	for _, r := range fifo {
		r.c.inflight -= r.count
		if r.c.closed {
			continue
		}
		for i := 0; i < r.count; i++ {
			_, _ = r.c.conn.Write(msg)
		}
		r.c.wakeIfStalled()
	}
}

// lost closes every client with a request on the connection: whether Redis
// executed them is unknown, and no later reply may be taken for theirs.
func (pp *pipe) lost(err error) {
	pp.lp.p.log.Warn("upstream connection lost", "err", err)
	fifo := pp.fifo[pp.head:]
	pp.conn, pp.fifo, pp.head, pp.out, pp.need = nil, nil, 0, nil, 0
	for _, r := range fifo {
		if !r.c.closed {
			r.c.closed = true
			_ = r.c.conn.Close()
		}
	}
}

// traffic matches the replies read from Redis to the FIFO and writes each
// client's consecutive replies with one write, straight from gnet's buffer.
func (pp *pipe) traffic(c gnet.Conn) gnet.Action {
	if c.InboundBuffered() < pp.need {
		return gnet.None
	}
	buf, _ := c.Peek(-1)
	off, start := 0, 0
	var owner *client
	pp.need = 0
	for off < len(buf) {
		n, need, err := frameReply(buf[off:])
		if err != nil || (n > 0 && pp.head == len(pp.fifo)) {
			pp.lp.p.log.Error("upstream protocol error: closing the pipe", "err", err)
			owner.deliver(buf[start:off])
			discard(c, off)
			return gnet.Close
		}
		if n == 0 {
			pp.need = need
			break
		}
		r := &pp.fifo[pp.head]
		if r.c != owner {
			owner.deliver(buf[start:off])
			owner, start = r.c, off
		}
		off += n
		r.c.inflight--
		if r.count--; r.count == 0 {
			pp.fifo[pp.head] = batch{}
			pp.head++
		}
	}
	owner.deliver(buf[start:off])
	discard(c, off)
	if pp.head == len(pp.fifo) {
		pp.fifo, pp.head = pp.fifo[:0], 0
		if cap(pp.fifo) > 4096 {
			pp.fifo = nil
		}
	}
	return gnet.None
}

func (cl *client) deliver(replies []byte) {
	if cl == nil || len(replies) == 0 || cl.closed {
		return
	}
	_, _ = cl.conn.Write(replies)
	if cl.conn.OutboundBuffered() > maxClientOutput {
		cl.pipe.lp.p.log.Warn("client output limit reached: closing it", "addr", cl.conn.RemoteAddr())
		cl.closed = true
		_ = cl.conn.Close()
		return
	}
	cl.wakeIfStalled()
}

func (cl *client) wakeIfStalled() {
	if cl.stalled && cl.inflight == 0 && !cl.closed {
		cl.stalled = false
		_ = cl.conn.Wake(nil)
	}
}

// discard drops the first n buffered bytes of c. gnet's Discard treats 0
// as "everything", which would drop an incomplete request or reply.
func discard(c gnet.Conn, n int) {
	if n > 0 {
		_, _ = c.Discard(n)
	}
}
