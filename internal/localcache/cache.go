package localcache

import (
	"errors"
	"hash/maphash"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/resp"
	"github.com/redproxy/redproxy/internal/upstream"
)

// Errors Fill returns besides upstream's. The caller forwards the read as
// if the tier did not exist.
var (
	// ErrNotNow: the key cannot be filled right now (a write to it is in
	// flight through the proxy, or the fill connection is not live).
	ErrNotNow = errors.New("localcache: key cannot be filled now")
	// ErrNoRESP2: the reply has no exact RESP2 form (see resp2.go); the
	// command is no longer filled for RESP2 clients.
	ErrNoRESP2 = errors.New("localcache: reply has no exact RESP2 form")
)

// Status is what Get decided for a read.
type Status uint8

const (
	// Pass: forward the read to Redis as if the tier did not exist.
	Pass Status = iota
	// Hit: the reply returned by Get is the answer.
	Hit
	// Fill: an admitted miss; call Fill (through the flight group).
	Fill
	// Stale: the tier cannot serve (its connection is down) but holds a
	// value allowed by stale_if_error. Send the read to Redis; only if that
	// fails with a connection error, answer StaleValue.
	Stale
	// PassToPrimary: forward the read as Pass does, but to the primary,
	// never a replica (read_from): a write to the key is in flight, so the
	// tier neither serves nor fills it, and a replica may be behind the
	// value this client had from the tier a moment ago.
	PassToPrimary
)

// Options are what the cache needs besides its configuration.
type Options struct {
	// Upstream returns the connection options for database db; the cache
	// turns on RESP3 and tracking itself.
	Upstream  func(db int) upstream.Options
	Databases int
	Logger    *slog.Logger
	// Registry may be nil (no metrics).
	Registry prometheus.Registerer

	// Cluster, set in cluster mode, is [upstream]'s cluster: fill
	// connections are then one per node of it (cluster.go), and Upstream
	// is not used.
	Cluster *Cluster
	// Routes, set with routes, are the upstreams keys route to: fill
	// connections are then one per upstream and database, or per node of
	// an upstream that is a cluster (routes.go), and Upstream is not used.
	Routes *Routes
}

// Cluster is one Redis Cluster the tier reads from: [upstream] in cluster
// mode, or a named upstream of routes. Its keys are filled and served
// through the tracking connection of their slot's owner (cluster.go).
type Cluster struct {
	// Owner names the node that owns key's slot now ("" when none is
	// known).
	Owner func(key []byte) string
	// Demoted is told that a node the tier read from answered as a
	// replica: the map that names it is out of date. May be nil.
	Demoted func(addr string)
	// Node returns the connection options of node addr (database 0).
	Node func(addr string) upstream.Options
}

// Routes are the upstreams of routes, by index (route.Table's).
type Routes struct {
	// Upstreams names them; Upstreams[0] is [upstream]. The names label
	// the tier's metrics.
	Upstreams []string
	// Route is the index of the upstream key's route names now.
	Route func(key []byte) int
	// Options returns the connection options of database db of upstream
	// up, which is not a cluster.
	Options func(up, db int) upstream.Options
	// Clusters holds, by index, the upstreams that are a cluster; nil for
	// the others (and may be shorter than Upstreams).
	Clusters []*Cluster
}

const (
	numShards = 16
	// Fixed charges per entry and per key, on top of the bytes stored, so
	// that many tiny entries cannot exceed the budget through overhead.
	// Measured (TestTierMemoryOfManySmallKeysStaysNearBudget): a key with
	// one small entry costs about 600 bytes of live heap beyond its bytes:
	// its keyRec, its map of entries, the entry, its LRU node and its slot
	// in the shard's map. Charged 256 in all, the tier really held twice
	// max_bytes when filled with small keys (found by review).
	entryOverhead = 160
	keyOverhead   = 420
)

// Cache is the local tier. See the package documentation for its contract.
type Cache struct {
	cfg  Config
	opt  Options
	log  *slog.Logger
	m    *cacheMetrics
	seed maphash.Seed

	shards    [numShards]shard
	used      atomic.Int64 // bytes charged against cfg.MaxBytes
	nentries  atomic.Int64
	evictNext atomic.Uint32
	maxEntry  int64
	// touchEvery is cfg.TouchInterval in nanoseconds (touch.go).
	touchEvery int64

	reads, writes *sketch
	halveNow      chan struct{} // a sketch filled up before its window ended
	include       patterns
	exclude       patterns

	// ups are the upstreams the tier reads from: one without routes, and
	// with routes one per upstream, by route index.
	ups []*upstreamTier

	connMu sync.Mutex
	conns  []atomic.Pointer[fillConn] // one per database, created on first use
	nodes  sync.Map                   // cluster or routes: ownerKey -> *fillConn
	epochs atomic.Uint64              // source of fill connection epochs
	// switching is set (under connMu) while SwitchUpstream has retired the
	// fill connections and not yet dialled new ones: no connection is
	// created meanwhile, so the tier neither serves nor fills (for a
	// named upstream's switch, switchRouted, the other upstreams'
	// existing connections go on serving; reads that would dial one pass
	// through until it ends).
	switching bool
	fenceAt   atomic.Int64 // hits need a heartbeat sent at or after this

	noRESP2 sync.Map // *commands.Command -> struct{}: replies with no RESP2 form

	scripts scriptWatch // scripts that may run SWAPDB (scripts.go)

	notes atomic.Int64 // records holding a notKept (maxNotKept)

	hotMu  sync.Mutex
	recent [512]hotCandidate // keys seen on warm misses and sampled hits, for /debug/hotkeys
	hotPos int

	stop    chan struct{}
	workers sync.WaitGroup
	closed  atomic.Bool
}

