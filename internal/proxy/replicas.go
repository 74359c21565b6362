package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/resp"
	"github.com/redproxy/redproxy/internal/sentinel"
	"github.com/redproxy/redproxy/internal/upstream"
)

// Reads from replicas (upstream.read_from = "replica" or
// "replica_preferred"; README "Replica reads").
//
// Which batches: a batch's Call goes to a replica only when every command
// in it is a read a replica may serve (replicaCommand) and the client is
// not in MULTI, WATCH, a blocking command or a relay; anything else in the
// Call sends the whole Call to the primary, so a client's commands are
// never split between servers and never reordered.
//
// Read-your-writes. Every poll (replica_poll_interval) first reads the
// primary's master_repl_offset, then each replica's slave_repl_offset (the
// offset it has applied). Redis adds a write to its replication stream
// before its reply leaves, so an offset the primary reports to an INFO sent
// after a write's reply arrived is at least that write's offset. After a
// Call that may have written, once its replies are in, the session notes
// the first poll started after now (replicaReads.needEpoch); until that poll
// has read the primary's offset the client's reads go to the primary, and
// from then on only to replicas whose applied offset has reached it
// (replicaReads.floor). Offsets only grow, so a replica that passed the
// floor keeps every write of the client's that the floor covers.
//
// Lag: a replica behind the primary's offset of an earlier poll is as far
// behind as that poll is old; past max_replica_lag it is skipped, and so is
// every replica when the last poll is itself older than that.
//
// Down or stalled: a read sent to a replica that fails, has no reply
// within upstream.reply_timeout, or is answered -LOADING or -MASTERDOWN
// (the replica is not serving), is sent again to the primary (reads change
// nothing, so running one twice is harmless), and the replica is skipped
// until a poll started after the failure has heard from it.
//
// Restarted: a replica's connection that is lost (the server closed it,
// it broke or timed out) marks the replica failed the same way, whether or
// not a read was on it. The pools redial at once, and the process they
// reach may be a restarted one serving an old dataset (its last RDB, while
// its full sync is pending) that the last poll's offset and link state
// say nothing about: found by review, a client read a restarted replica
// that lacked its own acknowledged write until the next poll. A read
// picked from a view before such a loss and answered after it is not
// trusted either (replicaNode.failedSince).

// replicaSet is one upstream's replicas and what the last poll learned:
// [upstream]'s, and with routes each named upstream's that reads from
// replicas (routeTarget.replicas).
type replicaSet struct {
	srv      *Server
	mode     string // config.ReadReplica or config.ReadReplicaPreferred
	maxLag   time.Duration
	interval time.Duration
	// replyTimeout is upstream.reply_timeout in nanoseconds: a reload
	// changes it (reconfigure).
	replyTimeout atomic.Int64
	log          *slog.Logger

	// primary is the upstream's shared pools (a Sentinel failover moves
	// them, the pointer stays); sentinel, in Sentinel mode, names the
	// replicas; nodeOptions are the pools' options for a replica at addr.
	primary     *upstream.Backend
	sentinel    *sentinel.Watcher
	nodeOptions func(addr string) upstream.BackendOptions
	// listReplicas, in cluster mode, names the shard's replicas (the
	// slot map's); nil elsewhere.
	listReplicas func() []string

	started atomic.Uint64 // epoch of the latest poll started; 0: none yet
	view    atomic.Pointer[replicaView]
	// gen counts the upstream's address changes (restart): a poll
	// stores its view only if no restart came since it began, so a poll
	// of the old primary still running cannot bring its replicas back.
	// viewMu orders that check and store against restart.
	gen    atomic.Uint32
	viewMu sync.Mutex
	// kick asks the poller for a poll now; it closes the channel sent
	// once that poll is done.
	kick chan chan struct{}

	// known is nodes as of the last change, for sessions: SCRIPT KILL
	// goes to every replica, usable or not (a replica busy with a script
	// fails its poll and leaves the view).
	known atomic.Pointer[[]*replicaNode]

	// Only the poller goroutine touches these.
	nodes   map[string]*replicaNode
	samples []offsetSample // recent primary offsets, oldest first
	pollGen uint32         // the gen samples were taken in
	// optsGen counts reloads that changed the pools' options
	// (reconfigure); nodesGen is the one the nodes' pools were last
	// switched to, by the poller.
	optsGen  atomic.Uint64
	nodesGen uint64
	polls    int
	listed   []string // the replicas the Sentinels named last (Sentinel mode)

	calls sync.Pool // *replicaCall

	replicaMetrics
	primaryUp bool // the last poll read the primary's offset, for logging changes only
	// onRoleChange, in cluster mode, asks for a new slot map: the
	// primary says it is a replica now.
	onRoleChange func()

	stop chan struct{}
	done chan struct{}
}

// replicaNode is one replica and its connection pools.
type replicaNode struct {
	addr    string
	backend *upstream.Backend
	// own are the node's pools for users with an upstream credential of
	// their own, by the primary pools that credential's commands use
	// (users.go), made on a user's first read: they read the replica
	// under their own Redis user, as they write the primary.
	ownMu  sync.Mutex
	own    map[*upstream.Backend]*upstream.Backend
	closed bool
	// failed is the poll epoch current when a read on the node last
	// failed, or one of its connections was lost (connLost): it is
	// skipped until a poll that started later heard from it.
	failed atomic.Uint64
	// pending is the poll's INFO still unanswered, if any: a stalled
	// replica gets no new one until it answers.
	pending *upstream.Call
	up      bool // as the last poll found it, for logging changes only
}

