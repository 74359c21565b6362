package localcache

import (
	"bytes"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redproxy/redproxy/internal/resp"
	"github.com/redproxy/redproxy/internal/upstream"
)

// ConnName is the CLIENT SETNAME of fill connections, so operators (and
// tests, with CLIENT KILL) can tell them apart.
const ConnName = "redproxy-tier"

// fillConn is one database's tracking connection: every fill of that
// database is read on it, and Redis sends it the invalidations for what it
// read, in order with its replies.
type fillConn struct {
	c    *Cache
	db   int
	pipe *upstream.Pipe
	// up is the upstream it reads from.
	up *upstreamTier
	// node is the cluster node the connection tracks, "" when up is not
	// a cluster (see cluster.go).
	node string

	// epoch changes whenever the connection goes down or comes up; an entry
	// or a fill from another epoch is never used. Epochs come from one
	// counter per Cache, so no two fill connections ever share one.
	epoch atomic.Uint64
	// ackSent is the send time of the latest heartbeat whose reply has
	// arrived on the current connection, 0 if none yet. mu orders its
	// updates with epoch changes; readers only Load.
	ackSent atomic.Int64
	mu      sync.Mutex

	kick chan struct{}
	// retired is set when an upstream switch replaces the connection
	// (Cache.SwitchUpstream): nothing it reads may be kept from then on,
	// and its pushes and reconnections concern a server no longer in use.
	// quit is closed at the same time, to stop its heartbeat.
	retired atomic.Bool
	quit    chan struct{}
	// demoted is set while a cluster node answers its heartbeat as a
	// replica (primaryNow).
	demoted atomic.Bool
	// roleRefused is set once the node answered ROLE with an error.
	roleRefused atomic.Bool

	touchMu sync.Mutex
	touches []string // keys served from the tier, to TOUCH (touch.go)
}

// conn returns db's fill connection, starting it on first use. It returns
// nil for a database out of range.
func (c *Cache) conn(db int) *fillConn {
	if db < 0 || db >= len(c.conns) {
		return nil
	}
	if fc := c.conns[db].Load(); fc != nil {
		return fc
	}
	c.connMu.Lock()
	defer c.connMu.Unlock()
	if fc := c.conns[db].Load(); fc != nil || c.closed.Load() || c.switching {
		return fc
	}
	fc := c.newFillConn(c.ups[0], "", db)
	c.conns[db].Store(fc)
	return fc
}

// newFillConn dials a fill connection for database db of upstream up, or
// for node of up when up is a cluster, and starts its heartbeat. connMu is
// held.
func (c *Cache) newFillConn(up *upstreamTier, node string, db int) *fillConn {
	fc := &fillConn{c: c, db: db, up: up, node: node, kick: make(chan struct{}, 1), quit: make(chan struct{})}
	fc.epoch.Store(c.epochs.Add(1))
	var opt upstream.Options
	switch {
	case up.cluster != nil:
		opt = up.cluster.Node(node)
	case c.opt.Routes != nil:
		opt = c.opt.Routes.Options(up.idx, db)
	default:
		opt = c.opt.Upstream(db)
	}
	opt.DB = db
	opt.RESP3 = true
	opt.Name = ConnName
	// OPTIN: only reads preceded by CLIENT CACHING YES are tracked, so the
	// heartbeats and PTTLs add nothing to Redis's tracking table. No
	// NOLOOP, which silently skips invalidations, and no REDIRECT: with
	// invalidations on another connection there is no order between a
	// fill's reply and the invalidation of what it read.
	opt.Handshake = [][]string{{"CLIENT", "TRACKING", "ON", "OPTIN"}}
	opt.OnPush = fc.onPush
	opt.OnUp = fc.onUp
	opt.OnDown = fc.onDown
	if opt.Logger == nil {
		opt.Logger = c.log
	}
	fc.pipe = upstream.NewPipe(opt)
	c.workers.Add(1)
	go fc.heartbeat()
	return fc
}

// live reports whether hits from this connection may be served: it has
// answered a heartbeat sent within the last S, and after the latest fence.
func (fc *fillConn) live(now, fenceAt int64) bool {
	a := fc.ackSent.Load()
	return a != 0 && a >= fenceAt && now-a <= int64(fc.c.cfg.Staleness.Duration)
}

func (fc *fillConn) wake() {
	select {
	case fc.kick <- struct{}{}:
	default:
	}
}