type shard struct {
	mu sync.Mutex
	// recs holds every key the tier knows: with entries, with fills in
	// flight, with writes in flight, or with stale-if-error values.
	recs map[uint64]*keyRec
	// lru orders the keys that hold entries; only they can be evicted, so
	// a fill in flight is never evicted (C5).
	lru *simplelru.LRU[uint64, *keyRec]
	// hits, by upstream, are counted here, under the lock the hit
	// already holds, rather than in one counter every core would write.
	hits []atomic.Uint64
	// writing counts writes in flight through the proxy to keys that have
	// no record, by writeSlot of their hash: a counting filter that stands
	// in for a record per written key, so that a write to a key the tier
	// does not know (most writes) allocates nothing. While a key's slot is
	// not zero no fill of it starts (Fill creates records, and checks this
	// under mu), so none can store a value read before the write ran. Two
	// keys sharing a slot only delay each other's fills. Incremented under
	// mu, decremented without it (WriteDone: that only lets fills start).
	writing [writeSlots]atomic.Int32
	_       [64]byte
}

// writeSlots per shard: 16K slots in all, so that even a thousand writes
// in flight at once leave most keys' slots at zero.
const writeSlots = 1024

// writeSlot is h's slot in its shard's writing filter; it uses other bits
// of h than shardOf does.
func writeSlot(h uint64) uint32 { return uint32(h>>32) & (writeSlots - 1) }

// writeInFlight reports whether a write may be in flight to the key of
// hash h, which has no record; s.mu is held.
func (s *shard) writeInFlight(h uint64) bool { return s.writing[writeSlot(h)].Load() > 0 }

// keyRec is one key of one database, identified by a 64-bit hash of both.
// Two keys with the same hash cannot both be in the tier: the second is
// simply not cached (or, for a write, fenced), which keeps every decision
// exact at the cost of a cache miss once in 2^64.
type keyRec struct {
	h   uint64
	db  int
	up  int // the upstream (index in Cache.ups) it was last filled from
	key string
	// gen changes whenever the key may have changed (invalidation, flush,
	// write through the proxy); a fill stores only if it did not change
	// between sending and storing.
	gen      uint64
	pending  int32 // fills in flight
	inflight int32 // writes in flight through the proxy
	// entries by protocol (0 RESP2, 1 RESP3), then the exact command bytes.
	entries [2]map[string]*entry
	// last is the entry served last, looked up by comparing its command
	// bytes, which is cheaper than hashing them: most keys are read with
	// one command.
	last      *entry
	lastRaw   string
	lastProto int
	n         int   // number of entries
	size      int64 // bytes charged: entries plus keyOverhead while n > 0
	inLRU     bool
	since     int64        // when the key got its first entry
	hits      atomic.Int64 // served from the tier (sampled, scaled)
	aside     *aside       // last values kept for stale-if-error
	touched   int64        // nanotime the key was last queued for TOUCH
	note      *notKept     // a fill of the key whose reply was not kept; nil: none
}

// notKept notes that a fill of one command of a key (protocol and exact
// bytes) read a reply the tier did not keep: nothing there with
// negative_caching off, an error, or a value refused as too_big or
// victim_hotter. Until it ends, that command is passed to Redis (one
// command) instead of filled again (CLIENT CACHING YES, the read and
// PTTL, three) only to be thrown away once more. Found by review: with
// negative caching off (as config.example.toml ships it) every read of a
// hot missing key was such a fill, three times the upstream commands of
// no tier. The note only ever sends reads to Redis, never answers one, so
// it cannot serve anything the tier did not get through tracking; it is
// still dropped as soon as the key may have changed: it holds for the
// record's generation it was taken in (an invalidation, which Redis sends
// for the key the fill read on the tracking connection, a flush or a write
// through the proxy bumps it) and the fill connection's epoch, so a key
// that appears is filled at its next read.
type notKept struct {
	raw   string
	proto int
	gen   uint64
	epoch uint64
	until int64 // nanotime
}

// Bounds on notes: each lasts notKeptFor (the sweep and the next read
// drop it afterwards), and at most maxNotKept records hold one, so a flood
// of hot missing keys cannot grow the tier's memory without bound.
const maxNotKept = 10000