// replicaView is what one poll learned; sessions read it without locks.
type replicaView struct {
	epoch   uint64
	gen     uint32    // replicaSet.gen when the poll started
	at      time.Time // when the poll started
	primary int64     // the primary's master_repl_offset, read after at
	nodes   []viewNode
}

type viewNode struct {
	node   *replicaNode
	offset int64 // slave_repl_offset: what it has applied, at least
	// behindSince is when the oldest poll whose primary offset the
	// replica has not reached started; zero when it had reached this
	// poll's.
	behindSince time.Time
}

type offsetSample struct {
	at     time.Time
	offset int64
}

// replicaReads is a session's part of replica reads.
type replicaReads struct {
	// forwarded counts the commands of the batch's Call that a replica
	// may serve; the Call goes to one only if that is all of them. A
	// batch holds at most resp.MaxExtendedBatch (2048) requests.
	forwarded int16
	// wrote: a command that may write was forwarded and its reply is not
	// in yet (writeForwarded, or a Call with more than reads).
	wrote bool
	// answered: a replica answered the batch's Call, or part of it: the
	// mirror does not compare those replies with its own as the
	// primary's. readOnReplica sets it on the state it was given; with
	// routes, whose shares are read on goroutines of their own, routedDo
	// gathers the upstreams' into sess.reads once all are in
	// (routeReplicaAnswered). flush resets sess.reads's.
	answered bool
	// gen is the replicaSet.gen of the views floor and last come from:
	// after an address change they are the old upstream's, meaningless
	// for the new one's offsets. (Small fields first: the Session, which
	// holds this, must stay in its size class.)
	gen uint32
	// needEpoch is the first poll started after the client's last write
	// was answered; 0 once floor covers it. Until that poll has read the
	// primary's offset, reads go to the primary.
	needEpoch uint64
	// floor is the replication offset a replica must have applied to
	// serve this client: the primary's, read after its last write.
	floor int64
	// last is the replica the client read from last: kept while usable,
	// so its reads of one replication stream do not go back in time.
	last *replicaNode
}

// replicaReads.forwarded is an int16: a batch must fit in it (this stops
// the build if resp.MaxExtendedBatch ever outgrows it).
const _ = uint16(1<<15 - 1 - resp.MaxExtendedBatch)

// replicaCall is a Call of the replica path with a copy of its commands:
// a Call given up on after reply_timeout may still be written later, when
// the client's read buffer holds other bytes.
type replicaCall struct {
	call  *upstream.Call
	buf   []byte
	timer *time.Timer
}

var (
	cmdInfoReplication = resp.AppendCommandStrings(nil, "INFO", "replication")

	// errNoReplica answers reads with read_from = "replica" when no
	// replica may serve them.
	errNoReplica = errors.New(`redproxy: no replica is available for reads (upstream.read_from = "replica")`)

	// errReplicaReconnected fails a read answered by a replica whose
	// connection was lost after it was picked (readOnReplica).
	errReplicaReconnected = errors.New("redproxy: the replica's connection was lost and redialled during the read")
	// errReplicaNotServing marks a read a replica answered -LOADING or
	// -MASTERDOWN (readOnReplica).
	errReplicaNotServing = errors.New("the replica answered -LOADING or -MASTERDOWN")
)

// noReadYourWrites turns the read-your-writes floor off, so tests can
// show that the per-client linearizability check fails without it.
var noReadYourWrites atomic.Bool

// SetTestNoReadYourWrites turns read-your-writes off (for tests only: a
// client may then read a replica that has not applied its own write) and
// returns a function that restores it.
func SetTestNoReadYourWrites(off bool) (restore func()) {
	old := noReadYourWrites.Swap(off)
	return func() { noReadYourWrites.Store(old) }
}

func initReplicas(s *Server) error {
	if s.routes != nil {
		return initRouteReplicas(s)
	}
	if s.router != nil {
		return initClusterReplicas(s)
	}
	u := s.cfg.Upstream
	if u.ReadFrom == config.ReadPrimary || u.ReadFrom == "" {
		return nil
	}
	rs, err := newReplicaSet(s, u, s.backend, s.sentinel, func(addr string) upstream.BackendOptions {
		return s.backendOptions(s.Config(), addr)
	}, s.metrics.Registry, s.log)
	s.replicas = rs
	return err
}

// newReplicaSet sets up the replica reads of upstream u, whose shared
// pools are primary; it registers its metrics with reg.
func newReplicaSet(s *Server, u config.Upstream, primary *upstream.Backend, w *sentinel.Watcher, opts func(addr string) upstream.BackendOptions, reg prometheus.Registerer, log *slog.Logger) (*replicaSet, error) {
	rs := makeReplicaSet(s, u, primary, w, opts, log)
	m, err := newReplicaMetrics(reg, func() float64 { return float64(rs.usable(time.Now())) })
	rs.replicaMetrics = m
	return rs, err
}

