package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"hash/fnv"
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
	"github.com/redproxy/redproxy/internal/resp"
	"github.com/redproxy/redproxy/internal/upstream"
)

// Options configure a Router.
type Options struct {
	// Seeds are the nodes asked for the slot map at start, and again
	// whenever the nodes the map names cannot answer.
	Seeds []string
	// Backend is the template for every node's connections; Addr is set
	// per node, Databases is 1 (a cluster has only DB 0).
	Backend upstream.BackendOptions
	// Table classifies the commands batches plan, or Tables, when set,
	// is asked for the table in force at each command: the proxy's
	// follows its upstream, and a router built before it read the
	// upstream's (a stand-in at start, the cluster upgraded since) must
	// plan with the one the sessions classify with.
	Table  *commands.Table
	Tables func() *commands.Table
	Logger *slog.Logger
	// RefreshInterval is how often the slot map is reloaded when nothing
	// (MOVED, a lost connection) asked for it sooner.
	RefreshInterval time.Duration
	// OnMap, when set, is called with each slot map a refresh loads (not
	// the single owner changes a MOVED records), on the goroutine of the
	// refresh, before the next one: it must not block.
	OnMap func(*Map)
	// NoStartWait makes New return without loading the slot map: the
	// refresher loads it at once, in the background. For seeds the caller
	// found silent (accepting, never answering), which would hold the
	// start back by reply_timeout.
	NoStartWait bool
	// Unanswered, when set, counts the commands the router answered with
	// an error of its own because no node did: no slot map, a node it
	// could not reach, a connection lost before the reply. Once per
	// command, however many slots it was split over. The proxy's
	// redproxy_route_errors_total of a named cluster upstream, which
	// counts a client's call over the output limit itself.
	Unanswered prometheus.Counter
}

// Router executes client batches against a Redis Cluster. It is safe for
// concurrent use by every session.
type Router struct {
	opt   Options
	table func() *commands.Table // Options.Tables, or one returning Options.Table
	log   *slog.Logger

	m atomic.Pointer[Map]

	nodesMu sync.Mutex
	nodes   map[string]*node

	refreshReq chan struct{}
	stop       chan struct{}
	workers    sync.WaitGroup
	refreshMu  sync.Mutex // one load at a time

	scripts scriptCache

	// keyless is the node keyless commands go to (keylessNode).
	keyless atomic.Pointer[string]
	// asking: the nodes a refresh asked whose answer is still due
	// (loadMap).
	asking sync.Map

	// departed, when set, hears of the nodes dropDeparted dropped.
	departed atomic.Pointer[func(addrs []string)]

	// asks is, per slot, the last ASK a node answered for it: the slot is
	// being migrated away from that node (see migrating).
	asks [Slots]atomic.Pointer[askMark]

	// Counters, for tests and metrics.
	moved, asked, retried atomic.Uint64
	// scanRestarts counts SCAN cursors made with another slot map whose
	// node's walk started again (planScan).
	scanRestarts atomic.Uint64
}

// node is one cluster node's shared connections, dialled on first use.
type node struct {
	once sync.Once
	b    atomic.Pointer[upstream.Backend] // nil until dialled
}

const (
	// maxRedirects bounds the MOVED and ASK replies one command follows: a
	// slot that keeps moving means the map is wrong in a way refreshing
	// does not fix, and the client should hear about it.
	maxRedirects = 5
	// maxRetries bounds the retries of TRYAGAIN, CLUSTERDOWN and a node
	// that cannot be reached; with the backoff below they cover about two
	// seconds, the usual length of a resharding step or an election.
	maxRetries    = 8
	retryBackoff  = 25 * time.Millisecond
	maxBackoff    = 500 * time.Millisecond
	minRefreshGap = 100 * time.Millisecond
)

// New builds a Router and loads the slot map from the seeds. A cluster
// none of whose seeds answers is not an error: the Router keeps trying in
// the background and is not Ready meanwhile.
func New(opt Options) *Router {
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	if opt.RefreshInterval <= 0 {
		opt.RefreshInterval = 10 * time.Second
	}
	opt.Backend.Databases = 1
	r := &Router{
		opt:        opt,
		log:        opt.Logger,
		nodes:      map[string]*node{},
		refreshReq: make(chan struct{}, 1),
		stop:       make(chan struct{}),
	}
	r.table = opt.Tables
	if r.table == nil {
		t := opt.Table
		r.table = func() *commands.Table { return t }
	}
	if opt.NoStartWait {
		r.refreshSoon()
	} else if err := r.Refresh(); err != nil {
		r.log.Warn("cluster: no slot map at start; retrying in the background", "seeds", opt.Seeds, "err", err)
	}
	r.workers.Add(1)
	go r.refresher()
	return r
}

// Seeds are the nodes asked for the slot map when the map's own cannot
// answer (Options.Seeds).
func (r *Router) Seeds() []string { return slices.Clone(r.opt.Seeds) }

// Table is the command table in force for the commands planned now.
func (r *Router) Table() *commands.Table { return r.table() }

// Map is the slot map in use, or nil before one was loaded.
func (r *Router) Map() *Map { return r.m.Load() }

// OwnerTag names the node that owns slot s in the map in use by a 32-bit
// hash of its address (FNV-1a), never 0; 0 when no map or no owner. Two
// tags taken at different times differ when the slot changed owner in
// between (a failover, a reshard), bar a 1 in 2^31 collision: the proxy
// keeps a client's in 4 bytes of its session (Session.wroteOwner).
func (r *Router) OwnerTag(s int) uint32 {
	m := r.m.Load()
	if m == nil || s < 0 || s >= Slots {
		return 0
	}
	addr := m.Owner(s)
	if addr == "" {
		return 0
	}
	h := uint32(2166136261)
	for i := 0; i < len(addr); i++ {
		h ^= uint32(addr[i])
		h *= 16777619
	}
	return h | 1
}

// AnyNode is a primary of the current map, or the first seed when no map
// is loaded.
func (r *Router) AnyNode() string {
	if m := r.m.Load(); m != nil {
		if addr := r.keylessNode(m); addr != "" {
			return addr
		}
	}
	return r.opt.Seeds[0]
}

// keylessNode is where commands of no key go (PUBLISH, PUBSUB, a classic
// SUBSCRIBE's relay, PING, ...): the primary chosen the first time, for as
// long as m has it serving slots, else the primary of the lowest slot,
// chosen anew. Following the lowest slot's owner itself moved classic
// PUBLISH away from the subscribers' node whenever slot 0 was resharded:
// PUBLISH and PUBSUB NUMSUB counted none of them, and one publisher's
// messages could be reordered at the move, one over the cluster bus and
// the next straight to the subscribers' node (found by the cluster soak).
// A primary the cluster flagged as failed is left for the first that is
// not (or ps[0] if all are): it keeps its slots while no replica takes
// over, and PING, PUBLISH and every keyless command failed for as long
// as it stayed in the map. "" when m has no primary.
func (r *Router) keylessNode(m *Map) string {
	live := m.LivePrimaries()
	if cur := r.keyless.Load(); cur != nil && slices.Contains(live, *cur) {
		return *cur
	}
	if len(live) == 0 {
		live = m.Primaries()
	}
	if len(live) == 0 {
		return ""
	}
	addr := live[0]
	r.keyless.Store(&addr)
	return addr
}

// Refresh reloads the slot map now from the nodes of the current map and
// the seeds.
func (r *Router) Refresh() error {
	r.refreshMu.Lock()
	defer r.refreshMu.Unlock()
	cur := r.m.Load()
	var addrs []string
	if cur != nil {
		addrs = cur.nodes()
	}
	addrs = append(addrs, r.opt.Seeds...)
	m, err := loadMap(r.baseOptions(), addrs, cur, &r.asking)
	if err != nil {
		return err
	}
	if cur == nil || cur.fingerprint() != m.fingerprint() {
		r.log.Info("cluster: slot map loaded", "primaries", m.Primaries())
	}
	r.m.Store(m)
	r.dropDeparted(cur, m)
	r.cutNewlyFailed(cur, m)
	if r.opt.OnMap != nil {
		r.opt.OnMap(m)
	}
	return nil
}

