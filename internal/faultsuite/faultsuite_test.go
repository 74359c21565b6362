package faultsuite

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/proxy"
	"github.com/redproxy/redproxy/internal/proxytest"
	"github.com/redproxy/redproxy/internal/redistest"
)

// durationEnv sets how long the workload runs, as a Go duration
// ("45s", "2m"). Default defaultDuration, or shortDuration with -short.
const (
	durationEnv     = "REDPROXY_FAULT_DURATION"
	defaultDuration = 45 * time.Second
	shortDuration   = 10 * time.Second
)

// The proxy's reply timeout is kept short so that the freeze outlasts it
// several times over within a short run.
const (
	replyTimeout = time.Second
	freezeFor    = 2*replyTimeout + 500*time.Millisecond
	killEvery    = 2500 * time.Millisecond
	// lateWindow: a write whose reply was lost may still run a little
	// later, when Redis reads what a closed connection left in its socket
	// (after a freeze, a timed-out batch runs on thaw). Within this window
	// after its error, such a write may still be what a read returns.
	lateWindow = 10 * time.Second
)

// Workload shape. maxPinned is below what the long-lived dedicated
// connections (subscribers, blockers) plus the pin clients want, so
// upstream.max_pinned is reached again and again during the run.
const (
	nPipeliners  = 8
	nTransactors = 4
	nSubscribers = 4 // half RESP2, half RESP3
	nBlockers    = 3
	nPinClients  = 8
	nTxCounters  = 3
	maxPinned    = nSubscribers + nBlockers + 5
)

// TestFaultSuite runs the workload against faults and fails if any client
// got a wrong reply, an acknowledged write went missing, or a client hung.
func TestFaultSuite(t *testing.T) {
	d := runDuration(t)
	r := runSuite(t, suiteOptions{duration: d, faults: true})
	r.log(t)
	if bad := r.failures(); bad != "" {
		t.Errorf("fault suite failed: %s\n(evidence above; rerun with -v for the proxy's logs)", bad)
	}
	// The run must have done real work, or passing proves nothing.
	if r.ops < 100 || r.execApplied == 0 || r.messages == 0 || r.popped == 0 {
		t.Errorf("workload too small to mean anything: ops=%d exec_applied=%d messages=%d popped=%d", r.ops, r.execApplied, r.messages, r.popped)
	}
}

// TestFaultSuiteDetectsCrossTalk breaks the proxy on purpose, swapping
// replies between clients through the proxy's test hook, and checks that
// the suite's detector sees it. A detector that cannot fire proves nothing.
func TestFaultSuiteDetectsCrossTalk(t *testing.T) {
	var mu sync.Mutex
	var held []byte
	var heldBy int64
	var n int
	restore := proxy.SetTestReplyHook(func(id int64, reply []byte) []byte {
		mu.Lock()
		defer mu.Unlock()
		n++
		// Every 20th reply goes to whoever asks next, as a proxy whose
		// reply matching slipped by one would hand it out.
		if held != nil && heldBy != id {
			out := held
			held = nil
			return out
		}
		if held == nil && n%20 == 0 {
			held, heldBy = append([]byte(nil), reply...), id
		}
		return reply
	})
	t.Cleanup(restore)
	// No faults and no max_pinned exhaustion: nothing but the hook may
	// mix replies up (without it, this run counts no cross-talk).
	r := runSuite(t, suiteOptions{duration: 3 * time.Second, maxPinned: 1000})
	r.log(t)
	if r.crossTalk == 0 {
		t.Fatalf("the proxy handed replies to the wrong clients on purpose, yet the suite counted no cross-talk")
	}
}

func runDuration(t *testing.T) time.Duration {
	if v := os.Getenv(durationEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("%s=%q: want a positive Go duration such as 45s", durationEnv, v)
		}
		return d
	}
	if testing.Short() {
		return shortDuration
	}
	return defaultDuration
}

type suiteOptions struct {
	duration  time.Duration
	faults    bool
	maxPinned int // 0: maxPinned
}