// notKeptFor is a variable only so that a test can lengthen it (see
// export_test.go); nothing else writes it.
var notKeptFor = time.Second

type entry struct {
	val    []byte
	expire int64  // nanotime
	epoch  uint64 // fill connection epoch when filled
	size   int64
}

// New builds the tier. It opens no connection until a database is used.
func New(cfg Config, opt Options) (*Cache, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	if opt.Databases < 1 {
		opt.Databases = 16
	}
	c := &Cache{
		cfg:     cfg,
		opt:     opt,
		log:     opt.Logger,
		m:       newMetrics(opt.Routes != nil),
		seed:    maphash.MakeSeed(),
		include: patterns(cfg.Include),
		exclude: patterns(cfg.Exclude),
		conns:   make([]atomic.Pointer[fillConn], opt.Databases),
		stop:    make(chan struct{}),
		// One value may take at most an eighth of the budget, so a single
		// huge reply cannot flush everything hot.
		maxEntry:   int64(cfg.MaxBytes) / 8,
		touchEvery: int64(cfg.TouchInterval.Duration),
	}
	// Sketch width: the sightings between halvings (see sketch); a key must
	// be among the hottest few thousandths of a percent of that traffic to
	// be admitted under load. Bounded: at most 1MB of counters per sketch.
	width := min(max(int(cfg.MaxBytes)/256, 4096), 1<<18)
	c.reads, c.writes = newSketch(width), newSketch(width)
	c.halveNow = make(chan struct{}, 1)
	if r := opt.Routes; r != nil {
		for i, name := range r.Upstreams {
			u := &upstreamTier{name: name, idx: i, m: c.m.forUpstream(name)}
			if i < len(r.Clusters) {
				u.cluster = r.Clusters[i]
			}
			c.ups = append(c.ups, u)
		}
	} else {
		c.ups = []*upstreamTier{{cluster: opt.Cluster, m: c.m.forUpstream("")}}
	}
	for i := range c.shards {
		l, _ := simplelru.NewLRU[uint64, *keyRec](1<<31-1, nil)
		c.shards[i] = shard{recs: map[uint64]*keyRec{}, lru: l, hits: make([]atomic.Uint64, len(c.ups))}
	}
	if opt.Registry != nil {
		c.register(opt.Registry)
	}
	c.workers.Add(1)
	go c.maintain()
	return c, nil
}

// Close stops every fill connection and goroutine.
func (c *Cache) Close() {
	if !c.closed.CompareAndSwap(false, true) {
		return
	}
	close(c.stop)
	// Under connMu, so a connection conn() is creating right now is either
	// closed here or never created (conn checks closed under connMu).
	c.connMu.Lock()
	var fcs []*fillConn
	for i := range c.conns {
		if fc := c.conns[i].Load(); fc != nil {
			fcs = append(fcs, fc)
		}
	}
	fcs = append(fcs, c.nodeConns()...)
	c.connMu.Unlock()
	for _, fc := range fcs {
		fc.pipe.Close()
	}
	c.workers.Wait()
}

// SwitchUpstream moves the tier to another Redis server. switchUpstream is
// called in the middle and must make Options.Upstream return the new
// server's options. When SwitchUpstream returns:
//
//   - nothing read from the old server is served again, stale_if_error
//     values included: every entry and value moved aside is dropped;
//   - no fill sent to the old server is kept, whenever its reply arrives;
//   - the fill connections of the databases in use have been replaced by
//     connections to the new server, which serve hits once a heartbeat on
//     them is answered, as after any reconnection.
//
// Until then no fill connection exists, so reads pass through to Redis.
// Concurrent calls are the caller's to prevent (Server.Reload holds its
// lock).
func (c *Cache) SwitchUpstream(switchUpstream func()) {
	c.SwitchUpstreamOf("", switchUpstream)
}

// SwitchUpstreamOf is SwitchUpstream for a failover of the named upstream
// of routes: only what was read from it is dropped, and only its
// connections are replaced (the flush is counted under its name). Its
// keys are read and tracked through its own connections alone, so the
// other upstreams' entries are still coherent. (It used to drop the whole
// tier and redial every connection, whose reconnections flushed it again,
// counted under [upstream]; found by a probe.)
func (c *Cache) SwitchUpstreamOf(name string, switchUpstream func()) {
	by := c.ups[0]
	for _, u := range c.ups {
		if name != "" && u.name == name {
			by = u
		}
	}
	if by != c.ups[0] {
		c.switchRouted(by, switchUpstream)
		return
	}
	c.connMu.Lock()
	c.switching = true
	var old, oldNodes []*fillConn
	for i := range c.conns {
		if fc := c.conns[i].Swap(nil); fc != nil {
			// Retired before the flush below: a fill storing after the
			// flush sees retired under its shard lock and is discarded; one
			// storing before it is dropped by the flush.
			fc.retire()
			old = append(old, fc)
		}
	}
	// Cluster nodes' connections are not redialled here: the next read of
	// one of a node's keys dials it again. The other upstreams of routes
	// are, below.
	for _, fc := range c.nodeConns() {
		c.nodes.Delete(fc.key())
		fc.retire()
		oldNodes = append(oldNodes, fc)
	}
	c.connMu.Unlock()
	c.flush(-1, FlushSwitch, by)
	c.closeAndSwitch(switchUpstream, old, oldNodes)
	c.log.Info("local tier: tracking connections moved to the new upstream", "databases", len(old))
}

