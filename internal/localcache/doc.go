// Package localcache is redproxy's local tier: it answers reads of hot keys
// from process memory, kept coherent with Redis by Redis's own
// server-assisted invalidation (CLIENT TRACKING).
//
// # Contract
//
// With S the configured staleness bound (localcache.staleness, default 1s):
//
//   - C1 If every write to key K goes through one redproxy instance P, the
//     history of reads and writes of K through P is linearizable.
//   - C2 For writes that reach Redis another way (another instance, a direct
//     client, a script), a read through P that starts at time t returns no
//     value older than any write of K acknowledged before t − S.
//   - C3 A client that received OK for a write of K through P never
//     afterwards reads an older value of K through P.
//   - C4 If P loses its invalidation stream (connection drop, half-open
//     connection, Redis restart, failover), it stops serving hits within S
//     and never serves an entry filled before the loss.
//   - C5 Memory stays within the configured byte budget; entries in the
//     middle of a fill are never evicted.
//
// stale_if_error rules relax C4, and only C4, for the keys they match: see
// stale.go.
//
// # How
//
// Fill connections. Each database has one RESP3 connection with CLIENT
// TRACKING ON OPTIN. A fill is one unit written contiguously on it: CLIENT
// CACHING YES, the client's read, PTTL key. So the read is tracked, and any
// later change of the key makes Redis push an invalidation on the same
// connection, after the fill's reply. The entry expires at min(send time +
// PTTL, fill time + max_ttl), so a key that expires in Redis without an
// invalidation (lazy expiry) is not served after it expired.
//
// Generations. Every key the tier knows has a generation; a fill records it
// before it is sent, and an invalidation, a flush or a write through the
// proxy changes it. A fill whose key's generation changed hands its reply to
// the clients waiting for it (their reads overlapped it) but does not keep
// it. Keys with fills in flight are kept outside the LRU and are never
// evicted (C5).
//
// Writes through the proxy (C1, C3). Before a write is sent, its keys are
// dropped and marked "write in flight" (on the key's record, or, for a key
// with none, in its shard's counting filter, so most writes allocate
// nothing); until its reply has arrived they are neither served nor filled. A fill sent after the reply reaches Redis
// after the write, so it reads the write's result. (A fence after every
// write would also do; BenchmarkWriteModes measured it slower, with half
// the hits, because it stops every key rather than the written ones.)
// Writes whose keys the
// proxy cannot name (scripts, MOVE, COPY ... DB, transactions, FLUSH*,
// SWAPDB) are followed by a fence: after their reply no hit is served until
// every fill connection has answered a PING sent after it, which Redis
// answers only after delivering the invalidations the write caused. The
// proxy raises it (WriteDone) before handing the reply to the client; a
// relay whose replies it no longer counts raises one before each chunk it
// passes on while such a write is held (and, for a held SWAPDB, drops its
// databases again: FlushSwapped).
//
// Liveness (C2, C4). Each fill connection sends a heartbeat PING every S/4.
// A hit is served only if the latest heartbeat whose reply has arrived was
// sent less than S ago (and after the latest fence): every write
// acknowledged before then has had its invalidation read. A half-open
// connection stops answering, so hits stop within S.
//
// # Cache interface contract
//
//   - Disconnect: when a fill connection is lost, its epoch changes before
//     anything else, so no entry it filled is served again; the entries are
//     then dropped (stale_if_error values are moved aside), and fills in
//     flight on it are discarded.
//   - Reconnect: a new connection starts a new epoch with no heartbeat
//     answered; the tier serves again once a heartbeat on it is answered,
//     and only entries filled on it.
//   - Flush: a null invalidation (FLUSHALL or FLUSHDB anywhere on the server),
//     a forwarded FLUSHALL, FLUSHDB or SWAPDB, or tracking-redir-broken drop
//     everything the affected connections filled and discard their fills in
//     flight. A forwarded SWAPDB drops both databases again when its reply
//     arrives (WriteDone): no invalidation will drop what a fill read
//     between the first drop and the swap. A script that may run SWAPDB
//     (its text mentions swapdb: scripts.go) is handled the same way, for
//     every database.
//   - Switch (SwitchUpstream, a reload that changes the upstream): every
//     fill connection is retired before anything is dropped, so no fill
//     sent to the old server is kept whenever its reply comes; everything,
//     stale_if_error values included, is dropped; new connections to the
//     new server then start as after a reconnection. Nothing read from the
//     old server is served after the switch returns.
//
// Cluster mode (Options.Cluster): one fill connection per node rather than
// per database, a key served and filled through its slot owner's, and a ROLE
// heartbeat that catches a demoted primary; see cluster.go for how C1-C5
// hold across resharding and failover.
//
// Routes mode (Options.Routes): the owners are the upstreams of routes, one
// fill connection per upstream and database, a key served and filled
// through its route's upstream's; an upstream that is a cluster is tracked
// per node exactly as in cluster mode. A route change flushes the tier
// (Reroute); see routes.go. The tier's counters then carry the upstream
// (metrics.go).
//
// Limits: Redis 7 sends no invalidation for SWAPDB, so a SWAPDB the proxy
// cannot see coming is outside C2 (and C1, C3): one that does not pass
// through the proxy, and one run through it by a script the proxy could not
// tell may run it. The proxy flushes on a SWAPDB command, on EVAL of a
// script whose text mentions swapdb (any ASCII case), on EVALSHA of such a
// script it saw sent with SCRIPT LOAD, EVAL or EVAL_RO, and on every FCALL
// once a library mentioning swapdb was sent with FUNCTION LOAD; not on
// EVALSHA or FCALL of a script or library loaded another way (directly,
// through another proxy, before the proxy started, FUNCTION RESTORE), nor
// on a script that builds the command name at run time (scripts.go). A
// reply with no exact RESP2 form (resp2.go) is forwarded to RESP2 clients
// instead of cached.
//
// # What is cached
//
// Read-only deterministic commands with exactly one key (Cacheable), keyed by
// database, protocol and the exact command bytes; all commands of a key are
// dropped together. Never error replies, never replies for a key that does
// not exist unless negative_caching is on, never for clients in MULTI,
// holding a WATCH or subscribed (the proxy does not ask), and a hit is served
// only if nothing of the client's batch is still to be sent to Redis ahead
// of it.
//
// # Admission
//
// Only hot keys: a count-min sketch with a doorkeeper (TinyLFU) counts
// reads and writes per key (writes from a key's first read in the window
// on: only a read key can be admitted), halved every admit_window. A missed key is
// filled through the tier once its reads exceed admit_min_reads, unless it
// is written more than write_ratio times as often as read, or excluded by
// pattern; it is kept only if it is hotter than the least recently used key
// it would evict.
package localcache
