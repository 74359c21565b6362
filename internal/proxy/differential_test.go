package proxy_test

// A differential test of the proxy's transparency: the same random command
// streams go to one Redis directly and to another, identical one through
// the proxy, and the two reply streams must be byte for byte the same.
//
// Left out because two Redis servers holding the same data answer them
// differently (nothing to do with the proxy):
//
//   - INFO, TIME, LASTSAVE, CONFIG, DEBUG, MEMORY, OBJECT, LATENCY, SLOWLOG,
//     COMMAND, ACL, MONITOR: server state and clocks, not data (MONITOR
//     also shows the proxy's own connections).
//   - RANDOMKEY, SRANDMEMBER, SPOP, HRANDFIELD, ZRANDMEMBER: random.
//   - SCAN, SSCAN, HSCAN, ZSCAN, SMEMBERS, SINTER, SUNION, SDIFF, KEYS,
//     PUBSUB CHANNELS matching several channels, UNSUBSCRIBE without
//     arguments while subscribed to several: their order follows a hash
//     table whose seed is random per process. Sets are read with
//     SISMEMBER, SMISMEMBER, SCARD, SINTERCARD, the *STORE forms and
//     SORT ... ALPHA instead; hashes are kept small (listpack encoded,
//     insertion ordered) so HGETALL/HKEYS/HVALS are deterministic.
//   - TTL, PTTL, EXPIRETIME, PEXPIRETIME, OBJECT IDLETIME, XPENDING's
//     extended form, XINFO: they depend on when each server ran the command.
//     Whether a key has a TTL is checked with a script answering the sign of
//     PTTL; every TTL set is at least 100 s (or far in the future), so no
//     key expires during a run; GT/LT are used only with absolute times
//     that cannot tie with relative ones.
//   - XADD with "*" IDs: the ID is the server's clock; IDs here are explicit.
//   - ZRANGE ... BYLEX, ZRANGEBYLEX, ZLEXCOUNT: on a sorted set whose
//     members have different scores their answer is undefined, and in
//     practice differs between two servers holding the same set (same DUMP):
//     a skiplist's search depends on its nodes' random levels (seen here).
//   - LCS, SETBIT/SETRANGE far offsets: unbounded memory on big values.
//   - SHUTDOWN, SYNC/PSYNC/REPLCONF: end the server or the protocol. QUIT
//     is only sent last, before the test reconnects.
//   - In runs with several clients (which share the two servers), also
//     DBSIZE, SWAPDB, SCRIPT FLUSH, PUBSUB NUMPAT, and EVALSHA/SCRIPT EXISTS
//     of a script another client may have loaded: their replies or effects
//     span every client, so they depend on how the clients interleave.
//   - After a reconnect the test waits until both servers have dropped the
//     old connection's subscriptions (settle): neither orders two
//     connections, and through the proxy the relay closes a little later.
//
// Left out or held back because the proxy documents a difference
// (docs/COMPATIBILITY.md):
//
//   - KEYS, FLUSHALL, FLUSHDB: refused by the guard by default ("Keyspace",
//     "Server and administration").
//   - CLIENT ID/INFO/LIST/KILL/TRACKING/...: the proxy's own clients and IDs
//     ("Connection"). CLIENT SETNAME, GETNAME and REPLY are sent.
//   - HELLO: the reply is the proxy's (its client ID; in this test also its
//     version, as proxytest never sets the upstream's), so it is sent (the
//     protocol switch is exercised) and its reply read but not compared.
//   - HELLO, SUBSCRIBE, CLIENT REPLY inside MULTI; HELLO and SUBSCRIBE
//     under WATCH: refused by the proxy ("Decisions inside transactions"),
//     so not sent there. HELLO is not sent while subscribed either.
//   - CLIENT GETNAME on a relayed connection of a client without a name
//     answers "redproxy-relay" ("Connection", CLIENT SETNAME): sent there
//     only by a client that has a name.
//   - AUTH: failed AUTHs are rate-limited per client address ("Proxy users
//     and ACLs"), and every client here is 127.0.0.1: at most 9 per run.
//   - A relay whose replies the proxy cannot count refuses writes after
//     1024 ("Client limits and relayed clients"): a client that subscribed
//     reconnects within 600 commands.
//   - SSUBSCRIBE and friends, CLIENT TRACKING, WAITAOF: not covered.
//
// Differences found by this test that the documentation does not describe
// are in diffKnownBugs; REDPROXY_DIFF_KNOWN_BUGS=1 sends what shows them.
//
// The default run is bounded in time (diffBudget per variant). Longer runs:
//
//	REDPROXY_DIFF_ROUNDS=5000 go test -run Differential ./internal/proxy/
//
// runs 5000 pipelines per client and variant without a time bound;
// REDPROXY_DIFF_SEED fixes the seed (a failure prints it);
// REDPROXY_DIFF_MINIMIZE=1 shrinks a failing stream to a short reproduction;
// REDPROXY_DIFF_HISTORY=n logs the failing client's last n pipelines.

import (
	"bufio"
	"bytes"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// diffBudget bounds each variant of the default run; diffDefaultRounds
// bounds the pipelines per client when the budget is not reached first.
const (
	diffBudget        = 2300 * time.Millisecond
	diffDefaultRounds = 2000
	diffReplyTimeout  = 20 * time.Second
)

type diffVariant struct {
	name    string
	proto   int  // the protocol each client starts with (HELLO 3 first)
	tier    bool // the proxy's local tier on, every read admitted
	clients int
}

var diffVariants = []diffVariant{
	{name: "RESP2", proto: 2, clients: 1},
	{name: "RESP3", proto: 3, clients: 1},
	{name: "LocalTier", proto: 2, tier: true, clients: 1},
	{name: "LocalTierRESP3", proto: 3, tier: true, clients: 1},
	// Half the clients start on RESP2, half on RESP3.
	{name: "LocalTierConcurrent", proto: 0, tier: true, clients: 8},
}

func TestDifferential(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("REDPROXY_DIFF_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("REDPROXY_DIFF_SEED: %v", err)
		}
		seed = v
	}
	rounds, budget := diffDefaultRounds, diffBudget
	if s := os.Getenv("REDPROXY_DIFF_ROUNDS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v <= 0 {
			t.Fatalf("REDPROXY_DIFF_ROUNDS: want a positive number, got %q", s)
		}
		rounds, budget = v, 0
	}
	t.Logf("seed %d (rerun with REDPROXY_DIFF_SEED=%d)", seed, seed)
	for _, v := range diffVariants {
		t.Run(v.name, func(t *testing.T) {
			runDifferential(t, v, seed, rounds, budget)
		})
	}
}