// newEpoch starts a new epoch with no heartbeat answered yet.
func (fc *fillConn) newEpoch() {
	fc.mu.Lock()
	fc.epoch.Store(fc.c.epochs.Add(1))
	fc.ackSent.Store(0)
	fc.mu.Unlock()
}

// retire takes the connection out of service for good: it is no longer
// live, its fills in flight are discarded (store checks retired under the
// shard lock), and its heartbeat stops. The caller closes the pipe.
func (fc *fillConn) retire() {
	fc.mu.Lock()
	fc.retired.Store(true)
	fc.epoch.Store(fc.c.epochs.Add(1))
	fc.ackSent.Store(0)
	fc.mu.Unlock()
	close(fc.quit)
}

// onDown runs when the connection is lost, before its Calls fail: from now
// on nothing filled on it is served, and it is all dropped (C4). A retired
// connection's loss changes nothing: the switch already dropped everything
// it filled, and what the tier holds now came from its successor.
func (fc *fillConn) onDown(err error) {
	if fc.retired.Load() {
		return
	}
	// Values are kept for stale_if_error only if no fence is unanswered:
	// a script acknowledged before the loss may have changed keys whose
	// invalidations had not come yet.
	fenceClear := fc.ackSent.Load() >= fc.c.fenceAt.Load()
	fc.newEpoch()
	fc.c.flushOwn(fc.db, FlushDisconnect, fc.up, fenceClear)
	if fc.c.closed.Load() {
		return
	}
	fc.c.log.Warn("local tier: tracking connection lost; its entries were dropped", "db", fc.db, "upstream", fc.up.name, "node", fc.node, "err", err)
}

// onUp runs when a connection is established. Nothing from before can be
// trusted, so it starts a new epoch and flushes again; a heartbeat at once
// makes the tier live again within one round trip.
func (fc *fillConn) onUp() {
	if fc.retired.Load() {
		return
	}
	fc.newEpoch()
	fc.c.flushOwn(fc.db, FlushReconnect, fc.up, false)
	fc.wake()
}

// heartbeat sends a PING every S/4, and at once when woken by a fence or a
// reconnection, waiting for each reply before sending the next, so fence
// requests arriving meanwhile share the next PING. A PING's reply arrives
// after every invalidation Redis sent before executing it, so once it is in,
// everything written before it was sent has been invalidated here.
func (fc *fillConn) heartbeat() {
	defer fc.c.workers.Done()
	t := time.NewTicker(max(fc.c.cfg.Staleness.Duration/4, time.Millisecond))
	defer t.Stop()
	call := upstream.NewCall()
	touchCall, touched := upstream.NewCall(), []string(nil)
	probe := resp.Ping
	if fc.clusterNode() {
		// A cluster node is asked its role instead: its reply is as much a
		// barrier as PING's, and says whether the node still is a primary
		// (see primaryNow).
		probe = cmdRole
	}
	for {
		select {
		case <-fc.c.stop:
			return
		case <-fc.quit:
			return
		case <-t.C:
		case <-fc.kick:
		}
		call.Reset()
		call.Add(probe)
		epoch := fc.epoch.Load()
		sent := nanotime()
		if err := fc.pipe.Send(call); err != nil {
			continue
		}
		call.Wait()
		if call.Err() != nil {
			continue
		}
		if fc.clusterNode() && !fc.primaryNow(call) {
			continue
		}
		if h := hooks.Load(); h != nil && h.DropHeartbeats {
			continue
		}
		fc.mu.Lock()
		if fc.epoch.Load() == epoch && sent > fc.ackSent.Load() {
			fc.ackSent.Store(sent)
		}
		fc.mu.Unlock()
		touched = fc.sendTouches(touchCall, touched)
	}
}

// onPush handles a RESP3 push on the reader goroutine, in order with the
// replies. Invalidation pushes are ">2 $10 invalidate" followed by an array
// of keys, or by a null when Redis flushed (FLUSHALL/FLUSHDB): Redis then
// invalidates everything, in every database.
func (fc *fillConn) onPush(frame []byte) {
	if h := hooks.Load(); h != nil {
		if h.BeforePush != nil {
			h.BeforePush()
		}
		if h.IgnorePushes {
			return
		}
	}
	// A retired connection's invalidations are about the old server's
	// keys; the switch dropped everything read there.
	if fc.retired.Load() {
		return
	}
	kind, rest, ok := pushKind(frame)
	if !ok {
		return
	}
	switch kind {
	case "invalidate":
		if len(rest) > 0 && (rest[0] == '_' || bytes.HasPrefix(rest, []byte("*-1"))) {
			fc.c.flush(fc.db, FlushRedis, fc.up)
			return
		}
		eachBulk(rest, func(key []byte) { fc.c.invalidate(fc.db, key, fc.up) })
	case "tracking-redir-broken":
		fc.c.flush(fc.db, FlushRedirBroke, fc.up)
	}
}

