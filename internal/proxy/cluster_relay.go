package proxy

import (
	"bytes"
	"errors"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redproxy/redproxy/internal/cluster"
	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/resp"
	"github.com/redproxy/redproxy/internal/upstream"
	"github.com/tidwall/redcon"
)

// Relays in cluster mode (see docs/COMPATIBILITY.md, "Cluster mode"):
//
//   - SUBSCRIBE and PSUBSCRIBE relay to one node: Redis Cluster broadcasts
//     classic messages to every node, so any node sees every channel. The
//     node is the primary of the lowest slot, the same one for every
//     client, so a map change that leaves it a primary does not move
//     subscribers around.
//   - SSUBSCRIBE relays to the primary owning the channels' slot; when
//     that slot moves away, Redis itself sends the client a sunsubscribe
//     push, which the relay passes on. When the slot had moved already
//     (the proxy's map was stale), the node answers MOVED (or, during a
//     migration, ASK): see relayRedirect.
//   - The relay stays on its node for the client's life, or until the
//     client has unsubscribed from everything (relayexit.go). A command on it
//     that the node cannot serve (a sharded channel or a key of a slot
//     another node owns, a whole-keyspace command) is refused in order,
//     never sent there to come back as MOVED.
//   - If the node goes away the client's connection is closed, as a
//     client subscribed on that node directly would see; clients
//     re-subscribe when they reconnect. Re-subscribing behind the client's
//     back would lose the messages published in between without telling it.

// relayBackend is where a relay's dedicated connection is taken: the
// client's backend, or in cluster mode the node chosen as above.
func (sess *Session) relayBackend(r *request) (*upstream.Backend, error) {
	if sess.srv.routes != nil {
		// The upstream of the relay's channels (routes.go); routes and a
		// cluster [upstream] never go together.
		return sess.backendFor(sess.route.relay)
	}
	if sess.srv.router == nil {
		return sess.backend(), nil
	}
	keySlot := -1
	if r.name == "ssubscribe" {
		keySlot, _, _ = sess.keySlot(r) // one slot: clusterStep checked
	}
	b, err := sess.srv.router.BackendFor(keySlot)
	if err != nil {
		return nil, err
	}
	sess.relayNode = b.Addr()
	return b, nil
}

// relayRedirect returns what a pub/sub relay on the cluster node at node
// does with the node's errors (relayFramer.redirect): a MOVED or ASK, to
// a SSUBSCRIBE (or to a keyed command of a RESP3 subscriber) that the
// proxy's stale map sent to the wrong node, updates the map
// (Router.Redirected) and reaches the client as TRYAGAIN, which Redis
// Cluster clients retry. Passed on as it was, the MOVED reached the client
// (which could not follow it), the map stayed stale until the next
// periodic refresh, and the relay stayed on the old node with nothing
// subscribed, refusing every SSUBSCRIBE after it (found by review). The
// framer also makes the relay ask, before the client's next batch,
// whether it may leave (relayexit.go): with nothing subscribed it does,
// and the retried SSUBSCRIBE starts a relay on the slot's owner; with
// other channels subscribed on this node it stays, and the retry is
// refused in order (relayMisrouted), as a channel of another node is.
func (sess *Session) relayRedirect(node string) func(reply []byte) ([]byte, bool) {
	router := sess.srv.router
	return func(reply []byte) ([]byte, bool) {
		moved, ok := router.Redirected(reply, node)
		if !ok {
			return nil, false
		}
		return errClusterRetry(moved), true
	}
}

// relayMisrouted is, for a command a relayed client sends in cluster
// mode, the refusal of a command its node cannot serve; "" to send it.
func (sess *Session) relayMisrouted(args [][]byte) string {
	if sess.relayNode == "" || len(args) == 0 {
		return ""
	}
	cmd := sess.cmds.table.Lookup(args)
	if cmd == nil {
		return ""
	}
	name := cmd.Name
	shown := strings.ToUpper(strings.ReplaceAll(name, "|", " "))
	switch {
	case name == "cluster" || cmd.Parent != nil && cmd.Parent.Name == "cluster":
		return "ERR This instance has cluster support disabled"
	case cluster.Whole(name), name == "monitor":
		return "ERR redproxy: " + shown + " on a subscribed connection would reach one node of the cluster only; use another connection"
	case name == "client|tracking" || name == "client|no-touch":
		if len(args) > 2 && strings.EqualFold(string(args[2]), "on") {
			return strings.TrimSuffix(strings.TrimPrefix(string(errClusterTracking(name)), "-"), "\r\n")
		}
		return ""
	case name == "sunsubscribe":
		// Redis answers for channels this connection never subscribed.
		return ""
	}
	var buf [8]int
	keys := cluster.SlotArgs(cmd, args, buf[:0])
	if len(keys) == 0 {
		return ""
	}
	keySlot := cluster.Slot(args[keys[0]])
	for _, k := range keys[1:] {
		if cluster.Slot(args[k]) != keySlot {
			return "" // the node answers CROSSSLOT, as Redis Cluster would
		}
	}
	if m := sess.srv.router.Map(); m != nil && m.Owner(keySlot) == sess.relayNode {
		return ""
	}
	what := "key"
	if cmd.Is(commands.PubSub) {
		what = "channel"
	}
	return "ERR redproxy: this connection is subscribed on cluster node " + sess.relayNode +
		", which does not serve slot " + strconv.Itoa(keySlot) + " of the " + what + " " +
		strconv.Quote(clip(args[keys[0]])) + "; use another connection for it"
}