// closeAndSwitch ends a switch whose connections were retired: conns,
// [upstream]'s per database, and nodes, those of cluster nodes and of the
// upstreams of routes. It closes them, calls switchUpstream, and redials
// conns and the routes' (the upstreams of routes stay the same ones;
// cluster nodes' connections are dialled again by the next read of one of
// their keys).
func (c *Cache) closeAndSwitch(switchUpstream func(), conns, nodes []*fillConn) {
	for _, fc := range conns {
		fc.pipe.Close()
	}
	for _, fc := range nodes {
		fc.pipe.Close()
	}
	switchUpstream()
	c.connMu.Lock()
	c.switching = false
	c.connMu.Unlock()
	for _, fc := range conns {
		c.conn(fc.db)
	}
	for _, fc := range nodes {
		if !fc.clusterNode() {
			c.nodeConn(fc.up, fc.node, fc.db)
		}
	}
}

// switchRouted is SwitchUpstreamOf for the upstream of routes up, which is
// not [upstream]: a Sentinel upstream, so its connections are one per
// database (nodeConn), none of a cluster.
func (c *Cache) switchRouted(up *upstreamTier, switchUpstream func()) {
	c.connMu.Lock()
	c.switching = true
	var old []*fillConn
	for _, fc := range c.nodeConns() {
		if fc.up != up {
			continue
		}
		// Retired before the flush, as in SwitchUpstreamOf.
		c.nodes.Delete(fc.key())
		fc.retire()
		old = append(old, fc)
	}
	c.connMu.Unlock()
	c.flushOwn(-1, FlushSwitch, up, false)
	c.closeAndSwitch(switchUpstream, nil, old)
	c.log.Info("local tier: tracking connections moved to the new upstream", "upstream", up.name, "databases", len(old))
}

// Config returns the configuration the cache was built with.
func (c *Cache) Config() Config { return c.cfg }

var clockBase = time.Now()

// nanotime is a monotonic clock reading.
func nanotime() int64 { return int64(time.Since(clockBase)) }

func (c *Cache) hash(db int, key []byte) uint64 {
	h := maphash.Bytes(c.seed, key)
	h ^= uint64(db+1) * 0x9E3779B97F4A7C15
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	return h
}

func (c *Cache) shardOf(h uint64) *shard { return &c.shards[h%numShards] }

func proto(resp3 bool) int {
	if resp3 {
		return 1
	}
	return 0
}

// same reports whether rec is the record of db/key (and not of another
// key with the same hash).
func (r *keyRec) same(db int, key []byte) bool { return r.db == db && r.key == string(key) }

// Get looks a read up. raw is the client's command exactly as sent (the
// cache key together with db and protocol), key its key argument. A Hit's
// reply is shared and must not be modified.
func (c *Cache) Get(db int, resp3 bool, raw, key []byte) ([]byte, Status) {
	fc := c.connFor(db, key)
	if fc == nil {
		return nil, Pass
	}
	m := fc.up.m
	h := c.hash(db, key)
	s := c.shardOf(h)
	now := nanotime()
	live := fc.live(now, c.fenceAt.Load())
	p := proto(resp3)
	s.mu.Lock()
	var rec *keyRec
	if live {
		rec, _ = s.lru.Get(h)
		if rec == nil {
			rec = s.recs[h]
		}
	} else {
		rec = s.recs[h]
	}
	if rec != nil {
		if !rec.same(db, key) {
			s.mu.Unlock()
			m.miss(missOther)
			return nil, Pass
		}
		if rec.inflight > 0 {
			s.mu.Unlock()
			m.miss(missInFlight)
			return nil, PassToPrimary
		}
		e := rec.last
		if e == nil || rec.lastProto != p || rec.lastRaw != string(raw) {
			if e = rec.entries[p][string(raw)]; e != nil {
				rec.last, rec.lastRaw, rec.lastProto = e, string(raw), p
			}
		}
		if e != nil {
			if live && e.epoch == fc.epoch.Load() && now < e.expire {
				val := e.val
				s.hits[fc.up.idx].Add(1)
				if c.touchEvery > 0 && now-rec.touched >= c.touchEvery {
					rec.touched = now
					fc.queueTouch(rec.key)
				}
				s.mu.Unlock()
				// Count hits in the sketch too, or a cached key would look
				// cold next to keys still missing; sampling keeps the hit
				// path free of contended writes.
				if r := rand.Uint32(); r&7 == 0 {
					if c.reads.add(h, 8) {
						c.wantHalve()
					}
					rec.hits.Add(8)
					if r&1023 == 0 {
						// Hot cached keys dominate hits, so a rare sample
						// is enough to keep them on /debug/hotkeys.
						c.noteCandidate(db, key)
					}
				}
				return val, Hit
			}
			if now >= e.expire {
				c.removeEntry(s, rec, p, string(raw))
			}
		}
		if !live && rec.aside != nil && rec.aside.has(p, raw, now) {
			s.mu.Unlock()
			return nil, Stale
		}
		if n := rec.note; n != nil {
			if n.gen != rec.gen || now >= n.until || n.epoch != fc.epoch.Load() {
				c.dropNote(rec)
				c.maybeForget(s, rec)
			} else if live && n.proto == p && n.raw == string(raw) {
				s.mu.Unlock()
				m.miss(missNotKept)
				return nil, Pass
			}
		}
	} else if live && s.writeInFlight(h) {
		s.mu.Unlock()
		m.miss(missInFlight)
		return nil, PassToPrimary
	}
	s.mu.Unlock()
	if !live {
		m.miss(missNotLive)
		return nil, Pass
	}
	if reason := c.admit(h, db, key); reason != "" {
		m.miss(reason)
		m.reject(reason)
		return nil, Pass
	}
	m.miss(missFill)
	return nil, Fill
}