// suite is one run: the proxy, its Redis, the shared bookkeeping of the
// workers, and the counters.
type suite struct {
	t      *testing.T
	proxy  string
	redis  *redistest.Server
	direct *redis.Client // straight to Redis, for setup, faults and the final reads
	ids    atomic.Int64

	// Counted failures. Each names what a correct proxy never does.
	crossTalk atomic.Int64 // a reply carrying another client's id
	wrong     atomic.Int64 // an own reply out of order, stale, or of the wrong shape
	lost      atomic.Int64 // an acknowledged write missing from Redis at the end
	phantom   atomic.Int64 // Redis holds a write no client sent or may have sent
	halfTx    atomic.Int64 // a transaction whose writes landed in part
	hangs     atomic.Int64 // no reply within hangTimeout

	// Context for the counts, never failures in themselves.
	ops, errReplies, connErrors, maybes atomic.Int64
	execApplied, execAborted            atomic.Int64
	messages, published, popped, pushed atomic.Int64
	pinRefused, kills                   atomic.Int64

	evMu     sync.Mutex
	evidence map[string][]string
	errTexts map[string]int // error replies by their first words

	pub   *publisher
	tx    [nTxCounters]txCounter
	queue queueBook
}

const evidencePerCounter = 8

// fail counts one failure and keeps the first few descriptions of it.
func (s *suite) fail(c *atomic.Int64, name, format string, args ...any) {
	c.Add(1)
	s.evMu.Lock()
	defer s.evMu.Unlock()
	if len(s.evidence[name]) < evidencePerCounter {
		s.evidence[name] = append(s.evidence[name], fmt.Sprintf(format, args...))
	}
}

// wrongReply files a reply that is not the one expected: as cross-talk when
// it carries another client's id, otherwise as an out-of-order or stale
// own reply.
func (s *suite) wrongReply(own int64, got value, format string, args ...any) {
	what := fmt.Sprintf(format, args...)
	if other, ok := s.otherID(own, got); ok {
		s.fail(&s.crossTalk, "cross_talk", "client c%d: %s: got %s, which belongs to client c%d", own, what, got, other)
		return
	}
	s.fail(&s.wrong, "wrong_reply", "client c%d: %s: got %s", own, what, got)
}

var idPattern = regexp.MustCompile(`c(\d+):`)

// otherID finds a client id other than own in a reply: in any string
// ("c17:..."), or in an integer from a pipeliner's counter, which starts
// at its owner's id times counterBase.
func (s *suite) otherID(own int64, v value) (int64, bool) {
	if v.kind == ':' && v.num >= counterBase {
		if id := v.num / counterBase; id != own && id <= s.ids.Load() {
			return id, true
		}
	}
	for _, str := range v.strings(nil) {
		for _, m := range idPattern.FindAllStringSubmatch(str, -1) {
			if id, err := strconv.ParseInt(m[1], 10, 64); err == nil && id != own {
				return id, true
			}
		}
	}
	return 0, false
}

// connFailed files a lost connection or a missing reply: a hang when the
// reply did not come within hangTimeout, else an ordinary fault-time error.
func (s *suite) connFailed(own int64, err error, doing string) {
	if isTimeout(err) {
		s.fail(&s.hangs, "hangs", "client c%d: no reply within %v while %s", own, hangTimeout, doing)
		return
	}
	s.connErrors.Add(1)
}

func (s *suite) newID() int64 { return s.ids.Add(1) }

// noteError counts an error reply; errors are allowed during faults, and
// which ones came is part of the report.
func (s *suite) noteError(v value) {
	s.errReplies.Add(1)
	text := v.str
	if len(text) > 72 {
		text = text[:72]
	}
	s.evMu.Lock()
	s.errTexts[text]++
	s.evMu.Unlock()
}

// report is what one run counted.
type report struct {
	crossTalk, wrong, lost, phantom, halfTx, hangs int64
	ops, errReplies, connErrors, maybes            int64
	execApplied, execAborted                       int64
	messages, published, popped, pushed            int64
	pinRefused, kills                              int64
	evidence                                       map[string][]string
	errTexts                                       map[string]int
}

func (r report) failures() string {
	var bad []string
	for _, c := range []struct {
		name string
		n    int64
	}{{"cross_talk", r.crossTalk}, {"wrong_reply", r.wrong}, {"lost_writes", r.lost}, {"phantom_writes", r.phantom}, {"half_transactions", r.halfTx}, {"hangs", r.hangs}} {
		if c.n != 0 {
			bad = append(bad, fmt.Sprintf("%s=%d", c.name, c.n))
		}
	}
	return strings.Join(bad, " ")
}

