package localcache

import (
	"bytes"
	"errors"

	"github.com/redproxy/redproxy/internal/resp"
	"github.com/redproxy/redproxy/internal/upstream"
)

// Cluster mode (Options.Cluster set), and a cluster upstream of routes
// (Options.Routes.Clusters).
//
// Redis tracks what a connection read on the node that served it, and
// sends the invalidations on that connection only, so the tier keeps one
// fill connection per node instead of one per database (a cluster has
// database 0 only). A key is served and filled through the connection of
// the node that owns its slot in the router's map at that moment, and an
// entry is served only if it was filled in that connection's current
// epoch. From that:
//
//   - Resharding. MIGRATE deletes each key it moves from the old node,
//     which sends the invalidation on our connection there before it
//     answers anything else; a fill sent to a node that no longer has the
//     key is answered with MOVED or ASK, which is never kept (Fill returns
//     ErrRedirected and the read goes through the router). Once the map
//     names the new owner, entries filled from the old one no longer
//     match the connection's epoch and are never served again.
//   - Failover. The new primary never saw our reads, so it sends no
//     invalidation for them. The heartbeat of a node's connection is ROLE,
//     not PING: a node that answers it as a replica has been demoted, and
//     the tier then drops everything (FlushDemoted), starts a new epoch on
//     that connection (which is not live again until the node answers as
//     a primary) and asks the router for a new map. Hits from a node stop
//     within S of its demotion, and a primary that fails stops them at
//     once when its connection drops (C4).
//   - A lost node connection flushes the whole tier (with routes, the
//     whole of that cluster upstream's part of it), not only what that
//     node served: the connection's epoch change already makes its own
//     entries unservable at once, and a flush, which happens rarely, is
//     simpler to reason about than a per-node one.

// ErrRedirected: in cluster mode, the node asked for a fill answered with
// an error (MOVED, ASK, TRYAGAIN, CLUSTERDOWN, ...). Nothing was kept; the
// caller forwards the read through the router, which follows it.
var ErrRedirected = errors.New("localcache: the node redirected the fill")

// FlushDemoted: a cluster node the tier read from is no longer a primary.
const FlushDemoted = "node_demoted"

var cmdRole = resp.AppendCommandStrings(nil, "ROLE")

// rolePrimary is how ROLE's reply starts on a primary, in RESP2 and RESP3
// alike.
var rolePrimary = []byte("*3\r\n$6\r\nmaster\r\n")

// upstreamTier is one upstream the tier reads from: the only one without
// routes, or one of routes. A cluster upstream (cluster set) is tracked
// per node with the guarantees above, whether it is [upstream] in cluster
// mode or a named upstream of routes: the same connections, epochs and
// ROLE heartbeat serve both.
type upstreamTier struct {
	name    string // the upstream's name with routes, "" without
	idx     int    // its index in Cache.ups (the route index)
	cluster *Cluster
	m       *upstreamMetrics
}

// ownerKey names a fill connection in cluster mode or with routes: a
// node of a cluster upstream (database 0), or one database of another
// upstream of routes.
type ownerKey struct {
	up   int
	node string
	db   int
}

func (fc *fillConn) key() ownerKey { return ownerKey{fc.up.idx, fc.node, fc.db} }

// nodeConn returns the fill connection of database db of upstream u (of
// its node when u is a cluster), starting it on first use; nil while the
// tier is closed or switching upstreams.
func (c *Cache) nodeConn(u *upstreamTier, node string, db int) *fillConn {
	k := ownerKey{u.idx, node, db}
	if v, ok := c.nodes.Load(k); ok {
		return v.(*fillConn)
	}
	c.connMu.Lock()
	defer c.connMu.Unlock()
	if v, ok := c.nodes.Load(k); ok {
		return v.(*fillConn)
	}
	if c.closed.Load() || c.switching {
		return nil
	}
	fc := c.newFillConn(u, node, db)
	c.nodes.Store(k, fc)
	return fc
}

// ConnectNode starts the fill connection of node addr of [upstream]'s
// cluster now rather than on the first read of one of its keys.
func (c *Cache) ConnectNode(addr string) {
	if c.ups[0].cluster != nil {
		c.nodeConn(c.ups[0], addr, 0)
	}
}

// DropNodes closes the fill connections of the nodes addrs of the cluster
// that is [upstream] (name "") or the upstream of routes called name:
// they left the cluster's slot map. Without it the tier dialled a node
// removed and shut down for as long as the proxy ran, logging each failed
// dial, its loss flushed the whole tier, and Live stayed false (found by
// a cluster probe). Nothing is flushed: what a node filled is served only
// through its connection in the epoch it was filled in, which retire ends,
// and the map names no slot of a departed node. A node that comes back is
// dialled again on the next read of one of its keys.
func (c *Cache) DropNodes(name string, addrs []string) {
	u := c.ups[0]
	if name != "" {
		u = c.upstreamNamed(name)
	}
	if u == nil || u.cluster == nil {
		return
	}
	var gone []*fillConn
	c.connMu.Lock()
	for _, a := range addrs {
		k := ownerKey{u.idx, a, 0}
		if v, ok := c.nodes.LoadAndDelete(k); ok {
			fc := v.(*fillConn)
			fc.retire()
			gone = append(gone, fc)
		}
	}
	c.connMu.Unlock()
	for _, fc := range gone {
		fc.pipe.Close()
		c.log.Info("local tier: closed the tracking connection of a node that left the cluster", "upstream", u.name, "node", fc.node)
	}
}

