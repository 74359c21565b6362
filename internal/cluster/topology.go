package cluster

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redproxy/redproxy/internal/resp"
	"github.com/redproxy/redproxy/internal/upstream"
)

// ErrNoTopology: no node could be asked, or none answered with a usable
// slot map.
var ErrNoTopology = errors.New("redproxy: no cluster node answered with a slot map")

// Map is one view of the cluster: who serves each slot.
type Map struct {
	// owner[s] indexes primaries; -1 while the slot has no owner.
	owner     [Slots]int16
	primaries []string // addresses, host:port
	replicas  []string // every replica's address, for asking views
	// replicasOf[i] are the replicas of primaries[i] the answering node
	// named (reads from replicas); nil for a primary added by MOVED.
	replicasOf [][]string
	// downReplicas are the replicas the answering node flagged as failed
	// (CLUSTER SHARDS's health "fail"); carried are the replicas listed
	// with a primary only because the previous map did, by "primary
	// replica", since when (mergeReplicas).
	downReplicas []string
	carried      map[string]time.Time
	// failed are the primaries most views of the slot map flagged as
	// failed (loadMap): CLUSTER SHARDS's health "fail", the cluster's
	// consensus. They keep their slots until a replica takes
	// over or an operator moves them; CLUSTER SLOTS says nothing of it.
	failed []string
	// health: the view came from CLUSTER SHARDS, which says which nodes
	// failed; a CLUSTER SLOTS view (Redis before 7.0) cannot tell.
	health bool

	// ordered caches Primaries, which keyless commands ask for often, and
	// live LivePrimaries.
	orderedOnce sync.Once
	ordered     []string
	liveOnce    sync.Once
	live        []string
	// fp caches fingerprint, which every map refresh, every replica poll
	// (cluster mode with read_from) and every SCAN call ask for: it walks
	// all 16384 slots. A Map is not changed once built.
	fpOnce sync.Once
	fp     string
	// scanHashes caches scanHash per SCAN base and slot (uint32 to
	// uint64), at most scanHashesCached of them (counted in scanHashesN).
	scanHashes  sync.Map
	scanHashesN atomic.Int64
}

// newMap returns a map with no slot assigned.
func newMap() *Map {
	m := &Map{}
	for i := range m.owner {
		m.owner[i] = -1
	}
	return m
}

// Owner is the address of the primary serving slot s, or "".
func (m *Map) Owner(s int) string {
	if i := m.owner[s]; i >= 0 {
		return m.primaries[i]
	}
	return ""
}

// ReplicasOf are the replicas of the primary at addr, as the node whose
// view the map is named them: those CLUSTER SHARDS (or CLUSTER SLOTS)
// listed with it. The slice must not be changed.
func (m *Map) ReplicasOf(addr string) []string {
	if i := slices.Index(m.primaries, addr); i >= 0 && i < len(m.replicasOf) {
		return m.replicasOf[i]
	}
	return nil
}

// Failed reports whether the cluster flagged the primary at addr as failed
// (see Map.failed): it still owns its slots, but nothing it is sent is
// answered.
func (m *Map) Failed(addr string) bool { return slices.Contains(m.failed, addr) }

// Fingerprint is a canonical text of who serves which slots: equal for
// two maps that route every slot alike.
func (m *Map) Fingerprint() string { return m.fingerprint() }

// Primaries are the addresses of the primaries that own at least one slot,
// ordered by the lowest slot each owns.
func (m *Map) Primaries() []string {
	m.orderedOnce.Do(func() { m.ordered = m.primariesBySlot() })
	return m.ordered
}

// LivePrimaries are Primaries but those the cluster flagged as failed
// (Failed): where keyless commands, the proxy's own connections and MONITOR
// may go, and what readiness asks for. The slice must not be changed.
func (m *Map) LivePrimaries() []string {
	m.liveOnce.Do(func() {
		for _, a := range m.Primaries() {
			if !m.Failed(a) {
				m.live = append(m.live, a)
			}
		}
	})
	return m.live
}

func (m *Map) primariesBySlot() []string {
	seen := make([]bool, len(m.primaries))
	var out []string
	for s := range m.owner {
		if i := m.owner[s]; i >= 0 && !seen[i] {
			seen[i] = true
			out = append(out, m.primaries[i])
		}
	}
	return out
}