func (r *Router) baseOptions() upstream.Options {
	b := r.opt.Backend
	// DeadTimeout is RoundTrip's wait for the reply, and loadMap waits
	// for every node asked: with dead_timeout (30 s by default) one node
	// that took the handshake and froze held each refresh that long. A
	// node answers CLUSTER SHARDS at once, or, busy with a script, -BUSY
	// once busy-reply-threshold (5 s) has passed: reply_timeout is enough.
	return upstream.Options{
		Username: b.Username, Password: b.Password, TLS: b.TLS,
		DialTimeout: b.DialTimeout, ReplyTimeout: b.ReplyTimeout, DeadTimeout: b.ReplyTimeout,
		Logger: r.log,
	}
}

// RefreshSoon asks for a reload of the slot map without waiting for it:
// something outside the router (the local tier's heartbeat) saw a node
// change role.
func (r *Router) RefreshSoon() { r.refreshSoon() }

// refreshSoon asks the refresher for a reload without waiting for it.
func (r *Router) refreshSoon() {
	select {
	case r.refreshReq <- struct{}{}:
	default:
	}
}

func (r *Router) refresher() {
	defer r.workers.Done()
	retry := noMapRetry
	for {
		// With no map yet (the cluster down or silent at the start) the
		// router serves nothing: it asks again soon, backing off, not a
		// whole RefreshInterval after the cluster came up (found by
		// review: a proxy started before its cluster served nothing for
		// up to 10 s after it answered).
		wait := r.opt.RefreshInterval
		if r.m.Load() == nil {
			wait, retry = min(retry, wait), min(2*retry, wait)
		}
		t := time.NewTimer(wait)
		select {
		case <-r.stop:
			t.Stop()
			return
		case <-t.C:
		case <-r.refreshReq:
			t.Stop()
		}
		if err := r.Refresh(); err != nil {
			r.log.Warn("cluster: slot map refresh failed; keeping the current one", "err", err)
		}
		// A burst of MOVED replies asks for one reload, not one each.
		select {
		case <-r.stop:
			return
		case <-time.After(minRefreshGap):
		}
	}
}

// noMapRetry is the first wait before the slot map is asked for again
// while none was loaded; it doubles up to RefreshInterval.
const noMapRetry = 100 * time.Millisecond

// backend returns addr's connections, dialling them the first time.
func (r *Router) backend(addr string) *upstream.Backend {
	r.nodesMu.Lock()
	n := r.nodes[addr]
	if n == nil {
		n = &node{}
		r.nodes[addr] = n
	}
	r.nodesMu.Unlock()
	n.once.Do(func() {
		o := r.opt.Backend
		o.Addr = addr
		// A node that stopped answering (hung, its host frozen or cut
		// off) sends no MOVED and drops no connection: only a reload
		// finds that its replica took over. Without this, the periodic
		// one (RefreshInterval) was the only one.
		o.OnOverdue = r.refreshSoon
		// A dead node fails the dials of transactions, blocking commands
		// and relays, which send nothing through the router's batches
		// (whose failures ask for a reload): without this they failed
		// until the periodic reload, up to 10 s after its replica took
		// over, where plain commands recovered in under a second (found
		// by a probe).
		o.OnDedicatedUnavailable = r.refreshSoon
		if o.Pins != nil {
			// Each node may hold upstream.max_pinned dedicated
			// connections: with one limit for all, a node that hangs
			// let its waiting transactions take every one, and the
			// other nodes' were refused (PinLimit.Child).
			o.Pins = o.Pins.Child()
		}
		n.b.Store(upstream.NewBackend(o))
	})
	return n.b.Load()
}

// dropDeparted closes the connections of the nodes m no longer names
// (removed with CLUSTER FORGET, or gone from every node's view), so the
// proxy stops dialling them and their metrics go away. A node that comes
// back is dialled afresh when a map or a redirection names it again. The
// OnDeparted listener hears of those nodes and of any other the previous
// map cur named: the tier may track a node the router never dialled.
func (r *Router) dropDeparted(cur, m *Map) {
	keep := map[string]bool{}
	for _, a := range m.nodes() {
		keep[a] = true
	}
	var gone []*node
	var addrs []string
	r.nodesMu.Lock()
	for a, n := range r.nodes {
		if !keep[a] {
			gone = append(gone, n)
			addrs = append(addrs, a)
			delete(r.nodes, a)
		}
	}
	r.nodesMu.Unlock()
	left := slices.Clone(addrs)
	if cur != nil {
		for _, a := range cur.nodes() {
			if !keep[a] && !slices.Contains(left, a) {
				left = append(left, a)
			}
		}
	}
	if f := r.departed.Load(); f != nil && len(left) > 0 {
		(*f)(left)
	}
	if len(gone) == 0 {
		return
	}
	r.log.Info("cluster: nodes left the slot map; closing their connections", "nodes", addrs)
	for _, n := range gone {
		n.once.Do(func() {})
		if b := n.b.Load(); b != nil {
			// Transactions and relays there end: their clients see the
			// connection lost, as when a node dies.
			b.CutDedicated()
			b.Close()
		}
	}
}

// OnDeparted makes f hear of the nodes that left the slot map, once the
// router has forgotten them (before it closes its own connections to
// them), on the goroutine of the refresh: it must not block. Connections
// others keep to the nodes (the local tier's) would dial a removed node
// for as long as the proxy runs.
func (r *Router) OnDeparted(f func(addrs []string)) { r.departed.Store(&f) }

// cutNewlyFailed severs the dedicated connections and relays of the
// primaries m flags as failed and cur did not: the node stays in the map
// (it keeps its slots while no replica takes over), so dropDeparted does
// not cut them, and a node that hangs without closing its sockets (a host
// frozen or cut off) left classic subscribers relayed to it hearing
// nothing, their connection open, while PUBLISH had moved to a live
// primary (keylessNode). Cut, their clients see the connection lost, as
// when a node dies, and subscribe again where the keyless node now is.
// Shared connections stay: their commands fail on their own timeouts, and
// those of a node that comes back are served again.
func (r *Router) cutNewlyFailed(cur, m *Map) {
	for _, a := range m.failed {
		if cur != nil && cur.Failed(a) {
			continue
		}
		r.nodesMu.Lock()
		n := r.nodes[a]
		r.nodesMu.Unlock()
		if n == nil {
			continue
		}
		if b := n.b.Load(); b != nil {
			r.log.Warn("cluster: the cluster flagged a primary as failed; cutting its dedicated connections and relays", "node", a)
			b.CutDedicated()
		}
	}
}

// Nodes are the addresses of the nodes the Router has connections for,
// in no particular order.
func (r *Router) Nodes() []string {
	r.nodesMu.Lock()
	defer r.nodesMu.Unlock()
	out := make([]string, 0, len(r.nodes))
	for a, n := range r.nodes {
		if n.b.Load() != nil {
			out = append(out, a)
		}
	}
	return out
}

// NodeBackend is one node's connections, as Backends lists them.
type NodeBackend struct {
	Addr    string
	Primary bool // it owns slots in the map in force
	Backend *upstream.Backend
}

// Backends are the nodes the Router has connections for: the primaries of
// the map in the order of the lowest slot each owns, then the others by
// address. A primary without connections yet (no command has gone to it)
// has them made, as Ready does, so that every primary is listed.
func (r *Router) Backends() []NodeBackend {
	var primaries []string
	if m := r.m.Load(); m != nil {
		primaries = m.Primaries()
	}
	out := make([]NodeBackend, 0, len(primaries))
	for _, a := range primaries {
		out = append(out, NodeBackend{Addr: a, Primary: true, Backend: r.backend(a)})
	}
	var others []NodeBackend
	r.nodesMu.Lock()
	for a, n := range r.nodes {
		if b := n.b.Load(); b != nil && !slices.Contains(primaries, a) {
			others = append(others, NodeBackend{Addr: a, Backend: b})
		}
	}
	r.nodesMu.Unlock()
	slices.SortFunc(others, func(x, y NodeBackend) int { return strings.Compare(x.Addr, y.Addr) })
	return append(out, others...)
}