// LiveNode reports whether hits from node addr of [upstream]'s cluster may
// be served now.
func (c *Cache) LiveNode(addr string) bool { return c.live(ownerKey{0, addr, 0}) }

// upstreamNamed is the upstream of routes called name, nil if none.
func (c *Cache) upstreamNamed(name string) *upstreamTier {
	if c.opt.Routes == nil {
		return nil
	}
	for _, u := range c.ups {
		if u.name == name {
			return u
		}
	}
	return nil
}

// ConnectOwner starts the fill connection of database db of the upstream
// of routes called owner now rather than on the first read of one of its
// keys; for a cluster upstream, see ConnectUpstreamNode.
func (c *Cache) ConnectOwner(owner string, db int) {
	if u := c.upstreamNamed(owner); u != nil && u.cluster == nil {
		c.nodeConn(u, "", db)
	}
}

// ConnectUpstreamNode starts the fill connection of node addr of the
// cluster upstream of routes called name.
func (c *Cache) ConnectUpstreamNode(name, addr string) {
	if u := c.upstreamNamed(name); u != nil && u.cluster != nil {
		c.nodeConn(u, addr, 0)
	}
}

// LiveUpstreamNode reports whether hits from node addr of the cluster
// upstream of routes called name may be served now.
func (c *Cache) LiveUpstreamNode(name, addr string) bool {
	u := c.upstreamNamed(name)
	return u != nil && c.live(ownerKey{u.idx, addr, 0})
}

// LiveOwner reports whether hits of database db from the upstream of
// routes called owner may be served now; for a cluster upstream, whether
// they may be from every primary the tier has a connection to.
func (c *Cache) LiveOwner(owner string, db int) bool {
	u := c.upstreamNamed(owner)
	return u != nil && c.liveUpstream(u, db)
}

func (c *Cache) live(k ownerKey) bool {
	v, ok := c.nodes.Load(k)
	return ok && v.(*fillConn).live(nanotime(), c.fenceAt.Load())
}

// clusterNode reports whether fc tracks a node of a cluster.
func (fc *fillConn) clusterNode() bool { return fc.up.cluster != nil }

// liveNodes reports whether every owner connection of db that tracks a
// primary is live, and there is at least one.
func (c *Cache) liveNodes(db int) bool { return c.liveWhere(db, nil) }

// liveUpstream is liveNodes for the connections of upstream u only.
func (c *Cache) liveUpstream(u *upstreamTier, db int) bool { return c.liveWhere(db, u) }

func (c *Cache) liveWhere(db int, u *upstreamTier) bool {
	now, fence := nanotime(), c.fenceAt.Load()
	n := 0
	all := true
	c.nodes.Range(func(_, v any) bool {
		fc := v.(*fillConn)
		if fc.demoted.Load() || fc.db != db || (u != nil && fc.up != u) {
			return true
		}
		n++
		all = all && fc.live(now, fence)
		return all
	})
	return all && n > 0
}

// nodeConns lists the node connections.
func (c *Cache) nodeConns() []*fillConn {
	var out []*fillConn
	c.nodes.Range(func(_, v any) bool {
		out = append(out, v.(*fillConn))
		return true
	})
	return out
}

// primaryNow reads the reply of a heartbeat ROLE on a cluster node's
// connection: true if the node is a primary, so the heartbeat counts.
// Otherwise the node was demoted (or refuses ROLE): what it served may be
// overwritten on its successor without an invalidation here, so nothing
// it filled is served again, and the router is told.
func (fc *fillConn) primaryNow(call *upstream.Call) bool {
	reply, err := call.Reply(0)
	if err == nil && bytes.HasPrefix(reply, rolePrimary) {
		fc.demoted.Store(false)
		return true
	}
	fc.mu.Lock()
	wasLive := fc.ackSent.Load() != 0
	fc.epoch.Store(fc.c.epochs.Add(1))
	fc.ackSent.Store(0)
	fc.mu.Unlock()
	if err == nil && resp.IsError(reply) {
		// Not a demotion: the upstream user may not run ROLE (it is in
		// @admin). Said once per connection, not every heartbeat.
		if fc.roleRefused.CompareAndSwap(false, true) {
			fc.c.log.Warn("local tier: a cluster node refused ROLE, so its keys are never served from the tier; allow ROLE to the upstream user", "upstream", fc.up.name, "node", fc.node, "reply", string(bytes.TrimSpace(reply)))
		}
		return false
	}
	fc.demoted.Store(true)
	if !wasLive {
		return false
	}
	fc.c.flush(fc.db, FlushDemoted, fc.up)
	if f := fc.up.cluster.Demoted; f != nil {
		f(fc.node)
	}
	fc.c.log.Warn("local tier: a cluster node is no longer a primary; the tier was flushed", "upstream", fc.up.name, "node", fc.node)
	return false
}
