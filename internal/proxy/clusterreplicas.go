package proxy

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/redproxy/redproxy/internal/cluster"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/upstream"
	"github.com/tidwall/redcon"
)

// Replica reads in cluster mode ([upstream] mode = "cluster" with
// read_from = "replica" or "replica_preferred"; a cluster named upstream
// of routes still reads its primaries only, config refuses it).
//
// Every primary of the slot map is a shard with a replicaSet of its own
// (replicas.go): its replicas are those the slot map lists with it
// (CLUSTER SHARDS or SLOTS), dialled in READONLY mode, and it is polled
// as a standalone primary is (offsets, lag, failures). clusterReplicas
// keeps one set per primary as the map changes and polls them all.
//
// A batch whose every command is a read a replica may serve goes through
// Router.DoReads, which sends each keyed command to a replica of its
// slot's primary, chosen by the client's read-your-writes state for that
// shard (clusterReads); a replica that fails, is late (reply_timeout),
// loads or lost its primary, or whose connection was lost since it was
// picked (Reconnected), sends the read back to the primary
// (replica_preferred) or fails it (replica); a MOVED from a replica is
// followed to the node it names, a primary. Any other batch goes to the
// primaries, and the router names each primary a command went to
// (clusterReads.Wrote): once the batch's replies are in, the client's
// reads of those shards wait for a poll of theirs started after now, as
// a standalone client's do. A write on a dedicated connection
// (transaction, blocking command) counts for every shard.
//
// Map changes: a primary that left the map loses its set, a new one gets
// one; the client's state for a shard it never saw, or for any shard
// after the map moved slots, starts with a poll started after now if the
// client ever wrote, since what it wrote may now live there.

// clusterReplicas is the shards' replica sets.
type clusterReplicas struct {
	srv      *Server
	router   *cluster.Router
	u        config.Upstream
	opts     func(addr string) upstream.BackendOptions
	interval time.Duration
	replicaMetrics

	sets atomic.Pointer[map[string]*replicaSet] // by primary address
	// gen counts the slot maps that moved slots (or changed primaries);
	// a client's state older than it starts again (clusterReads).
	gen         atomic.Uint64
	fingerprint string // the map behind gen; the poller's only
	polls       int

	running atomic.Bool // start ran: close waits for the loop
	stop    chan struct{}
	done    chan struct{}
}

func initClusterReplicas(s *Server) error {
	u := s.cfg.Upstream
	if s.router == nil || u.ReadFrom == config.ReadPrimary || u.ReadFrom == "" {
		return nil
	}
	cr := &clusterReplicas{
		srv:      s,
		router:   s.router,
		u:        u,
		interval: u.ReplicaPollInterval.Duration,
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	cr.opts = func(addr string) upstream.BackendOptions {
		o := s.backendOptions(s.Config(), addr)
		o.Databases = 1
		// Without READONLY a cluster replica answers MOVED to its
		// primary for every key.
		o.Handshake = append(o.Handshake, []string{"READONLY"})
		return o
	}
	empty := map[string]*replicaSet{}
	cr.sets.Store(&empty)
	m, err := newReplicaMetrics(s.metrics.Registry, func() float64 { return float64(cr.usable(time.Now())) })
	cr.replicaMetrics = m
	s.creplicas = cr
	return err
}

// usable counts the replicas of every shard a client without writes
// could read now.
func (cr *clusterReplicas) usable(now time.Time) int {
	n := 0
	for _, rs := range *cr.sets.Load() {
		n += rs.usable(now)
	}
	return n
}

// start polls once, so reads can use the replicas from the first client
// on, then keeps polling in the background.
func (cr *clusterReplicas) start() {
	cr.running.Store(true)
	cr.poll()
	go cr.loop()
}

func (cr *clusterReplicas) loop() {
	defer close(cr.done)
	t := time.NewTicker(cr.interval)
	defer t.Stop()
	for {
		select {
		case <-cr.stop:
			return
		case <-t.C:
			cr.poll()
		}
	}
}

func (cr *clusterReplicas) close() {
	select {
	case <-cr.stop:
		return
	default:
	}
	close(cr.stop)
	if cr.running.Load() {
		<-cr.done
	}
	for _, rs := range *cr.sets.Load() {
		rs.close()
	}
}

// poll brings the sets in line with the slot map, then polls every shard
// at once.
func (cr *clusterReplicas) poll() {
	// The router reloads its map every 10 s, or on MOVED and lost
	// nodes; replicas come, go, finish syncing or fail without either,
	// so the map is asked for about once a second, as the Sentinels are.
	if cr.polls%max(1, int(time.Second/cr.interval)) == 0 {
		cr.router.RefreshSoon()
	}
	cr.polls++
	m := cr.router.Map()
	if m == nil {
		return
	}
	old := *cr.sets.Load()
	next := make(map[string]*replicaSet, len(old))
	changed := false
	for _, p := range m.Primaries() {
		// (A primary that left the map and came back has new pools.)
		if rs := old[p]; rs != nil && rs.primary == cr.router.NodeBackend(p) {
			next[p] = rs
			continue
		}
		next[p] = cr.newShard(p)
		changed = true
	}
	var gone []*replicaSet
	for p, rs := range old {
		if next[p] != rs {
			gone = append(gone, rs)
			changed = true
		}
	}
	if fp := m.Fingerprint(); changed || fp != cr.fingerprint {
		cr.fingerprint = fp
		cr.sets.Store(&next)
		cr.gen.Add(1)
	}
	for _, rs := range gone {
		rs.close()
	}
	var wg sync.WaitGroup
	for _, rs := range next {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rs.poll()
		}()
	}
	wg.Wait()
}