// lowestSlot is the lowest slot addr owns, or -1.
func (m *Map) lowestSlot(addr string) int {
	for s := range m.owner {
		if i := m.owner[s]; i >= 0 && m.primaries[i] == addr {
			return s
		}
	}
	return -1
}

// nodes are every node the map names, primaries first.
func (m *Map) nodes() []string {
	return append(slices.Clone(m.primaries), m.replicas...)
}

// withOwner returns a copy of m in which addr serves slot s (after a MOVED).
func (m *Map) withOwner(s int, addr string) *Map {
	n := &Map{owner: m.owner, primaries: m.primaries, replicas: m.replicas, replicasOf: m.replicasOf, failed: m.failed, carried: m.carried}
	i := slices.Index(n.primaries, addr)
	if i < 0 {
		n.primaries = append(slices.Clone(n.primaries), addr)
		i = len(n.primaries) - 1
	}
	n.owner[s] = int16(i)
	return n
}

// assign makes addr the owner of slots [from, to].
func (m *Map) assign(from, to int, addr string) error {
	if from < 0 || to >= Slots || from > to || addr == "" {
		return errBadReply
	}
	i := m.primaryIndex(addr)
	for s := from; s <= to; s++ {
		m.owner[s] = int16(i)
	}
	return nil
}

// primaryIndex is addr's index in primaries, added if new.
func (m *Map) primaryIndex(addr string) int {
	i := slices.Index(m.primaries, addr)
	if i < 0 {
		m.primaries = append(m.primaries, addr)
		m.replicasOf = append(m.replicasOf, nil)
		i = len(m.primaries) - 1
	}
	return i
}

// addReplica records addr as a replica of primary.
func (m *Map) addReplica(primary, addr string) {
	i := m.primaryIndex(primary)
	if !slices.Contains(m.replicasOf[i], addr) {
		m.replicasOf[i] = append(m.replicasOf[i], addr)
	}
	if !slices.Contains(m.replicas, addr) {
		m.replicas = append(m.replicas, addr)
	}
}

// fingerprint is a canonical text of the map's slot ranges and owners, so
// that views from different nodes can be compared and counted.
func (m *Map) fingerprint() string {
	m.fpOnce.Do(func() { m.fp = m.slotRanges() })
	return m.fp
}

// slotRanges is fingerprint, uncached.
func (m *Map) slotRanges() string {
	var b strings.Builder
	start := 0
	for s := 1; s <= Slots; s++ {
		if s == Slots || m.owner[s] != m.owner[start] {
			fmt.Fprintf(&b, "%d-%d=%s;", start, s-1, m.Owner(start))
			start = s
		}
	}
	return b.String()
}

// complete reports whether every slot has an owner.
func (m *Map) complete() bool {
	for _, o := range m.owner {
		if o < 0 {
			return false
		}
	}
	return true
}

var (
	cmdShards = resp.AppendCommandStrings(nil, "CLUSTER", "SHARDS")
	cmdSlots  = resp.AppendCommandStrings(nil, "CLUSTER", "SLOTS")
)

// askView fetches one node's view: CLUSTER SHARDS (Redis 7), else CLUSTER
// SLOTS.
func askView(opt upstream.Options) (*Map, error) {
	reply, err := upstream.RoundTrip(opt, cmdShards)
	if err != nil {
		return nil, err
	}
	if !resp.IsError(reply) {
		return parseShards(reply, opt.Addr, opt.TLS != nil)
	}
	reply, err = upstream.RoundTrip(opt, cmdSlots)
	if err != nil {
		return nil, err
	}
	return parseSlots(reply, opt.Addr)
}

// topArray is a topology reply's top-level array. Redis's own refusal
// (LOADING after a restart, a node still joining) is returned as it is:
// logged as "malformed" it hid what to wait for (found by a probe).
func topArray(v any) ([]any, error) {
	switch a := v.(type) {
	case []any:
		return a, nil
	case replyError:
		return nil, a
	}
	return nil, fmt.Errorf("%w: %v", errBadReply, v)
}