// CountRead counts a read of cmd (a CacheableCommand) the tier was not
// asked to answer (it came behind commands of its batch still to be sent
// to Redis), so pipelined clients' reads count towards admission like any
// other. It counts one such read in countReadSample, chosen at random, as
// countReadSample reads: these are all but the first read of every
// pipelined batch, and counting each one (finding the key, a hash, the
// doorkeeper and four compare-and-swaps on cache lines of a large sketch)
// was over half of what the tier added to a GET -P 16 that it could not
// answer. A key read often enough to matter is still counted
// about as often as it is read; one read a few times in a window may be
// admitted or not a little earlier or later. Random rather than every
// n-th read, so that a client pipelining the same keys in the same order
// does not have the same ones skipped every time.
func (c *Cache) CountRead(db int, cmd *commands.Command, args [][]byte) {
	if rand.Uint32()%countReadSample != 0 {
		return
	}
	key, ok := CacheableKey(cmd, args)
	if !ok {
		return
	}
	if c.reads.add(c.hash(db, key), countReadSample) {
		c.wantHalve()
	}
	// Each is a miss too: left out, a client pipelining cold reads made
	// the hit ratio 0.84 where it was 0.02 (found by a probe).
	if u, _, ok := c.keyOwner(db, key); ok {
		u.m.missByReason[missPipelined].Add(countReadSample)
	}
}

// countReadSample: CountRead counts one read in this many.
const countReadSample = 4

// admit decides whether a missed key should be filled through the tier; it
// returns "" to admit, or the reason not to. It also counts the read.
func (c *Cache) admit(h uint64, db int, key []byte) string {
	if (len(c.include) > 0 && !c.include.match(key)) || c.exclude.match(key) {
		return missPattern
	}
	if c.reads.add(h, 1) {
		c.wantHalve()
	}
	reads := c.reads.estimate(h)
	if reads >= 2 {
		c.noteCandidate(db, key)
	}
	if reads <= uint64(c.cfg.AdmitMinReads) && c.cfg.AdmitMinReads > 0 {
		return missCold
	}
	if w := c.writes.estimate(h); w > 0 && float64(w) > c.cfg.WriteRatio*float64(reads) {
		return missWrites
	}
	return ""
}