// Describe and Collect make the Router a Prometheus collector of every
// node's upstream metrics, labelled with the node: the nodes of the slot
// map only, so the series are bounded by the cluster's size, and a
// departed node's series end with it (dropDeparted).
// With a shared limit of dedicated connections (Options.Backend.Pins),
// the clients every node refused at it are counted unlabelled.
func (r *Router) Describe(ch chan<- *prometheus.Desc) {
	upstream.DescribeNodeMetrics(ch)
	if r.opt.Backend.Pins != nil {
		upstream.DescribeRefused(ch)
	}
}

// Collect: see Describe.
func (r *Router) Collect(ch chan<- prometheus.Metric) {
	type live struct {
		addr string
		b    *upstream.Backend
	}
	var nodes []live
	r.nodesMu.Lock()
	for a, n := range r.nodes {
		if b := n.b.Load(); b != nil {
			nodes = append(nodes, live{a, b})
		}
	}
	r.nodesMu.Unlock()
	for _, n := range nodes {
		n.b.CollectNodeMetrics(ch, n.addr)
	}
	if p := r.opt.Backend.Pins; p != nil {
		p.CollectRefused(ch)
	}
}

// Ready reports whether a complete slot map is loaded and every primary in
// it has a connection up, but for those the cluster flagged as failed, of
// which there must be fewer than all. A failed primary keeps its slots
// while no replica takes over, and every instance of the proxy sees it
// down alike: counted, it made /readyz answer 503 on all of them, and a
// load balancer withdrew every instance, failing the slots still served
// too (cluster-require-full-coverage no), as named upstreams do not
// (Server.Ready).
func (r *Router) Ready() bool {
	m := r.m.Load()
	if m == nil || !m.complete() {
		return false
	}
	live := m.LivePrimaries()
	for _, a := range live {
		if !r.backend(a).Pool(0, false).Up() {
			return false
		}
	}
	return len(live) > 0
}

// Close stops the refresher and closes every node's connections.
func (r *Router) Close() {
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	r.workers.Wait()
	r.nodesMu.Lock()
	nodes := r.nodes
	r.nodes = map[string]*node{}
	r.nodesMu.Unlock()
	for _, n := range nodes {
		n.once.Do(func() {})
		if b := n.b.Load(); b != nil {
			b.Close()
		}
	}
}

// Stats are the redirections the Router followed for its clients.
func (r *Router) Stats() (moved, asked, retried uint64) {
	return r.moved.Load(), r.asked.Load(), r.retried.Load()
}

// ScanRestarts is how many SCAN walks started again from the node under
// way because the slot map changed since their cursor was made.
func (r *Router) ScanRestarts() uint64 { return r.scanRestarts.Load() }

// Errors the Router answers with itself, in Redis Cluster's words where
// Redis Cluster has them.
var (
	errCrossSlot       = []byte("-CROSSSLOT Keys in request don't hash to the same slot\r\n")
	errClusterDisabled = []byte("-ERR This instance has cluster support disabled\r\n")
	errBadCursor       = []byte("-ERR invalid cursor\r\n")
	errSlotUnserved    = []byte("-CLUSTERDOWN Hash slot not served\r\n")
	replyOK            = []byte("+OK\r\n")
	cmdAsking          = resp.AppendCommandStrings(nil, "ASKING")
)

// ErrTooManyRedirects: a command was redirected more than maxRedirects
// times.
var ErrTooManyRedirects = errors.New("redproxy: too many cluster redirections")

var errTooManyRedirects = []byte("-TRYAGAIN " + ErrTooManyRedirects.Error() + "\r\n")

// errRanAfter answers a command redirected (or not sent) after a later
// command of its slot in the client's batch ran: following it would run it
// after that one.
var errRanAfter = []byte("-TRYAGAIN redproxy: the slot is moving and a later command of it already ran\r\n")

func errorFrame(err error) []byte {
	return []byte("-ERR " + err.Error() + "\r\n")
}

// finishUnanswered answers sub i with err, the reason no node answered it,
// for opUnanswered to count.
func (b *batch) finishUnanswered(i int, err error) {
	b.finish(i, errorFrame(err))
	b.subs[i].unanswered = true
}

// opUnanswered reports whether op i's reply holds an error of the
// router's own because no node answered (a sub of it, or the op itself):
// counted once per command, as the proxy counts the commands it routes,
// however many slots or nodes the command was split over or tries it took.
func (b *batch) opUnanswered(i int) bool {
	o := &b.ops[i]
	if o.local != nil {
		return o.unanswered
	}
	for k := o.first; k < o.first+o.n; k++ {
		if b.subs[k].unanswered {
			return true
		}
	}
	return false
}

// Reads lets the reads of a batch go to replicas (DoReads). The proxy's
// session implements it with its read-your-writes state per shard.
type Reads interface {
	// Replica is the connections of the replica a read of a slot that
	// primary serves goes to (in READONLY mode), or nil for the primary;
	// refusal, when not nil, is the read's reply instead.
	Replica(primary string) (replica *upstream.Backend, refusal []byte)
	// Failed: a read sent to replica failed with err, or had no reply in
	// ReplyTimeout. toPrimary says to send it to the slot's primary;
	// otherwise its reply is the error.
	Failed(replica *upstream.Backend, err error) (toPrimary bool)
	// Reconnected reports whether a connection to replica was lost since
	// Replica picked it for the batch: the read may have been sent on the
	// redialled one, to a restarted server serving an old dataset, so its
	// replies are not used (a failed read).
	Reconnected(replica *upstream.Backend) bool
	// Wrote: a command that may write was sent to primary.
	Wrote(primary string)
	// ReplyTimeout bounds the wait for a replica's replies.
	ReplyTimeout() time.Duration
}

// Do executes every command of c against the cluster and fills c's replies
// in c's order. Commands for different nodes travel concurrently, each
// node's share in c's order on one of its shared connections, so commands
// on one key (one slot, one node) run in the order the client sent them.
// A redirected command is resent after the batch's first round; see
// docs/COMPATIBILITY.md for what that means for ordering.
func (r *Router) Do(c *upstream.Call, resp3 bool) { r.DoReads(c, resp3, nil, false) }

// DoReads is Do with replicas: when onlyReads (every command of c is a
// read a replica may serve), each keyed command goes where reads.Replica
// says, and back to its slot's primary when that replica fails, is late,
// or answers MOVED; otherwise every node a command goes to is reported to
// reads.Wrote. reads nil is Do.
func (r *Router) DoReads(c *upstream.Call, resp3 bool, reads Reads, onlyReads bool) {
	b := batchPool.Get().(*batch)
	b.reset(r, resp3, c.Len())
	b.reads, b.onlyReads = reads, onlyReads && reads != nil
	b.pauseReads = c.OnlyReads()
	// The node calls share the client's Call's limit (one budget), so a
	// client's replies cannot grow past a few times its output limit here.
	// (Not the Call's own budget, when routes split it first: the replies
	// are counted there again as they are added to it.)
	b.limit = c.ReplyLimit()
	b.budget.Store(0)
	b.table = r.table()
	for i := range b.ops {
		b.plan(i, c.Part(i))
	}
	b.placeGroups()
	b.run()
	if b.overflow {
		// A node's share did not fit: the client's replies do not either.
		c.Overflow()
	}
	for i := range b.ops {
		if b.overflow {
			c.AddReply(nil) // dropped: no need to merge it
			continue
		}
		if u := r.opt.Unanswered; u != nil && b.opUnanswered(i) {
			u.Inc()
		}
		b.addReply(c, i)
	}
	b.reset(nil, false, 0)
	batchPool.Put(b)
}

// batchPool keeps batches and their buffers between a session's batches,
// so a batch through the router costs no allocation for its bookkeeping.
var batchPool = sync.Pool{New: func() any { return new(batch) }}