// makeReplicaSet is newReplicaSet without metrics.
func makeReplicaSet(s *Server, u config.Upstream, primary *upstream.Backend, w *sentinel.Watcher, opts func(addr string) upstream.BackendOptions, log *slog.Logger) *replicaSet {
	rs := &replicaSet{
		srv:       s,
		mode:      u.ReadFrom,
		maxLag:    u.MaxReplicaLag.Duration,
		interval:  u.ReplicaPollInterval.Duration,
		log:       log.With("component", "replicas"),
		primary:   primary,
		sentinel:  w,
		nodes:     map[string]*replicaNode{},
		primaryUp: true,
		kick:      make(chan chan struct{}),
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
	}
	rs.replyTimeout.Store(int64(u.ReplyTimeout.Duration))
	rs.nodeOptions = func(addr string) upstream.BackendOptions {
		o := opts(addr)
		o.OnReadOnly, o.WantPrimary = nil, false
		o.MaxPinned = 1 // nothing is pinned on a replica
		o.Pins = nil
		return o
	}
	rs.calls.New = func() any { return &replicaCall{call: upstream.NewCall()} }
	return rs
}

// replicaMetrics count an upstream's reads by where they were answered.
type replicaMetrics struct {
	// Batches of reads by where they were answered
	// (redproxy_replica_reads_total{result}).
	onReplica, onPrimary, fellBack, failed prometheus.Counter
}

// newReplicaMetrics registers the replica-read metrics with reg; usable
// counts the replicas usable now.
func newReplicaMetrics(reg prometheus.Registerer, usable func() float64) (replicaMetrics, error) {
	var rm replicaMetrics
	reads := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "redproxy_replica_reads_total",
		Help: "Batches of reads by where they were answered: replica; primary (read-your-writes or no usable replica); fallback (a replica failed or was late, then the primary); failed (read_from = replica and no replica).",
	}, []string{"result"})
	rm.onReplica, rm.onPrimary = reads.WithLabelValues("replica"), reads.WithLabelValues("primary")
	rm.fellBack, rm.failed = reads.WithLabelValues("fallback"), reads.WithLabelValues("failed")
	if err := reg.Register(reads); err != nil {
		return rm, err
	}
	err := reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "redproxy_replicas_usable",
		Help: "Replicas the last poll found replicating, answering and within upstream.max_replica_lag.",
	}, usable))
	return rm, err
}

// allReplicaSets are the replica sets of every upstream that reads from
// replicas.
func (s *Server) allReplicaSets() []*replicaSet {
	if s.routes == nil {
		if s.replicas == nil {
			return nil
		}
		return []*replicaSet{s.replicas}
	}
	var sets []*replicaSet
	for _, t := range s.routes.targets {
		if t.replicas != nil {
			sets = append(sets, t.replicas)
		}
	}
	return sets
}

// startReplicas polls once, so reads can use the replicas from the first
// client on, then keeps polling in the background.
func (s *Server) startReplicas() {
	if s.creplicas != nil {
		s.creplicas.start()
	}
	for _, rs := range s.allReplicaSets() {
		rs.poll()
		go rs.loop()
	}
}

// closeReplicas stops the poller and closes the replicas' pools.
func (s *Server) closeReplicas() {
	if s.creplicas != nil {
		s.creplicas.close()
	}
	for _, rs := range s.allReplicaSets() {
		rs.close()
	}
}

func (rs *replicaSet) close() {
	select {
	case <-rs.stop:
		return
	default:
	}
	close(rs.stop)
	if rs.started.Load() > 0 && rs.listReplicas == nil {
		<-rs.done // (a cluster shard's set has no loop of its own)
	}
	for _, n := range rs.nodes {
		n.close()
	}
}

// backendFor is the node's pools for commands that use primary's
// credential: the node's own for the upstream's credential, else pools
// made on first use with that of primary.
func (n *replicaNode) backendFor(rs *replicaSet, primary *upstream.Backend) *upstream.Backend {
	if primary == rs.primary {
		return n.backend
	}
	n.ownMu.Lock()
	defer n.ownMu.Unlock()
	if b := n.own[primary]; b != nil || n.closed {
		if b == nil {
			return n.backend // closed: the read fails there and goes to the primary
		}
		return b
	}
	o := rs.optionsFor(n)
	po := primary.Options(0, false)
	o.Username, o.Password = po.Username, po.Password
	b := upstream.NewBackend(o)
	if n.own == nil {
		n.own = map[*upstream.Backend]*upstream.Backend{}
	}
	n.own[primary] = b
	return b
}

// optionsFor are the options of n's pools: nodeOptions, and a lost
// connection marks n failed (connLost).
func (rs *replicaSet) optionsFor(n *replicaNode) upstream.BackendOptions {
	o := rs.nodeOptions(n.addr)
	o.OnConnLost = func() { rs.connLost(n) }
	return o
}

// connLost: a connection to n was lost, so the pools' next one may reach a
// restarted server whose dataset the last poll did not see (found by
// review: it served its old RDB, without the client's acknowledged write,
// until the next poll). n is skipped until a poll started after now has
// found it replicating and in sync again.
func (rs *replicaSet) connLost(n *replicaNode) {
	n.markFailed(rs.started.Load())
}