// runDifferential starts two fresh servers, a proxy in front of the second,
// and v.clients clients, each comparing its own stream.
func runDifferential(t *testing.T, v diffVariant, seed uint64, rounds int, budget time.Duration) {
	direct := redistest.Start(t)
	behind := redistest.Start(t)
	p := proxytest.Start(t, behind, func(c *config.Config) {
		if v.tier {
			c.LocalCache.Enabled = true
			c.LocalCache.AdmitMinReads = 0
			c.LocalCache.WriteRatio = 1000 // the streams write a lot; keep every key admitted
			c.LocalCache.NegativeCaching = true
			c.LocalCache.MaxTTL = units.Duration{Duration: time.Minute}
		}
	})
	if v.tier {
		redistest.Eventually(t, 10*time.Second, func() bool { return p.LocalTier().Live(0) }, "local tier never became live")
	}
	var (
		mu                 sync.Mutex
		pipelines, command int
		failed             []*diffClient
	)
	// pass runs every client's stream once, for the budget (or rounds).
	pass := func(seed uint64) {
		var deadline time.Time
		if budget > 0 {
			deadline = time.Now().Add(budget)
		}
		timeBase := time.Now().Unix()
		var wg sync.WaitGroup
		for i := range v.clients {
			proto := v.proto
			if proto == 0 {
				proto = 2 + i%2
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				g := newDiffGen(seed, i, v.clients, proto, timeBase)
				cl := &diffClient{t: t, v: v, seed: seed, id: i, addrA: direct.Addr(), addrB: p.Addr, addrBDirect: behind.Addr(), prefix: g.prefix, proto: proto}
				np, nc, err := cl.run(g, rounds, deadline)
				mu.Lock()
				pipelines += np
				command += nc
				mu.Unlock()
				if err != nil {
					t.Error(err)
					if n, _ := strconv.Atoi(os.Getenv("REDPROXY_DIFF_HISTORY")); n > 0 {
						t.Logf("client %d, its last pipelines before the failing one:\n%s", cl.id, cl.lastPipelines(n))
					}
					mu.Lock()
					failed = append(failed, cl)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
	}
	pass(seed)
	// A budgeted run on a loaded machine (CI runs test processes side by
	// side) may end before the tier served anything, which would leave
	// the variant comparing nothing it answers (seen in CI: 547 commands,
	// no hit): further passes, with the next seeds, until it has.
	for extra := uint64(1); v.tier && budget > 0 && extra <= 3 && !t.Failed() && metricSum(t, p, "redproxy_localcache_hits_total") == 0; extra++ {
		t.Logf("%s: no tier hit yet; pass %d with seed %d", v.name, extra+1, seed+extra)
		pass(seed + extra)
	}
	if os.Getenv("REDPROXY_DIFF_MINIMIZE") != "" {
		// One at a time, once every client is done: a replay empties
		// both servers.
		for _, cl := range failed {
			cl.minimize(direct, behind, p)
		}
	}
	t.Logf("%s: %d pipelines, %d commands compared; %.0f reads coalesced, %.0f sharing another's fetch", v.name, pipelines, command,
		metricSum(t, p, "redproxy_stampede_coalesced_reads_total"), metricSum(t, p, "redproxy_stampede_fetches_saved_total"))
	if v.tier {
		hits := metricSum(t, p, "redproxy_localcache_hits_total")
		t.Logf("%s: %.0f replies served by the local tier", v.name, hits)
		if hits == 0 && !t.Failed() {
			t.Errorf("the local tier served nothing: this variant compared nothing it answers")
		}
	}
}

// diffCmd is one command of a stream: how it goes on the wire and what the
// generator expects back.
type diffCmd struct {
	args   []string
	inline string // when not "", the command is sent as this inline line (with its line end)
	// replies is how many reply frames the command draws (0 when muted by
	// CLIENT REPLY, one per channel for SUBSCRIBE, ...); noCmp: read them
	// without comparing (HELLO, whose reply is the proxy's own).
	replies int
	noCmp   bool
	// reconnect: not a command but fresh connections on both sides, once
	// the pipeline it ends is answered.
	reconnect bool
	// side: the pipeline goes to the client's second pair of connections
	// (plain RESP2), whose writes are another connection's to the first.
	side bool
	// twin: the command (a pipeline of its own) goes to every pair at once.
	twin bool
	// raw, when set, is sent as it is (a malformed or empty request),
	// drawing rawReplies replies.
	raw        string
	rawReplies int
	// sloppy: each bulk string is followed by "xx", not CRLF; Redis skips
	// the two bytes unread, and so must the proxy.
	sloppy bool
}

func (c *diffCmd) appendWire(b []byte) []byte {
	if c.raw != "" {
		return append(b, c.raw...)
	}
	if c.inline != "" {
		return append(b, c.inline...)
	}
	b = append(b, '*')
	b = strconv.AppendInt(b, int64(len(c.args)), 10)
	b = append(b, '\r', '\n')
	for _, a := range c.args {
		b = append(b, '$')
		b = strconv.AppendInt(b, int64(len(a)), 10)
		b = append(b, '\r', '\n')
		b = append(b, a...)
		if c.sloppy {
			b = append(b, 'x', 'x')
		} else {
			b = append(b, '\r', '\n')
		}
	}
	return b
}

func (c *diffCmd) String() string {
	var b strings.Builder
	if c.reconnect {
		return "(reconnect)"
	}
	if c.side {
		b.WriteString("(side connection) ")
	}
	if c.twin {
		b.WriteString("(on four connections at once) ")
	}
	if c.raw != "" {
		return fmt.Sprintf("(raw) %q", c.raw)
	}
	if c.inline != "" {
		b.WriteString("(inline) ")
	}
	if c.sloppy {
		b.WriteString("(bulks not ended by CRLF) ")
	}
	for i, a := range c.args {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(diffShow(a, 60))
	}
	if len(c.args) == 0 {
		fmt.Fprintf(&b, "%q", c.inline)
	}
	return b.String()
}

// diffShow quotes s for a failure message, cut to about max bytes.
func diffShow(s string, max int) string {
	if len(s) > max {
		return fmt.Sprintf("%q...(%d bytes)", s[:max], len(s))
	}
	return strconv.Quote(s)
}

// diffConn is one side: a connection to Redis directly, or to the proxy.
type diffConn struct {
	nc net.Conn
	rd *bufio.Reader
}

func dialDiff(addr string) (*diffConn, error) {
	nc, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return nil, err
	}
	return &diffConn{nc: nc, rd: bufio.NewReaderSize(nc, 64<<10)}, nil
}

// exchange writes wire in one write and reads n reply frames.
func (c *diffConn) exchange(wire []byte, n int) ([][]byte, error) {
	werr := make(chan error, 1)
	go func() {
		c.nc.SetWriteDeadline(time.Now().Add(diffReplyTimeout))
		_, err := c.nc.Write(wire)
		werr <- err
	}()
	c.nc.SetReadDeadline(time.Now().Add(diffReplyTimeout))
	frames := make([][]byte, 0, n)
	var err error
	for len(frames) < n {
		var f []byte
		if f, err = readDiffFrame(c.rd, nil); err != nil {
			err = fmt.Errorf("reading reply %d of %d: %w", len(frames)+1, n, err)
			break
		}
		frames = append(frames, f)
	}
	if e := <-werr; e != nil && err == nil {
		err = fmt.Errorf("write: %w", e)
	}
	return frames, err
}

// readDiffFrame appends one whole reply, as raw bytes, to dst. It frames
// by itself (not with the proxy's resp package) so that a framing bug
// there cannot hide here. A RESP3 attribute is kept with the reply it
// annotates.
func readDiffFrame(rd *bufio.Reader, dst []byte) ([]byte, error) {
	line, err := rd.ReadBytes('\n')
	if err != nil {
		return dst, err
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return dst, fmt.Errorf("malformed line %q", line)
	}
	dst = append(dst, line...)
	typ, body := line[0], string(line[1:len(line)-2])
	switch typ {
	case '+', '-', ':', '_', ',', '#', '(':
		return dst, nil
	case '$', '!', '=':
		n, err := strconv.Atoi(body)
		if err != nil {
			return dst, fmt.Errorf("bad length in %q", line)
		}
		if n < 0 {
			return dst, nil
		}
		start := len(dst)
		dst = append(dst, make([]byte, n+2)...)
		if _, err := io.ReadFull(rd, dst[start:]); err != nil {
			return dst, err
		}
		if dst[len(dst)-2] != '\r' || dst[len(dst)-1] != '\n' {
			return dst, fmt.Errorf("bulk of %d bytes not followed by CRLF", n)
		}
		return dst, nil
	case '*', '~', '>', '%', '|':
		n, err := strconv.Atoi(body)
		if err != nil {
			return dst, fmt.Errorf("bad count in %q", line)
		}
		if typ == '%' || typ == '|' {
			n *= 2
		}
		for range max(n, 0) {
			if dst, err = readDiffFrame(rd, dst); err != nil {
				return dst, err
			}
		}
		if typ == '|' {
			return readDiffFrame(rd, dst)
		}
		return dst, nil
	}
	return dst, fmt.Errorf("unknown reply type in %q", line)
}

type diffClient struct {
	t            *testing.T
	v            diffVariant
	seed         uint64
	id           int
	addrA, addrB string
	addrBDirect  string // the proxy's Redis, for probes
	prefix       string // of the client's keys and channels
	proto        int
	// history is every pipeline sent, for the minimizer.
	history [][]diffCmd
}

// run sends rounds pipelines (or until deadline), and reports the first
// difference with everything needed to rerun it.
func (cl *diffClient) run(g *diffGen, rounds int, deadline time.Time) (pipelines, commands int, err error) {
	var cs diffConns
	defer cs.close()
	for r := -1; r < rounds; r++ {
		var pl []diffCmd
		if r < 0 {
			pl = g.reconnect(true)
		} else {
			if !deadline.IsZero() && time.Now().After(deadline) {
				break
			}
			pl = g.pipeline()
		}
		cl.history = append(cl.history, pl)
		if err := cl.step(&cs, pl, r); err != nil {
			return pipelines, commands, err
		}
		pipelines++
		commands += len(pl)
	}
	return pipelines, commands, nil
}

// diffConns are a client's connections: a and b its main pair (direct,
// proxy), sa and sb its side pairs, dialled when first used. Side pipelines
// use the first; twin reads all.
type diffConns struct {
	a, b   *diffConn
	sa, sb [3]*diffConn
}

func (cs *diffConns) close() {
	for _, c := range append([]*diffConn{cs.a, cs.b}, append(cs.sa[:], cs.sb[:]...)...) {
		if c != nil {
			c.nc.Close()
		}
	}
}

// step runs one pipeline of the history.
func (cl *diffClient) step(cs *diffConns, pl []diffCmd, round int) error {
	var err error
	if pl[0].side || pl[0].twin {
		for i := range cs.sa {
			if cs.sa[i] == nil {
				if cs.sa[i], cs.sb[i], err = cl.dialPair(); err != nil {
					return err
				}
			}
		}
	}
	switch {
	case pl[0].side:
		return cl.compare(cs.sa[0], cs.sb[0], pl, round)
	case pl[0].twin:
		// The side connections are plain RESP2: one reply, whatever the
		// main connection's state counts.
		side := append([]diffCmd{}, pl...)
		side[0].replies, side[0].noCmp = 1, false
		errc := make(chan error, len(cs.sa))
		for i := range cs.sa {
			go func() { errc <- cl.compare(cs.sa[i], cs.sb[i], side, round) }()
		}
		err = cl.compare(cs.a, cs.b, pl, round)
		for range cs.sa {
			err = errors.Join(err, <-errc)
		}
		return err
	}
	body := pl
	last := pl[len(pl)-1]
	if last.reconnect {
		body = pl[:len(pl)-1]
	}
	if len(body) > 0 {
		if err := cl.compare(cs.a, cs.b, body, round); err != nil {
			return err
		}
	}
	if last.reconnect {
		for _, c := range []*diffConn{cs.a, cs.b} {
			if c != nil {
				c.nc.Close()
			}
		}
		if err := cl.settle(); err != nil {
			return err
		}
		cs.a, cs.b, err = cl.dialPair()
	}
	return err
}

// settle waits until the connections just closed have left their
// subscriptions on both servers. Redis drops a closed connection's
// subscriptions once it reads the close, and the proxy closes a relay's
// upstream connection once it noticed its client's; until then a PUBLISH
// or PUBSUB NUMSUB of the next connection counts them (seen through the
// proxy, which takes longer). Neither server promises an order between
// two connections, so this is the test's to wait for.
func (cl *diffClient) settle() error {
	var w []byte
	for i := range 3 {
		w = (&diffCmd{args: []string{"PUBLISH", cl.prefix + "ch" + strconv.Itoa(i), ""}}).appendWire(w)
	}
	for _, addr := range []string{cl.addrA, cl.addrBDirect} {
		c, err := dialDiff(addr)
		if err != nil {
			return err
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			f, err := c.exchange(w, 3)
			if err != nil {
				c.nc.Close()
				return err
			}
			if string(bytes.Join(f, nil)) == ":0\r\n:0\r\n:0\r\n" {
				break
			}
			if time.Now().After(deadline) {
				c.nc.Close()
				return fmt.Errorf("%s: a closed connection's subscriptions still count after 10s: %q", addr, f)
			}
			time.Sleep(time.Millisecond)
		}
		c.nc.Close()
	}
	return nil
}

// dialPair connects to Redis directly and to the proxy.
func (cl *diffClient) dialPair() (*diffConn, *diffConn, error) {
	a, err := dialDiff(cl.addrA)
	if err != nil {
		return nil, nil, err
	}
	b, err := dialDiff(cl.addrB)
	if err != nil {
		a.nc.Close()
		return nil, nil, err
	}
	return a, b, nil
}

// compare sends pl to both sides and compares the replies.
func (cl *diffClient) compare(a, b *diffConn, pl []diffCmd, round int) error {
	var wire []byte
	n := 0
	for i := range pl {
		wire = pl[i].appendWire(wire)
		n += pl[i].replies
	}
	var (
		fa, fb     [][]byte
		errA, errB error
		wg         sync.WaitGroup
	)
	wg.Add(1)
	go func() { defer wg.Done(); fa, errA = a.exchange(wire, n) }()
	fb, errB = b.exchange(wire, n)
	wg.Wait()
	if errA != nil {
		return fmt.Errorf("%s: direct Redis failed (a test bug, or a reply count the generator got wrong): %v\n%s", cl.where(round), errA, diffReport(pl, fa, fb, -1))
	}
	// Which command each frame belongs to.
	owner := make([]int, 0, n)
	for i := range pl {
		for range pl[i].replies {
			owner = append(owner, i)
		}
	}
	for i := range fa {
		if i >= len(fb) {
			return fmt.Errorf("%s: the proxy sent %d of %d replies: %v\n%s", cl.where(round), len(fb), n, errB, diffReport(pl, fa, fb, owner[i]))
		}
		if !pl[owner[i]].noCmp && !bytes.Equal(fa[i], fb[i]) {
			return fmt.Errorf("%s: reply %d differs (command %d)\n%s%s", cl.where(round), i, owner[i], diffReport(pl, fa, fb, owner[i]), cl.probe(pl[owner[i]]))
		}
	}
	if errB != nil {
		return fmt.Errorf("%s: proxy: %v\n%s", cl.where(round), errB, diffReport(pl, fa, fb, -1))
	}
	return nil
}

// lastPipelines lists the last n pipelines of the client's history, the
// failing one included.
func (cl *diffClient) lastPipelines(n int) string {
	var b strings.Builder
	h := cl.history[max(0, len(cl.history)-n):]
	for i, pl := range h {
		fmt.Fprintf(&b, "pipeline -%d:\n", len(h)-1-i)
		for _, c := range pl {
			fmt.Fprintf(&b, "    %s\n", c.String())
		}
	}
	return b.String()
}

// probe sends c again, after the fact, on new RESP2 connections in DB 0
// to both servers directly (the proxy's Redis too, bypassing the proxy):
// when both answer the same now, the proxy's reply was its own doing.
func (cl *diffClient) probe(c diffCmd) string {
	if c.inline != "" || len(c.args) < 2 || c.side {
		return ""
	}
	var b strings.Builder
	b.WriteString("the same command sent again to each Redis directly (RESP2, DB 0):\n")
	for _, side := range []struct{ name, addr string }{{"direct", cl.addrA}, {"proxy's Redis", cl.addrBDirect}} {
		if side.addr == "" {
			continue
		}
		conn, err := dialDiff(side.addr)
		if err != nil {
			fmt.Fprintf(&b, "  %s: %v\n", side.name, err)
			continue
		}
		f, err := conn.exchange((&diffCmd{args: c.args}).appendWire(nil), 1)
		conn.nc.Close()
		if err != nil || len(f) == 0 {
			fmt.Fprintf(&b, "  %s: %v\n", side.name, err)
			continue
		}
		fmt.Fprintf(&b, "  %s: %s\n", side.name, diffShow(string(f[0]), 300))
	}
	return b.String()
}

func (cl *diffClient) where(round int) string {
	return fmt.Sprintf("variant %s, client %d (RESP%d), pipeline %d; rerun: REDPROXY_DIFF_SEED=%d go test -run 'TestDifferential/%s$' ./internal/proxy/",
		cl.v.name, cl.id, cl.proto, round, cl.seed, cl.v.name)
}

// diffReport lists the pipeline with both sides' replies, marking command
// bad.
func diffReport(pl []diffCmd, fa, fb [][]byte, bad int) string {
	var b strings.Builder
	ia, ib := 0, 0
	for i := range pl {
		mark := "  "
		if i == bad {
			mark = "=>"
		}
		fmt.Fprintf(&b, "%s %3d: %s\n", mark, i, pl[i].String())
		for range pl[i].replies {
			var ra, rb string
			if ia < len(fa) {
				ra = diffShow(string(fa[ia]), 300)
			} else {
				ra = "(none)"
			}
			if ib < len(fb) {
				rb = diffShow(string(fb[ib]), 300)
			} else {
				rb = "(none)"
			}
			ia++
			ib++
			if ra == rb {
				fmt.Fprintf(&b, "         both:   %s\n", ra)
			} else {
				fmt.Fprintf(&b, "         direct: %s\n         proxy:  %s\n", ra, rb)
			}
		}
	}
	return b.String()
}

// ---------------------------------------------------------------------------
// Reply accounting: how many frames each command draws, from the state of
// the connection (transaction, subscriptions, CLIENT REPLY). It is kept
// apart from the generator so the minimizer can recount a shortened stream.

type diffState struct {
	proto    int
	multi    bool
	watching bool
	channels map[string]bool
	patterns map[string]bool
	replyOff bool
	skipNext bool
	// relayCmds counts the commands since the connection first
	// subscribed (-1: never). The proxy made it a relay, which may stay
	// for the connection's life; a relay whose replies it cannot count
	// refuses writes after 1024 of them (COMPATIBILITY.md, "Client limits
	// and relayed clients"), so the generator reconnects before that.
	relayCmds int
	named     bool // CLIENT SETNAME gave the connection a name
}

func newDiffState(proto int) *diffState {
	return &diffState{proto: proto, channels: map[string]bool{}, patterns: map[string]bool{}, relayCmds: -1}
}

func (s *diffState) subscribed() bool { return len(s.channels)+len(s.patterns) > 0 }

// allowedSubscribedRESP2 are the commands Redis runs on a RESP2
// connection in subscribed mode; the rest get an error.
var allowedSubscribedRESP2 = map[string]bool{
	"SUBSCRIBE": true, "UNSUBSCRIBE": true, "PSUBSCRIBE": true, "PUNSUBSCRIBE": true,
	"SSUBSCRIBE": true, "SUNSUBSCRIBE": true, "PING": true, "QUIT": true, "RESET": true,
}

// account updates s for c and sets c.replies (and c.noCmp).
func (s *diffState) account(c *diffCmd) {
	if c.reconnect {
		*s = *newDiffState(2)
		c.replies = 0
		return
	}
	if c.raw != "" {
		c.replies = c.rawReplies
		if s.replyOff {
			c.replies = 0 // errors are muted too
		}
		return
	}
	if s.relayCmds >= 0 {
		s.relayCmds++
	}
	refused := len(c.args) > 0 && s.proto == 2 && s.subscribed() && !allowedSubscribedRESP2[strings.ToUpper(c.args[0])]
	replies, pushes, noCmp := s.count(c.args)
	mute := s.replyOff
	if s.skipNext && len(c.args) > 0 {
		s.skipNext = false
		mute = true
	}
	if len(c.args) >= 3 && strings.EqualFold(c.args[0], "CLIENT") && strings.EqualFold(c.args[1], "REPLY") && !s.multi && !refused {
		switch strings.ToUpper(c.args[2]) {
		case "ON":
			s.replyOff, s.skipNext = false, false
			mute = false
		case "OFF":
			s.replyOff = true
			mute = true
		case "SKIP":
			if !s.replyOff {
				s.skipNext = true
			}
			mute = true
		}
	}
	if mute {
		replies = 0
	}
	// Pub/sub confirmations and messages are pushes, which CLIENT REPLY
	// never mutes (on RESP2 connections too).
	c.replies, c.noCmp = replies+pushes, noCmp
}

// count is how many replies args draws (muted by CLIENT REPLY), and how
// many pushes (never muted).
func (s *diffState) count(args []string) (replies, pushes int, noCmp bool) {
	if len(args) == 0 {
		return 0, 0, false // an empty inline line: Redis answers nothing
	}
	name := strings.ToUpper(args[0])
	if s.proto == 2 && s.subscribed() && !allowedSubscribedRESP2[name] {
		return 1, 0, false
	}
	if s.multi {
		switch {
		case name == "EXEC", name == "DISCARD" && len(args) == 1:
			// EXEC with arguments aborts the transaction too; DISCARD
			// with arguments is refused and flags it, like RESET's.
			s.multi, s.watching = false, false
		case name == "RESET" && len(args) == 1:
			s.reset()
		}
		// Everything else is queued (or refused) with one reply; MULTI
		// and WATCH are refused.
		return 1, 0, false
	}
	switch name {
	case "MULTI":
		s.multi = len(args) == 1
	case "EXEC":
		// Without MULTI, EXEC with arguments is answered EXECABORT, and
		// the WATCH ends with the transaction it aborts.
		if len(args) > 1 {
			s.watching = false
		}
	case "QUIT":
		// +OK, then the server closes the connection (the generator
		// reconnects right after).
	case "WATCH":
		if len(args) > 1 {
			s.watching = true
		}
	case "UNWATCH":
		s.watching = s.watching && len(args) > 1
	case "RESET":
		if len(args) == 1 {
			s.reset()
		}
	case "CLIENT":
		if len(args) == 3 && strings.EqualFold(args[1], "SETNAME") && !strings.ContainsAny(args[2], " \n") {
			s.named = args[2] != ""
		}
	case "HELLO":
		if len(args) > 1 && (args[1] == "2" || args[1] == "3") {
			s.proto = int(args[1][0] - '0')
		}
		return 1, 0, true
	case "SUBSCRIBE", "PSUBSCRIBE":
		s.relayCmds = max(s.relayCmds, 0)
		set := s.channels
		if name == "PSUBSCRIBE" {
			set = s.patterns
		}
		for _, ch := range args[1:] {
			set[ch] = true
		}
		return 0, max(len(args)-1, 1), false
	case "UNSUBSCRIBE", "PUNSUBSCRIBE":
		set := s.channels
		if name == "PUNSUBSCRIBE" {
			set = s.patterns
		}
		if len(args) > 1 {
			for _, ch := range args[1:] {
				delete(set, ch)
			}
			return 0, len(args) - 1, false
		}
		n := len(set)
		clear(set)
		return 0, max(n, 1), false
	case "PUBLISH":
		// A RESP3 subscriber is pushed its own messages, before PUBLISH's
		// reply. (At most one pattern of a client matches a channel, so
		// the order of pmessages cannot depend on Redis's dict order.)
		if s.proto == 3 && len(args) == 3 {
			n := 0
			if s.channels[args[1]] {
				n++
			}
			for p := range s.patterns {
				if diffGlob(p, args[1]) {
					n++
				}
			}
			return 1, n, false
		}
	}
	return 1, 0, false
}

// reset is RESET: the connection's state as new, but for the proxy's
// relay, which stays.
func (s *diffState) reset() {
	relay := s.relayCmds
	*s = *newDiffState(2)
	s.relayCmds = relay
}

// diffGlob matches the only pattern syntax the generator uses: '*' and '?'.
func diffGlob(p, s string) bool {
	if p == "" {
		return s == ""
	}
	switch p[0] {
	case '*':
		for i := 0; i <= len(s); i++ {
			if diffGlob(p[1:], s[i:]) {
				return true
			}
		}
		return false
	case '?':
		return s != "" && diffGlob(p[1:], s[1:])
	}
	return s != "" && s[0] == p[0] && diffGlob(p[1:], s[1:])
}

// ---------------------------------------------------------------------------
// The generator.

type diffGen struct {
	r        *rand.Rand
	st       *diffState
	prefix   string
	single   bool  // the only client: whole-database commands are allowed
	timeBase int64 // unix seconds at the start; absolute TTLs are far past it
	xid      int64 // the next explicit stream ID
	loaded   map[string]bool
	big      []string
	proto    int       // the protocol a connection of this client starts with
	pending  []diffCmd // the start of the next pipeline, after a reconnect
	// readPhase counts down the read-only pipelines still to come.
	readPhase int
	unsynced  bool       // see pipeline
	watched   []string   // the keys of the last WATCH
	hot       [][]string // the reads repeated in this phase
	// authLeft bounds the failed AUTHs: the proxy rate-limits them per
	// client address (10, then one a second; COMPATIBILITY.md, "Proxy
	// users and ACLs"), and every client of a run is 127.0.0.1.
	authLeft int
	// known: also send what triggers the differences found by this test
	// and not fixed yet (REDPROXY_DIFF_KNOWN_BUGS=1), see diffKnownBugs.
	known bool
}

// diffProtocolErrors are malformed requests Redis and the proxy both
// answer with the same protocol error before closing the connection.
var diffProtocolErrors = []string{
	"*1\r\n$abc\r\n", "*abc\r\n", "*1\r\n+PING\r\n", "PING \"a\"b\r\n", "ECHO 'a'b\r\n",
	"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$-5\r\n", "*2\r\n$4\r\nECHO\r\n$536870913\r\n", "*1\r\n$-1\r\n",
	"*1\r\n$\r\n", "*\r\n", "*1\r\n$ 4\r\nPING\r\n", "*+1\r\n$4\r\nPING\r\n", "*01\r\n$04\r\nPING\r\n",
}

// diffKnownBugs are differences this test found that the documentation
// does not describe. The generator avoids them unless
// REDPROXY_DIFF_KNOWN_BUGS is set, so the test keeps guarding the rest.
//
//   None known at present.

func newDiffGen(seed uint64, client, clients, proto int, timeBase int64) *diffGen {
	single := clients == 1
	g := &diffGen{
		r:        rand.New(rand.NewPCG(seed, uint64(client)+1)),
		st:       newDiffState(2),
		proto:    proto,
		prefix:   fmt.Sprintf("dt%d:", client),
		single:   single,
		timeBase: timeBase,
		xid:      1,
		loaded:   map[string]bool{},
		authLeft: max(1, 9/clients),
		known:    os.Getenv("REDPROXY_DIFF_KNOWN_BUGS") != "",
	}
	for i := range 2 {
		b := make([]byte, 100<<10)
		for j := range b {
			b[j] = byte(g.r.IntN(256))
		}
		b[i] = '\r'
		g.big = append(g.big, string(b))
	}
	return g
}

// reconnect is a pipeline that opens fresh connections, then what every
// connection starts with: HELLO 3 for RESP3 clients and, first, the
// function library FCALL needs (FUNCTION LOAD REPLACE is idempotent, so
// concurrent clients may all send it).
func (g *diffGen) reconnect(first bool) []diffCmd {
	var out []diffCmd
	switch x := g.r.IntN(6); {
	case first:
	case x < 2:
		out = append(out, g.cmd("QUIT"))
	case x < 3:
		// A malformed request: both answer a protocol error and close.
		out = append(out, diffCmd{raw: diffProtocolErrors[g.r.IntN(len(diffProtocolErrors))], rawReplies: 1})
	}
	c := diffCmd{reconnect: true}
	g.st.account(&c)
	g.pending = nil
	if g.proto == 3 {
		g.pending = append(g.pending, g.cmd("HELLO", "3"))
	}
	if first {
		g.pending = append(g.pending, g.cmd("FUNCTION", "LOAD", "REPLACE", diffLibrary))
	}
	return append(out, c)
}

const diffLibrary = "#!lua name=difflib\n" +
	"redis.register_function('dget', function(keys, args) return redis.call('GET', keys[1]) end)\n" +
	"redis.register_function('dset', function(keys, args) return redis.call('SET', keys[1], args[1]) end)\n" +
	"redis.register_function{function_name='dro', callback=function(keys, args) return redis.call('STRLEN', keys[1]) end, flags={'no-writes'}}\n"

// cmd makes a command and accounts for its replies.
func (g *diffGen) cmd(args ...string) diffCmd {
	c := diffCmd{args: args}
	switch g.r.IntN(40) {
	case 0, 1:
		c.inline = diffInline(g.r, args)
	case 2:
		c.sloppy = true
	}
	g.st.account(&c)
	return c
}

// diffInline writes args as an inline command when they fit on a line
// ("" if not): quoted where needed, in double or single quotes.
func diffInline(r *rand.Rand, args []string) string {
	var b strings.Builder
	n := 0
	for _, a := range args {
		n += len(a)
	}
	if n > 8<<10 || len(args) == 0 {
		return ""
	}
	for i, a := range args {
		if i > 0 {
			b.WriteString(strings.Repeat(" ", 1+r.IntN(2)))
		}
		switch {
		case a != "" && diffPlain(a) && r.IntN(4) != 0:
			b.WriteString(a)
		case !strings.ContainsAny(a, "'\\\r\n\x00") && r.IntN(3) == 0:
			// In single quotes only \' is an escape.
			b.WriteString("'" + a + "'")
		default:
			b.WriteByte('"')
			for j := 0; j < len(a); j++ {
				switch c := a[j]; c {
				case '"':
					b.WriteString(`\"`)
				case '\\':
					b.WriteString(`\\`)
				case '\n':
					b.WriteString(`\n`)
				case '\r':
					b.WriteString(`\r`)
				case '\t':
					b.WriteString(`\t`)
				default:
					if c < 0x20 || c >= 0x7f {
						fmt.Fprintf(&b, `\x%02x`, c)
					} else {
						b.WriteByte(c)
					}
				}
			}
			b.WriteByte('"')
		}
	}
	if r.IntN(5) == 0 {
		b.WriteString("\n") // Redis takes a bare LF as the end of an inline line too
	} else {
		b.WriteString("\r\n")
	}
	return b.String()
}

func diffPlain(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == ':' || c == '.' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// pipeline makes the next batch: 1 to 50 commands (a unit such as CLIENT
// REPLY OFF ... ON may take it a little past).
func (g *diffGen) pipeline() (pl []diffCmd) {
	// unsynced: the main connection's last command drew no reply (CLIENT
	// REPLY SKIP or OFF), so the test did not wait for it to run, and a
	// command on another connection, or on a new one, could overtake it
	// (through the proxy, that happens). Redis orders nothing across
	// connections either; a client that wants its muted commands done
	// first has to wait for a reply on the same connection.
	unsynced := g.unsynced
	defer func() {
		if last := pl[len(pl)-1]; !last.side && !last.reconnect {
			g.unsynced = last.replies == 0 && last.raw == ""
		} else if last.reconnect {
			g.unsynced = false
		}
	}()
	if !unsynced && (g.st.relayCmds > 600 || g.r.IntN(200) == 0) {
		return g.reconnect(false)
	}
	pl = g.pending
	g.pending = nil
	if g.readPhase == 0 && g.r.IntN(8) == 0 {
		g.readPhase = 5 + g.r.IntN(25)
		g.hot = g.hot[:0]
		for range 2 + g.r.IntN(4) {
			g.hot = append(g.hot, g.unsent(g.read).args)
		}
	}
	if g.readPhase > 0 && !g.st.multi && !(g.st.proto == 2 && g.st.subscribed()) {
		// A run of pipelines of a few reads: the local tier serves a read
		// only when nothing of the client's batch is on its way to Redis
		// ahead of it, the same command (byte for byte) was filled
		// before, and no write it cannot name (a script, a transaction)
		// came since its last fence.
		g.readPhase--
		if len(pl) == 0 && g.r.IntN(4) == 0 && !g.st.watching && !unsynced {
			// The same read alone on four connections at once: the
			// proxy's stampede protection shares one request between
			// identical reads in flight (when the protocol and database
			// are the same too; the first read leads a fetch of its own,
			// the next ones share the following one).
			c := g.cmd(g.hot[g.r.IntN(len(g.hot))]...)
			c.twin = true
			return []diffCmd{c}
		}
		if g.r.IntN(4) == 0 {
			pl = append(pl, g.hiddenWrite()...)
		}
		for range 1 + g.r.IntN(3) {
			if g.r.IntN(5) == 0 {
				pl = append(pl, g.read())
			} else {
				pl = append(pl, g.cmd(g.hot[g.r.IntN(len(g.hot))]...))
			}
		}
		return pl
	}
	if len(pl) == 0 && g.r.IntN(12) == 0 && !unsynced {
		return g.side()
	}
	if len(pl) == 0 && g.r.IntN(300) == 0 && !g.st.subscribed() && !g.st.multi {
		return g.bigReplies()
	}
	n := 1 + g.r.IntN(50)
	if g.r.IntN(150) == 0 && g.st.relayCmds < 0 {
		// Past the 1024 requests the proxy takes from a client per batch.
		n = 1000 + g.r.IntN(600)
	}
	for len(pl) < n && (g.st.relayCmds <= 600 || len(pl) == 0) {
		pl = append(pl, g.unit()...)
	}
	return pl
}

// key families: each key is mostly used with the commands of its type; a
// few picks take any key, for WRONGTYPE errors.
var diffFamilies = map[byte]int{'s': 6, 'l': 4, 'h': 4, 't': 4, 'z': 4, 'x': 3, 'p': 2}

func (g *diffGen) key(fam byte) string {
	if g.r.IntN(12) == 0 {
		fams := "slhtzxp"
		fam = fams[g.r.IntN(len(fams))]
	}
	if fam == 's' && g.r.IntN(15) == 0 {
		return g.prefix + "s:bin\r\n\x00 'key\""
	}
	return g.prefix + string(fam) + strconv.Itoa(g.r.IntN(diffFamilies[fam]))
}

func (g *diffGen) keys(fam byte, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = g.key(fam)
	}
	return out
}

// value is a string value: mostly short, sometimes numeric, binary (CR,
// LF, NUL), empty, or 100 KB.
func (g *diffGen) value() string {
	switch x := g.r.IntN(200); {
	case x < 70:
		return "v" + strconv.Itoa(g.r.IntN(50))
	case x < 100:
		return g.intValue()
	case x < 115:
		return g.floatValue()
	case x < 140:
		return g.binValue(1 + g.r.IntN(24))
	case x < 150:
		return ""
	case x < 152:
		return g.big[g.r.IntN(len(g.big))]
	case x < 155:
		return strings.Repeat("x", 200+g.r.IntN(5000))
	default:
		return `a b"c'd\e ` + strconv.Itoa(g.r.IntN(9))
	}
}

// small is a value short enough to keep hashes and sets listpack or intset
// encoded where that matters for order.
func (g *diffGen) small() string {
	switch x := g.r.IntN(10); {
	case x < 5:
		return "v" + strconv.Itoa(g.r.IntN(20))
	case x < 7:
		return strconv.Itoa(g.r.IntN(100) - 10)
	case x < 9:
		return g.binValue(1 + g.r.IntN(8))
	default:
		return ""
	}
}

func (g *diffGen) intValue() string {
	switch g.r.IntN(10) {
	case 0:
		return "9223372036854775807"
	case 1:
		return "-9223372036854775808"
	case 2:
		return "1e3" // not an integer
	default:
		return strconv.Itoa(g.r.IntN(2000) - 1000)
	}
}

func (g *diffGen) floatValue() string {
	vals := []string{"1.5", "-0.25", "3", "1e3", "inf", "-inf", "0.1", "1e308", "2.5e-3", "nan", "abc", "10.00"}
	return vals[g.r.IntN(len(vals))]
}

func (g *diffGen) binValue(n int) string {
	alphabet := "\r\n\x00\xff ab\"'\\\t"
	b := make([]byte, n)
	for i := range b {
		if g.r.IntN(2) == 0 {
			b[i] = alphabet[g.r.IntN(len(alphabet))]
		} else {
			b[i] = byte(g.r.IntN(256))
		}
	}
	return string(b)
}

func (g *diffGen) num(lo, hi int) string { return strconv.Itoa(lo + g.r.IntN(hi-lo+1)) }

// relTTL is a relative TTL long enough that nothing expires in a run.
func (g *diffGen) relTTL(ms bool) string {
	s := []int{100, 1000, 10000, 100000}[g.r.IntN(4)]
	if ms {
		return strconv.Itoa(s*1000 + g.r.IntN(1000))
	}
	return strconv.Itoa(s)
}

// absTTL is an absolute expiry later than any relTTL (from 2.3 days on),
// so GT/LT between the two never tie.
func (g *diffGen) absTTL(ms bool) string {
	s := g.timeBase + 200000 + int64(g.r.IntN(100))*1000
	if ms {
		return strconv.FormatInt(s*1000+int64(g.r.IntN(1000)), 10)
	}
	return strconv.FormatInt(s, 10)
}

// unit is the next command, or a few that belong together.
func (g *diffGen) unit() []diffCmd {
	st := g.st
	switch {
	case st.subscribed() && st.proto == 2:
		return []diffCmd{g.subscribedRESP2()}
	case st.multi:
		return []diffCmd{g.inMulti()}
	}
	x := g.r.IntN(1000)
	switch {
	case x < 25:
		return []diffCmd{g.cmd("MULTI")}
	case x < 35:
		keys := g.keys("slhtzxp"[g.r.IntN(7)], 1+g.r.IntN(2))
		g.watched = keys
		return []diffCmd{g.cmd(append([]string{"WATCH"}, keys...)...)}
	case x < 37:
		return g.txScenario()
	case x < 40 && st.watching:
		return []diffCmd{g.cmd("UNWATCH")}
	case x < 50:
		return g.replyUnit()
	case x < 60 && !st.watching:
		return []diffCmd{g.pubsub()}
	case x < 65 && !st.watching && !st.subscribed():
		v := []string{"2", "3"}[g.r.IntN(2)]
		return []diffCmd{g.cmd("HELLO", v)}
	case x < 67:
		return []diffCmd{g.cmd("RESET")}
	case x < 90:
		return []diffCmd{g.connection()}
	case x < 110:
		return []diffCmd{g.errors()}
	case x < 150:
		return []diffCmd{g.script()}
	case x < 165:
		return []diffCmd{g.blocking()}
	}
	return []diffCmd{g.data()}
}

// inMulti is a command inside a transaction.
func (g *diffGen) inMulti() diffCmd {
	switch x := g.r.IntN(100); {
	case x < 15:
		return g.cmd("EXEC")
	case x < 18:
		return g.cmd("DISCARD")
	case x < 20:
		return g.errors() // arity, unknown command: EXECABORT
	case x < 21:
		return g.cmd("MULTI") // nested: an error, the transaction goes on
	case x < 22:
		return g.cmd("WATCH", g.key('s'))
	case x < 24:
		return g.cmd("SELECT", []string{"0", "1", "0", "99"}[g.r.IntN(4)])
	case x < 25:
		return g.cmd("UNWATCH")
	case x < 27:
		return g.blocking() // does not block inside MULTI
	case x < 30:
		return g.script()
	case x < 31:
		return g.cmd("RESET")
	case x < 33:
		return g.cmd("PING")
	case x < 35:
		return g.cmd("ECHO", g.value())
	case x < 36:
		return g.getname()
	}
	return g.data()
}

// getname is CLIENT GETNAME, or PING where it would show a documented
// difference (a relayed client without a name).
func (g *diffGen) getname() diffCmd {
	if !g.st.named && g.st.relayCmds >= 0 {
		return g.cmd("PING")
	}
	return g.cmd("CLIENT", "GETNAME")
}

// replyUnit is CLIENT REPLY OFF ... ON, or SKIP and one command.
func (g *diffGen) replyUnit() []diffCmd {
	if g.st.subscribed() {
		return []diffCmd{g.data()}
	}
	if g.r.IntN(2) == 0 {
		return []diffCmd{g.cmd("CLIENT", "REPLY", "SKIP"), g.muted()}
	}
	out := []diffCmd{g.cmd("CLIENT", "REPLY", "OFF")}
	for range 1 + g.r.IntN(4) {
		out = append(out, g.muted())
	}
	return append(out, g.cmd("CLIENT", "REPLY", "ON"))
}

// txScenario is a transaction with the parts that change what EXEC does:
// a WATCH broken or not by the connection itself, SELECT before and inside
// MULTI (taking effect only if EXEC runs it), queue-time errors, and
// reads of the watched key after it, in whichever database is current.
func (g *diffGen) txScenario() []diffCmd {
	var out []diffCmd
	k := g.key('s')
	if g.r.IntN(2) == 0 {
		g.watched = []string{k}
		out = append(out, g.cmd("WATCH", k))
		if g.r.IntN(3) == 0 {
			out = append(out, g.cmd("SELECT", []string{"0", "1"}[g.r.IntN(2)]))
		}
		if g.r.IntN(3) == 0 {
			out = append(out, g.cmd("SET", k, g.value()))
		}
	}
	out = append(out, g.cmd("MULTI"))
	for range 1 + g.r.IntN(5) {
		switch g.r.IntN(8) {
		case 0:
			out = append(out, g.cmd("SELECT", []string{"0", "1", "99"}[g.r.IntN(3)]))
		case 1:
			if g.r.IntN(3) == 0 {
				out = append(out, g.errors())
			}
		case 2:
			out = append(out, g.cmd("INCR", k))
		case 3:
			out = append(out, g.cmd("GET", k))
		default:
			out = append(out, g.data())
		}
	}
	switch g.r.IntN(10) {
	case 0:
		out = append(out, g.cmd("DISCARD"))
	case 1:
		out = append(out, g.cmd("RESET"))
	default:
		out = append(out, g.cmd("EXEC"))
	}
	return append(out, g.cmd("GET", k), g.cmd("SET", k, g.value()), g.cmd("GET", k))
}

// muted is a command whose reply CLIENT REPLY mutes: the proxy answers
// some itself (ECHO, SELECT, CLIENT GETNAME, a tier hit), some go to
// dedicated connections (blocking commands).
func (g *diffGen) muted() diffCmd {
	switch g.r.IntN(16) {
	case 0:
		return g.cmd("ECHO", g.value())
	case 1:
		return g.cmd("SELECT", []string{"0", "1", "99"}[g.r.IntN(3)])
	case 2:
		return g.cmd("CLIENT", "GETNAME")
	case 3:
		return g.cmd("PING")
	case 4:
		return g.blocking()
	case 5:
		return g.script()
	case 6, 7:
		return g.read()
	case 8:
		if !g.st.watching { // refused under WATCH, documented
			return g.pubsub()
		}
	}
	return g.data()
}

// subscribedRESP2 is a command for a RESP2 connection in subscribed mode.
func (g *diffGen) subscribedRESP2() diffCmd {
	switch x := g.r.IntN(100); {
	case x < 30:
		return g.pubsub()
	case x < 45:
		if g.r.IntN(2) == 0 {
			return g.cmd("PING")
		}
		return g.cmd("PING", g.value())
	case x < 50:
		return g.cmd("RESET")
	}
	return g.data() // refused by Redis in this context
}

func (g *diffGen) channel() string {
	return g.prefix + "ch" + strconv.Itoa(g.r.IntN(3))
}

// pubsub is a (un)subscription or a publish on the client's own channels.
func (g *diffGen) pubsub() diffCmd {
	switch x := g.r.IntN(100); {
	case x < 25:
		n := 1 + g.r.IntN(2)
		chs := make([]string, n)
		for i := range chs {
			chs[i] = g.channel()
		}
		return g.cmd(append([]string{"SUBSCRIBE"}, chs...)...)
	case x < 45:
		// Without arguments Redis answers for each channel in the order
		// of its hash table, which differs between two servers; so only
		// when there is at most one.
		if g.r.IntN(2) == 0 && len(g.st.channels) <= 1 {
			return g.cmd("UNSUBSCRIBE")
		}
		if g.r.IntN(2) == 0 {
			return g.cmd("UNSUBSCRIBE", g.channel(), g.channel())
		}
		return g.cmd("UNSUBSCRIBE", g.channel())
	case x < 55:
		return g.cmd("PSUBSCRIBE", g.prefix+"ch*")
	case x < 65:
		if g.r.IntN(2) == 0 {
			return g.cmd("PUNSUBSCRIBE")
		}
		return g.cmd("PUNSUBSCRIBE", g.prefix+"ch*")
	case x < 90:
		return g.cmd("PUBLISH", g.channel(), g.value())
	case x < 95:
		return g.cmd("PUBSUB", "NUMSUB", g.channel(), g.channel())
	default:
		if g.single {
			return g.cmd("PUBSUB", "NUMPAT")
		}
		// A pattern that matches one channel: the list's order is a hash
		// table's.
		return g.cmd("PUBSUB", "CHANNELS", g.channel())
	}
}

// connection is a connection command whose reply is the same on both.
func (g *diffGen) connection() diffCmd {
	switch x := g.r.IntN(100); {
	case x < 20:
		return g.cmd("PING")
	case x < 30:
		return g.cmd("PING", g.value())
	case x < 45:
		return g.cmd("ECHO", g.value())
	case x < 60:
		return g.cmd("SELECT", []string{"0", "1", "0", "1", "16", "-1", "abc", "0 "}[g.r.IntN(8)])
	case x < 68 && g.authLeft > 0:
		g.authLeft--
		if x < 65 {
			return g.cmd("AUTH", "nopass")
		}
		return g.cmd("AUTH", "someone", "nopass")
	case x < 78:
		names := []string{"app-1", "diff", "", "bad name", "x\ny"}
		return g.cmd("CLIENT", "SETNAME", names[g.r.IntN(len(names))])
	case x < 88:
		return g.getname()
	case x < 92:
		return g.cmd("EXEC") // without MULTI
	case x < 95:
		return g.cmd("DISCARD")
	case x < 97:
		return g.cmd("UNWATCH")
	case x < 98:
		return g.cmd("WAIT", "0", "0")
	default:
		// Requests Redis answers with nothing: an empty or blank inline
		// line, a multibulk of no or negative length.
		c := diffCmd{raw: []string{"\r\n", "   \r\n", "*0\r\n", "*-1\r\n", "\n", "*1\r\n$0\r\n\r\n"}[g.r.IntN(6)]}
		if c.raw == "*1\r\n$0\r\n\r\n" {
			c.rawReplies = 1 // unknown command ''
		}
		g.st.account(&c)
		return c
	}
}

// errors are commands Redis refuses: wrong arity, unknown commands,
// syntax errors.
func (g *diffGen) errors() diffCmd {
	switch g.r.IntN(14) {
	case 0:
		return g.cmd("GET")
	case 1:
		return g.cmd("SET", g.key('s'))
	case 2:
		return g.cmd("hset", g.key('h'), "f")
	case 3:
		return g.cmd("NOSUCHCOMMAND", g.value(), "x")
	case 4:
		return g.cmd("nosuch")
	case 5:
		return g.cmd("ZADD", g.key('z'), "notanumber", "m")
	case 6:
		return g.cmd("SET", g.key('s'), "v", "EX", "0")
	case 7:
		return g.cmd("SET", g.key('s'), "v", "NX", "XX")
	case 8:
		return g.cmd("LPUSH", g.key('l'))
	case 9:
		return g.cmd("EXPIRE", g.key('s'), "abc")
	case 10:
		return g.cmd("PING", "a", "b")
	case 11:
		return g.cmd("OBJECT", "NOSUCHSUB")
	}
	// The commands the proxy handles itself, with wrong arguments.
	switch g.r.IntN(10) {
	case 0:
		return g.cmd("ECHO")
	case 1:
		return g.cmd("SELECT")
	case 2:
		return g.cmd("MULTI", "x")
	case 3:
		return g.cmd("DISCARD", "x")
	case 4:
		return g.cmd("UNWATCH", "x")
	case 5:
		if !g.st.multi { // refused inside MULTI, documented
			return g.cmd("CLIENT", "REPLY", "maybe")
		}
	case 6:
		return g.cmd("RESET", "x")
	case 7:
		return g.cmd("EXEC", "x")
	case 8:
		if !g.st.multi { // refused inside MULTI, documented
			return g.cmd("CLIENT", []string{"NO-EVICT", "TRACKING"}[g.r.IntN(2)], "maybe")
		}
	}
	return g.cmd("CLIENT", "GETNAME", "x")
}

var diffScripts = []struct {
	body string
	keys int
	args int
}{
	{"return redis.call('GET', KEYS[1])", 1, 0},
	{"return redis.call('INCR', KEYS[1])", 1, 0},
	{"redis.call('SET', KEYS[1], ARGV[1]); return redis.call('STRLEN', KEYS[1])", 1, 1},
	{"return redis.pcall('LPUSH', KEYS[1], ARGV[1])", 1, 1},
	// Whether the key has a TTL: 1 if it has, -1 if not, -2 if no key.
	{"local t = redis.call('PTTL', KEYS[1]); if t > 0 then return 1 end; return t", 1, 0},
	{"return {1, 2, {3, 'x'}, ARGV[1]}", 0, 1},
	{"return {ok = 'fine'}", 0, 0},
	{"return {err = 'custom failure'}", 0, 0},
	{"return 3.99", 0, 0},
	{"return redis.call('TYPE', KEYS[1])", 1, 0},
	{"return redis.call('HGETALL', KEYS[1])", 1, 0},
	{"return redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')", 1, 0},
	// A write to a key the script does not declare: the proxy cannot name
	// it, so its local tier must fence.
	{"return redis.call('SET', ARGV[1], ARGV[2])", 0, 2},
	{"return redis.call('DEL', KEYS[1])", 1, 0},
	{"return nil", 0, 0},
	{"return false", 0, 0},
	{"return true", 0, 0},
	{"this is not lua", 0, 0},
	{"return redis.call('NOSUCH')", 0, 0},
	{"return redis.call('EXPIRE', KEYS[1], 1000)", 1, 0},
}

func diffSHA(body string) string {
	h := sha1.Sum([]byte(body))
	return hex.EncodeToString(h[:])
}

// script is EVAL, EVALSHA, EVAL_RO, SCRIPT or FCALL.
func (g *diffGen) script() diffCmd {
	s := diffScripts[g.r.IntN(len(diffScripts))]
	args := []string{strconv.Itoa(s.keys)}
	for range s.keys {
		args = append(args, g.key("sslhz"[g.r.IntN(5)]))
	}
	for i := range s.args {
		if i == 0 && s.body == diffScripts[12].body {
			args = append(args, g.key('s'))
		} else {
			args = append(args, g.value())
		}
	}
	sha := diffSHA(s.body)
	// Scripts count as loaded only when run for sure: not queued in a
	// transaction that may be discarded, nor refused while subscribed.
	runs := !g.st.multi && !(g.st.proto == 2 && g.st.subscribed())
	switch x := g.r.IntN(100); {
	case x < 45:
		g.loaded[sha] = g.loaded[sha] || runs
		return g.cmd(append([]string{"EVAL", s.body}, args...)...)
	case x < 60:
		// Only scripts this client loaded itself: another client's load
		// would race with this.
		if !g.loaded[sha] {
			sha = diffSHA("never loaded " + strconv.Itoa(g.r.IntN(3)))
		}
		return g.cmd(append([]string{"EVALSHA", sha}, args...)...)
	case x < 68:
		return g.cmd(append([]string{"EVAL_RO", s.body}, args...)...)
	case x < 75:
		g.loaded[sha] = g.loaded[sha] || runs
		return g.cmd("SCRIPT", "LOAD", s.body)
	case x < 80:
		if !g.loaded[sha] { // another client may have loaded it
			sha = diffSHA("never loaded 0")
		}
		return g.cmd("SCRIPT", "EXISTS", sha, diffSHA("nope"))
	case x < 82 && g.single && !g.st.multi:
		clear(g.loaded)
		return g.cmd("SCRIPT", "FLUSH")
	case x < 88:
		return g.cmd("FCALL", "dget", "1", g.key('s'))
	case x < 93:
		return g.cmd("FCALL", "dset", "1", g.key('s'), g.value())
	case x < 97:
		return g.cmd("FCALL_RO", "dro", "1", g.key('s'))
	default:
		return g.cmd("FCALL_RO", "dset", "1", g.key('s'), "v")
	}
}

// blocking are the blocking commands, with a timeout short enough that a
// miss costs 10 ms.
func (g *diffGen) blocking() diffCmd {
	switch g.r.IntN(7) {
	case 0:
		return g.cmd("BLPOP", g.key('l'), g.key('l'), "0.01")
	case 1:
		return g.cmd("BRPOP", g.key('l'), "0.01")
	case 2:
		return g.cmd("BLMOVE", g.key('l'), g.key('l'), "LEFT", "RIGHT", "0.01")
	case 3:
		return g.cmd("BZPOPMIN", g.key('z'), "0.01")
	case 4:
		return g.cmd("BLMPOP", "0.01", "1", g.key('l'), "LEFT", "COUNT", "2")
	case 5:
		return g.cmd("XREAD", "BLOCK", "10", "COUNT", "2", "STREAMS", g.key('x'), "0-0")
	default:
		return g.cmd("BRPOPLPUSH", g.key('l'), g.key('l'), "0.01")
	}
}

// unsent makes a command that is not sent as made (the args are used
// later), so that it counts in no connection's state.
func (g *diffGen) unsent(f func() diffCmd) diffCmd {
	main := g.st
	g.st = newDiffState(2)
	defer func() { g.st = main }()
	return f()
}

// bigReplies is a pipeline whose replies add up to several MB, which the
// proxy forwards in parts (COMPATIBILITY.md, "Client limits"), on a key
// of its own, left as it was found (gone).
func (g *diffGen) bigReplies() []diffCmd {
	k := g.prefix + "big"
	push := []string{"RPUSH", k}
	for range 5 + g.r.IntN(25) {
		push = append(push, g.big[g.r.IntN(len(g.big))])
	}
	pl := []diffCmd{g.cmd("DEL", k), g.cmd(push...)}
	for range 1 + g.r.IntN(5) {
		pl = append(pl, g.cmd("LRANGE", k, "0", "-1"), g.cmd("GET", g.key('s')))
	}
	return append(pl, g.cmd("DEL", k))
}

// side is a pipeline for the client's second connection: data commands
// only, so its state never changes; its writes land between two of the
// main connection's pipelines (breaking a WATCH, invalidating the tier).
func (g *diffGen) side() []diffCmd {
	main := g.st
	g.st = newDiffState(2)
	defer func() { g.st = main }()
	var pl []diffCmd
	for range 1 + g.r.IntN(3) {
		var c diffCmd
		if main.watching && len(g.watched) > 0 && g.r.IntN(2) == 0 {
			// Break the main connection's WATCH (or touch a key of the
			// same name in another database, which must not).
			c = g.cmd("SET", g.watched[g.r.IntN(len(g.watched))], g.value())
		} else if g.r.IntN(2) == 0 && len(g.hot) > 0 {
			// A write of a key the reads of the phase use.
			c = g.cmd("DEL", g.hot[g.r.IntN(len(g.hot))][1])
		} else {
			c = g.data()
		}
		c.side = true
		pl = append(pl, c)
	}
	return pl
}

// hiddenWrite changes a key of the phase's reads in a way the proxy
// cannot see key by key: a script that names it only in ARGV, a
// transaction. The local tier must drop what it holds of the key all the
// same (Redis's invalidation, after a fence), or the next read is stale.
func (g *diffGen) hiddenWrite() []diffCmd {
	k := g.hot[g.r.IntN(len(g.hot))][1]
	switch g.r.IntN(5) {
	case 0:
		return []diffCmd{g.cmd("EVAL", "return redis.call('DEL', ARGV[1])", "0", k)}
	case 1:
		return []diffCmd{g.cmd("EVAL", "return redis.call('SET', ARGV[1], ARGV[2])", "0", k, g.value())}
	case 2:
		return []diffCmd{g.cmd("EVAL", "return redis.call('HSET', ARGV[1], 'f1', ARGV[2])", "0", k, g.small())}
	case 3:
		return []diffCmd{g.cmd("MULTI"), g.cmd("DEL", k), g.cmd("EXEC")}
	default:
		return []diffCmd{g.cmd("FCALL", "dset", "1", k, g.value())}
	}
}

// read is a read the local tier may cache, in one of few forms so that
// the same command comes back often.
func (g *diffGen) read() diffCmd {
	switch g.r.IntN(14) {
	case 0, 1, 2:
		return g.cmd("GET", g.key('s'))
	case 3:
		return g.cmd("MGET", g.key('s'), g.key('s'))
	case 4:
		return g.cmd("STRLEN", g.key('s'))
	case 5:
		return g.cmd("EXISTS", g.anyKey())
	case 6:
		return g.cmd("HGETALL", g.key('h'))
	case 7:
		return g.cmd("HGET", g.key('h'), "f"+strconv.Itoa(g.r.IntN(3)))
	case 8:
		return g.cmd("HMGET", g.key('h'), "f0", "f1")
	case 9:
		return g.cmd("LRANGE", g.key('l'), "0", "-1")
	case 10:
		return g.cmd("ZRANGE", g.key('z'), "0", "-1", "WITHSCORES")
	case 11:
		return g.cmd("ZSCORE", g.key('z'), g.member())
	case 12:
		return g.cmd("SMISMEMBER", g.key('t'), "m1", "1")
	default:
		return g.cmd("XRANGE", g.key('x'), "-", "+")
	}
}

// data is a data command on the client's keys.
func (g *diffGen) data() diffCmd {
	switch x := g.r.IntN(100); {
	case x < 30:
		return g.str()
	case x < 42:
		return g.keyspace()
	case x < 54:
		return g.list()
	case x < 64:
		return g.hash()
	case x < 72:
		return g.set()
	case x < 84:
		return g.zset()
	case x < 93:
		return g.stream()
	case x < 96:
		return g.hll()
	}
	return g.bits()
}

func (g *diffGen) str() diffCmd {
	k := g.key('s')
	switch g.r.IntN(30) {
	case 0, 1, 2, 3:
		args := []string{"SET", k, g.value()}
		if g.r.IntN(3) == 0 {
			args = append(args, []string{"NX", "XX"}[g.r.IntN(2)])
		}
		if g.r.IntN(4) == 0 {
			args = append(args, "GET")
		}
		switch g.r.IntN(8) {
		case 0:
			args = append(args, "EX", g.relTTL(false))
		case 1:
			args = append(args, "PX", g.relTTL(true))
		case 2:
			args = append(args, "EXAT", g.absTTL(false))
		case 3:
			args = append(args, "PXAT", g.absTTL(true))
		case 4:
			args = append(args, "KEEPTTL")
		}
		return g.cmd(args...)
	case 4, 5, 6, 7:
		return g.cmd("GET", k)
	case 8:
		return g.cmd("GETSET", k, g.value())
	case 9:
		return g.cmd("GETDEL", k)
	case 10:
		return g.cmd("APPEND", k, g.value())
	case 11:
		return g.cmd("INCR", k)
	case 12:
		return g.cmd("INCRBY", k, g.intValue())
	case 13:
		return g.cmd("DECR", k)
	case 14:
		return g.cmd("DECRBY", k, g.num(-5, 5))
	case 15:
		return g.cmd("INCRBYFLOAT", k, g.floatValue())
	case 16:
		args := []string{"MSET"}
		for range 1 + g.r.IntN(3) {
			args = append(args, g.key('s'), g.value())
		}
		return g.cmd(args...)
	case 17, 18:
		return g.cmd(append([]string{"MGET"}, g.keys('s', 1+g.r.IntN(4))...)...)
	case 19:
		return g.cmd("SETNX", k, g.value())
	case 20:
		return g.cmd("STRLEN", k)
	case 21:
		return g.cmd("SETRANGE", k, g.num(0, 40), g.value())
	case 22:
		return g.cmd("GETRANGE", k, g.num(-10, 10), g.num(-10, 30))
	case 23:
		switch g.r.IntN(5) {
		case 0:
			return g.cmd("GETEX", k)
		case 1:
			return g.cmd("GETEX", k, "PERSIST")
		case 2:
			return g.cmd("GETEX", k, "EX", g.relTTL(false))
		case 3:
			return g.cmd("GETEX", k, "PXAT", g.absTTL(true))
		default:
			return g.cmd("GETEX", k, "EX", "-1")
		}
	case 24:
		return g.cmd("SETEX", k, g.relTTL(false), g.value())
	case 25:
		return g.cmd("PSETEX", k, g.relTTL(true), g.value())
	case 26:
		args := []string{"MSETNX"}
		for range 1 + g.r.IntN(2) {
			args = append(args, g.key('s'), g.value())
		}
		return g.cmd(args...)
	case 27:
		return g.cmd("SUBSTR", k, "0", g.num(0, 5))
	case 28:
		return g.cmd("get", k) // lower case
	default:
		return g.cmd("GeT", k)
	}
}

func (g *diffGen) anyKey() string { return g.key("slhtzxp"[g.r.IntN(7)]) }

func (g *diffGen) keyspace() diffCmd {
	k := g.anyKey()
	switch g.r.IntN(22) {
	case 0, 1:
		return g.cmd(append([]string{"DEL"}, g.keys("slhtzxp"[g.r.IntN(7)], 1+g.r.IntN(3))...)...)
	case 2:
		return g.cmd("UNLINK", k)
	case 3, 4:
		return g.cmd(append([]string{"EXISTS"}, g.keys("slhtzxp"[g.r.IntN(7)], 1+g.r.IntN(3))...)...)
	case 5, 6:
		return g.cmd("TYPE", k)
	case 7:
		args := []string{"EXPIRE", k, g.relTTL(false)}
		if g.r.IntN(2) == 0 {
			args = append(args, []string{"NX", "XX"}[g.r.IntN(2)])
		}
		return g.cmd(args...)
	case 8:
		return g.cmd("PEXPIRE", k, g.relTTL(true))
	case 9:
		args := []string{"EXPIREAT", k, g.absTTL(false)}
		if g.r.IntN(2) == 0 {
			args = append(args, []string{"NX", "XX", "GT", "LT"}[g.r.IntN(4)])
		}
		return g.cmd(args...)
	case 10:
		args := []string{"PEXPIREAT", k, g.absTTL(true)}
		if g.r.IntN(2) == 0 {
			args = append(args, []string{"GT", "LT"}[g.r.IntN(2)])
		}
		return g.cmd(args...)
	case 11:
		return g.cmd("EXPIRE", k, []string{"0", "-5"}[g.r.IntN(2)]) // deletes the key
	case 12, 13:
		return g.cmd("PERSIST", k)
	case 14:
		return g.cmd("RENAME", k, g.anyKey())
	case 15:
		return g.cmd("RENAMENX", k, g.anyKey())
	case 16:
		if g.r.IntN(2) == 0 {
			return g.cmd("COPY", k, g.anyKey(), "REPLACE")
		}
		return g.cmd("COPY", k, g.anyKey())
	case 17:
		return g.cmd("TOUCH", k, g.anyKey())
	case 18:
		return g.cmd("MOVE", k, []string{"0", "1"}[g.r.IntN(2)])
	case 19:
		if g.single {
			return g.cmd("DBSIZE")
		}
		return g.cmd("EXISTS", k)
	case 20:
		if g.single && g.r.IntN(3) == 0 {
			return g.cmd("SWAPDB", "0", "1")
		}
		return g.cmd("COPY", k, g.anyKey(), "DB", "1")
	default:
		// The sign of the TTL, as a script: the TTL itself is a clock.
		return g.cmd("EVAL", diffScripts[4].body, "1", k)
	}
}

func (g *diffGen) list() diffCmd {
	k := g.key('l')
	vals := func() []string {
		out := make([]string, 1+g.r.IntN(4))
		for i := range out {
			out[i] = g.value()
		}
		return out
	}
	switch g.r.IntN(24) {
	case 0, 1:
		return g.cmd(append([]string{"LPUSH", k}, vals()...)...)
	case 2, 3:
		return g.cmd(append([]string{"RPUSH", k}, vals()...)...)
	case 4:
		return g.cmd("LPOP", k)
	case 5:
		return g.cmd("RPOP", k, g.num(0, 3))
	case 6, 7, 8:
		return g.cmd("LRANGE", k, g.num(-5, 2), g.num(-3, 10))
	case 9:
		return g.cmd("LLEN", k)
	case 10:
		return g.cmd("LINDEX", k, g.num(-4, 4))
	case 11:
		return g.cmd("LSET", k, g.num(-3, 3), g.value())
	case 12:
		return g.cmd("LREM", k, g.num(-2, 2), g.value())
	case 13:
		return g.cmd("LINSERT", k, []string{"BEFORE", "AFTER"}[g.r.IntN(2)], g.value(), g.value())
	case 14:
		return g.cmd("LTRIM", k, g.num(0, 3), g.num(-3, 20))
	case 15:
		return g.cmd("LPOS", k, g.value(), "RANK", g.num(1, 2), "COUNT", "0")
	case 16:
		return g.cmd("LMOVE", k, g.key('l'), "LEFT", "RIGHT")
	case 17:
		return g.cmd("RPOPLPUSH", k, g.key('l'))
	case 18:
		return g.cmd("LMPOP", "2", k, g.key('l'), "RIGHT", "COUNT", g.num(1, 3))
	case 19:
		return g.cmd("LPUSHX", k, g.value())
	case 20:
		return g.cmd("SORT", k)
	case 21:
		return g.cmd("SORT", k, "ALPHA", "LIMIT", "0", g.num(1, 5))
	case 22:
		return g.cmd("SORT", k, "DESC", "ALPHA", "STORE", g.key('l'))
	default:
		return g.cmd("LRANGE", k, "0", "-1")
	}
}

func (g *diffGen) hash() diffCmd {
	k := g.key('h')
	field := func() string { return "f" + strconv.Itoa(g.r.IntN(8)) }
	switch g.r.IntN(16) {
	case 0, 1, 2:
		args := []string{"HSET", k}
		for range 1 + g.r.IntN(3) {
			args = append(args, field(), g.small())
		}
		return g.cmd(args...)
	case 3, 4:
		return g.cmd("HGET", k, field())
	case 5, 6:
		return g.cmd("HGETALL", k)
	case 7:
		return g.cmd("HDEL", k, field(), field())
	case 8:
		return g.cmd("HINCRBY", k, field(), g.num(-5, 5))
	case 9:
		return g.cmd("HMGET", k, field(), field(), field())
	case 10:
		return g.cmd("HINCRBYFLOAT", k, field(), []string{"1.5", "-0.5", "2"}[g.r.IntN(3)])
	case 11:
		return g.cmd("HKEYS", k)
	case 12:
		return g.cmd("HVALS", k)
	case 13:
		return g.cmd("HLEN", k)
	case 14:
		return g.cmd("HSETNX", k, field(), g.small())
	default:
		return g.cmd("HEXISTS", k, field())
	}
}

func (g *diffGen) member() string {
	if g.r.IntN(3) == 0 {
		return strconv.Itoa(g.r.IntN(20))
	}
	return "m" + strconv.Itoa(g.r.IntN(12))
}

func (g *diffGen) set() diffCmd {
	k := g.key('t')
	switch g.r.IntN(12) {
	case 0, 1, 2:
		return g.cmd("SADD", k, g.member(), g.member())
	case 3:
		return g.cmd("SREM", k, g.member())
	case 4:
		return g.cmd("SISMEMBER", k, g.member())
	case 5:
		return g.cmd("SMISMEMBER", k, g.member(), g.member(), g.member())
	case 6:
		return g.cmd("SCARD", k)
	case 7:
		return g.cmd("SORT", k, "ALPHA")
	case 8:
		return g.cmd("SINTERCARD", "2", k, g.key('t'))
	case 9:
		return g.cmd([]string{"SUNIONSTORE", "SINTERSTORE", "SDIFFSTORE"}[g.r.IntN(3)], g.key('t'), k, g.key('t'))
	case 10:
		return g.cmd("SMOVE", k, g.key('t'), g.member())
	default:
		return g.cmd("SORT", k, "ALPHA", "DESC", "LIMIT", "1", "3")
	}
}

func (g *diffGen) score() string {
	vals := []string{"1", "2", "2.5", "-1", "0", "3.14159", "+inf", "-inf", "1e10", "100"}
	return vals[g.r.IntN(len(vals))]
}

func (g *diffGen) zset() diffCmd {
	k := g.key('z')
	switch g.r.IntN(20) {
	case 0, 1, 2:
		args := []string{"ZADD", k}
		switch g.r.IntN(6) {
		case 0:
			args = append(args, "NX")
		case 1:
			args = append(args, "XX", "CH")
		case 2:
			args = append(args, "GT")
		case 3:
			args = append(args, "INCR")
			return g.cmd(append(args, g.score(), g.member())...)
		}
		for range 1 + g.r.IntN(3) {
			args = append(args, g.score(), g.member())
		}
		return g.cmd(args...)
	case 3, 4:
		return g.cmd("ZRANGE", k, "0", "-1", "WITHSCORES")
	case 5:
		return g.cmd("ZRANGE", k, g.num(0, 2), g.num(-2, 5))
	case 6:
		return g.cmd("ZSCORE", k, g.member())
	case 7:
		return g.cmd("ZINCRBY", k, []string{"1", "0.5", "-2", "1e2"}[g.r.IntN(4)], g.member())
	case 8:
		return g.cmd("ZREM", k, g.member(), g.member())
	case 9:
		return g.cmd("ZCARD", k)
	case 10:
		return g.cmd("ZRANGEBYSCORE", k, "-inf", "+inf", "WITHSCORES", "LIMIT", "0", g.num(1, 5))
	case 11:
		return g.cmd("ZREVRANGE", k, "0", "-1")
	case 12:
		return g.cmd("ZRANK", k, g.member())
	case 13:
		return g.cmd("ZMSCORE", k, g.member(), g.member())
	case 14:
		return g.cmd("ZCOUNT", k, "(0", "+inf")
	case 15:
		return g.cmd("ZPOPMIN", k)
	case 16:
		return g.cmd("ZUNIONSTORE", g.key('z'), "2", k, g.key('z'), "WEIGHTS", "1", "2")
	case 17:
		return g.cmd("ZRANGE", k, "0", "-1", "REV", "WITHSCORES")
	case 18:
		return g.cmd("ZMPOP", "1", k, "MAX", "COUNT", "2")
	default:
		return g.cmd("ZRANGESTORE", g.key('z'), k, "0", "2")
	}
}

func (g *diffGen) stream() diffCmd {
	k := g.key('x')
	field := func() string { return "f" + strconv.Itoa(g.r.IntN(3)) }
	switch g.r.IntN(14) {
	case 0, 1, 2, 3:
		id := strconv.FormatInt(g.xid, 10) + "-" + g.num(0, 2)
		g.xid++
		args := []string{"XADD", k}
		if g.r.IntN(4) == 0 {
			args = append(args, "MAXLEN", "=", g.num(1, 5))
		}
		if g.r.IntN(20) == 0 {
			id = "0-1" // too small once the stream has entries
		}
		return g.cmd(append(args, id, field(), g.value())...)
	case 4, 5:
		return g.cmd("XRANGE", k, "-", "+")
	case 6:
		return g.cmd("XRANGE", k, "-", "+", "COUNT", g.num(1, 3))
	case 7:
		return g.cmd("XREVRANGE", k, "+", "-", "COUNT", "2")
	case 8:
		return g.cmd("XLEN", k)
	case 9:
		return g.cmd("XDEL", k, strconv.FormatInt(max(1, g.xid-int64(g.r.IntN(5))), 10)+"-0")
	case 10:
		return g.cmd("XTRIM", k, "MAXLEN", g.num(0, 4))
	case 11:
		return g.cmd("XREAD", "COUNT", "3", "STREAMS", k, "0-0")
	case 12:
		return g.cmd("XGROUP", "CREATE", k, "g", "0", "MKSTREAM")
	default:
		if g.r.IntN(2) == 0 {
			return g.cmd("XREADGROUP", "GROUP", "g", "c", "COUNT", "2", "STREAMS", k, ">")
		}
		return g.cmd("XPENDING", k, "g")
	}
}

func (g *diffGen) hll() diffCmd {
	k := g.key('p')
	switch g.r.IntN(3) {
	case 0:
		return g.cmd("PFADD", k, g.member(), g.member())
	case 1:
		return g.cmd("PFCOUNT", k)
	default:
		return g.cmd("PFMERGE", k, g.key('p'))
	}
}

func (g *diffGen) bits() diffCmd {
	k := g.key('s')
	switch g.r.IntN(4) {
	case 0:
		return g.cmd("SETBIT", k, g.num(0, 300), g.num(0, 1))
	case 1:
		return g.cmd("GETBIT", k, g.num(0, 300))
	case 2:
		return g.cmd("BITCOUNT", k)
	default:
		return g.cmd("BITPOS", k, g.num(0, 1))
	}
}

// ---------------------------------------------------------------------------
// The minimizer: REDPROXY_DIFF_MINIMIZE=1 shrinks a failing client's
// history to a short stream that still differs, replaying candidates on
// fresh connections after flushing both servers directly.

func (cl *diffClient) minimize(direct, behind *redistest.Server, p *proxytest.Proxy) {
	t := cl.t
	hist := cl.history
	fails := func(h [][]diffCmd) bool {
		err := cl.replay(direct, behind, p, h)
		return err != nil && !errors.Is(err, errDiffDirect)
	}
	if !fails(hist) {
		t.Logf("minimize: the history does not fail again on its own (timing, or other clients)")
		return
	}
	// Pipelines first, then commands (each pipeline kept at least one).
	hist = ddmin(hist, fails)
	flat := func(h [][]diffCmd) (out [][]diffCmd) {
		for _, pl := range h {
			for _, c := range pl {
				out = append(out, []diffCmd{c})
			}
		}
		return out
	}
	// Try the commands as separate pipelines, then as one.
	if f := flat(hist); fails(f) {
		hist = ddmin(f, fails)
	} else {
		var cmds []diffCmd
		for _, pl := range hist {
			cmds = append(cmds, pl...)
		}
		one := [][]diffCmd{cmds}
		if fails(one) {
			hist = one
		}
		// Shrink within pipelines.
		for i := range hist {
			for j := 0; j < len(hist[i]) && len(hist[i]) > 1; {
				cand := append([][]diffCmd{}, hist...)
				cand[i] = append(append([]diffCmd{}, hist[i][:j]...), hist[i][j+1:]...)
				if fails(cand) {
					hist = cand
				} else {
					j++
				}
			}
		}
	}
	var b strings.Builder
	err := cl.replay(direct, behind, p, hist)
	fmt.Fprintf(&b, "minimized to %d pipelines (RESP%d at the start):\n", len(hist), cl.proto)
	for i, pl := range hist {
		fmt.Fprintf(&b, "pipeline %d:\n", i)
		for _, c := range pl {
			fmt.Fprintf(&b, "    %s\n", c.String())
		}
	}
	fmt.Fprintf(&b, "result: %v", err)
	t.Log(b.String())
}

var errDiffDirect = errors.New("direct Redis failed")

// replay runs h on fresh connections after emptying both servers.
func (cl *diffClient) replay(direct, behind *redistest.Server, p *proxytest.Proxy, h [][]diffCmd) error {
	for _, s := range []*redistest.Server{direct, behind} {
		c, err := dialDiff(s.Addr())
		if err != nil {
			return err
		}
		var w []byte
		for _, args := range [][]string{{"FLUSHALL"}, {"SCRIPT", "FLUSH"}, {"FUNCTION", "FLUSH"}} {
			w = (&diffCmd{args: args}).appendWire(w)
		}
		_, err = c.exchange(w, 3)
		c.nc.Close()
		if err != nil {
			return err
		}
	}
	if cl.v.tier {
		time.Sleep(50 * time.Millisecond) // the flush's invalidation
		redistest.Eventually(cl.t, 10*time.Second, func() bool { return p.LocalTier().Live(0) }, "local tier never became live")
	}
	var cs diffConns
	defer cs.close()
	// Recount the replies for the shortened stream (the side connection's
	// commands keep theirs: they change no state).
	st := newDiffState(2)
	for i, pl := range h {
		re := make([]diffCmd, len(pl))
		for j, c := range pl {
			if !c.side {
				c.replies, c.noCmp = 0, false
				st.account(&c)
			}
			re[j] = c
		}
		if cs.a == nil && !re[0].side {
			var err error
			if cs.a, cs.b, err = cl.dialPair(); err != nil {
				return err
			}
		}
		if err := cl.step(&cs, re, i); err != nil {
			if strings.Contains(err.Error(), "direct Redis failed") {
				return fmt.Errorf("%w: %v", errDiffDirect, err)
			}
			return err
		}
	}
	return nil
}

// ddmin removes chunks of xs while fails still holds.
func ddmin[T any](xs []T, fails func([]T) bool) []T {
	n := 2
	for len(xs) >= 2 {
		chunk := (len(xs) + n - 1) / n
		reduced := false
		for start := 0; start < len(xs); start += chunk {
			end := min(start+chunk, len(xs))
			cand := append(append([]T{}, xs[:start]...), xs[end:]...)
			if len(cand) > 0 && fails(cand) {
				xs = cand
				n = max(n-1, 2)
				reduced = true
				break
			}
		}
		if !reduced {
			if n >= len(xs) {
				break
			}
			n = min(n*2, len(xs))
		}
	}
	return xs
}