// Fill reads cmd through db's tracking connection, keeps the reply if no
// invalidation, flush or write touched the key meanwhile, and returns the
// reply in the client's protocol. It must run at most once at a time per
// command (the flight group sees to that), and the caller forwards the read
// itself on any error.
func (c *Cache) Fill(db int, resp3 bool, cmd *commands.Command, raw, key []byte) ([]byte, error) {
	if !resp3 {
		if _, no := c.noRESP2.Load(cmd); no {
			return nil, ErrNoRESP2
		}
	}
	fc := c.connFor(db, key)
	if fc == nil {
		return nil, ErrNotNow
	}
	m := fc.up.m
	h := c.hash(db, key)
	s := c.shardOf(h)

	// Register the fill before sending it, so that anything that touches
	// the key from now on changes the generation we compare at the end.
	s.mu.Lock()
	rec := s.recs[h]
	if rec == nil {
		if s.writeInFlight(h) {
			s.mu.Unlock()
			return nil, ErrNotNow
		}
		rec = &keyRec{h: h, db: db, key: string(key)}
		s.recs[h] = rec
	} else if !rec.same(db, key) || rec.inflight > 0 {
		s.mu.Unlock()
		return nil, ErrNotNow
	}
	rec.pending++
	rec.up = fc.up.idx
	gen := rec.gen
	s.mu.Unlock()
	epoch := fc.epoch.Load()

	call := upstream.NewCall()
	call.Add(cmdCachingYes)
	call.Add(raw)
	pttl := resp.AppendCommandNamed(nil, "PTTL", key)
	call.Add(pttl)
	sent := nanotime()
	err := fc.pipe.Send(call)
	if err == nil {
		call.Wait()
		err = call.Err()
	}
	if h := hooks.Load(); h != nil && h.AfterFill != nil {
		h.AfterFill(key)
	}
	filledAt := nanotime()
	var val, ttlReply []byte
	if err == nil {
		var ack []byte
		ack, _ = call.Reply(0)
		// The value's own error: a reply past the fill connection's
		// limit (ErrOutputLimit) came as nil, which then failed the
		// RESP2 conversion and marked the command as having no RESP2
		// form: one large GET turned the tier off for every RESP2 GET
		// for good (found by a probe).
		val, err = call.Reply(1)
		ttlReply, _ = call.Reply(2)
		if err == nil && resp.IsError(ack) {
			err = errors.New("localcache: CLIENT CACHING refused: " + string(ack))
		}
	}
	if err != nil {
		c.unpend(s, rec)
		m.fill(fillError)
		return nil, err
	}
	if fc.clusterNode() && resp.IsError(val) {
		// MOVED, ASK and the like are for the router to follow, and any
		// other error it hands back to the client as is.
		c.unpend(s, rec)
		m.fill(fillSkipped)
		return nil, ErrRedirected
	}
	// The Call's buffer is ours; still copy, so the kept value is exactly
	// as large as the reply.
	val = append([]byte(nil), val...)
	out := val
	if !resp3 {
		var ok bool
		if out, ok = toRESP2For(cmd, val); !ok {
			c.noRESP2.Store(cmd, struct{}{})
			c.unpend(s, rec)
			m.fill(fillSkipped)
			return nil, ErrNoRESP2
		}
	}

	// Decide how long the reply may live: never past the key's expiry in
	// Redis (measured from when we sent, before Redis read it), never
	// longer than max_ttl.
	ttl, _ := resp.Integer(ttlReply)
	expire := filledAt + int64(c.cfg.MaxTTL.Duration)
	keep := !resp.IsError(val)
	switch {
	case ttl == -2:
		keep = keep && c.cfg.NegativeCaching && isEmptyReply(val)
	case ttl >= 0:
		expire = min(expire, sent+ttl*int64(time.Millisecond))
		keep = keep && expire > filledAt
	case ttl != -1:
		keep = false
	}
	if keep {
		c.store(s, rec, gen, epoch, fc, proto(resp3), raw, out, expire)
	} else {
		c.unpendNoting(s, rec, gen, epoch, fc, proto(resp3), raw)
		m.fill(fillSkipped)
	}
	return out, nil
}

// unpendNoting ends a fill that stores nothing, and notes (notKept) that
// its command of the key is not worth filling while the key stays as the
// fill read it: while no invalidation, flush or write touched it since
// the fill was sent, and on the same fill connection.
func (c *Cache) unpendNoting(s *shard, rec *keyRec, gen, epoch uint64, fc *fillConn, p int, raw []byte) {
	s.mu.Lock()
	rec.pending--
	if rec.gen == gen && rec.inflight == 0 && fc.epoch.Load() == epoch && !fc.retired.Load() {
		n := rec.note
		if n == nil && c.notes.Load() < maxNotKept {
			n = &notKept{}
			rec.note = n
			c.notes.Add(1)
		}
		if n != nil {
			if n.raw != string(raw) {
				n.raw = string(raw)
			}
			n.proto, n.gen, n.epoch, n.until = p, gen, epoch, nanotime()+int64(notKeptFor)
		}
	}
	c.maybeForget(s, rec)
	s.mu.Unlock()
}

// dropNote drops rec's notKept; s.mu is held.
func (c *Cache) dropNote(rec *keyRec) {
	if rec.note != nil {
		rec.note = nil
		c.notes.Add(-1)
	}
}

// unpend ends a fill that stores nothing.
func (c *Cache) unpend(s *shard, rec *keyRec) {
	s.mu.Lock()
	rec.pending--
	c.maybeForget(s, rec)
	s.mu.Unlock()
}