// newShard makes the replica set of the shard whose primary is at addr.
func (cr *clusterReplicas) newShard(primary string) *replicaSet {
	s := cr.srv
	rs := makeReplicaSet(s, cr.u, cr.router.NodeBackend(primary), nil, cr.opts, s.log.With("shard", primary))
	rs.replicaMetrics = cr.replicaMetrics
	rs.listReplicas = func() []string {
		if m := cr.router.Map(); m != nil {
			return m.ReplicasOf(primary)
		}
		return nil
	}
	rs.onRoleChange = cr.router.RefreshSoon
	close(rs.done) // polled by cr, no loop of its own
	return rs
}

// clusterReads is a session's read-your-writes state per shard, and its
// part of Router.DoReads (cluster.Reads). Allocated on the session's
// first batch in cluster mode with replica reads.
type clusterReads struct {
	sess *Session
	cr   *clusterReplicas
	// gen is the cr.gen the shards' states are from.
	gen    uint64
	shards []shardReads
	// wroteAny: the client wrote at some time, so a shard it has no
	// state for may hold its writes (after a failover or resharding).
	wroteAny bool
	// picked are the replicas of the batch's reads, to find the node of
	// a failed read.
	picked []pickedReplica
}

type shardReads struct {
	set   *replicaSet
	rr    replicaReads
	wrote bool // a command that may write went to the shard in this batch
}

type pickedReplica struct {
	b    *upstream.Backend
	node *replicaNode
	set  *replicaSet
	// epoch is the poll epoch of the view the node was first picked from
	// in the batch (Reconnected).
	epoch uint64
}

func (sess *Session) clusterReads() *clusterReads {
	if sess.creads == nil {
		sess.creads = &clusterReads{sess: sess, cr: sess.srv.creplicas, gen: sess.srv.creplicas.gen.Load()}
	}
	return sess.creads
}

// clusterDo sends the batch's Call through the router, its reads to
// replicas when every command is one (flush).
func (sess *Session) clusterDo(call *upstream.Call) {
	if sess.srv.creplicas == nil {
		sess.srv.router.Do(call, sess.resp3)
		return
	}
	reads := int(sess.reads.forwarded) == call.Len()
	sess.reads.forwarded = 0
	c := sess.clusterReads()
	c.sync()
	sess.srv.router.DoReads(call, sess.resp3, c, reads)
	// A replica was picked for some read (its reply may be the primary's
	// after a fallback, which the mirror then need not compare either).
	sess.reads.answered = sess.reads.answered || len(c.picked) > 0
	c.batchDone()
}

// sync drops the states of shards gone and, after a map change, makes
// every shard's next read wait for a fresh poll if the client wrote.
func (c *clusterReads) sync() {
	gen := c.cr.gen.Load()
	if gen == c.gen {
		return
	}
	c.gen = gen
	sets := *c.cr.sets.Load()
	kept := c.shards[:0]
	for _, sh := range c.shards {
		if sets[sh.set.primary.Addr()] == sh.set {
			if c.wroteAny {
				sh.rr.needEpoch = sh.set.started.Load() + 1
			}
			kept = append(kept, sh)
		}
	}
	clear(c.shards[len(kept):])
	c.shards = kept
}