func (r report) log(t *testing.T) {
	t.Helper()
	t.Logf("fault suite counters: cross_talk=%d wrong_reply=%d lost_writes=%d phantom_writes=%d half_transactions=%d hangs=%d",
		r.crossTalk, r.wrong, r.lost, r.phantom, r.halfTx, r.hangs)
	t.Logf("fault suite work: ops=%d error_replies=%d conn_errors=%d maybe_applied=%d exec_applied=%d exec_aborted=%d published=%d messages=%d pushed=%d popped=%d max_pinned_refusals=%d upstream_kills=%d",
		r.ops, r.errReplies, r.connErrors, r.maybes, r.execApplied, r.execAborted, r.published, r.messages, r.pushed, r.popped, r.pinRefused, r.kills)
	texts := slices.Collect(maps.Keys(r.errTexts))
	slices.SortFunc(texts, func(a, b string) int { return r.errTexts[b] - r.errTexts[a] })
	for _, text := range texts[:min(6, len(texts))] {
		t.Logf("  error reply x%d: %s", r.errTexts[text], text)
	}
	for _, name := range []string{"cross_talk", "wrong_reply", "lost_writes", "phantom_writes", "half_transactions", "hangs"} {
		for _, e := range r.evidence[name] {
			t.Logf("  %s: %s", name, e)
		}
	}
}

// runSuite starts Redis and the proxy, runs every worker for o.duration
// while the test goroutine injects faults, stops the workers, and checks
// what Redis holds against what the clients were told.
func runSuite(t *testing.T, o suiteOptions) report {
	t.Helper()
	// Acknowledged writes must survive the restart, or a lost write would
	// be Redis's doing, not the proxy's: an append-only file synced before
	// every reply, and a restart that replays it (same port, same dir).
	rs := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	p := proxytest.Start(t, rs, func(c *config.Config) {
		c.Upstream.MaxPinned = maxPinned
		if o.maxPinned > 0 {
			c.Upstream.MaxPinned = o.maxPinned
		}
		c.Upstream.ReplyTimeout = units.Duration{Duration: replyTimeout}
		c.Upstream.DialTimeout = units.Duration{Duration: replyTimeout}
	})
	s := &suite{
		t:        t,
		proxy:    p.Addr,
		redis:    rs,
		direct:   redis.NewClient(&redis.Options{Addr: rs.Addr(), MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: 3 * time.Second}),
		evidence: make(map[string][]string),
		errTexts: make(map[string]int),
		pub:      newPublisher(),
	}
	t.Cleanup(func() { s.direct.Close() })

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var wg sync.WaitGroup
	var checks []func()
	start := func(setup func() func(context.Context)) {
		run := setup()
		wg.Add(1)
		go func() {
			defer wg.Done()
			run(ctx)
		}()
	}

	for i := range nPipeliners {
		w := s.newPipeliner(i%2 == 1)
		checks = append(checks, w.finalCheck)
		start(func() func(context.Context) { return w.run })
	}
	s.setupTx()
	for range nTransactors {
		w := &transactor{s: s, id: s.newID(), resp3: rand.IntN(2) == 1}
		start(func() func(context.Context) { return w.run })
	}
	checks = append(checks, s.finalTxCheck)
	var subs []*subscriber
	for i := range nSubscribers {
		w := s.newSubscriber(i%2 == 1)
		subs = append(subs, w)
		start(func() func(context.Context) { return w.run })
	}
	start(func() func(context.Context) { return s.pub.runner(s) })
	checks = append(checks, func() { s.checkSubscribers(subs) })
	s.queue.init()
	for i := range nBlockers {
		w := &blocker{s: s, id: s.newID(), resp3: i%2 == 1}
		start(func() func(context.Context) { return w.run })
	}
	pusher := &pusher{s: s, id: s.newID()}
	start(func() func(context.Context) { return pusher.run })
	checks = append(checks, s.finalQueueCheck)
	for range nPinClients {
		w := s.newPinClient()
		checks = append(checks, w.finalCheck)
		start(func() func(context.Context) { return w.run })
	}

	if o.faults {
		s.injectFaults(o.duration)
	} else {
		time.Sleep(o.duration)
	}
	stop()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(3 * hangTimeout):
		// Every read has a deadline, so this is a test bug or a client
		// stuck in a write; count it rather than hang the test binary.
		s.fail(&s.hangs, "hangs", "workers did not stop within %v of the end of the run", 3*hangTimeout)
	}
	for _, check := range checks {
		check()
	}
	return s.report()
}