// maxKeptArena bounds the reply buffer a pooled batch keeps.
const maxKeptArena = 1 << 20

func (b *batch) reset(r *Router, resp3 bool, n int) {
	b.r, b.resp3, b.table = r, resp3, nil
	if cap(b.ops) < n {
		b.ops = make([]op, n)
	} else {
		clear(b.ops[:cap(b.ops)])
		b.ops = b.ops[:n]
	}
	clear(b.subs)
	b.subs = b.subs[:0]
	clear(b.args)
	b.args = b.args[:0]
	b.arena = b.arena[:0]
	if cap(b.arena) > maxKeptArena {
		b.arena = nil
	}
	b.open, b.groups = 0, 0
	b.limit, b.overflow = 0, false
	b.reads, b.onlyReads, b.pauseReads = nil, false, false
	clear(b.ran)
}

// op is one command of the client's batch.
type op struct {
	local []byte // answered without Redis
	// unanswered: local is the error of a command no node could be
	// asked (no slot map), counted in Options.Unanswered.
	unanswered bool
	// Its commands to nodes are batch.subs[first:first+n]: an op's subs
	// are added one after the other.
	first, n int
	merge    mergeKind
	// pos[k] locates key k's element of a split MGET: sub, element.
	pos [][2]int
	// scan is the part of a SCAN walk the command makes.
	scan scanWalk
}

type mergeKind uint8

const (
	mergeOne          mergeKind = iota // one sub-command, its reply as is
	mergeMGET                          // array elements put back in key order
	mergeSum                           // integers added (DEL, EXISTS, DBSIZE, ...)
	mergeAllOK                         // the first reply if none failed, else the first error
	mergeConcat                        // arrays concatenated (KEYS)
	mergeFirstNonNull                  // RANDOMKEY
	mergeAllOnes                       // SCRIPT EXISTS: 1 only where every primary has it
	mergeScan                          // SCAN: the node's cursor rewritten
)

// sub is one command sent to one node.
type sub struct {
	raw  []byte
	slot int    // -1 for a keyless command
	to   string // a fixed node (fan-out); "" routes by slot
	// redirect is where the next try goes after MOVED or ASK.
	redirect  string
	asking    bool
	sentTo    string
	redirects int
	retries   int
	// group numbers the transaction (MULTI ... EXEC in one batch) the sub
	// belongs to, from 1; 0 for none. A group goes to one node as a whole.
	group int
	// primaryOnly: a replica failed this read; it goes to the primary.
	primaryOnly bool
	// mayWrite: the command may write (or is unknown), for Reads.Wrote.
	mayWrite bool
	// sha is the script an EVALSHA runs; preload, when set, is the
	// SCRIPT LOAD sent before it on its next try (after NOSCRIPT).
	sha     string
	preload []byte
	// The final reply is batch.arena[rstart:rend] once done.
	rstart, rend int
	done         bool
	// unanswered: the final reply is the router's error because no node
	// answered (batch.unanswered).
	unanswered bool
}

type batch struct {
	r     *Router
	table *commands.Table // the router's table when the batch began: one per batch
	resp3 bool
	ops   []op
	subs  []sub
	args  [][]byte
	keys  []int
	// arena holds the subs' replies back to back.
	arena []byte
	// calls are the node calls of a round, kept for the next.
	calls, spare []*nodeCall
	// limit caps the node calls' replies together (budget); overflow is
	// set when one did not fit.
	limit    int
	overflow bool
	budget   atomic.Int64 // shared by the node calls (SetReplyBudget)
	// open is the group a MULTI started and no EXEC or DISCARD ended yet;
	// groups counts them.
	open, groups int
	// reads and onlyReads: see DoReads. timer bounds a round's wait for
	// replicas.
	reads     Reads
	onlyReads bool
	// pauseReads: every command of the client's Call is one Redis answers
	// during CLIENT PAUSE WRITE (upstream.Call.AddRead), and so is each
	// node's share of it, which may then go to a node pool's spare
	// connection while its shared ones wait.
	pauseReads bool
	timer      *time.Timer
	mayWrite   bool // the command being planned may write
	// ran maps a slot to the highest sub of it that ran (or may have: its
	// reply was lost), in any round and node call of the batch.
	ran map[int]int
}

func (b *batch) add(o *op, s sub) {
	s.mayWrite = b.mayWrite
	if o.n == 0 {
		o.first = len(b.subs)
	}
	o.n++
	b.subs = append(b.subs, s)
}

// subReply is sub i's final reply.
func (b *batch) subReply(i int) []byte { return b.arena[b.subs[i].rstart:b.subs[i].rend] }

// plan decides where command i goes and how its replies combine.
func (b *batch) plan(i int, raw []byte) {
	o := &b.ops[i]
	var err error
	b.args, err = resp.SplitCommand(raw, b.args[:0])
	if err != nil || len(b.args) == 0 {
		o.local = errorFrame(resp.ErrProtocol)
		return
	}
	cmd := b.table.Lookup(b.args)
	b.mayWrite = mayWrite(cmd)
	if cmd == nil {
		// Unknown to the proxy: let a node say what it makes of it.
		b.add(o, sub{raw: raw, slot: -1, group: b.open})
		return
	}
	name := cmd.Name
	if b.open != 0 || name == "multi" {
		b.planQueued(o, raw, cmd)
		return
	}
	if cmd.Parent != nil && cmd.Parent.Name == "cluster" || name == "cluster" {
		o.local = errClusterDisabled
		return
	}
	switch name {
	case "asking", "readonly", "readwrite":
		// On a shared connection ASKING would apply to another client's
		// next command; the proxy follows ASK itself, so these are no-ops.
		o.local = replyOK
		return
	case "scan":
		b.planScan(o, raw)
		return
	}
	if k, ok := fanOut[name]; ok {
		b.r.scripts.note(name, b.args)
		o.merge = k
		m := b.r.m.Load()
		if m == nil {
			o.local, o.unanswered = errorFrame(ErrNoTopology), true
			return
		}
		for _, a := range m.Primaries() {
			b.add(o, sub{raw: raw, slot: -1, to: a})
		}
		if o.n == 0 {
			o.local = errSlotUnserved
		}
		return
	}
	b.keys = SlotArgs(cmd, b.args, b.keys[:0])
	if len(b.keys) == 0 {
		b.add(o, sub{raw: raw, slot: -1, sha: b.r.scripts.note(name, b.args)})
		return
	}
	slot := Slot(b.args[b.keys[0]])
	same := true
	for _, k := range b.keys[1:] {
		if Slot(b.args[k]) != slot {
			same = false
			break
		}
	}
	if same {
		b.add(o, sub{raw: raw, slot: slot, sha: b.r.scripts.note(name, b.args)})
		return
	}
	switch name {
	case "mget":
		b.split(o, mergeMGET, 1)
	case "del", "unlink", "exists", "touch":
		b.split(o, mergeSum, 1)
	case "mset":
		b.split(o, mergeAllOK, 2)
	default:
		o.local = errCrossSlot
	}
}

// mayWrite reports whether cmd may change data: a write, a script that
// is not read-only, or a command the table does not know.
func mayWrite(cmd *commands.Command) bool {
	if cmd == nil || cmd.Flags&commands.Write != 0 {
		return true
	}
	return cmd.Parent == nil && cmd.Flags&commands.CatScripting != 0 && cmd.Flags&commands.ReadOnly == 0
}

// planQueued adds a command of a transaction as it is, never split nor
// answered locally: the node queues it, and its reply is +QUEUED or a
// queue-time error. The group's node is the one of its first key (Do).
func (b *batch) planQueued(o *op, raw []byte, cmd *commands.Command) {
	if cmd.Name == "multi" && b.open == 0 {
		b.groups++
		b.open = b.groups
	}
	slot := -1
	if b.keys = cmd.Keys(b.args, b.keys[:0]); len(b.keys) > 0 {
		slot = Slot(b.args[b.keys[0]])
	}
	b.add(o, sub{raw: raw, slot: slot, group: b.open})
	if cmd.Name == "exec" || cmd.Name == "discard" {
		b.open = 0
	}
}