// markFailed makes n unusable in views of polls started up to epoch. It
// never lowers failed: a read's failure noted late must not undo a later
// connection loss.
func (n *replicaNode) markFailed(epoch uint64) {
	for {
		old := n.failed.Load()
		if old >= epoch || n.failed.CompareAndSwap(old, epoch) {
			return
		}
	}
}

// failedSince reports whether n failed (a read, or a lost connection)
// since it was picked from the view of poll epoch: a read picked just
// before a connection was lost may have been sent on its replacement, to
// a restarted server.
func (n *replicaNode) failedSince(epoch uint64) bool { return n.failed.Load() >= epoch }

// close closes the node's pools, its users' included.
func (n *replicaNode) close() {
	n.ownMu.Lock()
	n.closed = true
	own := n.own
	n.own = nil
	n.ownMu.Unlock()
	n.backend.Close()
	for _, b := range own {
		b.Close()
	}
}

func (rs *replicaSet) loop() {
	defer close(rs.done)
	t := time.NewTicker(rs.interval)
	defer t.Stop()
	for {
		select {
		case <-rs.stop:
			return
		case <-t.C:
			rs.poll()
		case done := <-rs.kick:
			rs.poll()
			close(done)
		}
	}
}

// restart forgets what the polls learned about the upstream's primary and
// replicas, when a reload has switched its pools to another address: until
// a poll of the new primary has named and checked its replicas, every read
// goes to the primary (read_from = "replica_preferred") or fails
// (read_from = "replica"). Without it, reads after the reload went on to
// the old primary's replicas until the next poll (found by review). It
// then asks for that poll at once and waits up to wait for it, as the
// first poll at start does, so read_from = "replica" has replicas again
// when Reload returns.
func (rs *replicaSet) restart(wait time.Duration) {
	rs.viewMu.Lock()
	rs.gen.Add(1)
	rs.view.Store(nil)
	rs.viewMu.Unlock()
	rs.pollNow(wait)
}

// timeout is upstream.reply_timeout in force for the replicas.
func (rs *replicaSet) timeout() time.Duration { return time.Duration(rs.replyTimeout.Load()) }

// reconfigure applies a reload that changed the upstream's pool options
// (connections, dial_timeout, reply_timeout, reconnect_*, [upstream.tls])
// to the replicas: reply_timeout at once, for reads and polls started
// after it; the replicas' pools, which only the poller touches, are
// switched (Backend.Switch) by the next poll, asked for now and waited
// for up to wait, as restart does. The pools' options come from
// nodeOptions, which reads the configuration in force.
func (rs *replicaSet) reconfigure(replyTimeout, wait time.Duration) {
	rs.replyTimeout.Store(int64(replyTimeout))
	rs.optsGen.Add(1)
	rs.pollNow(wait)
}

// switchNodes switches every replica's pools (its users' included) to the
// options in force, when a reload changed them since the last switch.
// Only the poller calls it.
func (rs *replicaSet) switchNodes() {
	g := rs.optsGen.Load()
	if g == rs.nodesGen {
		return
	}
	rs.nodesGen = g
	for _, n := range rs.nodes {
		n.backend.Switch(rs.optionsFor(n))
		n.ownMu.Lock()
		for primary, b := range n.own {
			o := rs.optionsFor(n)
			po := primary.Options(0, false)
			o.Username, o.Password = po.Username, po.Password
			b.Switch(o)
		}
		n.ownMu.Unlock()
	}
}

// pollNow asks the poller for a poll at once and waits up to wait for it.
func (rs *replicaSet) pollNow(wait time.Duration) {
	if rs.listReplicas != nil || rs.started.Load() == 0 {
		return // no poller of its own, or not started: its first poll comes
	}
	done := make(chan struct{})
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case rs.kick <- done:
	case <-t.C:
		return
	case <-rs.stop:
		return
	}
	select {
	case <-done:
	case <-t.C:
	}
}

// checkTimeout bounds one poll's wait for a server: a stalled replica must
// not hold up the offsets of the others for long.
func (rs *replicaSet) checkTimeout() time.Duration {
	return min(rs.timeout(), max(rs.maxLag, 4*rs.interval))
}

