package route

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/resp"
)

var table = commands.Builtin()

func newTestTable(t testing.TB) *Table {
	t.Helper()
	tb, err := New([]string{"default", "cache", "queue"},
		[]Rule{{Pattern: "queue:*", Upstream: "queue"}, {Pattern: "cache:*", Upstream: "cache"}, {Pattern: "q?:*", Upstream: "queue"}},
		[]Rule{{Pattern: "jobs.*", Upstream: "queue"}})
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

func args(s ...string) [][]byte {
	out := make([][]byte, len(s))
	for i, a := range s {
		out[i] = []byte(a)
	}
	return out
}

func plan(t *Table, s ...string) Plan {
	a := args(s...)
	return t.Plan(table.Lookup(a), a, nil)
}

func TestFirstMatchWins(t *testing.T) {
	tb := newTestTable(t)
	for key, want := range map[string]int{"queue:1": 2, "cache:1": 1, "qx:1": 2, "other": 0, "": 0, "queue": 0} {
		if up, _ := tb.Key([]byte(key)); up != want {
			t.Errorf("Key(%q) = %d, want %d", key, up, want)
		}
	}
	if tb.Channel([]byte("jobs.a")) != 2 || tb.Channel([]byte("news")) != Default {
		t.Error("channel routes")
	}
	if _, err := New([]string{"default"}, []Rule{{Pattern: "a*", Upstream: "nope"}}, nil); err == nil {
		t.Error("a rule naming an unknown upstream compiled")
	}
}

func TestPlanKinds(t *testing.T) {
	tb := newTestTable(t)
	if p := plan(tb, "GET", "cache:1"); p.Merge != One || p.Len() != 1 || p.Part(0).Upstream != 1 || p.Part(0).Raw != nil {
		t.Errorf("GET: %+v", p)
	}
	if p := plan(tb, "PUBLISH", "jobs.x", "m"); p.Part(0).Upstream != 2 {
		t.Errorf("PUBLISH: %+v", p)
	}
	if p := plan(tb, "DBSIZE"); p.Merge != Sum || p.Len() != 3 {
		t.Errorf("DBSIZE: %+v", p)
	}
	if p := plan(tb, "PING"); p.Part(0).Upstream != Default {
		t.Errorf("PING: %+v", p)
	}
	p := plan(tb, "MSETNX", "queue:1", "a", "cache:1", "b")
	if !bytes.HasPrefix(p.Local, []byte("-CROSSROUTE")) || !bytes.Contains(p.Local, []byte(`route "queue:*" -> queue`)) || !bytes.Contains(p.Local, []byte(`route "cache:*" -> cache`)) {
		t.Errorf("MSETNX: %s", p.Local)
	}
	p = plan(tb, "EVAL", "return 1", "2", "x", "queue:1")
	if !bytes.Contains(p.Local, []byte("the default route -> default")) {
		t.Errorf("EVAL: %s", p.Local)
	}
	if p := plan(tb, "MSET", "queue:1", "a", "cache:1"); !bytes.Contains(p.Local, []byte("wrong number")) {
		// Arity is checked by the session before; the splitter must
		// still not index past the arguments.
		t.Logf("MSET with a missing value: %s", p.Local)
	}
}

// TestMergeMGET: replies of a split MGET come back in the client's order.
func TestMergeMGET(t *testing.T) {
	tb := newTestTable(t)
	p := plan(tb, "MGET", "cache:1", "a", "queue:1", "cache:2", "b")
	if p.Merge != MGET || p.Len() != 3 {
		t.Fatalf("%+v", p)
	}
	// Parts in first-appearance order: cache (cache:1, cache:2), default (a, b), queue.
	replies := [][]byte{
		[]byte("*2\r\n$2\r\nc1\r\n$2\r\nc2\r\n"),
		[]byte("*2\r\n$1\r\nA\r\n$-1\r\n"),
		[]byte("*1\r\n$2\r\nq1\r\n"),
	}
	got := string(p.Reply(replies))
	want := "*5\r\n$2\r\nc1\r\n$1\r\nA\r\n$2\r\nq1\r\n$2\r\nc2\r\n$-1\r\n"
	if got != want {
		t.Fatalf("merged %q, want %q", got, want)
	}
	if r := p.Reply([][]byte{replies[0], []byte("-ERR down\r\n"), replies[2]}); string(r) != "-ERR down\r\n" {
		t.Fatalf("a failed part: %q", r)
	}
}

// TestPlanPubsub: PUBSUB NUMSUB goes by its channels' routes, split over
// several upstreams and merged in the client's order; CHANNELS and NUMPAT
// ask every upstream.
func TestPlanPubsub(t *testing.T) {
	tb := newTestTable(t)
	if p := plan(tb, "PUBSUB", "NUMSUB", "jobs.a", "jobs.b"); p.Len() != 1 || p.Part(0).Upstream != 2 || p.Part(0).Raw != nil {
		t.Errorf("NUMSUB of queue's channels: %+v", p)
	}
	if p := plan(tb, "PUBSUB", "NUMSUB"); p.Len() != 1 || p.Part(0).Upstream != Default {
		t.Errorf("NUMSUB of nothing: %+v", p)
	}
	p := plan(tb, "PUBSUB", "SHARDNUMSUB", "news", "jobs.a", "x")
	if p.Merge != MGET || p.Len() != 2 || p.Part(0).Upstream != Default || p.Part(1).Upstream != 2 {
		t.Fatalf("NUMSUB over two upstreams: %+v", p)
	}
	if got := string(p.Part(0).Raw); got != string(resp.AppendCommand(nil, args("PUBSUB", "SHARDNUMSUB", "news", "x")...)) {
		t.Errorf("default's part: %q", got)
	}
	replies := [][]byte{
		[]byte("*4\r\n$4\r\nnews\r\n:3\r\n$1\r\nx\r\n:0\r\n"),
		[]byte("*2\r\n$6\r\njobs.a\r\n:1\r\n"),
	}
	want := "*6\r\n$4\r\nnews\r\n:3\r\n$6\r\njobs.a\r\n:1\r\n$1\r\nx\r\n:0\r\n"
	if got := string(p.Reply(replies)); got != want {
		t.Errorf("merged %q, want %q", got, want)
	}
	if _, _, err := tb.Channels("pubsub|numsub", args("PUBSUB", "NUMSUB", "news", "jobs.a")); err == nil ||
		!strings.Contains(err.Error(), "the channels of 'PUBSUB NUMSUB'") || !strings.Contains(err.Error(), `channel_route "jobs.*" -> queue`) {
		t.Errorf("NUMSUB over two upstreams, in a transaction: %v", err)
	}
	for cmd, m := range map[string]Merge{"CHANNELS": Concat, "SHARDCHANNELS": Concat, "NUMPAT": Sum} {
		if p := plan(tb, "PUBSUB", cmd); p.Merge != m || p.Len() != 3 {
			t.Errorf("PUBSUB %s: %+v", cmd, p)
		}
	}
}

// TestPatternOverlap: a PSUBSCRIBE pattern subscribes on the upstream it
// routes to as a channel name, and is refused when it may match channels
// of another upstream (literal prefixes overlap), or, on a named upstream,
// channels no route matches.
func TestPatternOverlap(t *testing.T) {
	tb, err := New([]string{"default", "cache", "queue"}, nil,
		[]Rule{{Pattern: "jobs.*", Upstream: "queue"}, {Pattern: "ev.?", Upstream: "cache"}, {Pattern: "exact", Upstream: "cache"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		pat string
		up  int    // when accepted
		err string // part of the refusal; "" for accepted
	}{
		{"jobs.*", 2, ""},
		{"jobs.new.*", 2, ""},
		{"jobs.?", 2, ""},
		{"jobs.[ab]", 2, ""},
		{"news.*", Default, ""},
		{"news", Default, ""}, // no metacharacter: one channel
		{"jobs.x", 2, ""},     // likewise
		{"ev.?", 1, ""},       // the route's very pattern
		{"exac?", Default, `upstream 'cache' (channel_route "exact") but would subscribe on 'default'`},
		{"job*", Default, `upstream 'queue' (channel_route "jobs.*") but would subscribe on 'default'`},
		{"j[o]bs.*", Default, "upstream 'queue'"},
		{"*", Default, "upstream 'queue'"},
		{"\\jobs.*", Default, "upstream 'queue'"}, // an escape ends the literal prefix
		{"e*", Default, "upstream 'cache'"},
		{"ev.*", 1, "channels no channel_route matches"}, // ev.ab goes to default
	} {
		checkPattern(t, tb, c.pat, c.up, c.err)
	}
	// Without channel routes every pattern is [upstream]'s, but for those
	// that may match keyspace notifications of keys on other upstreams:
	// "*" matches __keyspace@0__:q:x, published on queue.
	plain, _ := New([]string{"default", "queue"}, []Rule{{Pattern: "q:*", Upstream: "queue"}}, nil)
	if up, err := plain.Pattern([]byte("news.*")); up != Default || err != nil {
		t.Errorf("no channel routes: %d %v", up, err)
	}
	if _, err := plain.Pattern([]byte("*")); err == nil {
		t.Errorf("no channel routes, key routes to queue: PSUBSCRIBE * accepted")
	}
	// Without key routes either, every notification is [upstream]'s.
	none, _ := New([]string{"default", "queue"}, nil, nil)
	if up, err := none.Pattern([]byte("*")); up != Default || err != nil {
		t.Errorf("no routes: %d %v", up, err)
	}
}

// TestNotificationChannels: keyspace notification channels go where their
// key does, whatever the channel routes say (Redis publishes them on the
// key's server; found by review); keyevent channels, published by every
// upstream holding keys, and patterns that may match notifications of
// several upstreams are refused when keys live on several upstreams.
func TestNotificationChannels(t *testing.T) {
	// A channel route that would catch notification channels, to show it
	// does not.
	tb, err := New([]string{"default", "cache", "queue"},
		[]Rule{{Pattern: "queue:*", Upstream: "queue"}, {Pattern: "cache:*", Upstream: "cache"}},
		[]Rule{{Pattern: "jobs.*", Upstream: "queue"}, {Pattern: "__keyspace@0__:cache:*", Upstream: "queue"}, {Pattern: "__keyevent@*", Upstream: "cache"}})
	if err != nil {
		t.Fatal(err)
	}
	for ch, want := range map[string]int{
		"__keyspace@0__:queue:a":   2,
		"__keyspace@12__:queue:a":  2,
		"__keyspace@0__:cache:a":   1, // not the channel route's queue
		"__keyspace@0__:plain":     Default,
		"__keyspace@0__:jobs.x":    Default, // the key jobs.x is [upstream]'s
		"__keyevent@0__:set":       Default, // not the channel route's cache
		"__keyspace@x__:queue:a":   Default, // not a notification channel
		"__keyspace@__:queue:a":    Default,
		"__keyspace@0_:queue:a":    Default,
		"jobs.x":                   2,
		"__keyspace@0__:queue:a__": 2,
	} {
		if got := tb.Channel([]byte(ch)); got != want {
			t.Errorf("Channel(%q) = %d, want %d", ch, got, want)
		}
	}
	// PUBLISH and PUBSUB NUMSUB go the same way; NUMSUB over two keys'
	// upstreams names their key routes.
	if up, ok, err := tb.Channels("publish", args("PUBLISH", "__keyspace@0__:queue:a", "m")); !ok || err != nil || up != 2 {
		t.Errorf("PUBLISH __keyspace@0__:queue:a: %d %v %v", up, ok, err)
	}
	if _, _, err := tb.Channels("pubsub|numsub", args("PUBSUB", "NUMSUB", "__keyspace@0__:queue:a", "__keyspace@0__:cache:a")); err == nil || !strings.Contains(err.Error(), `route "queue:*" -> queue`) {
		t.Errorf("NUMSUB over two keys' upstreams: %v", err)
	}
	if up, err := tb.Subscribe([]byte("__keyspace@0__:queue:a")); up != 2 || err != nil {
		t.Errorf("Subscribe(__keyspace@0__:queue:a) = %d %v", up, err)
	}
	if _, err := tb.Subscribe([]byte("__keyevent@0__:set")); err == nil {
		t.Errorf("Subscribe(__keyevent@0__:set) accepted with keys on three upstreams")
	}
	for _, c := range []struct {
		pat string
		up  int
		err string
	}{
		{"__keyspace@0__:queue:*", 2, ""},
		{"__keyspace@0__:queue:a?", 2, ""},
		{"__keyspace@3__:cache:[ab]", 1, ""},
		{"__keyspace@0__:queue:a", 2, ""},
		{"__keyspace@0__:plain:*", Default, ""},
		{"__keyspace@0__:*", Default, "keys of upstream 'queue' (route \"queue:*\")"},
		{"__keyspace@0__:q*", Default, "upstream 'queue'"},
		{"__keyspace@0__:c*", Default, "upstream 'cache'"},
		{"__keyevent@0__:*", Default, "__keyevent@"},
		{"__keyevent@0__:set", Default, "__keyevent@"},
		{"__keyspace@*__:queue:*", Default, "__keyevent@"},
		{"__keyspace@0[__:]*", Default, "__keyevent@"},
		{"__key*", Default, "__keyevent@"},
		{"_*", Default, "__keyevent@"},
		{"?*", Default, "__keyevent@"},
		{"*", Default, "__keyevent@"},
		{"news.*", Default, ""},
		{"jobs.*", 2, ""},
		{"__keyspace@0__", Default, ""}, // one channel, not a notification one
	} {
		checkPattern(t, tb, c.pat, c.up, c.err)
	}
	// Keys all on [upstream]: every notification is there. A pattern that
	// may match them must subscribe there too.
	def, _ := New([]string{"default", "queue"}, nil, []Rule{{Pattern: "jobs.*", Upstream: "queue"}, {Pattern: "__k*", Upstream: "queue"}})
	for _, pat := range []string{"__keyevent@0__:*", "__keyspace@0__:*", "__keyevent@0__:set"} {
		if up, err := def.Pattern([]byte(pat)); up != Default || err != nil {
			t.Errorf("no key routes: Pattern(%q) = %d %v", pat, up, err)
		}
	}
	if _, err := def.Pattern([]byte("__k*")); err == nil || !strings.Contains(err.Error(), "keyspace notifications") {
		t.Errorf("no key routes: Pattern(__k*), channel-routed to queue while notifications are default's: %v", err)
	}
	if up, err := def.Subscribe([]byte("__keyevent@0__:set")); up != Default || err != nil {
		t.Errorf("no key routes: Subscribe(__keyevent@0__:set) = %d %v", up, err)
	}
}

// checkPattern checks tb.Pattern(pat): subscribed on upstream up when
// errWant is "", else refused with an error containing errWant.
func checkPattern(t *testing.T, tb *Table, pat string, up int, errWant string) {
	t.Helper()
	got, err := tb.Pattern([]byte(pat))
	switch {
	case errWant == "" && err != nil:
		t.Errorf("Pattern(%q) refused: %v", pat, err)
	case errWant == "" && got != up:
		t.Errorf("Pattern(%q) = %d, want %d", pat, got, up)
	case errWant != "" && (err == nil || !strings.Contains(err.Error(), errWant)):
		t.Errorf("Pattern(%q) = %d, %v; want a refusal with %q", pat, got, err, errWant)
	}
}

// TestScanCursor: a cursor walks the upstreams in order and ends at 0.
func TestScanCursor(t *testing.T) {
	tb := newTestTable(t)
	scanReply := func(cursor string) []byte {
		return []byte("*2\r\n$" + strconv.Itoa(len(cursor)) + "\r\n" + cursor + "\r\n*0\r\n")
	}
	cursor := "0"
	var visited []string
	for range 10 {
		p := plan(tb, "SCAN", cursor, "COUNT", "5")
		a, _ := resp.SplitCommand(p.Part(0).Raw, nil)
		visited = append(visited, fmt.Sprintf("%d:%s", p.Part(0).Upstream, a[1]))
		inner := "0"
		if string(a[1]) == "0" {
			inner = "17" // each upstream answers one page, then is done
		}
		r := p.Reply([][]byte{scanReply(inner)})
		e, ok := resp.ArrayElements(r)
		if !ok {
			t.Fatalf("%q", r)
		}
		n, _ := bulkUint(e[0])
		if cursor = strconv.FormatUint(n, 10); cursor == "0" {
			break
		}
	}
	if got := strings.Join(visited, " "); got != "0:0 0:17 1:0 1:17 2:0 2:17" {
		t.Fatalf("visited %s", got)
	}
	for _, c := range []string{"3", "-1"} {
		if p := plan(tb, "SCAN", c); string(p.Local) != "*2\r\n$1\r\n0\r\n*0\r\n" {
			t.Fatalf("SCAN %s, naming no upstream: %+v; want the walk's end", c, p)
		}
	}
	if p := plan(tb, "SCAN", "+1"); p.Local != nil || p.single.Upstream != 1 {
		t.Fatalf("SCAN +1: %+v; want upstream 1 from its cursor 0", p)
	}
	for _, c := range []string{" 1", "1x", "18446744073709551616"} {
		if p := plan(tb, "SCAN", c); !bytes.Contains(p.Local, []byte("invalid cursor")) {
			t.Fatalf("SCAN %q: %+v; want invalid cursor", c, p)
		}
	}
}

// FuzzPlan: for any keys and routes, every part of a split command holds
// only keys of its own upstream, every key is in exactly one part, and a
// merged MGET puts each key's value back at its position.
func FuzzPlan(f *testing.F) {
	f.Add("queue:*", "c*", "queue:1 cache:2 x queue:1 c")
	f.Add("*", "[a-", "a b c")
	f.Add("a?b", "\\*", "* a?b axb")
	f.Fuzz(func(t *testing.T, p1, p2, keys string) {
		tb, err := New([]string{"default", "one", "two"}, []Rule{{Pattern: p1, Upstream: "one"}, {Pattern: p2, Upstream: "two"}}, nil)
		if err != nil {
			return // a pattern glob.Check refuses
		}
		ks := strings.Fields(keys)
		if len(ks) == 0 || len(ks) > 64 {
			return
		}
		a := append(args("MGET"), args(ks...)...)
		p := tb.Plan(table.Lookup(a), a, nil)
		if p.Local != nil {
			t.Fatalf("MGET refused: %s", p.Local)
		}
		replies := make([][]byte, p.Len())
		seen := 0
		for k := range p.Len() {
			part := p.Part(k)
			raw := part.Raw
			if raw == nil {
				raw = resp.AppendCommand(nil, a...)
			}
			sub, err := resp.SplitCommand(raw, nil)
			if err != nil {
				t.Fatal(err)
			}
			replies[k] = resp.AppendArray(nil, len(sub)-1)
			for _, key := range sub[1:] {
				if up, _ := tb.Key(key); up != part.Upstream {
					t.Fatalf("key %q of upstream %d in the part for %d", key, up, part.Upstream)
				}
				v := "v" + string(key)
				replies[k] = append(replies[k], "$"+strconv.Itoa(len(v))+"\r\n"+v+"\r\n"...)
				seen++
			}
		}
		if seen != len(ks) {
			t.Fatalf("%d keys in the parts, %d sent", seen, len(ks))
		}
		e, ok := resp.ArrayElements(p.Reply(replies))
		if !ok || len(e) != len(ks) {
			t.Fatalf("merged reply has %d elements, want %d", len(e), len(ks))
		}
		for i, k := range ks {
			if want := "$" + strconv.Itoa(len(k)+1) + "\r\nv" + k + "\r\n"; string(e[i]) != want {
				t.Fatalf("element %d = %q, want %q", i, e[i], want)
			}
		}
	})
}

// A ring route spreads its keys, and so their keyspace notifications,
// over several upstreams: subscriptions that would hear only some are
// refused, a single key's channel goes to that key's upstream.
func TestRingRouteSubscriptions(t *testing.T) {
	tb, err := New([]string{"default", "a", "b"}, []Rule{{Pattern: "s:*", Upstreams: []string{"default", "a", "b"}, Ring: RingConfig{Names: []string{"x", "y", "z"}}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for i := range 200 {
		k := []byte("s:" + strconv.Itoa(i*2654435761))
		up, _ := tb.Key(k)
		seen[up] = true
		if got, err := tb.Subscribe([]byte("__keyspace@0__:" + string(k))); err != nil || got != up {
			t.Fatalf("SUBSCRIBE to %s's notifications: upstream %d, %v; the key is on %d", k, got, err, up)
		}
	}
	if len(seen) != 3 {
		t.Fatalf("200 keys over 3 upstreams landed on %d", len(seen))
	}
	for _, pat := range []string{"__keyspace@0__:s:*", "__keyspace@0__:*", "__keyevent@0__:set"} {
		if _, err := tb.Pattern([]byte(pat)); err == nil {
			t.Errorf("PSUBSCRIBE %s hears one upstream of three: not refused", pat)
		}
	}
	if _, err := tb.Subscribe([]byte("__keyevent@0__:set")); err == nil {
		t.Error("SUBSCRIBE __keyevent@0__:set with keys on three upstreams: not refused")
	}
	if up, err := tb.Pattern([]byte("__keyspace@0__:other:*")); err != nil || up != Default {
		t.Errorf("PSUBSCRIBE to notifications of keys no route spreads: %d, %v", up, err)
	}
}