// shard is the client's state for set, made on first need.
func (c *clusterReads) shard(set *replicaSet) *shardReads {
	for i := range c.shards {
		if c.shards[i].set == set {
			return &c.shards[i]
		}
	}
	sh := shardReads{set: set}
	if c.wroteAny {
		sh.rr.needEpoch = set.started.Load() + 1
	}
	c.shards = append(c.shards, sh)
	return &c.shards[len(c.shards)-1]
}

// Replica picks the replica for a read of primary's slots
// (cluster.Reads).
func (c *clusterReads) Replica(primary string) (*upstream.Backend, []byte) {
	set := (*c.cr.sets.Load())[primary]
	if set == nil {
		// A primary the poller has not seen yet (a failover's new
		// primary, until the next poll): no replica is known, which is
		// the metric's "primary".
		c.cr.onPrimary.Inc()
		return nil, nil
	}
	sh := c.shard(set)
	now := time.Now()
	node, epoch := set.pick(&sh.rr, c.sess.id, now)
	if node == nil {
		if set.mode == config.ReadReplica && sh.rr.needEpoch == 0 && set.usable(now) == 0 {
			set.failed.Inc()
			return nil, errNoReplicaReply
		}
		set.onPrimary.Inc()
		return nil, nil
	}
	b := node.backend
	set.onReplica.Inc()
	if h := testClusterPicked.Load(); h != nil {
		(*h)(node.addr)
	}
	for _, p := range c.picked {
		if p.b == b {
			// The first pick's view is the oldest: a loss since then
			// counts for every read of the batch on b.
			return b, nil
		}
	}
	c.picked = append(c.picked, pickedReplica{b: b, node: node, set: set, epoch: epoch})
	return b, nil
}

// testClusterPicked, when set (tests only, SetTestClusterPicked), runs
// in Replica after a replica is picked for a read, before the read is
// sent: a test can lose the replica's connection in between.
var testClusterPicked atomic.Pointer[func(replica string)]

// Reconnected reports whether a connection to b was lost since b was
// picked for the batch (cluster.Reads): as in standalone mode
// (readOnReplica, replicaNode.failedSince), the read may have gone on the
// redialled connection, to a restarted replica serving an old dataset
// without the client's writes, so the router sends it to the primary.
func (c *clusterReads) Reconnected(b *upstream.Backend) bool {
	for _, p := range c.picked {
		if p.b == b {
			return p.node.failedSince(p.epoch)
		}
	}
	return false
}

var errNoReplicaReply = redcon.AppendError(nil, "ERR "+errNoReplica.Error())

// Failed marks a replica that failed a read (cluster.Reads).
func (c *clusterReads) Failed(b *upstream.Backend, err error) bool {
	for _, p := range c.picked {
		if p.b != b {
			continue
		}
		p.node.markFailed(p.set.started.Load())
		if rr := &c.shard(p.set).rr; rr.last == p.node {
			rr.last = nil
		}
		c.sess.logger().Debug("read on a cluster replica failed", "replica", p.node.addr, "err", err)
		if p.set.mode == config.ReadReplica {
			p.set.failed.Inc()
			return false
		}
		p.set.fellBack.Inc()
		return true
	}
	return c.cr.u.ReadFrom != config.ReadReplica
}

// Wrote notes a command that may write sent to primary (cluster.Reads).
func (c *clusterReads) Wrote(primary string) {
	c.wroteAny = true
	if set := (*c.cr.sets.Load())[primary]; set != nil {
		c.shard(set).wrote = true
		return
	}
	// A primary with no set yet: its set, when made, is new to the
	// client, whose state for it then waits for a fresh poll (shard).
}

// ReplyTimeout bounds a replica's replies (cluster.Reads).
func (c *clusterReads) ReplyTimeout() time.Duration { return c.cr.u.ReplyTimeout.Duration }

// batchDone: every reply of the batch is in; the shards written wait for
// a poll started after now.
func (c *clusterReads) batchDone() {
	clear(c.picked)
	c.picked = c.picked[:0]
	for i := range c.shards {
		if sh := &c.shards[i]; sh.wrote {
			sh.wrote = false
			sh.rr.needEpoch = sh.set.started.Load() + 1
		}
	}
}

// wroteEverywhere: a write on a dedicated connection was answered; every
// shard's reads wait for a poll started after now.
func (c *clusterReads) wroteEverywhere() {
	c.wroteAny = true
	for i := range c.shards {
		sh := &c.shards[i]
		sh.rr.needEpoch = sh.set.started.Load() + 1
	}
}