// placeGroups sends every command of a group to the node of the group's
// first key (or, with none, wherever keyless commands go).
func (b *batch) placeGroups() {
	if b.groups == 0 {
		return
	}
	slots := make([]int, b.groups+1)
	for i := range slots {
		slots[i] = -1
	}
	for _, s := range b.subs {
		if s.group != 0 && slots[s.group] < 0 {
			slots[s.group] = s.slot
		}
	}
	for i := range b.subs {
		if g := b.subs[i].group; g != 0 {
			b.subs[i].slot = slots[g]
		}
	}
}

// fanOut lists the keyless commands that go to every primary, and how
// their replies combine.
var fanOut = map[string]mergeKind{
	"dbsize":           mergeSum,
	"keys":             mergeConcat,
	"randomkey":        mergeFirstNonNull,
	"flushall":         mergeAllOK,
	"flushdb":          mergeAllOK,
	"script|load":      mergeAllOK,
	"script|flush":     mergeAllOK,
	"script|exists":    mergeAllOnes,
	"function|load":    mergeAllOK,
	"function|delete":  mergeAllOK,
	"function|flush":   mergeAllOK,
	"function|restore": mergeAllOK,
}

// splitScanGroups is how many groups split finds a key's among by a scan.
const splitScanGroups = 16

// split sends one command per slot of a multi-key command whose keys are
// args[1], args[1+stride], ... (with stride-1 values after each key), in
// the order each slot first appears.
func (b *batch) split(o *op, k mergeKind, stride int) {
	o.merge = k
	if (len(b.args)-1)%stride != 0 {
		o.local = []byte("-ERR wrong number of arguments for '" + string(bytes.ToLower(b.args[0])) + "' command\r\n")
		return
	}
	name := b.args[0]
	var groups [][][]byte // per sub: arguments after the name
	var slots []int
	// index maps a slot to its group + 1 once there are more groups than
	// a scan of them is cheap for: scanned, a million-key MGET cost up to
	// 16,384 comparisons a key, seconds of the proxy's core while other
	// clients waited (found by a probe; BenchmarkSplitMGET).
	var index []int32
	for i := 1; i < len(b.args); i += stride {
		s := Slot(b.args[i])
		g := -1
		if index != nil {
			g = int(index[s]) - 1
		} else {
			for j, gs := range slots {
				if gs == s {
					g = j
					break
				}
			}
		}
		if g < 0 {
			g = len(groups)
			groups = append(groups, nil)
			slots = append(slots, s)
			switch {
			case index != nil:
				index[s] = int32(g + 1)
			case len(slots) > splitScanGroups:
				index = make([]int32, Slots)
				for j, gs := range slots {
					index[gs] = int32(j + 1)
				}
			}
		}
		if k == mergeMGET {
			o.pos = append(o.pos, [2]int{g, len(groups[g])})
		}
		groups[g] = append(groups[g], b.args[i:i+stride]...)
	}
	for g, args := range groups {
		raw := resp.AppendCommand(nil, append([][]byte{name}, args...)...)
		b.add(o, sub{raw: raw, slot: slots[g]})
	}
}

// Scan cursors carry, from the low bits up: a slot (14 bits), a hash
// (10 bits), a base (6 bits, in steps of 256 slots), a holes bit and the
// node's own cursor (33 bits).
//
// A walk with base b visits the primaries serving slots from b on, in the
// order of the lowest such slot each serves, and keeps each one's keys of
// slots from b on; the cursor's slot is the node's lowest from b on, so it
// names the node and says that every slot below it is walked, but for
// slots no primary served when the walk went past them (the holes bit
// says there were some). A walk starts with base 0: every primary walked
// whole, once.
//
// The hash is that of what the cursor relies on (scanHash): which slots
// from b on the primaries already walked, and the one under way, serve,
// and which have no primary. While that holds, nothing is skipped or
// walked twice; moves among primaries not yet walked (a resharding ahead
// of the walk) change nothing it relies on and cost nothing, nor do moves
// below the base. When it changes, the order the walk followed is gone: a
// slot moved to a primary already walked would be skipped, and a
// failover's new primary cannot take the old one's cursor, a position in
// another process's hash table (found by review: 9,992 and 1,592 of
// 30,000 keys that never moved were missed). What still holds is that
// every slot below the cursor's was walked, so the walk starts again with
// its base at that slot (rounded down to 256), or at its base if it went
// past holes, which may be served now: the node under way and those after
// it are walked again, keys already returned may come again (SCAN allows
// it), and none that stayed put is missed. One change costs at most one
// more walk of each primary, however many separate slot ranges each
// serves.
const (
	cursorSlotBits = 14
	cursorHashBits = 10
	cursorBaseBits = 6
	cursorBaseLow  = cursorSlotBits + cursorHashBits
	cursorHolesBit = cursorBaseLow + cursorBaseBits
	cursorNodeLow  = cursorHolesBit + 1
	scanBaseStep   = Slots >> cursorBaseBits
	maxNodeCursor  = 1<<(64-cursorNodeLow) - 1
	cursorSlotMask = 1<<cursorSlotBits - 1
	cursorHashMask = 1<<cursorHashBits - 1
	cursorBaseMask = 1<<cursorBaseBits - 1
	// scanHashesCached bounds the hashes a map keeps (scanHash): one per
	// base and primary's lowest slot from it, which cursors a client
	// makes up could otherwise multiply.
	scanHashesCached = 1024
)

// scanHash is the hash a cursor of base b at slot carries: for each slot
// from b on, the primary serving it if that primary's lowest slot from b
// on is at most slot (walked, or under way), else whether any serves it.
// Cached in m per base and slot. It is not the hash of the cursors before
// bases (the fingerprint's alone): such a cursor, handed over by a client
// mid-scan across an upgrade, has the node's cursor from bit 24 on, which
// read as a cursor of this format with a matching hash would send the
// node another cursor than its own (found by review: 108 of 6,000 keys
// missed). With the salt it does not match (but one time in 1,024), and
// the walk starts again.
func scanHash(m *Map, b, slot int) uint64 {
	key := uint32(b)<<cursorSlotBits | uint32(slot)
	if h, ok := m.scanHashes.Load(key); ok {
		return h.(uint64)
	}
	lowest := make([]int, len(m.primaries))
	for i := range lowest {
		lowest[i] = Slots
	}
	for s := Slots - 1; s >= b; s-- {
		if i := m.owner[s]; i >= 0 {
			lowest[i] = s
		}
	}
	label := func(s int) string {
		switch i := m.owner[s]; {
		case i < 0:
			return "-"
		case lowest[i] <= slot:
			return m.primaries[i]
		}
		return "+"
	}
	h := fnv.New64a()
	fmt.Fprintf(h, "scan/4 %d %d;", b, slot)
	start, l := b, label(b)
	for s := b + 1; s <= Slots; s++ {
		var next string
		if s < Slots {
			next = label(s)
		}
		if s == Slots || next != l {
			fmt.Fprintf(h, "%d-%d=%s;", start, s-1, l)
			start, l = s, next
		}
	}
	sum := h.Sum64() & cursorHashMask
	// Only a slot that is its primary's lowest from b on can come from a
	// walk (cursor and next make no other); a cursor a client made up
	// with another is hashed but not kept, so that it cannot fill the
	// cache (found by review).
	if i := m.owner[slot]; i >= 0 && lowest[i] == slot && m.scanHashesN.Add(1) <= scanHashesCached {
		m.scanHashes.Store(key, sum)
	}
	return sum
}

// scanWalk is the part of a SCAN walk one call makes: the walk of base in
// map m at slot's primary, slot being its lowest slot from base on; holes
// says the walk went past slots no primary served.
type scanWalk struct {
	m     *Map
	base  int
	slot  int
	holes bool
}