// poll reads the primary's offset, then every replica's, and publishes
// what it learned.
func (rs *replicaSet) poll() {
	rs.switchNodes()
	gen := rs.gen.Load()
	epoch := rs.started.Add(1)
	at := time.Now()
	if gen != rs.pollGen {
		// The primary's offsets before an address change are another
		// server's.
		rs.samples = rs.samples[:0]
		rs.pollGen = gen
	}
	primary, info, err := rs.primaryOffset()
	if ok := err == nil; ok != rs.primaryUp {
		rs.primaryUp = ok
		if ok {
			rs.log.Info("replica poll: the primary's replication offset is readable again; reads may go to replicas")
		} else {
			// Without the primary's offset no floor can be resolved: the
			// last view stays, and goes stale (pick) if this lasts.
			rs.log.Warn("replica poll: cannot read the primary's replication offset; reads go to the primary (replica_preferred) or fail (replica) until it can", "err", err)
		}
	}
	if err != nil {
		return
	}
	rs.sync(rs.discover(info))
	rs.samples = append(rs.samples, offsetSample{at: at, offset: primary})
	// Keep samples covering max_replica_lag: an older one says nothing
	// more (a replica behind it is skipped either way).
	cut := 0
	for cut < len(rs.samples)-1 && at.Sub(rs.samples[cut+1].at) > rs.maxLag {
		cut++
	}
	rs.samples = append(rs.samples[:0], rs.samples[cut:]...)

	v := &replicaView{epoch: epoch, gen: gen, at: at, primary: primary}
	type result struct {
		n      *replicaNode
		offset int64
		ok     bool
	}
	results := make(chan result, len(rs.nodes))
	replid := infoFields(info)["master_replid"]
	for _, n := range rs.nodes {
		go func() {
			off, ok := rs.checkReplica(n, replid)
			results <- result{n, off, ok}
		}()
	}
	for range rs.nodes {
		r := <-results
		if r.ok != r.n.up {
			rs.log.Info("replica usable for reads changed", "replica", r.n.addr, "usable", r.ok)
			r.n.up = r.ok
		}
		if !r.ok {
			continue
		}
		vn := viewNode{node: r.n, offset: r.offset}
		if r.offset < primary {
			vn.behindSince = rs.samples[0].at
			for _, s := range rs.samples {
				if s.offset > r.offset {
					vn.behindSince = s.at
					break
				}
			}
		}
		v.nodes = append(v.nodes, vn)
	}
	slices.SortFunc(v.nodes, func(a, b viewNode) int { return strings.Compare(a.node.addr, b.node.addr) })
	rs.viewMu.Lock()
	if rs.gen.Load() == gen {
		rs.view.Store(v)
	} // else a restart came during the poll: it may have asked the old primary
	rs.viewMu.Unlock()
}

// primaryOffset reads the primary's master_repl_offset, and returns the
// INFO it came in.
func (rs *replicaSet) primaryOffset() (int64, []byte, error) {
	info, err := rs.info(rs.primary, nil)
	if err != nil {
		return 0, nil, err
	}
	f := infoFields(info)
	if f["role"] != "master" {
		if rs.onRoleChange != nil {
			rs.onRoleChange()
		}
		return 0, nil, fmt.Errorf("the primary says role:%s (a failover?)", f["role"])
	}
	off, err := strconv.ParseInt(f["master_repl_offset"], 10, 64)
	if err != nil {
		return 0, nil, fmt.Errorf("no master_repl_offset in the primary's INFO replication: %w", err)
	}
	return off, info, nil
}

// checkReplica reads a replica's applied offset, if it replicates (role
// slave, link up, not syncing) the primary's history, replid, and answers
// within checkTimeout.
func (rs *replicaSet) checkReplica(n *replicaNode, replid string) (int64, bool) {
	info, err := rs.info(n.backend, n)
	if err != nil {
		return 0, false
	}
	f := infoFields(info)
	if f["role"] != "slave" || f["master_link_status"] != "up" || f["master_sync_in_progress"] == "1" {
		return 0, false
	}
	if replid != "" && f["master_replid"] != replid {
		// Offsets compare only within one replication history: right
		// after a failover a replica still following the demoted primary
		// counts that server's writes, and its offset passed the new
		// primary's floor without holding a client's write made there
		// (found by review). A replica takes its primary's replid once
		// in sync, chained ones too.
		return 0, false
	}
	off, err := strconv.ParseInt(f["slave_repl_offset"], 10, 64)
	return off, err == nil
}

var errStillPending = errors.New("the previous INFO is still unanswered")

// info runs INFO replication on a shared connection of b. n, for a
// replica, remembers an unanswered INFO so a stalled server is not sent
// one per poll.
func (rs *replicaSet) info(b *upstream.Backend, n *replicaNode) ([]byte, error) {
	var c *upstream.Call
	if n != nil && n.pending != nil {
		select {
		case <-n.pending.Done():
			c = n.pending
			n.pending = nil
			c.Reset()
		default:
			return nil, errStillPending
		}
	} else {
		c = upstream.NewCall()
	}
	c.Add(cmdInfoReplication)
	if err := b.Pool(0, false).Send(c); err != nil {
		return nil, err
	}
	t := time.NewTimer(rs.checkTimeout())
	defer t.Stop()
	select {
	case <-c.Done():
	case <-t.C:
		if n != nil {
			n.pending = c
		}
		return nil, upstream.ErrTimeout
	}
	r, err := c.Reply(0)
	if err != nil {
		return nil, err
	}
	if resp.IsError(r) {
		return nil, fmt.Errorf("INFO replication: %s", bytes.TrimSpace(r[1:]))
	}
	return r, nil
}

// infoFields reads the "name:value" lines of an INFO reply (a bulk
// string).
func infoFields(reply []byte) map[string]string {
	f := map[string]string{}
	if i := bytes.IndexByte(reply, '\n'); i >= 0 && len(reply) > 0 && reply[0] == '$' {
		reply = reply[i+1:]
	}
	for _, line := range bytes.Split(reply, []byte("\r\n")) {
		if k, v, ok := bytes.Cut(line, []byte(":")); ok && len(k) > 0 && k[0] != '#' {
			f[string(k)] = string(v)
		}
	}
	return f
}