func (s *suite) report() report {
	s.evMu.Lock()
	defer s.evMu.Unlock()
	return report{
		crossTalk: s.crossTalk.Load(), wrong: s.wrong.Load(), lost: s.lost.Load(), phantom: s.phantom.Load(), halfTx: s.halfTx.Load(), hangs: s.hangs.Load(),
		ops: s.ops.Load(), errReplies: s.errReplies.Load(), connErrors: s.connErrors.Load(), maybes: s.maybes.Load(),
		execApplied: s.execApplied.Load(), execAborted: s.execAborted.Load(),
		messages: s.messages.Load(), published: s.published.Load(), popped: s.popped.Load(), pushed: s.pushed.Load(),
		pinRefused: s.pinRefused.Load(), kills: s.kills.Load(),
		evidence: s.evidence,
		errTexts: maps.Clone(s.errTexts),
	}
}

// injectFaults runs on the test goroutine for d: it kills some of the
// proxy's Redis connections every killEvery, restarts Redis once at a third
// of the run, and freezes it (SIGSTOP) for longer than the proxy's reply
// timeout at two thirds.
func (s *suite) injectFaults(d time.Duration) {
	t := s.t
	begin := time.Now()
	end := begin.Add(d)
	restartAt := begin.Add(d * 35 / 100)
	freezeAt := begin.Add(d * 65 / 100)
	nextKill := begin.Add(time.Second)
	restarted, frozen := false, false
	for {
		now := time.Now()
		if !now.Before(end) {
			return
		}
		switch {
		case !restarted && !now.Before(restartAt):
			restarted = true
			t.Logf("fault: restarting redis at %v", now.Sub(begin).Round(time.Millisecond))
			s.redis.Restart(t)
		case !frozen && !now.Before(freezeAt):
			frozen = true
			t.Logf("fault: freezing redis for %v at %v", freezeFor, now.Sub(begin).Round(time.Millisecond))
			s.redis.Freeze(t)
			time.Sleep(freezeFor)
			s.redis.Thaw(t)
		case !now.Before(nextKill):
			s.killProxyConns()
			nextKill = now.Add(killEvery + rand.N(time.Second) - 500*time.Millisecond)
		default:
			wait := min(time.Until(end), time.Until(nextKill))
			if !restarted {
				wait = min(wait, time.Until(restartAt))
			}
			if !frozen {
				wait = min(wait, time.Until(freezeAt))
			}
			time.Sleep(wait)
		}
	}
}

// killProxyConns runs CLIENT KILL on Redis for about half of the proxy's
// connections (shared, pinned and relayed alike, told apart by the names
// the proxy gives them), and at least one.
func (s *suite) killProxyConns() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	list, err := s.direct.ClientList(ctx).Result()
	if err != nil {
		s.t.Logf("fault: CLIENT LIST failed: %v", err)
		return
	}
	var ids []string
	for _, line := range strings.Split(list, "\n") {
		var id, name string
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "id="); ok {
				id = v
			}
			if v, ok := strings.CutPrefix(f, "name="); ok {
				name = v
			}
		}
		if id != "" && strings.HasPrefix(name, "redproxy") {
			ids = append(ids, id)
		}
	}
	rand.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
	n := max(1, len(ids)/2)
	for _, id := range ids[:min(n, len(ids))] {
		if err := s.direct.Do(ctx, "CLIENT", "KILL", "ID", id).Err(); err == nil {
			s.kills.Add(1)
		}
	}
}

// redisCtx bounds one direct call to Redis at setup or final-check time.
func redisCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 5*time.Second)
}

// pause waits d or until ctx ends; it reports whether to go on.
func pause(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// roundTrip sends one command on c for client own and reads its reply,
// counting it; a failed connection is noted (doing names the command) and
// reported by live == false.
func (s *suite) roundTrip(c *client, own int64, doing string, args ...string) (v value, live bool) {
	if err := c.send(args); err != nil {
		s.connFailed(own, err, "sending "+doing)
		return v, false
	}
	v, err := c.read()
	if err != nil {
		s.connFailed(own, err, "reading the reply to "+doing)
		return v, false
	}
	s.ops.Add(1)
	return v, true
}
