package localcache

// Routes mode (Options.Routes set).
//
// With routes ([upstreams.NAME], [[route]]) each key is served by the
// upstream of its route, and Redis sends the invalidations of what a
// connection read on that connection only, so the tier reuses cluster
// mode's per-owner connections: the owner of a key is its route's
// upstream, and there is one fill connection per upstream and database;
// for an upstream that is a cluster, the owner is the node of that
// upstream owning the key's slot, with cluster mode's guarantees
// (cluster.go): one connection per node, ROLE heartbeats, redirected
// fills never kept.
// A key is filled on, and its entries served only in the current epoch
// of, the connection of the upstream its route names at that moment; a
// fill is never read from another upstream. From that:
//
//   - A lost connection to one upstream starts a new epoch on it, so
//     nothing it filled is served again, and drops that upstream's
//     entries of the database (all of its nodes' for a cluster, as
//     cluster mode flushes on a lost node): nothing of that upstream is
//     served until a heartbeat on a new connection is answered. The
//     other upstreams' entries stay (flushOwn): their keys are filled,
//     tracked and served through their own connections only.
//   - A route change (Reroute, on a reload that changes the key routes)
//     moves keys to another upstream. An entry filled from the old owner
//     carries the old owner's epoch, which never matches the new owner's
//     connection, and the old owner keeps invalidating what it tracked; the
//     tier is still flushed, with a new epoch on every connection, so that
//     nothing filled under the old routes is kept at all: simpler to reason
//     about than entries of several owners for one key, for a rare event.
//     Hits resume one heartbeat later.
//   - A failover of [upstream] (Sentinel) switches the whole tier
//     (SwitchUpstream): every connection is retired and everything
//     dropped. A failover of a named Sentinel upstream retires that
//     upstream's connections and drops what was read from it only
//     (switchRouted).
//
// Connections to standalone and Sentinel upstreams are probed with PING,
// not ROLE: ROLE is in @admin, and a Sentinel upstream's demotion is
// handled by the failover above. A cluster upstream's nodes are probed
// with ROLE, as in cluster mode.

// FlushRoutes: the routes changed, so keys may have moved to another
// upstream.
const FlushRoutes = "routes_changed"

// Reroute changes which owner serves which keys: swap is called in the
// middle and must make Options.Routes.Route answer with the new routes. When
// Reroute returns, no entry filled before it, nor any fill sent to an
// owner chosen by the old routes, is ever served. Concurrent calls (and
// calls concurrent with SwitchUpstream) are the caller's to prevent.
func (c *Cache) Reroute(swap func()) {
	// A new epoch before the swap: nothing is served from here on until
	// a heartbeat is answered. Another after it: a fill that chose its
	// connection by the old routes stores in an epoch no longer current,
	// as does one from a connection dialled in between.
	c.newOwnerEpochs()
	swap()
	c.newOwnerEpochs()
	// The flush frees what the epochs already made unservable, and makes
	// any fill in flight store nothing (its key's generation moved).
	c.flush(-1, FlushRoutes, nil)
	for _, fc := range c.nodeConns() {
		fc.wake()
	}
	c.log.Info("local tier: routes changed; the tier was flushed")
}

// newOwnerEpochs starts a new epoch on every owner connection.
func (c *Cache) newOwnerEpochs() {
	c.connMu.Lock()
	defer c.connMu.Unlock()
	for _, fc := range c.nodeConns() {
		fc.newEpoch()
	}
}