// discover lists the replicas to read from: in Sentinel mode those the
// Sentinels name (SENTINEL REPLICAS, asked about once a second), else
// those connected to the primary, from its INFO replication.
func (rs *replicaSet) discover(primaryInfo []byte) []string {
	if rs.listReplicas != nil {
		return rs.listReplicas()
	}
	if w := rs.sentinel; w != nil {
		every := max(1, int(time.Second/rs.interval))
		if rs.polls%every == 0 {
			ctx, cancel := context.WithTimeout(context.Background(), rs.checkTimeout())
			list, err := w.Replicas(ctx)
			cancel()
			if err == nil {
				rs.listed = list
			} else {
				rs.log.Debug("replica poll: no Sentinel listed the replicas; keeping the last list", "err", err)
			}
		}
		rs.polls++
		return rs.listed
	}
	var addrs []string
	for k, v := range infoFields(primaryInfo) {
		if len(k) < 6 || k[:5] != "slave" || k[5] < '0' || k[5] > '9' {
			continue
		}
		var ip, port, state string
		for _, kv := range bytes.Split([]byte(v), []byte(",")) {
			name, val, _ := bytes.Cut(kv, []byte("="))
			switch string(name) {
			case "ip":
				ip = string(val)
			case "port":
				port = string(val)
			case "state":
				state = string(val)
			}
		}
		if ip != "" && port != "" && state == "online" {
			addrs = append(addrs, net.JoinHostPort(ip, port))
		}
	}
	return addrs
}

// sync opens pools to new replicas and closes those of replicas gone. A
// session still holding a closed one fails its read and goes to the
// primary.
func (rs *replicaSet) sync(addrs []string) {
	seen := make(map[string]bool, len(addrs))
	changed := false
	for _, a := range addrs {
		seen[a] = true
		if rs.nodes[a] != nil || a == rs.primary.Addr() {
			continue
		}
		n := &replicaNode{addr: a}
		n.backend = upstream.NewBackend(rs.optionsFor(n))
		rs.nodes[a] = n
		rs.log.Info("replica found", "replica", a)
		changed = true
	}
	for a, n := range rs.nodes {
		if !seen[a] || a == rs.primary.Addr() {
			delete(rs.nodes, a)
			rs.log.Info("replica gone", "replica", a)
			go n.close()
			changed = true
		}
	}
	if changed || rs.known.Load() == nil {
		known := make([]*replicaNode, 0, len(rs.nodes))
		for _, n := range rs.nodes {
			known = append(known, n)
		}
		slices.SortFunc(known, func(a, b *replicaNode) int { return strings.Compare(a.addr, b.addr) })
		rs.known.Store(&known)
	}
}

// ReplicaViewStarted is when the poll behind [upstream]'s current replica
// view started (zero before the first, or without replica reads). A view
// judges a replica by the primary's offset at that moment, so a test that
// needs a write taken into account waits for a view started after it.
func (s *Server) ReplicaViewStarted() time.Time {
	if s.replicas == nil {
		return time.Time{}
	}
	if v := s.replicas.view.Load(); v != nil {
		return v.at
	}
	return time.Time{}
}

// UsableReplicas is the number of replicas a client without writes could
// read from now; 0 when reads from replicas are off.
func (s *Server) UsableReplicas() int {
	return s.UsableReplicasOf(config.DefaultUpstream)
}

// UsableReplicasOf is UsableReplicas for upstream name ([upstream] is
// config.DefaultUpstream).
func (s *Server) UsableReplicasOf(name string) int {
	rs := s.replicas
	if s.creplicas != nil {
		return s.creplicas.usable(time.Now())
	}
	if s.routes != nil {
		rs = nil
		for _, t := range s.routes.targets {
			if t.name == name {
				rs = t.replicas
			}
		}
	}
	if rs == nil {
		return 0
	}
	return rs.usable(time.Now())
}

// usable counts the replicas a client without writes could read now.
func (rs *replicaSet) usable(now time.Time) int {
	v := rs.view.Load()
	if v == nil {
		return 0
	}
	n := 0
	for i := range v.nodes {
		if rs.fresh(v, &v.nodes[i], now) {
			n++
		}
	}
	return n
}

// fresh reports whether vn is within max_replica_lag now and has not
// failed a read since the poll of v started.
func (rs *replicaSet) fresh(v *replicaView, vn *viewNode, now time.Time) bool {
	since := vn.behindSince
	if since.IsZero() {
		since = v.at
	}
	return now.Sub(since) <= rs.maxLag && vn.node.failed.Load() < v.epoch
}