// clip shortens a client's argument for an error message.
func clip(b []byte) string {
	if len(b) > 64 {
		return string(b[:64]) + "..."
	}
	return string(b)
}

var (
	cmdMonitorRaw      = resp.AppendCommandStrings(nil, "MONITOR")
	errMonitorReadOnly = []byte("-ERR redproxy: a cluster-wide MONITOR accepts only QUIT; close the connection to end it\r\n")
)

// clusterMonitor is MONITOR in cluster mode: a connection to every primary
// of the slot map in MONITOR mode, their lines merged into the client's
// stream as whole frames, in the order they arrive (each node's lines stay
// in that node's order; lines of different nodes are not ordered by time).
// When any watched node goes away, or a primary not watched serves slots
// (watchMonitorMap), the client's connection is closed: a monitor that
// silently lost or lacked a node would show a partial picture as if it
// were whole. Primaries the cluster flagged as failed are not watched:
// they run nothing, and dialling them refused MONITOR for as long as they
// stayed in the map.
func (sess *Session) clusterMonitor(r *request) bool {
	m := r.m
	router := sess.srv.router
	var primaries []string
	if cm := router.Map(); cm != nil {
		primaries = cm.LivePrimaries()
	}
	if len(primaries) == 0 {
		sess.replyLocal(m, errorReply(cluster.ErrSlotUnserved))
		return true
	}
	type watched struct {
		b  *upstream.Backend
		nc net.Conn
		rd []byte // bytes read past the +OK
	}
	nodes := make([]watched, 0, len(primaries))
	release := func() {
		for _, w := range nodes {
			w.b.ReleaseConn(w.nc)
		}
	}
	for _, addr := range primaries {
		b := router.NodeBackend(addr)
		nc, err := b.AcquireConnFor(0, sess.resp3, sess.name, sess.left)
		if err == nil {
			nodes = append(nodes, watched{b: b, nc: nc})
			var rest []byte
			rest, err = startMonitor(nc, sess.srv.Config().Upstream.ReplyTimeout.Duration)
			nodes[len(nodes)-1].rd = rest
		}
		if err != nil {
			release()
			sess.replyLocal(m, errorReply(err))
			if upstreamDown(err) || upstream.PeerClosed(err) {
				sess.closeUpstreamLost() // as startRelay (upstreamlost.go)
			}
			return true
		}
	}
	sess.list.relay.Store(uint32(relayMonitor) + 1)
	sess.replyLocal(m, ok)
	sess.flush(time.Now())
	limit := int64(sess.srv.Config().Server.PubSubOutputLimit)
	q := newOutQueue(limit)
	q.push(append([]byte(nil), sess.out...))
	// The rest of the batch is answered as later commands are.
	quit := pushMonitorReplies(q, sess.batchReqs[r.i+1:], sess.replyOff)
	sess.out = sess.out[:0]
	idle := sess.srv.Config().Server.IdleTimeout.Duration
	if idle > 0 {
		sess.nc.SetReadDeadline(time.Time{}) // MONITOR clients never idle out
	}
	var once sync.Once
	stop := func(reason string) {
		once.Do(func() {
			sess.closing(reason)
			for _, w := range nodes {
				w.nc.Close()
			}
			sess.nc.SetReadDeadline(time.Now()) // wakes the client reader
		})
	}
	var wg sync.WaitGroup
	for _, w := range nodes {
		wg.Add(1)
		go func() { // node -> queue, whole frames only
			defer wg.Done()
			buf := w.rd
			chunk := make([]byte, 16<<10)
			for {
				var frames int
				for frames < len(buf) {
					n, err := resp.ScanReply(buf[frames:])
					if err != nil {
						stop(metrics.CloseUpstreamLost)
						return
					}
					if n == 0 {
						break
					}
					frames += n
				}
				if frames > 0 {
					if !q.push(append([]byte(nil), buf[:frames]...)) {
						sess.closeFor(metrics.CloseOutputLimit, "relayed output exceeds its limit", "limit_bytes", limit)
						stop(metrics.CloseOutputLimit)
						q.close()
						return
					}
					buf = append(buf[:0], buf[frames:]...)
				}
				if limit > 0 && int64(len(buf)) > limit {
					// One line longer than the client may be owed.
					sess.closeFor(metrics.CloseOutputLimit, "relayed output exceeds its limit", "limit_bytes", limit)
					stop(metrics.CloseOutputLimit)
					q.close()
					return
				}
				n, err := w.nc.Read(chunk)
				buf = append(buf, chunk[:n]...)
				if err != nil {
					stop(metrics.CloseUpstreamLost)
					q.close()
					return
				}
			}
		}()
	}
	done := make(chan struct{})
	wg.Add(1)
	go func() { // the map -> close when a primary serves unwatched
		defer wg.Done()
		if sess.watchMonitorMap(primaries, done) {
			stop(metrics.CloseUpstreamLost)
			q.close()
		}
	}()
	wg.Add(1)
	go func() { // queue -> client
		defer wg.Done()
		for {
			chunk, ok := q.pop()
			if !ok {
				return
			}
			if _, err := sess.nc.Write(chunk); err != nil {
				stop(metrics.CloseWriteError)
				return
			}
		}
	}()
	// client: QUIT ends it; anything else is refused.
	for !quit {
		reqs, err := sess.rd.ReadBatch()
		quit = pushMonitorReplies(q, reqs, sess.replyOff)
		if !quit && err != nil {
			sess.readEnded(err)
			var pe *resp.ProtocolError
			if errors.As(err, &pe) {
				// After every reply queued before it, as Redis does.
				sess.srv.metrics.ProtocolErrors.Inc()
				q.push(redcon.AppendError(nil, "ERR "+pe.Error()))
				sess.protoErrAnswered = true
			}
			break
		}
	}
	if quit {
		sess.closing(metrics.CloseQuit)
	}
	stop(metrics.CloseClient)
	q.close()
	close(done)
	wg.Wait()
	release()
	sess.quitting = true
	return true
}