// store keeps a filled reply if the key's generation and the connection's
// epoch are what they were when the fill was sent, and no write is in
// flight. It ends the fill in every case.
func (c *Cache) store(s *shard, rec *keyRec, gen, epoch uint64, fc *fillConn, p int, raw, val []byte, expire int64) {
	m := fc.up.m
	size := int64(len(raw)+len(val)) + entryOverhead
	if size > c.maxEntry {
		c.unpendNoting(s, rec, gen, epoch, fc, p, raw)
		m.fill(fillSkipped)
		m.reject("too_big")
		return
	}
	// Reserve before locking the shard: eviction locks other shards. The
	// key's own charge is reserved too and given back if already held.
	charge := size + rec.keyCharge()
	if !c.reserve(charge, c.reads.estimate(rec.h)) {
		c.unpendNoting(s, rec, gen, epoch, fc, p, raw)
		m.fill(fillSkipped)
		m.reject("victim_hotter")
		return
	}
	s.mu.Lock()
	rec.pending--
	ok := rec.gen == gen && rec.inflight == 0 && fc.epoch.Load() == epoch && !fc.retired.Load()
	if h := hooks.Load(); h != nil && h.SkipGenerationCheck {
		ok = rec.inflight == 0
	}
	if !ok {
		c.maybeForget(s, rec)
		s.mu.Unlock()
		c.used.Add(-charge)
		m.fill(fillDiscarded)
		return
	}
	if rec.n > 0 {
		c.used.Add(-rec.keyCharge())
	} else {
		rec.since = nanotime()
		m.admissions.Inc()
	}
	if old := rec.entries[p][string(raw)]; old != nil {
		if rec.last == old {
			rec.last, rec.lastRaw = nil, ""
		}
		rec.n--
		rec.size -= old.size
		c.used.Add(-old.size)
		c.nentries.Add(-1)
	}
	if rec.entries[p] == nil {
		rec.entries[p] = map[string]*entry{}
	}
	rec.entries[p][string(raw)] = &entry{val: val, expire: expire, epoch: epoch, size: size}
	rec.n++
	rec.size += size
	c.nentries.Add(1)
	c.dropAside(rec) // a fresh value supersedes a stale one
	c.dropNote(rec)
	if !rec.inLRU {
		s.lru.Add(rec.h, rec)
		rec.inLRU = true
	}
	s.mu.Unlock()
	m.fill(fillStored)
}

// keyCharge is what a key costs the budget while it has entries.
func (r *keyRec) keyCharge() int64 { return int64(len(r.key)) + keyOverhead }

// removeEntry drops one entry; s.mu is held.
func (c *Cache) removeEntry(s *shard, rec *keyRec, p int, raw string) {
	e := rec.entries[p][raw]
	if e == nil {
		return
	}
	delete(rec.entries[p], raw)
	if rec.last == e {
		rec.last, rec.lastRaw = nil, ""
	}
	rec.n--
	rec.size -= e.size
	c.used.Add(-e.size)
	c.nentries.Add(-1)
	if rec.n == 0 {
		c.dropEntries(s, rec)
	}
	c.maybeForget(s, rec)
}

// dropEntries drops all of a key's entries and its charge; s.mu is held.
func (c *Cache) dropEntries(s *shard, rec *keyRec) {
	if rec.n > 0 || rec.inLRU {
		c.used.Add(-rec.size - rec.keyCharge())
		c.nentries.Add(-int64(rec.n))
		rec.entries = [2]map[string]*entry{}
		rec.last, rec.lastRaw = nil, ""
		rec.n, rec.size = 0, 0
		rec.hits.Store(0)
	}
	if rec.inLRU {
		s.lru.Remove(rec.h)
		rec.inLRU = false
	}
}

// maybeForget deletes a record nothing refers to any more; s.mu is held.
// A note (notKept) keeps its record only while it holds, that is for the
// generation it was taken in.
func (c *Cache) maybeForget(s *shard, rec *keyRec) {
	if rec.note != nil && rec.note.gen != rec.gen {
		c.dropNote(rec)
	}
	if rec.n == 0 && rec.pending == 0 && rec.inflight == 0 && rec.aside == nil && rec.note == nil && s.recs[rec.h] == rec {
		delete(s.recs, rec.h)
	}
}

// reserve charges n bytes against the budget, evicting least recently used
// keys as needed. A key at least as hot (by the sketch) as the one being
// stored is not evicted for it, unless admission is off (admit_min_reads 0).
func (c *Cache) reserve(n int64, est uint64) bool {
	max := int64(c.cfg.MaxBytes)
	for evictions := 0; ; {
		cur := c.used.Load()
		if cur+n <= max {
			if c.used.CompareAndSwap(cur, cur+n) {
				return true
			}
			continue
		}
		if evictions >= 64 || !c.evictOne(est) {
			return false
		}
		evictions++
	}
}

// evictOne evicts the least recently used key of the next shard that has
// one.
func (c *Cache) evictOne(est uint64) bool {
	for range numShards {
		s := &c.shards[c.evictNext.Add(1)%numShards]
		s.mu.Lock()
		h, rec, ok := s.lru.GetOldest()
		if !ok {
			s.mu.Unlock()
			continue
		}
		if c.cfg.AdmitMinReads > 0 && c.reads.estimate(h) >= est {
			s.mu.Unlock()
			return false
		}
		up := rec.up
		c.dropEntries(s, rec)
		c.maybeForget(s, rec)
		s.mu.Unlock()
		c.ups[up].m.evictions.Inc()
		return true
	}
	return false
}

// invalidate drops db/key because Redis said it changed on a connection
// of upstream by.
func (c *Cache) invalidate(db int, key []byte, by *upstreamTier) {
	h := c.hash(db, key)
	s := c.shardOf(h)
	s.mu.Lock()
	if rec := s.recs[h]; rec != nil && rec.same(db, key) {
		rec.gen++
		c.dropEntries(s, rec)
		c.dropAside(rec)
		c.maybeForget(s, rec)
	}
	s.mu.Unlock()
	by.m.invalidated.Inc()
}