// pick chooses the replica for a read of the session, or nil for the
// primary, and returns the epoch of the view it was chosen from
// (replicaNode.failedSince). The session's last replica is kept while it
// qualifies; a new one is chosen by the session's id, spreading clients
// over the replicas.
func (rs *replicaSet) pick(rr *replicaReads, id int64, now time.Time) (*replicaNode, uint64) {
	v := rs.view.Load()
	if v == nil {
		return nil, 0
	}
	if rr.gen != v.gen {
		// The upstream's address changed since the client's floor was
		// set: that offset was the old primary's. needEpoch stays: a write
		// still waits for a poll started after it, which reads the new
		// primary's offset (restart).
		rr.gen, rr.floor, rr.last = v.gen, 0, nil
	}
	if rr.needEpoch != 0 {
		if v.epoch < rr.needEpoch {
			return nil, 0 // the primary's offset after the write is not known yet
		}
		rr.floor = max(rr.floor, v.primary)
		rr.needEpoch = 0
	}
	floor := rr.floor
	if noReadYourWrites.Load() {
		floor = 0
	}
	ok := func(vn *viewNode) bool { return vn.offset >= floor && rs.fresh(v, vn, now) }
	count := 0
	for i := range v.nodes {
		vn := &v.nodes[i]
		if ok(vn) {
			if vn.node == rr.last {
				return vn.node, v.epoch
			}
			count++
		}
	}
	if count == 0 {
		return nil, 0
	}
	k := int(uint64(id) % uint64(count))
	for i := range v.nodes {
		vn := &v.nodes[i]
		if ok(vn) {
			if k == 0 {
				rr.last = vn.node
				return vn.node, v.epoch
			}
			k--
		}
	}
	return nil, 0
}

// replicaCommand reports whether a replica may answer cmd: a read-only
// command that neither blocks nor carries state, and that does not depend
// on what this one server holds beyond the data (SCAN cursors belong to
// one server; EVALSHA_RO needs a script cache, which is not replicated).
func replicaCommand(cmd *commands.Command) bool {
	if cmd == nil || cmd.Flags&commands.ReadOnly == 0 || cmd.Flags&(commands.Write|commands.Admin|commands.PubSub|commands.ConnState|commands.Blocking) != 0 {
		return false
	}
	switch cmd.Name {
	case "scan", "sscan", "hscan", "zscan", "evalsha_ro":
		return false
	}
	return true
}

// replicaCandidate reports whether r, forwarded now, could be read from a
// replica. XREAD is flagged blocking and only blocks with BLOCK, so it is
// allowed without.
//
// A user with an upstream credential of its own reads replicas too, on
// pools with its credential (replicaNode.backendFor).
func (sess *Session) replicaCandidate(r *request) bool {
	if sess.pin.pipe != nil || r.blocking || r.cmd == nil || r.toPrimary {
		return false
	}
	if sess.srv.replicas == nil && sess.srv.creplicas == nil && !sess.routeToReplicas(r) {
		return false
	}
	if r.cmd.Name == "xread" {
		return true
	}
	return replicaCommand(r.cmd)
}

// replicaForwarded counts a command added to the batch's Call as a read a
// replica may serve (forwardCommand). Writes are noted by
// replicaWriteForwarded; a command the table does not know (a module's)
// may write too.
func (sess *Session) replicaForwarded(r *request) {
	switch {
	case sess.srv.replicas == nil && sess.srv.creplicas == nil:
	case sess.replicaCandidate(r):
		sess.reads.forwarded++
	case r.cmd == nil:
		sess.reads.wrote = true
	}
}

// replicaWriteForwarded notes a write on its way upstream (writeForwarded).
// With routes, routedDo notes each upstream's writes on shared
// connections itself; a write on a dedicated connection (a transaction, a
// blocking command) is noted here for every upstream, which is more than
// needed but never less.
func (sess *Session) replicaWriteForwarded() {
	switch {
	case sess.srv.replicas != nil:
		sess.reads.wrote = true
	case sess.srv.creplicas != nil:
		// Writes through the router are noted per shard (clusterReads.
		// Wrote); one on a dedicated connection, for every shard.
		if sess.pin.pipe != nil || sess.pin.inMulti || sess.cur.blocking || sess.cmulti.open {
			sess.reads.wrote = true
		}
	case sess.srv.routes != nil && sess.srv.routes.replicas:
		if sess.pin.pipe != nil || sess.pin.inMulti || sess.cur.blocking || sess.cmulti.open {
			sess.reads.wrote = true
		}
	}
}

// replicaBatchFlushed: every reply of the batch is in, so the client's
// writes have run; its reads wait for a poll started after now
// (batchFlushed).
func (sess *Session) replicaBatchFlushed() {
	if !sess.reads.wrote {
		return
	}
	sess.reads.wrote = false
	if sess.srv.creplicas != nil {
		sess.clusterReads().wroteEverywhere()
		return
	}
	if sess.srv.replicas != nil {
		sess.reads.needEpoch = sess.srv.replicas.started.Load() + 1
		return
	}
	for up, t := range sess.srv.routes.targets {
		if t.replicas != nil {
			sess.routeReads(up).needEpoch = t.replicas.started.Load() + 1
		}
	}
}

// replicaRelayWrote: the client's relay, which carried a command that may
// write, has ended with every reply in (relayWrites.end). Its reads wait
// for a poll started after now, as after a shared-path batch with a write:
// on every upstream with routes and every shard in cluster mode, since the
// relay's connection may have been any of them's.
func (sess *Session) replicaRelayWrote() {
	srv := sess.srv
	if srv.replicas == nil && srv.creplicas == nil && (srv.routes == nil || !srv.routes.replicas) {
		return
	}
	sess.reads.wrote = true
	sess.replicaBatchFlushed()
}