// cursor is the cursor of w at the node's cursor nodeCursor.
func (w scanWalk) cursor(nodeCursor uint64) uint64 {
	c := nodeCursor<<cursorNodeLow | uint64(w.base/scanBaseStep)<<cursorBaseLow |
		scanHash(w.m, w.base, w.slot)<<cursorSlotBits | uint64(w.slot)
	if w.holes {
		c |= 1 << cursorHolesBit
	}
	return c
}

// next is the cursor that starts the next primary's walk once this one's
// has ended, or 0 when it was the last: the primary whose lowest slot from
// the base on comes next, in the map the walk was planned with (the next
// call checks that it still holds).
func (w scanWalk) next() uint64 {
	m := w.m
	seen := make([]bool, len(m.primaries))
	for s := w.base; s < Slots; s++ {
		i := m.owner[s]
		switch {
		case i < 0:
			w.holes = w.holes || s > w.slot
		case !seen[i]:
			seen[i] = true
			if s > w.slot {
				w.slot = s
				return w.cursor(0)
			}
		}
	}
	return 0
}

// keeps reports whether the walk returns key: one of a slot from the base
// on.
func (w scanWalk) keeps(key []byte) bool {
	return w.base == 0 || Slot(key) >= w.base
}

// planScanWalk is the walk a SCAN with cursor makes in map m: which part,
// on which primary ("" if the slot to walk has none), from which of the
// node's cursors, and whether a node's walk under way was started again.
func planScanWalk(m *Map, cursor uint64) (w scanWalk, addr string, nodeCursor uint64, restarted bool) {
	w = scanWalk{m: m}
	nodeCursor = cursor >> cursorNodeLow
	if cursor != 0 {
		w.slot = int(cursor & cursorSlotMask)
		w.base = int(cursor>>cursorBaseLow&cursorBaseMask) * scanBaseStep
		w.holes = cursor>>cursorHolesBit&1 == 1
		if addr = m.Owner(w.slot); addr != "" && w.base <= w.slot &&
			cursor>>cursorSlotBits&cursorHashMask == scanHash(m, w.base, w.slot) {
			return w, addr, nodeCursor, false
		}
		// What the cursor relied on changed since it was made: every
		// slot below the cursor's was walked but for holes, nothing
		// more is known. Start again from there.
		restarted = nodeCursor != 0
		if !w.holes || w.base > w.slot {
			w.base = w.slot / scanBaseStep * scanBaseStep
		}
	}
	if w.slot = m.nextServed(w.base); w.slot < 0 {
		return w, "", 0, false
	}
	w.holes = w.slot > w.base
	return w, m.Owner(w.slot), 0, restarted
}

func (b *batch) planScan(o *op, raw []byte) {
	o.merge = mergeScan
	if len(b.args) < 2 {
		o.local = []byte("-ERR wrong number of arguments for 'scan' command\r\n")
		return
	}
	cursor, ok := commands.ParseScanCursor(b.args[1])
	if !ok {
		o.local = errBadCursor
		return
	}
	m := b.r.m.Load()
	if m == nil {
		o.local, o.unanswered = errorFrame(ErrNoTopology), true
		return
	}
	w, addr, nodeCursor, restarted := planScanWalk(m, cursor)
	if addr == "" {
		o.local = errSlotUnserved
		return
	}
	if restarted {
		b.r.scanRestarts.Add(1)
	}
	o.scan = w
	args := append([][]byte{b.args[0], strconv.AppendUint(nil, nodeCursor, 10)}, b.args[2:]...)
	b.add(o, sub{raw: resp.AppendCommand(nil, args...), slot: -1, to: addr})
}

// run sends every sub-command, round after round, until each has a final
// reply: a round sends what is pending to each node at once and waits for
// all of it; redirected and retried commands make up the next round.
func (b *batch) run() {
	pending := b.keys[:0] // the keys scratch is free once planning is done
	for i := range b.subs {
		pending = append(pending, i)
	}
	// Kept for the next batch: pending itself ends as a round's retries
	// (nil when all is done), and a new scratch per batch allocated.
	scratch := pending
	defer func() { b.keys = scratch[:0] }()
	if b.ran == nil {
		b.ran = map[int]int{}
	}
	backoff := time.Duration(0)
	for len(pending) > 0 {
		if backoff > 0 {
			time.Sleep(backoff)
		}
		next, wait := b.round(pending)
		// A round's retries are listed node call by node call; sent in
		// the client's order, those that meet on one node run in it.
		slices.Sort(next)
		pending = next
		if wait {
			backoff = min(max(2*backoff, retryBackoff), maxBackoff)
		}
	}
}

type nodeCall struct {
	addr string
	call *upstream.Call
	subs []int // sub index per reply; -1 for an ASKING reply
	err  error
	// replica, when set, is the replica's connections the call goes to.
	// Its commands are copied into buf (ends: where each ends): a call
	// given up on after the reply timeout is written and answered some
	// time later, when the client's buffer holds other bytes; such a call
	// is abandoned, never reused.
	replica   *upstream.Backend
	buf       []byte
	ends      []int
	abandoned bool
}