// monitorMapCheck is how often a cluster MONITOR looks at the slot map for
// a primary it does not watch.
const monitorMapCheck = 500 * time.Millisecond

// watchMonitorMap reports true once the slot map has a primary serving
// that watched does not hold and the cluster has not flagged as failed
// (one that joined, was promoted, or came back from failure), false when
// done is closed first. The monitor is then closed, as when a watched node
// goes away: one that went on without that node would show a partial
// picture as if it were whole (found by review: a primary skipped while
// flagged failed was never watched once it served again).
func (sess *Session) watchMonitorMap(watched []string, done <-chan struct{}) bool {
	t := time.NewTicker(monitorMapCheck)
	defer t.Stop()
	var seen *cluster.Map
	for {
		select {
		case <-done:
			return false
		case <-t.C:
		}
		m := sess.srv.router.Map()
		if m == nil || m == seen {
			continue
		}
		seen = m
		for _, a := range m.LivePrimaries() {
			if !slices.Contains(watched, a) {
				sess.logger().Info("cluster MONITOR: a primary it does not watch serves slots; closing it", "node", a)
				return true
			}
		}
	}
}

// startMonitor sends MONITOR on nc and reads its +OK; it returns what the
// node sent after it.
func startMonitor(nc net.Conn, timeout time.Duration) ([]byte, error) {
	if timeout > 0 {
		nc.SetDeadline(time.Now().Add(timeout))
		defer nc.SetDeadline(time.Time{})
	}
	if _, err := nc.Write(cmdMonitorRaw); err != nil {
		return nil, err
	}
	var buf []byte
	chunk := make([]byte, 4<<10)
	for {
		n, err := nc.Read(chunk)
		buf = append(buf, chunk[:n]...)
		if l, _ := resp.ScanReply(buf); l > 0 {
			if !bytes.Equal(buf[:l], ok) {
				return nil, errors.New(string(bytes.TrimPrefix(bytes.TrimRight(buf[:l], "\r\n"), []byte("-"))))
			}
			return buf[l:], nil
		}
		if err != nil {
			return nil, err
		}
		if len(buf) > 64<<10 {
			return nil, resp.ErrProtocol
		}
	}
}

// pushMonitorReplies queues the answers to a cluster MONITOR client's
// requests; it reports whether one was QUIT, the last answered. muted: the
// client set CLIENT REPLY OFF before MONITOR (which it cannot undo here),
// so nothing is answered, as Redis would answer nothing (found by review).
func pushMonitorReplies(q *outQueue, reqs []resp.Request, muted bool) (quit bool) {
	for k := range reqs {
		quit = isQuit(reqs[k].Args)
		switch {
		case muted:
		case quit:
			q.push(ok)
		default:
			q.push(errMonitorReadOnly)
		}
		if quit {
			return true
		}
	}
	return false
}

func isQuit(args [][]byte) bool {
	return len(args) > 0 && strings.EqualFold(string(args[0]), "quit")
}