// flush drops every key of db (all databases when db < 0), counted under
// upstream by, which caused it (nil: none did; the default upstream).
// Entries of keys with a stale_if_error rule are moved aside when the
// flush is caused by a lost connection, and kept from then on for the
// rule's max_age.
func (c *Cache) flush(db int, reason string, by *upstreamTier) {
	c.flushKeeping(db, reason, by, reason == FlushDisconnect)
}

// flushKeeping is flush, with keepAside saying whether stale_if_error
// values are moved aside (only ever on a lost connection).
func (c *Cache) flushKeeping(db int, reason string, by *upstreamTier, keepAside bool) {
	c.drop(db, reason, by, nil, keepAside)
}

// flushOwn is flushKeeping of only what was read from upstream up, for the
// events of up's own connections (lost, reconnected, switched). With
// routes, a key is filled, tracked and served through the connections of
// its route's upstream alone (and a route change flushes everything), so
// the other upstreams' entries are not touched: a lost connection or a
// failover of one upstream used to drop every upstream's (found by a
// probe).
func (c *Cache) flushOwn(db int, reason string, up *upstreamTier, keepAside bool) {
	c.drop(db, reason, up, up, keepAside)
}

// drop is flushKeeping of the keys last filled from only (nil: of any
// upstream).
func (c *Cache) drop(db int, reason string, by, only *upstreamTier, keepAside bool) {
	if by == nil {
		by = c.ups[0]
	}
	by.m.flushed(reason)
	lost := reason == FlushDisconnect
	now := nanotime()
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		for _, rec := range s.recs {
			if db >= 0 && rec.db != db || only != nil && c.ups[rec.up] != only {
				continue
			}
			rec.gen++
			var keep *aside
			if keepAside && rec.n > 0 {
				if rule := c.staleRule([]byte(rec.key)); rule != nil {
					keep = newAside(rec, now, now+int64(rule.MaxAge.Duration))
				}
			}
			c.dropEntries(s, rec)
			if keep != nil || !lost {
				c.dropAside(rec)
			}
			if keep != nil {
				// The same bytes stay in memory, so they stay charged.
				rec.aside = keep
				c.used.Add(keep.size)
			}
			c.maybeForget(s, rec)
		}
		s.mu.Unlock()
	}
}

// Fence makes the tier serve no hit until every fill connection has
// answered a PING sent after this call. Redis sends a connection the
// invalidations caused by a write before any reply it sends after the
// write, so once those PINGs are answered, whatever a write the proxy could
// not name the keys of had changed has been dropped.
func (c *Cache) Fence() {
	if h := hooks.Load(); h != nil && h.SkipFences {
		return
	}
	now := nanotime()
	for {
		cur := c.fenceAt.Load()
		if cur >= now || c.fenceAt.CompareAndSwap(cur, now) {
			break
		}
	}
	c.m.fences.Inc()
	for i := range c.conns {
		if fc := c.conns[i].Load(); fc != nil {
			fc.wake()
		}
	}
	c.nodes.Range(func(_, v any) bool {
		v.(*fillConn).wake()
		return true
	})
}

// maintain ages the frequency sketches every admission window and drops
// expired entries and stale-if-error values a shard at a time.
func (c *Cache) maintain() {
	defer c.workers.Done()
	t := time.NewTicker(c.cfg.AdmitWindow.Duration)
	defer t.Stop()
	next := 0
	for {
		select {
		case <-c.stop:
			return
		case <-c.halveNow:
			// Only the sketch that filled up; the other keeps its window.
			if c.reads.adds.Load() >= c.reads.limit {
				c.reads.halve()
			}
			if c.writes.adds.Load() >= c.writes.limit {
				c.writes.halve()
			}
			continue
		case <-t.C:
		}
		c.reads.halve()
		c.writes.halve()
		for range numShards / 4 {
			c.sweep(&c.shards[next%numShards])
			next++
		}
	}
}

// wantHalve asks the maintenance goroutine to halve a full sketch.
func (c *Cache) wantHalve() {
	select {
	case c.halveNow <- struct{}{}:
	default:
	}
}

func (c *Cache) sweep(s *shard) {
	now := nanotime()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, rec := range s.recs {
		for p := range rec.entries {
			for raw, e := range rec.entries[p] {
				if now >= e.expire {
					c.removeEntry(s, rec, p, raw)
				}
			}
		}
		if rec.aside != nil && now >= rec.aside.until {
			c.dropAside(rec)
			c.maybeForget(s, rec)
		}
		if rec.note != nil && now >= rec.note.until {
			c.dropNote(rec)
			c.maybeForget(s, rec)
		}
	}
}

var cmdCachingYes = resp.AppendCommandStrings(nil, "CLIENT", "CACHING", "YES")