// round sends pending subs and classifies their replies. It returns the
// subs to try again, and whether the next round should wait first.
func (b *batch) round(pending []int) (retry []int, wait bool) {
	r := b.r
	m := r.m.Load()
	if m == nil {
		if err := r.Refresh(); err != nil {
			for _, i := range pending {
				b.finishUnanswered(i, err)
			}
			return nil, false
		}
		m = r.m.Load()
	}
	defer b.recycleCalls()
	callFor := func(addr string, replica *upstream.Backend) *nodeCall {
		for _, nc := range b.calls {
			if nc.addr == addr && nc.replica == replica {
				return nc
			}
		}
		var nc *nodeCall
		if k := len(b.spare); k > 0 {
			nc, b.spare = b.spare[k-1], b.spare[:k-1]
		} else {
			nc = &nodeCall{call: upstream.NewCall()}
		}
		nc.addr, nc.replica = addr, replica
		if b.limit > 0 {
			nc.call.SetReplyLimit(b.limit)
			nc.call.SetReplyBudget(&b.budget)
		}
		b.calls = append(b.calls, nc)
		return nc
	}
	askedGroup := map[int]bool{}
	for _, i := range pending {
		s := &b.subs[i]
		if b.ranAfter(i) {
			// Not sent last round (its slot had no node), and a later
			// command of its slot ran meanwhile (the others were answered
			// when their replies were read).
			b.finish(i, errRanAfter)
			continue
		}
		addr := s.redirect
		switch {
		case addr != "":
		case s.to != "":
			addr = s.to
		case s.slot >= 0:
			addr = m.Owner(s.slot)
		default:
			addr = r.keylessNode(m)
		}
		if addr == "" {
			if s.retries++; s.retries > maxRetries {
				b.finish(i, errSlotUnserved)
				continue
			}
			r.refreshSoon()
			retry, wait = append(retry, i), true
			continue
		}
		if b.reads != nil && s.redirect == "" && s.to == "" && s.slot >= 0 {
			if b.onlyReads && !s.primaryOnly && !s.asking && s.preload == nil && !r.migrating(s.slot, addr) {
				replica, refusal := b.reads.Replica(addr)
				if refusal != nil {
					b.finish(i, refusal)
					continue
				}
				if replica != nil {
					s.sentTo = replica.Addr()
					nc := callFor(s.sentTo, replica)
					nc.buf = append(nc.buf, s.raw...)
					nc.ends = append(nc.ends, len(nc.buf))
					nc.subs = append(nc.subs, i)
					continue
				}
			}
		}
		if b.reads != nil && s.mayWrite {
			b.reads.Wrote(addr)
		}
		s.sentTo = addr
		nc := callFor(addr, nil)
		if s.preload != nil {
			nc.call.Add(s.preload)
			nc.subs = append(nc.subs, -1)
			s.preload = nil
		}
		if s.asking && (s.group == 0 || !askedGroup[s.group]) {
			// Inside MULTI, ASKING would be queued (an extra element of
			// EXEC's reply); the flag set before MULTI lasts to EXEC.
			if s.group != 0 {
				askedGroup[s.group] = true
			}
			nc.call.Add(cmdAsking)
			nc.subs = append(nc.subs, -1)
		}
		if b.pauseReads {
			nc.call.AddRead(s.raw)
		} else {
			nc.call.Add(s.raw)
		}
		nc.subs = append(nc.subs, i)
	}
	calls := b.calls
	replicas := false
	for _, nc := range calls {
		if nc.replica == nil {
			nc.err = r.backend(nc.addr).Pool(0, b.resp3).Send(nc.call)
			continue
		}
		replicas = true
		start := 0
		for _, end := range nc.ends {
			nc.call.Add(nc.buf[start:end:end])
			start = end
		}
		nc.err = nc.replica.Pool(0, b.resp3).Send(nc.call)
	}
	if replicas {
		b.startTimer()
	}
	for _, nc := range calls {
		switch {
		case nc.err != nil:
		case nc.replica == nil:
			nc.call.Wait()
		default:
			select {
			case <-nc.call.Done():
			case <-b.timer.C:
				// The timer fired once; the other replicas' calls get
				// no more time than this one had.
				nc.err, nc.abandoned = upstream.ErrTimeout, true
				b.timer.Reset(0)
			}
		}
	}
	if replicas {
		b.timer.Stop()
	}
	// Commands of one transaction go and come back together: if one of
	// them was redirected, EXEC failed, and the whole group is sent again.
	groupAgain := map[int]int{} // group -> the member that must go again
	// Which subs ran (see ranAfter), every call of the round counted
	// before any sub is retried: calls run concurrently. A lost reply may
	// have run; a transaction's member counts too (at worst an earlier
	// sub is answered TRYAGAIN when its group failed).
	for _, nc := range calls {
		if nc.err != nil || nc.replica != nil {
			continue
		}
		for k, i := range nc.subs {
			if i < 0 || b.subs[i].slot < 0 {
				continue
			}
			if reply, err := nc.call.Reply(k); err != nil || !retryable(reply) {
				if j, ok := b.ran[b.subs[i].slot]; !ok || i > j {
					b.ran[b.subs[i].slot] = i
				}
			}
		}
	}
	// finish copies the round's replies into the arena: room for them all
	// is made at once, not append by append, which for a large split
	// reply allocated about five times its size (Go grows a large slice
	// by a quarter; a 1,000,000-key MGET's 110 MB of replies cost 630 MB).
	if !b.overflow {
		need := 0
		for _, nc := range calls {
			if nc.err == nil && !nc.abandoned {
				need += nc.call.ReplyBytes()
			}
		}
		b.arena = slices.Grow(b.arena, need)
	}
	for _, nc := range calls {
		for k, i := range nc.subs {
			if i < 0 {
				continue
			}
			s := &b.subs[i]
			s.redirect, s.asking = "", false
			if b.ranAfter(i) {
				// Sending it again would run it after that later command
				// (maybe on its key): its answer is what it got, which
				// clients retry, a redirection as TRYAGAIN (they never
				// see one).
				if nc.err != nil {
					b.finishUnanswered(i, nc.err)
					continue
				}
				if reply, err := nc.call.Reply(k); err == nil && retryable(reply) {
					if bytes.HasPrefix(reply, prefixMoved) || bytes.HasPrefix(reply, prefixAsk) {
						reply = errRanAfter
					}
					b.finish(i, reply)
					continue
				}
			}
			again, slow := b.classify(i, nc, k)
			if again {
				if s.group != 0 {
					if _, ok := groupAgain[s.group]; !ok {
						groupAgain[s.group] = i
					}
				}
				retry = append(retry, i)
				wait = wait || slow
			}
		}
	}
	if len(groupAgain) > 0 {
		retry = retry[:0]
		for _, i := range pending {
			s := &b.subs[i]
			if lead, ok := groupAgain[s.group]; ok && s.group != 0 {
				s.done = false
				s.redirect, s.asking = b.subs[lead].redirect, b.subs[lead].asking
				retry = append(retry, i)
			} else if !s.done {
				retry = append(retry, i)
			}
		}
	}
	return retry, wait
}

// ranAfter reports whether a later sub of sub i's slot ran, in this round
// or an earlier one, on any node. Then sub i is never sent again: the
// client's commands of one slot (on one key, maybe) would run out of its
// order. Keeping, for the whole batch, the highest sub of each slot that
// ran makes that one comparison, whatever rounds and node calls the two
// went through; holding later subs back while an earlier one is retried
// would also keep the order, but delays them and must follow every way a
// sub is put off. Not for a transaction's subs: a group goes again as a
// whole (see round); nor in a batch of reads only (DoReads), which has no
// order to keep and whose reads a failed replica puts off.
func (b *batch) ranAfter(i int) bool {
	s := &b.subs[i]
	if s.group != 0 || s.slot < 0 || b.onlyReads {
		return false
	}
	j, ok := b.ran[s.slot]
	return ok && j > i
}

// classify looks at sub i's outcome, reply k of nc: it finishes the sub,
// or reports that it must go again (after a wait, if slow).
func (b *batch) classify(i int, nc *nodeCall, k int) (again, slow bool) {
	r := b.r
	s := &b.subs[i]
	if nc.replica != nil {
		if again, done := b.replicaFailed(i, nc, k); done {
			return again, false
		}
	}
	if nc.err != nil {
		// Nothing was sent: safe to try again once the map says where
		// the slot lives now.
		if s.retries++; s.retries > maxRetries || !errors.Is(nc.err, upstream.ErrUnavailable) {
			b.finishUnanswered(i, nc.err)
			return false, false
		}
		r.refreshSoon()
		r.retried.Add(1)
		return true, true
	}
	reply, err := nc.call.Reply(k)
	if errors.Is(err, upstream.ErrOutputLimit) {
		// Not unanswered: the client's whole call overflows, and the
		// proxy counts that as it does for any upstream.
		b.overflow = true
		b.finish(i, errorFrame(err))
		return false, false
	}
	if err != nil {
		// Sent and lost: a write may have run, so it is never retried
		// behind the client's back.
		r.refreshSoon()
		b.finishUnanswered(i, err)
		return false, false
	}
	if again, slow = b.redirected(i, reply); !again {
		if s.redirects > maxRedirects && (bytes.HasPrefix(reply, prefixMoved) || bytes.HasPrefix(reply, prefixAsk)) {
			// Clients of the proxy never see a redirection; TRYAGAIN is
			// what Redis answers while a slot moves, and clients retry it.
			reply = errTooManyRedirects
		}
		b.finish(i, reply)
	}
	return again, slow
}

// errReplicaReconnected fails a read whose replica's connection was lost
// after the replica was picked (Reads.Reconnected).
var errReplicaReconnected = errors.New("redproxy: the replica's connection was lost and redialled during the read")

// replicaFailed handles sub i's outcome on a replica when the replica
// failed it: it was not sent, was lost or late, its connection was lost
// since it was picked, or the replica is not serving (loading, or cut off
// from its primary). A read changes nothing, so the primary may run it
// again. done is false when the reply is to be classified as any other
// (a MOVED included).
func (b *batch) replicaFailed(i int, nc *nodeCall, k int) (again, done bool) {
	err := nc.err
	if err == nil && b.reads.Reconnected(nc.replica) {
		// Whatever the replica answered, it may be a restarted server's
		// old dataset (the standalone path's replicaNode.failedSince).
		err = errReplicaReconnected
	}
	// notServing is the replica's -LOADING or -MASTERDOWN, when that is
	// how it failed.
	var notServing []byte
	if err == nil {
		reply, rerr := nc.call.Reply(k)
		switch {
		case rerr != nil && !errors.Is(rerr, upstream.ErrOutputLimit):
			err = rerr
		case rerr == nil && (bytes.HasPrefix(reply, prefixLoading) || bytes.HasPrefix(reply, prefixMasterDown)):
			err = errors.New(string(bytes.TrimSpace(reply[1:])))
			notServing = reply
		default:
			return false, false
		}
	}
	if b.reads.Failed(nc.replica, err) {
		b.subs[i].primaryOnly = true
		return true, true
	}
	if notServing != nil {
		// The client gets the replica's error as Redis sent it, as in
		// standalone mode: its code (LOADING, MASTERDOWN) is what clients
		// decide on, and "-ERR MASTERDOWN ..." hid it.
		b.finish(i, notServing)
		return false, true
	}
	b.finishUnanswered(i, err)
	return false, true
}