// sendUpstream sends the batch's Call on the shared connections of
// primary and waits for its replies; or, when every command in it is a
// read a replica may serve and read_from and read-your-writes allow, to
// one of primary's replicas. This is the one place a read picks its server
// (flush). The replicas are those of the proxy's own upstream, read with
// the credential of primary (the proxy's, or the client's user's own).
func (sess *Session) sendUpstream(call *upstream.Call, primary *upstream.Backend) {
	if rs := sess.srv.replicas; rs != nil {
		reads := int(sess.reads.forwarded) == call.Len()
		sess.reads.forwarded = 0
		if reads && sess.readOnReplica(rs, &sess.reads, call, primary) {
			return
		}
	}
	primary.Pool(sess.db, sess.resp3).Do(call)
}

// readOnReplica sends a Call of reads to a replica. It reports false when
// the primary is to answer it instead (and nothing was kept from the
// replica); true when call holds the replies or the error to give.
// rr is the client's read-your-writes state for rs's upstream; primary
// is the pools the client's commands use there, whose credential the
// replica's connections must have.
func (sess *Session) readOnReplica(rs *replicaSet, rr *replicaReads, call *upstream.Call, primary *upstream.Backend) bool {
	now := time.Now()
	node, epoch := rs.pick(rr, sess.id, now)
	if node == nil {
		// read_from = "replica" keeps reads off the primary, except those
		// read-your-writes sends there.
		if rs.mode == config.ReadReplica && rr.needEpoch == 0 && rs.usable(now) == 0 {
			rs.failed.Inc()
			call.Fail(errNoReplica)
			return true
		}
		rs.onPrimary.Inc()
		return false
	}
	rc := rs.calls.Get().(*replicaCall)
	rc.buf = rc.buf[:0]
	for i := range call.Len() {
		rc.buf = append(rc.buf, call.Part(i)...)
	}
	start := 0
	for i := range call.Len() {
		end := start + len(call.Part(i))
		rc.call.Add(rc.buf[start:end:end])
		start = end
	}
	rc.call.SetReplyLimit(call.ReplyLimit())
	err := node.backendFor(rs, primary).Pool(sess.db, sess.resp3).Send(rc.call)
	done := err == nil
	if done {
		if rc.timer == nil {
			rc.timer = time.NewTimer(rs.timeout())
		} else {
			rc.timer.Reset(rs.timeout())
		}
		select {
		case <-rc.call.Done():
			rc.timer.Stop()
			err = rc.call.Err()
		case <-rc.timer.C:
			// Given up: the pipe completes it some day, unseen; its
			// bytes are its own (buf), never reused.
			done = false
			err = upstream.ErrTimeout
		}
	}
	if err == nil && node.failedSince(epoch) {
		// A connection to the replica was lost after it was picked: the
		// read may have gone on the redialled one, to a restarted server
		// serving an old dataset (found by review). Its replies are not
		// used; the primary answers.
		err = errReplicaReconnected
	}
	// A replica loading its dataset (-LOADING) or cut off from its primary
	// with replica-serve-stale-data no (-MASTERDOWN) is not serving: the
	// read failed there, as in cluster mode (cluster/router.go,
	// replicaFailed). Before, its error reached the client as the read's
	// reply, though the primary held the value (found by review). With
	// read_from = "replica" the client gets the replica's replies, that
	// error among them, as it gets a failed read's error.
	refused := err == nil && replicaNotServing(rc.call)
	if err == nil && (!refused || rs.mode == config.ReadReplica) {
		copyReplies(call, rc.call)
		rr.answered = true
	}
	if refused {
		err = errReplicaNotServing
	}
	if done || err != upstream.ErrTimeout {
		rc.call.Reset()
		if cap(rc.buf) > 64<<10 {
			rc.buf = nil
		}
		rs.calls.Put(rc)
	}
	if err == nil {
		rs.onReplica.Inc()
		return true
	}
	node.markFailed(rs.started.Load())
	if rr.last == node {
		rr.last = nil
	}
	sess.logger().Debug("read on a replica failed; the primary answers it", "replica", node.addr, "err", err)
	if rs.mode == config.ReadReplica {
		rs.failed.Inc()
		if !refused {
			call.Fail(err)
		}
		return true
	}
	rs.fellBack.Inc()
	return false
}

var (
	replyLoading    = []byte("-LOADING")
	replyMasterDown = []byte("-MASTERDOWN")
)

// replicaNotServing reports whether a reply of c, answered by a replica,
// says the replica does not serve reads now: -LOADING or -MASTERDOWN.
func replicaNotServing(c *upstream.Call) bool {
	for i := range c.Len() {
		r, err := c.Reply(i)
		if err == nil && len(r) > 0 && r[0] == '-' && (bytes.HasPrefix(r, replyLoading) || bytes.HasPrefix(r, replyMasterDown)) {
			return true
		}
	}
	return false
}

// copyReplies fills dst, a Call never sent, with the replies of src.
func copyReplies(dst, src *upstream.Call) {
	for i := range src.Len() {
		r, err := src.Reply(i)
		if err != nil { // only ErrOutputLimit, src having completed
			dst.Overflow()
			r = nil
		}
		dst.AddReply(r)
	}
}
