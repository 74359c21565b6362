package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/redistest"
	"github.com/redproxy/redproxy/internal/upstream"
)

// TestLoadMapMajority: a node claiming every slot for itself (a node of
// another cluster listed as a seed by mistake, or one cut off and stale)
// is outvoted by the nodes that agree; with no majority, a refresh keeps
// the map in use.
func TestLoadMapMajority(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	rogue := redistest.Start(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
	ctx := context.Background()
	if err := rogue.Client(t).Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, Slots-1).Err(); err != nil {
		t.Fatal(err)
	}
	base := upstream.Options{DialTimeout: time.Second, ReplyTimeout: time.Second}
	seeds := append([]string{rogue.Addr()}, c.Seeds()...)
	m, err := loadMap(base, seeds, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	truth, err := loadMap(base, c.Seeds()[:1], nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if m.fingerprint() != truth.fingerprint() {
		t.Fatalf("believed %s, the majority says %s", m.fingerprint(), truth.fingerprint())
	}
	for s := range Slots {
		if m.Owner(s) == rogue.Addr() {
			t.Fatalf("slot %d routed to the rogue node", s)
		}
	}
	if len(m.Primaries()) != 3 || !m.complete() {
		t.Fatalf("primaries %v, complete %v", m.Primaries(), m.complete())
	}
	// One against one, with a map in use: neither is believed.
	if _, err := loadMap(base, []string{rogue.Addr(), c.Seeds()[0]}, m, nil); !errors.Is(err, ErrNoTopology) {
		t.Fatalf("a split vote gave %v, want ErrNoTopology", err)
	}
	// Nobody to ask.
	if _, err := loadMap(base, []string{"127.0.0.1:1"}, nil, nil); !errors.Is(err, ErrNoTopology) {
		t.Fatalf("no node answering gave %v", err)
	}
}

func TestParseSlotsAndShards(t *testing.T) {
	slots := "*2\r\n*3\r\n:0\r\n:99\r\n*3\r\n$9\r\n127.0.0.1\r\n:7000\r\n$2\r\nid\r\n*4\r\n:100\r\n:16383\r\n*3\r\n$0\r\n\r\n:7001\r\n$2\r\nid\r\n*3\r\n$1\r\n?\r\n:7002\r\n$2\r\nid\r\n"
	m, err := parseSlots([]byte(slots), "10.0.0.9:7001")
	if err != nil {
		t.Fatal(err)
	}
	if m.Owner(0) != "127.0.0.1:7000" || m.Owner(16383) != "10.0.0.9:7001" || !m.complete() {
		t.Fatalf("owners %q %q", m.Owner(0), m.Owner(16383))
	}
	for _, bad := range []string{"", "*1\r\n", "*1\r\n*3\r\n:5\r\n:1\r\n*2\r\n$1\r\na\r\n:1\r\n", "-ERR no\r\n", "*1\r\n*2\r\n:0\r\n:1\r\n"} {
		if _, err := parseSlots([]byte(bad), "a:1"); err == nil {
			t.Errorf("parseSlots(%q) accepted", bad)
		}
	}
}

// TestMapReplicasOf: both CLUSTER SLOTS and CLUSTER SHARDS name each
// primary's replicas (read_from), a failed replica excluded, and a map
// changed by MOVED keeps them.
func TestMapReplicasOf(t *testing.T) {
	slots := "*2\r\n*3\r\n:0\r\n:99\r\n*3\r\n$9\r\n127.0.0.1\r\n:7000\r\n$2\r\nid\r\n*4\r\n:100\r\n:16383\r\n*3\r\n$0\r\n\r\n:7001\r\n$2\r\nid\r\n*3\r\n$1\r\n?\r\n:7002\r\n$2\r\nid\r\n"
	m, err := parseSlots([]byte(slots), "10.0.0.9:7001")
	if err != nil {
		t.Fatal(err)
	}
	if got := m.ReplicasOf("10.0.0.9:7001"); len(got) != 1 || got[0] != "10.0.0.9:7002" {
		t.Fatalf("CLUSTER SLOTS: replicas of 7001 = %v", got)
	}
	if got := m.ReplicasOf("127.0.0.1:7000"); len(got) != 0 {
		t.Fatalf("CLUSTER SLOTS: replicas of 7000 = %v", got)
	}
	if got := m.withOwner(5, "127.0.0.1:7009").ReplicasOf("10.0.0.9:7001"); len(got) != 1 {
		t.Fatalf("after MOVED: replicas of 7001 = %v", got)
	}
	node := func(port int, role, health string) string {
		return "*10\r\n$4\r\nport\r\n:" + strconv.Itoa(port) + "\r\n$8\r\nendpoint\r\n$9\r\n127.0.0.1\r\n$4\r\nrole\r\n$" + strconv.Itoa(len(role)) + "\r\n" + role + "\r\n$6\r\nhealth\r\n$" + strconv.Itoa(len(health)) + "\r\n" + health + "\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n"
	}
	shards := "*1\r\n*4\r\n$5\r\nslots\r\n*2\r\n:0\r\n:16383\r\n$5\r\nnodes\r\n*3\r\n" +
		node(7011, "replica", "loading") + node(7010, "master", "online") + node(7012, "replica", "fail")
	m, err = parseShards([]byte(shards), "127.0.0.1:7010", false)
	if err != nil {
		t.Fatal(err)
	}
	if got := m.ReplicasOf("127.0.0.1:7010"); len(got) != 1 || got[0] != "127.0.0.1:7011" {
		t.Fatalf("CLUSTER SHARDS: replicas of 7010 = %v (want the loading one, not the failed one)", got)
	}
}

// The view chosen among equally voted ones is the complete one, whatever
// the order they are looked at in; then the lexically first.
func TestViewTieBreakIsOrderFree(t *testing.T) {
	type view struct {
		n        int
		complete bool
		fp       string
	}
	views := []view{{2, false, "a"}, {2, true, "b"}, {1, true, "0"}, {2, true, "c"}}
	pick := func(order []int) string {
		best := -1
		for _, i := range order {
			v := views[i]
			if best < 0 || beats(v.n, v.complete, v.fp, views[best].n, views[best].complete, views[best].fp) {
				best = i
			}
		}
		return views[best].fp
	}
	for _, order := range [][]int{{0, 1, 2, 3}, {1, 0, 3, 2}, {3, 2, 1, 0}, {2, 3, 0, 1}, {1, 3, 0, 2}} {
		if got := pick(order); got != "b" {
			t.Errorf("order %v chose %q, want \"b\" (complete, most votes, first)", order, got)
		}
	}
}

// TestLoadMapFrozenNodeBoundedByReplyTimeout: a node that takes the
// connection's handshake and then never answers CLUSTER SHARDS holds a
// refresh for upstream.reply_timeout, not dead_timeout (30 s by
// default), when no view is held by most of the nodes asked without it
// (one live node of two here), and RoundTrip's deadline was the dead
// timeout.
func TestLoadMapFrozenNodeBoundedByReplyTimeout(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	frozen := redistest.FrozenAfterHandshake(t, "CLUSTER")
	r := &Router{opt: Options{Backend: upstream.BackendOptions{DialTimeout: time.Second,
		ReplyTimeout: 500 * time.Millisecond, DeadTimeout: 20 * time.Second}}}
	start := time.Now()
	m, err := loadMap(r.baseOptions(), []string{frozen, c.Seeds()[0]}, nil, nil)
	took := time.Since(start)
	if err != nil || len(m.Primaries()) != 3 {
		t.Fatalf("loadMap with a frozen node: %v", err)
	}
	if took > 5*time.Second {
		t.Fatalf("loadMap took %v with a frozen node and reply_timeout 500ms", took)
	}
}

// TestLoadMapDoesNotWaitForAHungNodeOnceMostAgree: with three of the four
// nodes asked agreeing, the map is known, and the hung fourth (it takes
// the handshake and never answers CLUSTER SHARDS) is not waited for:
// before, every refresh waited reply_timeout on it, and a failover's new
// primary was adopted only then (found by a fault probe). A refresh while
// its answer is still due does not ask it again.
func TestLoadMapDoesNotWaitForAHungNodeOnceMostAgree(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	hung := redistest.FrozenAfterHandshake(t, "CLUSTER")
	// A reply_timeout far past the test's bound below: a loadMap that
	// waits for the hung node cannot end in time.
	r := &Router{opt: Options{Backend: upstream.BackendOptions{DialTimeout: time.Second,
		ReplyTimeout: time.Hour, DeadTimeout: time.Hour}}}
	var asking sync.Map
	load := func() {
		t.Helper()
		done := make(chan error, 1)
		go func() {
			m, err := loadMap(r.baseOptions(), append([]string{hung}, c.Seeds()...), nil, &asking)
			if err == nil && len(m.Primaries()) != 3 {
				err = fmt.Errorf("%d primaries", len(m.Primaries()))
			}
			done <- err
		}()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(2 * time.Minute):
			t.Fatal("loadMap waited for the hung node although three of four agreed")
		}
	}
	load()
	if _, due := asking.Load(hung); !due {
		t.Fatal("the hung node's answer is due but not recorded")
	}
	load() // answers without asking it again (it would leave a second connection)
}

// TestFailedByMost: a primary is taken as failed only when most views of
// the map flag it. A node clears the flag only when it hears from the
// primary again, so one node with a bad link to it can hold the flag
// alone long after the primary came back; believed, its answer would have
// the primary's connections cut at every refresh it made it into. Views
// of CLUSTER SLOTS (Redis before 7.0, in a cluster upgraded node by node)
// cannot flag, and do not count.
func TestFailedByMost(t *testing.T) {
	view := func(failed ...string) *Map {
		m := newMap()
		m.failed, m.health = failed, true
		return m
	}
	slotsView := newMap() // CLUSTER SLOTS: no health to tell
	for _, c := range []struct {
		views []*Map
		want  string
	}{
		{[]*Map{view("x"), view(), view()}, ""},
		{[]*Map{view("x"), view("x"), view()}, "x"},
		{[]*Map{view("x", "y"), view("y"), view("x")}, "x y"},
		{[]*Map{view("x"), view()}, ""},
		{[]*Map{view("x")}, "x"},
		{nil, ""},
		{[]*Map{view("x"), view("x"), slotsView, slotsView, slotsView}, "x"},
		{[]*Map{view("x"), view(), slotsView}, ""},
		{[]*Map{slotsView, slotsView}, ""},
	} {
		if got := strings.Join(failedByMost(c.views), " "); got != c.want {
			var flags [][]string
			for _, v := range c.views {
				flags = append(flags, v.failed)
			}
			t.Errorf("failedByMost of views flagging %v = %q, want %q", flags, got, c.want)
		}
	}
}

// TestParseRedirect: MOVED and ASK name the node as Redis writes it,
// host:port with no brackets around an IPv6 host; the address must be the
// map's spelling of the node, which dials.
func TestParseRedirect(t *testing.T) {
	for _, c := range []struct{ reply, want string }{
		{"-MOVED 3999 127.0.0.1:6381\r\n", "127.0.0.1:6381"},
		{"-ASK 3999 127.0.0.1:6381\r\n", "127.0.0.1:6381"},
		{"-MOVED 3999 ::1:6381\r\n", "[::1]:6381"},
		{"-MOVED 3999 fe80::1:2:6381\r\n", "[fe80::1:2]:6381"},
		{"-MOVED 3999 [::1]:6381\r\n", "[::1]:6381"},
		{"-MOVED 3999 redis-0.redis:6381\r\n", "redis-0.redis:6381"},
		{"-MOVED 3999 :6381\r\n", "10.0.0.7:6381"},
		{"-MOVED 3999 6381\r\n", ""},
		{"-MOVED 3999 host:\r\n", ""},
		{"-MOVED 16384 127.0.0.1:6381\r\n", ""},
	} {
		slot, addr, ok := parseRedirect([]byte(c.reply), "10.0.0.7:7000")
		if c.want == "" {
			if ok {
				t.Errorf("parseRedirect(%q) = %d %q, want not ok", c.reply, slot, addr)
			}
			continue
		}
		if !ok || slot != 3999 || addr != c.want {
			t.Errorf("parseRedirect(%q) = %d %q %v, want 3999 %q", c.reply, slot, addr, ok, c.want)
		}
	}
}

// TestSlotlessPrimaryIsANodeOfTheMap: a primary that serves no slot (one
// just added, or one a failover demoted, as a node that has not yet heard
// which primary it now replicates sees it) is a node of the map. It was
// left out, so a refresh that loaded such a view had dropDeparted close
// its connections with commands pending on them: a SET answered
// "upstream closed" during a coordinated failover (TestClusterFailover,
// seen in CI).
func TestSlotlessPrimaryIsANodeOfTheMap(t *testing.T) {
	c := redistest.StartCluster(t, 3, 0)
	empty := redistest.Start(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
	ctx := context.Background()
	seed := c.Nodes[0]
	if err := seed.Client(t).Do(ctx, "CLUSTER", "MEET", "127.0.0.1", empty.Port()).Err(); err != nil {
		t.Fatal(err)
	}
	base := upstream.Options{Addr: seed.Addr(), DialTimeout: time.Second, ReplyTimeout: time.Second}
	var m *Map
	redistest.Eventually(t, 30*time.Second, func() bool {
		reply, err := upstream.RoundTrip(base, cmdShards)
		if err != nil || !strings.Contains(string(reply), strconv.Itoa(empty.Port())) {
			return false // the seed has not met it yet
		}
		m, err = parseShards(reply, seed.Addr(), false)
		return err == nil
	}, "the seed never listed the new node in CLUSTER SHARDS")
	if slices.Contains(m.Primaries(), empty.Addr()) {
		t.Fatalf("the slotless node is taken for a primary serving slots: %v", m.Primaries())
	}
	if !slices.Contains(m.nodes(), empty.Addr()) {
		t.Fatalf("the slotless primary %s is no node of the map: %v", empty.Addr(), m.nodes())
	}
}

// TestMergeReplicas: a primary's replicas are those of every agreeing view
// and those of the current map no view places elsewhere, so a view from a
// node that has not yet heard of a replica does not take it out of the
// proxy's replica set (which failed read_from = "replica" reads in CI).
func TestMergeReplicas(t *testing.T) {
	// view builds a map of two primaries, a (slots 0-8191) and b (the
	// rest), with the replicas given as "a:r1" (r1 follows a) and the
	// other nodes it names.
	view := func(replicas []string, others ...string) *Map {
		m := newMap()
		if err := m.assign(0, Slots/2-1, "a"); err != nil {
			t.Fatal(err)
		}
		if err := m.assign(Slots/2, Slots-1, "b"); err != nil {
			t.Fatal(err)
		}
		for _, pr := range replicas {
			p, r, _ := strings.Cut(pr, ":")
			m.addReplica(p, r)
		}
		m.replicas = append(m.replicas, others...)
		return m
	}
	now := time.Now()
	for _, c := range []struct {
		name    string
		chosen  *Map
		others  []*Map
		current *Map
		want    string // a's replicas; b's replicas
	}{
		{"one view", view([]string{"a:r1", "b:r2"}), nil, nil, "r1;r2"},
		{"a lagging chosen view", view([]string{"b:r2"}, "r1"), []*Map{view([]string{"a:r1", "b:r2"})}, nil, "r1;r2"},
		{"every answer lags, the current map knew", view([]string{"b:r2"}, "r1"), nil, view([]string{"a:r1", "b:r2"}), "r1;r2"},
		{"moved to b by an answer", view(nil, "r1"), []*Map{view([]string{"b:r1"})}, view([]string{"a:r1"}), ";r1"},
		{"promoted", func() *Map {
			m := view(nil)
			if err := m.assign(0, 10, "r1"); err != nil {
				t.Fatal(err)
			}
			return m
		}(), nil, view([]string{"a:r1"}), ";"},
		{"forgotten by every answer", view(nil), nil, view([]string{"a:r1"}), ";"},
		{"a primary of the current map that left", view(nil, "r1", "r2"), nil, func() *Map {
			m := view([]string{"b:r2"})
			m.addReplica("c", "r1")
			return m
		}(), ";r2"},
		{"flagged failed by an answer", view(nil, "r1"), []*Map{func() *Map {
			m := view(nil, "r1")
			m.downReplicas = []string{"r1"}
			return m
		}()}, view([]string{"a:r1"}), ";"},
		{"carried for a while already", view(nil, "r1"), nil, func() *Map {
			m := view([]string{"a:r1"})
			m.carried = map[string]time.Time{"a r1": now.Add(-replicaCarryFor / 2)}
			return m
		}(), "r1;"},
		{"carried for too long (a replica reset into an empty primary)", view(nil, "r1"), nil, func() *Map {
			m := view([]string{"a:r1"})
			m.carried = map[string]time.Time{"a r1": now.Add(-replicaCarryFor)}
			return m
		}(), ";"},
	} {
		views := append([]*Map{c.chosen}, c.others...)
		c.chosen.mergeReplicas(views, c.current, now)
		got := strings.Join(c.chosen.ReplicasOf("a"), ",") + ";" + strings.Join(c.chosen.ReplicasOf("b"), ",")
		if got != c.want {
			t.Errorf("%s: replicas of a;b = %q, want %q", c.name, got, c.want)
		}
	}

	// A carried replica keeps the time its carry began, map after map.
	cur := view([]string{"a:r1"})
	for i := range 3 {
		next := view(nil, "r1")
		next.mergeReplicas([]*Map{next}, cur, now.Add(time.Duration(i)*time.Second))
		if since, ok := next.carried["a r1"]; !ok || !since.Equal(now) {
			t.Fatalf("refresh %d: carried since %v (%v), want %v", i, since, ok, now)
		}
		cur = next
	}
}

// A node that refuses the slot map (LOADING after a restart) is named with
// Redis's own error, not taken for a malformed reply (found by a probe:
// "malformed cluster topology reply: LOADING Redis is loading the dataset
// in memory" in the refresh log).
func TestSlotMapRefusalIsRedisError(t *testing.T) {
	refusal := []byte("-LOADING Redis is loading the dataset in memory\r\n")
	for name, parse := range map[string]func() error{
		"SHARDS": func() error { _, err := parseShards(refusal, "127.0.0.1:7000", false); return err },
		"SLOTS":  func() error { _, err := parseSlots(refusal, "127.0.0.1:7000"); return err },
	} {
		err := parse()
		if err == nil || errors.Is(err, errBadReply) || !strings.HasPrefix(err.Error(), "LOADING ") {
			t.Errorf("%s refused with LOADING: %v, want Redis's error as it is", name, err)
		}
	}
}