// startTimer arms the batch's timer for a round's replicas.
func (b *batch) startTimer() {
	d := b.reads.ReplyTimeout()
	if b.timer == nil {
		b.timer = time.NewTimer(d)
		return
	}
	b.timer.Reset(d)
}

var (
	prefixLoading    = []byte("-LOADING")
	prefixMasterDown = []byte("-MASTERDOWN")
	prefixMoved      = []byte("-MOVED ")
	prefixAsk        = []byte("-ASK ")
	prefixTryAgain   = []byte("-TRYAGAIN Multiple keys request during rehashing of slot")
	// The retried errors by Redis's own texts: a script may return an
	// error of its own that starts "NOSCRIPT" or "TRYAGAIN", after it ran
	// (and wrote); taken for Redis's, it ran up to maxRetries times.
	prefixNoScript    = []byte("-NOSCRIPT No matching script")
	prefixClusterDown = []byte("-CLUSTERDOWN The cluster is down")
	prefixNotServed   = []byte("-CLUSTERDOWN Hash slot not served")
)

// askMark is a node's ASK for a slot: from is the node, at when (UnixNano).
type askMark struct {
	from string
	at   int64
}

// askHold bounds how long after a node's last ASK for a slot that node's
// replicas serve none of its reads. Only the migrating primary knows that
// a slot is migrating: its READONLY replicas serve the keys already moved
// away as missing, where the primary answers ASK, and a client's own write
// of the slot taken by the importing node is not on them at all (found by
// a probe: a client's own SET read back nil from the old owner's replica
// for as long as the slot stayed MIGRATING). So a read of a slot that met
// an ASK goes to the primary, which answers it or sends it on with ASK,
// until the slot has another owner in the map (the migration's end: the
// primary answers MOVED, which updates the map) or until no ASK has come
// for this long. Not a few seconds: reads on the primary meet no ASK for
// keys not moved yet, and a hold that lapsed while the slot stayed
// MIGRATING served nil again (found by review, after 10 s). A migration
// abandoned without SETSLOT STABLE keeps the slot's reads on its primary
// that long, which costs load, not answers.
const askHold = 10 * time.Minute

// noteAsk records that the node at from answered ASK for slot.
func (r *Router) noteAsk(slot int, from string) {
	r.asks[slot].Store(&askMark{from: from, at: time.Now().UnixNano()})
}

// migrating reports whether slot, owned by owner in the map, is being
// migrated away from it: owner answered ASK for it within askHold.
func (r *Router) migrating(slot int, owner string) bool {
	a := r.asks[slot].Load()
	return a != nil && a.from == owner && time.Now().UnixNano()-a.at < int64(askHold)
}

// redirected reports whether sub i must be sent again because of its
// reply, and whether after a wait. It records where MOVED and ASK point.
func (b *batch) redirected(i int, reply []byte) (again, wait bool) {
	if len(reply) == 0 || reply[0] != '-' {
		return false, false
	}
	r := b.r
	s := &b.subs[i]
	switch {
	case bytes.HasPrefix(reply, prefixMoved), bytes.HasPrefix(reply, prefixAsk):
		ask := reply[1] == 'A'
		slot, addr, ok := parseRedirect(reply, s.sentTo)
		if !ok {
			return false, false
		}
		if s.redirects++; s.redirects > maxRedirects {
			return false, false
		}
		if ask {
			r.asked.Add(1)
			r.noteAsk(slot, s.sentTo)
			s.asking = true
		} else {
			r.moved.Add(1)
			for {
				m := r.m.Load()
				if m.Owner(slot) == addr || r.m.CompareAndSwap(m, m.withOwner(slot, addr)) {
					break
				}
			}
			r.refreshSoon()
		}
		s.redirect = addr
		return true, false
	case bytes.HasPrefix(reply, prefixNoScript) && s.sha != "":
		// The node lacks a script the proxy saw loaded (on a primary that
		// was a replica, or joined, since): load it there and run again.
		body := r.scripts.body(s.sha)
		if body == nil {
			return false, false
		}
		if s.retries++; s.retries > maxRetries {
			return false, false
		}
		s.preload = resp.AppendCommandStrings(nil, "SCRIPT", "LOAD", string(body))
		s.redirect = s.sentTo
		r.retried.Add(1)
		return true, false
	case bytes.HasPrefix(reply, prefixTryAgain), bytes.HasPrefix(reply, prefixClusterDown), bytes.HasPrefix(reply, prefixNotServed):
		if s.retries++; s.retries > maxRetries {
			return false, false
		}
		r.retried.Add(1)
		if reply[1] == 'C' {
			r.refreshSoon()
		}
		return true, true
	}
	return false, false
}

// retryable: a reply the router may send again (redirect or retry).
func retryable(reply []byte) bool {
	for _, p := range [][]byte{prefixMoved, prefixAsk, prefixTryAgain, prefixNoScript, prefixClusterDown, prefixNotServed} {
		if bytes.HasPrefix(reply, p) {
			return true
		}
	}
	return false
}

// parseRedirect reads "-MOVED 3999 127.0.0.1:6381" or "-ASK ...".
func parseRedirect(reply []byte, from string) (slot int, addr string, ok bool) {
	f := bytes.Fields(bytes.TrimRight(reply, "\r\n"))
	if len(f) != 3 {
		return 0, "", false
	}
	slot, err := strconv.Atoi(string(f[1]))
	if err != nil || slot < 0 || slot >= Slots {
		return 0, "", false
	}
	// Redis writes host:port with no brackets around an IPv6 host
	// ("-MOVED 3999 ::1:6381"), which is not an address to dial nor the
	// map's spelling of the node ("[::1]:6381"): the port is what follows
	// the last colon.
	target := f[2]
	i := bytes.LastIndexByte(target, ':')
	if i < 0 || i == len(target)-1 {
		return 0, "", false
	}
	host, port := string(target[:i]), string(target[i+1:])
	if len(host) > 1 && host[0] == '[' && host[len(host)-1] == ']' {
		host = host[1 : len(host)-1]
	}
	if host == "" {
		// "-MOVED 3999 :6381": the node does not know its hostname;
		// clients use the host of the node that answered.
		var err error
		if host, _, err = net.SplitHostPort(from); err != nil {
			return 0, "", false
		}
	}
	return slot, net.JoinHostPort(host, port), true
}

// finish records sub i's final reply, copied: the node call's buffer is
// reused.
func (b *batch) finish(i int, reply []byte) {
	s := &b.subs[i]
	s.rstart = len(b.arena)
	if !b.overflow { // else every reply is dropped (DoReads)
		b.arena = append(b.arena, reply...)
	}
	s.rend = len(b.arena)
	s.done = true
	s.unanswered = false // a transaction sent again may be answered now
}

// recycleCalls keeps a round's node calls, every one of them complete,
// for the next round or batch.
func (b *batch) recycleCalls() {
	for _, nc := range b.calls {
		if nc.abandoned {
			continue // still the pipe's, until its replies come
		}
		nc.call.Reset()
		nc.call.Trim(64 << 10)
		clear(nc.subs)
		nc.subs = nc.subs[:0]
		nc.addr, nc.err, nc.replica = "", nil, nil
		nc.buf, nc.ends = nc.buf[:0], nc.ends[:0]
		if cap(nc.buf) > 64<<10 {
			nc.buf = nil
		}
		b.spare = append(b.spare, nc)
	}
	clear(b.calls)
	b.calls = b.calls[:0]
}