// pushKind parses ">N\r\n$len\r\nkind\r\n" and returns kind and the bytes
// after it.
func pushKind(frame []byte) (string, []byte, bool) {
	nl := bytes.IndexByte(frame, '\n')
	if nl < 0 || len(frame) < nl+2 || frame[nl+1] != '$' {
		return "", nil, false
	}
	rest := frame[nl+1:]
	s, next, ok := bulk(rest)
	if !ok {
		return "", nil, false
	}
	return string(s), rest[next:], true
}

// bulk parses one "$len\r\nbytes\r\n" at b[0:].
func bulk(b []byte) ([]byte, int, bool) {
	if len(b) < 4 || b[0] != '$' {
		return nil, 0, false
	}
	nl := bytes.IndexByte(b, '\n')
	if nl < 2 {
		return nil, 0, false
	}
	n, err := strconv.Atoi(string(b[1 : nl-1]))
	if err != nil || n < 0 || nl+1+n+2 > len(b) {
		return nil, 0, false
	}
	return b[nl+1 : nl+1+n], nl + 1 + n + 2, true
}

// eachBulk calls f for every bulk string of the array at b[0:].
func eachBulk(b []byte, f func([]byte)) {
	if len(b) < 4 || b[0] != '*' {
		return
	}
	nl := bytes.IndexByte(b, '\n')
	if nl < 2 {
		return
	}
	n, err := strconv.Atoi(string(b[1 : nl-1]))
	if err != nil {
		return
	}
	pos := nl + 1
	for range n {
		s, k, ok := bulk(b[pos:])
		if !ok {
			return
		}
		f(s)
		pos += k
	}
}

// Connect starts db's fill connection now rather than on its first read.
// In cluster mode or with routes it does nothing (see ConnectNode,
// ConnectOwner).
func (c *Cache) Connect(db int) {
	if !c.owned() {
		c.conn(db)
	}
}

// owned reports whether fill connections are per owner (cluster node or
// upstream of routes) rather than per database.
func (c *Cache) owned() bool { return c.opt.Cluster != nil || c.opt.Routes != nil }

// Live reports whether hits on db may be served right now; in cluster mode
// or with routes, whether they may be for keys of every owner the tier has
// a connection to.
func (c *Cache) Live(db int) bool {
	if c.owned() {
		return c.liveNodes(db)
	}
	if db < 0 || db >= len(c.conns) {
		return false
	}
	fc := c.conns[db].Load()
	return fc != nil && fc.live(nanotime(), c.fenceAt.Load())
}

// connFor is the fill connection that serves and fills key: db's, with
// routes the one of db of key's upstream, and for a key of a cluster the
// one of the node owning key's slot now. It returns nil when there is none
// (database out of range, or not 0 on a cluster, slot without an owner).
func (c *Cache) connFor(db int, key []byte) *fillConn {
	if !c.owned() {
		return c.conn(db)
	}
	u, node, ok := c.keyOwner(db, key)
	if !ok {
		return nil
	}
	return c.nodeConn(u, node, db)
}

// keyOwner is where connFor finds key of db, without dialling: its
// upstream and, on a cluster, the node owning its slot now ("" otherwise).
// ok is false when there is none.
func (c *Cache) keyOwner(db int, key []byte) (u *upstreamTier, node string, ok bool) {
	if db < 0 || db >= len(c.conns) {
		return nil, "", false
	}
	u = c.ups[0]
	if r := c.opt.Routes; r != nil {
		i := r.Route(key)
		if i < 0 || i >= len(c.ups) {
			return nil, "", false
		}
		u = c.ups[i]
	}
	if u.cluster == nil {
		return u, "", true
	}
	// A cluster has database 0 only.
	if db != 0 {
		return nil, "", false
	}
	node = u.cluster.Owner(key)
	return u, node, node != ""
}
