package proxy_test

import (
	"fmt"
	"hash/fnv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// scanThrough scans through rc from cursor, counting the keys in seen, until
// the walk ends or stopAt says to stop at the cursor returned.
func scanThrough(t *testing.T, rc *redis.Client, cursor uint64, seen map[string]int, stopAt func(cursor uint64) bool) uint64 {
	t.Helper()
	for calls := 0; ; calls++ {
		keys, next, err := rc.Scan(ctx, cursor, "scan:*", 100).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			seen[k]++
		}
		if cursor = next; cursor == 0 || stopAt != nil && stopAt(cursor) {
			return cursor
		}
		if calls > 100000 {
			t.Fatal("SCAN never ended")
		}
	}
}

// scanKeysN keys scan:0 ... are written by startScanCluster.
const scanKeysN = 6000

// startScanCluster starts a cluster of 3 primaries (with replicas each),
// a proxy in front of it and a client of the proxy, and writes scanKeysN
// keys through it.
func startScanCluster(t *testing.T, replicas int) (*redistest.Cluster, *proxytest.Proxy, *redis.Client) {
	t.Helper()
	c := redistest.StartCluster(t, 3, replicas)
	p := proxytest.Start(t, c.Nodes[0], func(cfg *config.Config) {
		cfg.Upstream.Mode = config.ModeCluster
		cfg.Upstream.Seeds = c.Seeds()
	})
	rc := p.Client(t)
	pipe := rc.Pipeline()
	for i := range scanKeysN {
		pipe.Set(ctx, fmt.Sprintf("scan:%d", i), "v", 0)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	return c, p, rc
}

// scanMissed is how many of startScanCluster's keys seen does not hold.
func scanMissed(seen map[string]int) int {
	missed := 0
	for i := range scanKeysN {
		if seen[fmt.Sprintf("scan:%d", i)] == 0 {
			missed++
		}
	}
	return missed
}

// A full SCAN through the proxy returns every key that stayed on its node
// even when the slot map changes during the walk: a moved slot reorders
// the primaries by their lowest slot, and a failover replaces the node
// being walked. Before (found by review), the first skipped a whole
// primary not yet walked, the second gave the old primary's cursor to the
// new one; both missed keys that never moved. Now a cursor of an older
// map starts the node's walk again, and walks on from there: keys may
// come twice, none is missed.
func TestClusterScanAcrossMapChanges(t *testing.T) {
	for _, change := range []string{"slot move", "failover"} {
		t.Run(change, func(t *testing.T) {
			replicas := 0
			if change == "failover" {
				replicas = 1
			}
			c, p, rc := startScanCluster(t, replicas)
			m := p.Router().Map()
			order := m.Primaries()
			first, second := nodeAt(t, c, order[0]), nodeAt(t, c, order[1])
			// Walk into the second primary: its first cursor's slot is
			// not the first's lowest, 0.
			seen := map[string]int{}
			cursor := scanThrough(t, rc, 0, seen, func(cur uint64) bool { return cur&(1<<14-1) != 0 && cur>>31 != 0 })
			if cursor == 0 {
				t.Fatal("the scan ended before the second primary's walk began")
			}
			restarts := p.Router().ScanRestarts()
			switch change {
			case "slot move":
				// Slot 0 from the first primary to the third: the third
				// now comes first, before the one being walked.
				third := nodeAt(t, c, order[2])
				moveSlot(t, c, 0, first, third)
			case "failover":
				if err := redistest.PromoteReplica(t, replicaOf(t, c, second.Addr())); err != nil {
					t.Fatal(err)
				}
				c.WaitHealthy(t)
			}
			p.Router().RefreshSoon()
			redistest.Eventually(t, 10*time.Second, func() bool { return p.Router().Map().Fingerprint() != m.Fingerprint() },
				"the proxy never saw the map change")
			scanThrough(t, rc, cursor, seen, nil)
			if missed := scanMissed(seen); missed > 0 {
				t.Fatalf("the scan missed %d of %d keys after the %s", missed, scanKeysN, change)
			}
			if got := p.Router().ScanRestarts(); got != restarts+1 {
				t.Fatalf("scan restarts %d -> %d, want one", restarts, got)
			}
		})
	}
}

// A SCAN under a resharding that goes on all through it ends, and misses
// nothing: slot 0, walked first, moves between two primaries after every
// page. The first change starts the walk again from the node under way;
// later ones are behind the walk and cost nothing. Before, every change
// started the whole walk again from the first primary: 120 restarts in
// 120 moves, and a scan that ended only when the moves stopped.
func TestClusterScanDuringResharding(t *testing.T) {
	c, p, rc := startScanCluster(t, 0)
	order := p.Router().Map().Primaries()
	first, third := nodeAt(t, c, order[0]), nodeAt(t, c, order[2])
	seen := map[string]int{}
	cursor := scanThrough(t, rc, 0, seen, func(cur uint64) bool { return cur&(1<<14-1) != 0 && cur>>31 != 0 })
	restarts := p.Router().ScanRestarts()
	const maxMoves = 120
	moves := 0
	for cursor != 0 {
		if moves < maxMoves {
			from, to := first, third
			if moves%2 == 1 {
				from, to = third, first
			}
			before := p.Router().Map().Fingerprint()
			moveSlot(t, c, 0, from, to)
			moves++
			p.Router().RefreshSoon()
			redistest.Eventually(t, 10*time.Second, func() bool { return p.Router().Map().Fingerprint() != before },
				"the proxy never saw slot 0 move")
		}
		cursor = scanThrough(t, rc, cursor, seen, func(uint64) bool { return true })
	}
	missed, twice := 0, 0
	for i := range scanKeysN {
		switch seen[fmt.Sprintf("scan:%d", i)] {
		case 0:
			missed++
		case 1:
		default:
			twice++
		}
	}
	if missed > 0 {
		t.Fatalf("the scan missed %d of %d keys across %d slot moves", missed, scanKeysN, moves)
	}
	if got := p.Router().ScanRestarts(); got != restarts+1 {
		t.Fatalf("scan restarts %d -> %d across %d slot moves, want one", restarts, got, moves)
	}
	t.Logf("%d slot moves during the scan; %d keys returned more than once", moves, twice)
}

// A client mid-scan across a proxy upgrade hands this version a cursor
// the previous one made: the slot (14 bits), the fingerprint's hash (10
// bits) and the node's cursor from bit 24 on. With the map unchanged the
// walk may start the node again, but must miss nothing. Found by review:
// an even node cursor read as a cursor of this format whose hash matched,
// and the node was sent another cursor than its own (108 of 6,000 keys
// missed).
func TestClusterScanPreviousVersionCursor(t *testing.T) {
	_, p, rc := startScanCluster(t, 0)
	// Walk to the start of the second primary, then one bucket at a time
	// to a node cursor that would read as base 0 from bit 24 on: Redis's
	// cursors count in reversed bits, so the first steps are multiples of
	// 64 in a table of 2,048.
	seen := map[string]int{}
	cursor := scanThrough(t, rc, 0, seen, func(cur uint64) bool { return cur&(1<<14-1) != 0 })
	for cursor>>31 == 0 || cursor>>31%64 != 0 {
		if cursor == 0 {
			t.Fatal("the scan ended before the second primary's walk reached a node cursor that is a multiple of 64")
		}
		keys, next, err := rc.Scan(ctx, cursor, "scan:*", 1).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			seen[k]++
		}
		cursor = next
	}
	h := fnv.New64a()
	h.Write([]byte(p.Router().Map().Fingerprint()))
	old := cursor>>31<<24 | h.Sum64()&(1<<10-1)<<14 | cursor&(1<<14-1)
	scanThrough(t, rc, old, seen, nil)
	if missed := scanMissed(seen); missed > 0 {
		t.Fatalf("the scan missed %d of %d keys after a previous version's cursor %d (node cursor %d)", missed, scanKeysN, old, cursor>>31)
	}
}