// parseShards reads CLUSTER SHARDS: per shard, its slot ranges and nodes,
// each node a map with ip, endpoint, port, tls-port, role, health. Over TLS
// (useTLS) a node is dialled at its tls-port.
func parseShards(reply []byte, from string, useTLS bool) (*Map, error) {
	v, err := parseValue(reply)
	if err != nil {
		return nil, err
	}
	shards, err := topArray(v)
	if err != nil {
		return nil, err
	}
	m := newMap()
	m.health = true
	for _, sh := range shards {
		fields := pairs(sh)
		slots, _ := fields["slots"].([]any)
		nodes, _ := fields["nodes"].([]any)
		primary := ""
		var shardReplicas []string
		for _, n := range nodes {
			nf := pairs(n)
			addr := nodeAddr(nf, from, useTLS)
			if addr == "" {
				continue
			}
			switch {
			case nf["role"] == "master":
				primary = addr
				if nf["health"] == "fail" {
					m.failed = append(m.failed, addr)
				}
			case nf["health"] != "fail":
				// ("loading" also means "no offset gossiped yet", as for
				// a synced replica of an idle primary: whether it can
				// serve reads is for its own INFO to say.)
				shardReplicas = append(shardReplicas, addr)
			default:
				m.replicas = append(m.replicas, addr)
				m.downReplicas = append(m.downReplicas, addr)
			}
		}
		if len(slots) == 0 {
			// A primary with no slots is still a node of the cluster: one
			// just added, or one a failover demoted, as a node that has
			// not yet heard which primary it now replicates sees it. Left
			// out, it was no node of the map, so dropDeparted closed its
			// connections with commands still pending on them (a SET
			// answered "upstream closed" in TestClusterFailover).
			if primary != "" {
				m.replicas = append(m.replicas, primary)
			}
			m.replicas = append(m.replicas, shardReplicas...)
			continue
		}
		for _, r := range shardReplicas {
			if primary != "" {
				m.addReplica(primary, r)
			}
		}
		if primary == "" || len(slots)%2 != 0 {
			return nil, fmt.Errorf("%w: shard without a primary", errBadReply)
		}
		for i := 0; i < len(slots); i += 2 {
			lo, ok1 := slots[i].(int64)
			hi, ok2 := slots[i+1].(int64)
			if !ok1 || !ok2 {
				return nil, errBadReply
			}
			if err := m.assign(int(lo), int(hi), primary); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// pairs reads a flattened map ([k1, v1, k2, v2, ...]).
func pairs(v any) map[string]any {
	a, _ := v.([]any)
	out := make(map[string]any, len(a)/2)
	for i := 0; i+1 < len(a); i += 2 {
		if k, ok := a[i].(string); ok {
			out[k] = a[i+1]
		}
	}
	return out
}

// nodeAddr is where to dial a node of CLUSTER SHARDS: its endpoint, or its
// ip when the endpoint is unknown ("?") or empty; an empty endpoint means
// "the address you asked", as in CLUSTER SLOTS. Over TLS the port is the
// node's tls-port: Redis lists "port" for the plaintext one (absent when
// that is off) and "tls-port" apart. Reading "port" alone dropped every
// node of a TLS-only cluster and dialled the plaintext port of the others
// with TLS, so a cluster behind [upstream.tls] never served (found by
// review). CLUSTER SLOTS and MOVED over TLS already name the TLS port.
func nodeAddr(f map[string]any, from string, useTLS bool) string {
	key := "port"
	if useTLS {
		key = "tls-port"
	}
	port, _ := f[key].(int64)
	if port == 0 && useTLS {
		// No TLS port listed: TLS is the network's (a sidecar at the
		// node's port), not the node's.
		port, _ = f["port"].(int64)
	}
	if port == 0 {
		return ""
	}
	host, _ := f["endpoint"].(string)
	if host == "" || host == "?" {
		host, _ = f["ip"].(string)
	}
	if host == "" || host == "?" {
		host, _, _ = net.SplitHostPort(from)
	}
	return net.JoinHostPort(host, strconv.FormatInt(port, 10))
}

// parseSlots reads CLUSTER SLOTS: [start, end, [host, port, id, ...]
// primary, replicas...] per range.
func parseSlots(reply []byte, from string) (*Map, error) {
	v, err := parseValue(reply)
	if err != nil {
		return nil, err
	}
	ranges, err := topArray(v)
	if err != nil {
		return nil, err
	}
	m := newMap()
	fromHost, _, _ := net.SplitHostPort(from)
	addrOf := func(n any) string {
		a, _ := n.([]any)
		if len(a) < 2 {
			return ""
		}
		host, _ := a[0].(string)
		port, _ := a[1].(int64)
		if host == "" || host == "?" {
			host = fromHost
		}
		return net.JoinHostPort(host, strconv.FormatInt(port, 10))
	}
	for _, r := range ranges {
		a, _ := r.([]any)
		if len(a) < 3 {
			return nil, errBadReply
		}
		lo, ok1 := a[0].(int64)
		hi, ok2 := a[1].(int64)
		if !ok1 || !ok2 {
			return nil, errBadReply
		}
		if err := m.assign(int(lo), int(hi), addrOf(a[2])); err != nil {
			return nil, err
		}
		for _, rep := range a[3:] {
			if addr := addrOf(rep); addr != "" {
				m.addReplica(addrOf(a[2]), addr)
			}
		}
	}
	return m, nil
}

// maxAsked bounds how many nodes one refresh asks.
const maxAsked = 16

// loadMap asks the nodes at addrs (at most maxAsked, concurrently) for
// their views and returns the view a strict majority of those that
// answered share. A view held by a minority is not believed: a node cut
// off from the others, or one that missed a failover, must not steer
// routing. With no majority, the most common complete view is returned
// only when current is nil (there is nothing better to route with), so a
// proxy can start while the cluster is in flux; otherwise ErrNoTopology.
//
// asking, when not nil, holds the nodes asked by an earlier call whose
// answer is still due (loadMap does not wait for them all): those are not
// asked again until it comes, so that refreshes every 100 ms do not pile
// up connections on a hung node, each held for reply_timeout.
func loadMap(base upstream.Options, addrs []string, current *Map, asking *sync.Map) (*Map, error) {
	addrs = dedupe(addrs)
	if len(addrs) > maxAsked {
		addrs = addrs[:maxAsked]
	}
	type answer struct {
		m   *Map
		err error
	}
	// Buffered: an ask still under way when loadMap returns ends on its
	// own (its reply_timeout at most) without blocking.
	results := make(chan answer, len(addrs))
	for _, a := range addrs {
		if asking != nil {
			if _, due := asking.LoadOrStore(a, struct{}{}); due {
				results <- answer{err: fmt.Errorf("%s: still asked by an earlier refresh", a)}
				continue
			}
		}
		go func() {
			if asking != nil {
				defer asking.Delete(a)
			}
			o := base
			o.Addr = a
			o.Name = "redproxy-topology"
			m, err := askView(o)
			results <- answer{m, err}
		}()
	}
	// Once one view is held by most of the nodes asked, no answer still
	// due can outvote it: the map is known. Waiting for every node held a
	// refresh for reply_timeout on a hung one (a frozen host), so a
	// failover's new primary was adopted only then, its slots' clients
	// waiting on the old one meanwhile (found by a fault probe).
	var answers []answer
	votes := map[string]int{}
	views := map[string]*Map{}
	answered := 0
	var lastErr error
	for range addrs {
		a := <-results
		answers = append(answers, a)
		if a.err != nil {
			lastErr = a.err
			continue
		}
		answered++
		fp := a.m.fingerprint()
		votes[fp]++
		views[fp] = a.m
		if 2*votes[fp] > len(addrs) {
			break
		}
	}
	if answered == 0 {
		if lastErr == nil {
			lastErr = errors.New("no node to ask")
		}
		return nil, fmt.Errorf("%w: %v", ErrNoTopology, lastErr)
	}
	best, bestVotes := "", 0
	for fp, n := range votes {
		if best == "" || beats(n, views[fp].complete(), fp, bestVotes, views[best].complete(), best) {
			best, bestVotes = fp, n
		}
	}
	if 2*bestVotes > answered || current == nil {
		m := views[best]
		// A primary is taken as failed when most views of the chosen map
		// flag it: a node clears the flag only once it hears from the
		// primary itself, so one node with a bad link to it can hold the
		// flag long after it came back, and believed, it would have the
		// primary's connections cut each time that node's answer made it
		// into a refresh (cutNewlyFailed; found by review).
		same := make([]*Map, 0, bestVotes)
		for _, a := range answers {
			if a.m != nil && a.m.fingerprint() == best {
				same = append(same, a.m)
			}
		}
		m.failed = failedByMost(same)
		m.mergeReplicas(same, current, time.Now())
		// Every node named by any view is worth asking next time.
		for _, a := range answers {
			if a.m != nil {
				for _, n := range a.m.nodes() {
					if !slices.Contains(m.primaries, n) && !slices.Contains(m.replicas, n) {
						m.replicas = append(m.replicas, n)
					}
				}
			}
		}
		return m, nil
	}
	return nil, fmt.Errorf("%w: no view is held by a majority of the %d nodes that answered", ErrNoTopology, answered)
}

// mergeReplicas makes each primary's replicas those any of the agreeing
// views lists with it, and, for up to replicaCarryFor, those current
// listed with it that no view lists with it now but none places
// elsewhere either (with another primary, as a primary of slots, or
// failed). One view's list alone flapped: a node that has not yet heard
// that a replica follows its primary (gossip takes a moment after
// CLUSTER REPLICATE or cluster create) lists it as a primary of no
// slots, so as answers alternated the replica left the proxy's replica
// set and came back with new connections, and read_from = "replica"
// refused reads of that shard meanwhile (TestClusterReplicaReadsGoTo-
// Replicas in CI). The carry is bounded so that a replica reset into an
// empty primary, which every view then shows as a primary of no slots,
// leaves (found by review). Listing too many is harmless: a replica
// serves reads only once its own INFO says it replicates that primary's
// history (replicaSet.checkReplica).
func (m *Map) mergeReplicas(views []*Map, current *Map, now time.Time) {
	serving := map[string]bool{}
	for _, p := range m.Primaries() {
		serving[p] = true
	}
	for _, v := range views {
		if v == m {
			continue
		}
		for i, p := range v.primaries {
			if i >= len(v.replicasOf) || !serving[p] {
				continue
			}
			for _, r := range v.replicasOf[i] {
				m.addReplica(p, r)
			}
		}
	}
	if current == nil {
		return
	}
	elsewhere := func(r, p string) bool {
		if serving[r] {
			return true
		}
		for _, v := range views {
			if slices.Contains(v.downReplicas, r) {
				return true
			}
			for i, q := range v.primaries {
				if q != p && i < len(v.replicasOf) && slices.Contains(v.replicasOf[i], r) {
					return true
				}
			}
		}
		return false
	}
	named := map[string]bool{}
	for _, v := range views {
		for _, a := range v.nodes() {
			named[a] = true
		}
	}
	for i, p := range current.primaries {
		if i >= len(current.replicasOf) || !serving[p] {
			continue
		}
		for _, r := range current.replicasOf[i] {
			if slices.Contains(m.ReplicasOf(p), r) {
				continue // listed with p now
			}
			// A replica no view names at all left the cluster (CLUSTER
			// FORGET), or the answering nodes never met it.
			if !named[r] || elsewhere(r, p) {
				continue
			}
			key := p + " " + r
			since, ok := current.carried[key]
			if !ok {
				since = now
			}
			if now.Sub(since) >= replicaCarryFor {
				continue
			}
			if m.carried == nil {
				m.carried = map[string]time.Time{}
			}
			m.carried[key] = since
			m.addReplica(p, r)
		}
	}
}

// replicaCarryFor bounds how long a replica no view lists with its
// primary stays listed (mergeReplicas): gossip tells every node of a new
// replica within a few cluster-node-timeout pings.
const replicaCarryFor = 10 * time.Second

// failedByMost are the primaries more than half of the views that can
// tell (CLUSTER SHARDS's) flag as failed, sorted: in a cluster upgraded
// node by node, CLUSTER SLOTS views, which never flag, would otherwise
// outvote those that do (found by review).
func failedByMost(views []*Map) []string {
	flags := map[string]int{}
	telling := 0
	for _, v := range views {
		if v.health {
			telling++
		}
		for _, f := range v.failed {
			flags[f]++
		}
	}
	var out []string
	for f, n := range flags {
		if 2*n > telling {
			out = append(out, f)
		}
	}
	slices.Sort(out)
	return out
}

func dedupe(a []string) []string {
	out := make([]string, 0, len(a))
	for _, s := range a {
		if s != "" && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// beats reports whether a view with votes n (complete or not, fingerprint
// fp) is preferred to the best so far: more votes, then on a tie the
// complete view, then the lexically first fingerprint, so that the choice
// does not depend on map iteration order. (The tie rule used to read
// "complete && !bestComplete || fp < best", which let an incomplete view
// with a smaller fingerprint displace a complete one, found by review.)
func beats(n int, complete bool, fp string, bestN int, bestComplete bool, best string) bool {
	switch {
	case n != bestN:
		return n > bestN
	case complete != bestComplete:
		return complete
	}
	return fp < best
}

// nextServed is the lowest slot from s on that has an owner, or -1.
func (m *Map) nextServed(s int) int {
	for ; s < Slots; s++ {
		if m.owner[s] >= 0 {
			return s
		}
	}
	return -1
}
