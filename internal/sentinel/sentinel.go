// Package sentinel finds the primary of a Redis Sentinel group and follows
// its failovers, for upstream.mode = "sentinel".
//
// It is the control plane only: the Sentinels are asked through go-redis,
// while the data path keeps its own pipelined connections (package
// upstream) and is only told, through Options.OnSwitch, to move them.
//
// How the primary is chosen. Every Sentinel is asked, all at once, for the
// primary's address (SENTINEL GET-MASTER-ADDR-BY-NAME, which names the
// promoted replica as soon as a failover has promoted it) and for its
// configuration epoch (SENTINEL MASTER), which every failover raises. Once
// more than half have answered (or all have answered or failed), the
// answers are tried newest epoch first, then by how many Sentinels agree;
// the first address whose server says it is a primary (HELLO's role
// field, or ROLE) wins (they are checked at once, but one is taken only
// once every one before it has failed). So a Sentinel that has not yet heard of a failover cannot
// send the proxy back to the old primary while that one still believes it
// is primary, and a demoted or dead server is never chosen.
//
// The primary in use is kept while it says it is one and no Sentinel names
// another with a newer epoch, nor every Sentinel that gave an epoch another
// at the same epoch; except a promotion adopted before any
// Sentinel named it, which is provisional: if after a short while no
// Sentinel names it, none is failing over, and most name another primary,
// that one wins (see discover).
//
// When the choice is made: on +switch-master and +promoted-slave events
// (all Sentinels are subscribed to, each on its own connection, retried
// while it is down), on a poll (Options.PollInterval, faster while no
// primary is known), and when the data path saw -READONLY (Recheck). On
// +selected-slave, the replica being promoted is polled and adopted as
// soon as it says it is a primary (see events).
package sentinel

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/resp"
)

// ErrNoPrimary is returned by Discover when no Sentinel names a server
// that says it is the primary.
var ErrNoPrimary = errors.New("redproxy: no primary known (no Sentinel names a reachable primary)")

// Options configure a Watcher.
type Options struct {
	Sentinels  []string // host:port of each Sentinel
	MasterName string
	// Username and Password are the Sentinels' own credentials.
	Username, Password string
	// TLS, if set, holds the configuration of the Sentinel connections
	// ([upstream.tls]), nil in it for plaintext; each dial reads it, so a
	// reload that stores new files there (SetTLS) is followed by every
	// connection dialled after it. Role should read it too.
	TLS *atomic.Pointer[tls.Config]
	// Role asks the server at addr for its role with Redis's credentials
	// and returns the raw RESP reply: to HELLO (whose "role" and "mode"
	// fields any user may read) or to ROLE (which needs @admin; see
	// parseRole). An error reply is reported as the reason the server
	// is not taken.
	Role        func(addr string) ([]byte, error)
	DialTimeout time.Duration
	// PollInterval is how often the Sentinels are asked even without a
	// +switch-master (1s if 0); a quarter of it while no primary is known.
	PollInterval time.Duration
	// ReconnectMax caps the wait between attempts to subscribe to a
	// Sentinel that is down (2s if 0).
	ReconnectMax time.Duration
	// OnSwitch is called with the new primary's address each time it
	// changes, one call at a time (from the watcher's loop, or from the
	// goroutine watching a promotion: switchMu orders them).
	OnSwitch func(addr string)
	Logger   *slog.Logger
}

// Watcher follows the primary of one Sentinel group.
type Watcher struct {
	opt     Options
	clients []*redis.SentinelClient

	// switchMu is held while the primary in use is changed (switchTo):
	// by a check, or by a promotion adopted while a check may still be
	// asking the Sentinels, which must not wait for it.
	switchMu sync.Mutex

	mu sync.Mutex
	// inUse is the address the data path was last told (OnSwitch or
	// Start); known says whether it was confirmed a primary on the last
	// check.
	inUse string
	known bool
	// epoch is the configuration epoch inUse was chosen at: -1 when not
	// known, one more than the newest seen when it was chosen as the
	// replica a failover promoted, before any Sentinel names it.
	epoch int64
	// newest is the newest epoch any Sentinel has named.
	newest int64
	// adopted is when inUse was adopted from a promotion (adopt), while
	// no Sentinel has named it yet: it is provisional (discover). Zero
	// once one has, or when inUse was chosen from the Sentinels' answers.
	adopted time.Time
	subs    []*redis.PubSub
	// promoting is the replica whose promotion is being watched, if any.
	promoting string

	// answering is how many Sentinels answered the last check (a check
	// stops counting at a majority); -1 before the first. unreachable:
	// none answered the last check, which was logged.
	answering   atomic.Int32
	unreachable atomic.Bool

	recheck   chan struct{}
	stop      chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup
}

// New builds a Watcher; nothing is dialled until Discover or Start.
func New(o Options) *Watcher {
	if o.DialTimeout <= 0 {
		o.DialTimeout = 2 * time.Second
	}
	if o.PollInterval <= 0 {
		o.PollInterval = time.Second
	}
	if o.ReconnectMax <= 0 {
		o.ReconnectMax = 2 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	w := &Watcher{opt: o, epoch: -1, newest: -1, recheck: make(chan struct{}, 1), stop: make(chan struct{})}
	w.answering.Store(-1)
	for _, addr := range o.Sentinels {
		w.clients = append(w.clients, redis.NewSentinelClient(w.clientOptions(addr)))
	}
	return w
}

func (w *Watcher) clientOptions(addr string) *redis.Options {
	return &redis.Options{
		Addr: addr, Username: w.opt.Username, Password: w.opt.Password,
		DialTimeout: w.opt.DialTimeout, ReadTimeout: w.opt.DialTimeout, WriteTimeout: w.opt.DialTimeout,
		MaxRetries: -1, PoolSize: 1, Protocol: 2, DisableIdentity: true,
		Dialer: w.dial,
	}
}

// dial connects to a Sentinel with the TLS configuration in force now:
// go-redis's TLSConfig is fixed when the client is built, and a reload
// that rotated [upstream.tls] left the Sentinel side on the old files
// while the data path had the new ones (found by a probe).
func (w *Watcher) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: w.opt.DialTimeout}
	nc, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	conf := w.currentTLS()
	if conf == nil {
		return nc, nil
	}
	if conf.ServerName == "" && !conf.InsecureSkipVerify {
		host, _, _ := net.SplitHostPort(addr)
		conf = conf.Clone()
		conf.ServerName = host
	}
	if w.opt.DialTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, w.opt.DialTimeout)
		defer cancel()
	}
	tc := tls.Client(nc, conf)
	if err := tc.HandshakeContext(ctx); err != nil {
		nc.Close()
		return nil, err
	}
	return tc, nil
}

// currentTLS is the TLS configuration dials use now, nil for none.
func (w *Watcher) currentTLS() *tls.Config {
	if w.opt.TLS == nil {
		return nil
	}
	return w.opt.TLS.Load()
}

// SetTLS makes dials from now on use conf (nil: plaintext); connections
// already open keep theirs. A watcher built without Options.TLS ignores it.
func (w *Watcher) SetTLS(conf *tls.Config) {
	if w.opt.TLS != nil {
		w.opt.TLS.Store(conf)
	}
}

// Primary returns the primary's address, or "" while none is known (at
// start before one was found, or after the last one stopped being one and
// no other was found yet).
func (w *Watcher) Primary() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.known {
		return ""
	}
	return w.inUse
}

// Recheck asks the watcher to check the primary now, e.g. because it
// answered -READONLY. It never blocks; checks asked for while one is
// pending are merged.
func (w *Watcher) Recheck() {
	select {
	case w.recheck <- struct{}{}:
	default:
	}
}

// answer is what one Sentinel says.
type answer struct {
	addr  string
	epoch int64
	votes int
	first int // order of the first Sentinel that gave it
}

// Discover asks the Sentinels once and returns the primary's address and
// the configuration epoch it was named with. current, if not "", is the
// primary in use, chosen at epoch currentEpoch: it is kept while it still
// says it is a primary and no Sentinel names anything with a newer epoch
// (at an equal epoch, while one names it: see candidates), so a Sentinel
// that has not yet heard of a failover cannot move the proxy back; among
// equally good answers it is preferred too.
//
// The Sentinels are asked all at once, and Discover goes on as soon as
// more than half of them have answered (or all have answered or failed).
// A hung Sentinel (its host gone without closing the sockets) would
// otherwise hold every check for its read timeout. A Sentinel left out
// this time is asked again at the next check.
func (w *Watcher) Discover(ctx context.Context, current string, currentEpoch int64) (string, int64, error) {
	f, err := w.discover(ctx, current, currentEpoch, time.Time{})
	return f.addr, f.epoch, err
}

// found is what one discovery found.
type found struct {
	addr  string
	epoch int64
	// named: some Sentinel named current (it is no longer provisional).
	named bool
	// overruled: current was provisional, and a majority of the
	// Sentinels that answered named addr instead, which is a primary.
	overruled bool
}

// discover is Discover, for a current primary that is provisional since
// adopted (not zero): adopted from a promotion no Sentinel has named yet
// (watchPromotion). Such a primary is kept as Discover keeps any, with
// its made-up epoch, for provisionalFor. After that, if no Sentinel
// names it and none reports a failover in progress, and more than half of
// those that answered name another server that says it is a primary, that
// server wins: the failover that promoted current was abandoned (its
// leader died before telling the others), and the Sentinels will turn
// current back into a replica, dropping the writes it took. While current
// is provisional every Sentinel's answer is waited for (each within its
// ask timeout), so the one leading the failover is heard if it can be.
func (w *Watcher) discover(ctx context.Context, current string, currentEpoch int64, adopted time.Time) (found, error) {
	provisional := current != "" && !adopted.IsZero()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // the Sentinels not waited for stop waiting for a connection
	type reply struct {
		i int
		sentinelAnswer
		err error
	}
	replies := make(chan reply, len(w.clients)) // late replies never block
	fanOut(ctx, len(w.clients), func(i int) {
		a, err := w.ask(ctx, w.clients[i])
		replies <- reply{i, a, err}
	})
	byAddr := map[string]*answer{}
	var asked []error
	answered := 0
	failingOver := false
gather:
	for range w.clients {
		var r reply
		select {
		case r = <-replies:
		case <-ctx.Done():
			asked = append(asked, ctx.Err())
			break gather
		}
		if r.err != nil {
			asked = append(asked, fmt.Errorf("%s: %w", w.opt.Sentinels[r.i], r.err))
			continue
		}
		failingOver = failingOver || r.failingOver
		a := byAddr[r.addr]
		if a == nil {
			a = &answer{addr: r.addr, epoch: r.epoch, first: r.i}
			byAddr[r.addr] = a
		}
		a.epoch = max(a.epoch, r.epoch)
		a.first = min(a.first, r.i)
		a.votes++
		if answered++; answered > len(w.clients)/2 && !provisional {
			break gather
		}
	}
	w.noteAnswering(answered, asked)
	answers := make([]*answer, 0, len(byAddr))
	for _, a := range byAddr {
		answers = append(answers, a)
	}
	named := current != "" && byAddr[current] != nil
	overdue := provisional && time.Since(adopted) >= w.provisionalFor()
	cands, overruled := candidates(answers, answered, current, currentEpoch, provisional, named, failingOver, overdue)
	off := len(cands) - len(answers) // cands[off:] are the answers
	addrs := make([]string, len(cands))
	for i, c := range cands {
		addrs[i] = c.addr
	}
	i, errs := w.firstPrimary(addrs)
	if i >= 0 {
		c := cands[i]
		return found{addr: c.addr, epoch: c.epoch, named: named, overruled: overruled && i == 0}, nil
	}
	for j, c := range cands {
		if j >= off { // why each server the Sentinels named is not the primary
			asked = append(asked, fmt.Errorf("%s: %w", c.addr, errs[j]))
		}
	}
	return found{epoch: -1, named: named}, fmt.Errorf("%w: %w", ErrNoPrimary, errors.Join(asked...))
}

// cand is a server discover asks for its role, and the epoch it was
// named with.
type cand struct {
	addr  string
	epoch int64
}

// candidates orders the servers discover tries, first choice first: the
// primary in use (current, chosen at currentEpoch) while it may be kept,
// then the Sentinels' answers, newest epoch first, then by votes (the
// primary in use first among equals), then by the first Sentinel that
// named it. answered Sentinels gave answers; provisional: current is an
// adopted promotion no Sentinel has named yet, overdue once it has been
// kept against them for provisionalFor; named: an answer names current;
// failingOver: a Sentinel leads a failover. overruled: cands[0] is the
// server most Sentinels name, tried before a provisional current that
// none confirms (current stays if that one is not a primary).
func candidates(answers []*answer, answered int, current string, currentEpoch int64, provisional, named, failingOver, overdue bool) (cands []cand, overruled bool) {
	newest := int64(-1)
	for _, a := range answers {
		newest = max(newest, a.epoch)
	}
	// Kept while no Sentinel names a newer epoch; at the same epoch only
	// while one names it (or it is a promotion they have not named yet,
	// whose made-up epoch may equal theirs). Kept at an equal epoch that
	// every Sentinel gave another server, the proxy stayed 7.5 s on a
	// demoted primary that still answered as one, after it had taken it
	// from an answer whose address and epoch were read at two moments
	// around a switch (found by a probe: acknowledged writes lost there).
	//
	// No epoch known on either side (-1: the watcher's first check after
	// Start, Sentinels that cannot be asked SENTINEL MASTER, none
	// answering) says nothing against it: kept, as before the rule
	// (found by review: at start with the Sentinels unreachable, a healthy
	// primary was dropped and /readyz said 503).
	keep := current != "" && (newest < currentEpoch || newest == currentEpoch && (named || provisional || newest < 0))
	slices.SortFunc(answers, func(a, b *answer) int {
		switch {
		case a.epoch != b.epoch:
			return int(b.epoch - a.epoch)
		case a.votes != b.votes:
			return b.votes - a.votes
		case a.addr == current:
			return -1
		case b.addr == current:
			return 1
		}
		return a.first - b.first
	})
	var overrule *answer
	if keep && provisional && !named && !failingOver && overdue {
		for _, a := range answers {
			if a.votes*2 > answered && (overrule == nil || a.votes > overrule.votes) {
				overrule = a
			}
		}
	}
	if overrule != nil {
		cands = append(cands, cand{overrule.addr, overrule.epoch})
	}
	if keep {
		cands = append(cands, cand{current, currentEpoch})
	}
	for _, a := range answers {
		cands = append(cands, cand{a.addr, a.epoch})
	}
	return cands, overrule != nil
}

// noteAnswering records how many Sentinels answered a check, and says
// when none did, and when one does again. With the primary healthy the
// proxy keeps serving without them, but could not follow a failover: an
// operator learnt of it only when the primary died (found by review:
// nothing above debug level, /readyz 200, no metric).
func (w *Watcher) noteAnswering(answered int, errs []error) {
	select {
	case <-w.stop:
		return // a check Close cut short says nothing of the Sentinels
	default:
	}
	w.answering.Store(int32(answered))
	switch {
	case answered == 0 && w.unreachable.CompareAndSwap(false, true):
		w.opt.Logger.Warn("sentinel: no Sentinel answered; a failover cannot be followed until one does",
			"master_name", w.opt.MasterName, "sentinels", len(w.clients), "err", errors.Join(errs...))
	case answered > 0 && w.unreachable.CompareAndSwap(true, false):
		w.opt.Logger.Info("sentinel: Sentinels answer again", "master_name", w.opt.MasterName, "answered", answered)
	}
}

// Answering is how many Sentinels answered the last check; a check stops
// counting once a majority has answered. -1 before the first check.
func (w *Watcher) Answering() int { return int(w.answering.Load()) }

// provisionalFor is how long an adopted promotion no Sentinel names is
// kept against the Sentinels (discover): twice the poll interval, and at
// least 2 s. The failover's leader names the promoted replica once its
// INFO (every second during a failover) shows it a primary, and says it
// is failing over until then.
func (w *Watcher) provisionalFor() time.Duration {
	return max(2*w.opt.PollInterval, 2*time.Second)
}

// firstPrimary checks every candidate at once (Role; once per address,
// at most maxParallel at a time, in cands' order) and returns the index of
// the first in cands' order that says it is a primary, or -1; errs[i]
// says why cands[i] is not one, for those before it.
//
// The choice is the one checking them one after another made: a
// candidate is taken only once every one before it has failed, so one
// that answers slowly still wins over a later one. What changes is the
// wait: candidates that never answer cost their timeout once between
// them, not each (TestDiscoverStalledCandidates: 6s before, 3s after for
// two hung ones ranked first). Checks still running when it returns end
// within the Role function's own timeout; those not started are skipped.
func (w *Watcher) firstPrimary(cands []string) (int, []error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type check struct {
		done chan struct{}
		err  error
	}
	checks := make(map[string]*check, len(cands))
	var distinct []string
	for _, a := range cands {
		if checks[a] == nil {
			checks[a] = &check{done: make(chan struct{})}
			distinct = append(distinct, a)
		}
	}
	fanOut(ctx, len(distinct), func(i int) {
		c := checks[distinct[i]]
		_, c.err = w.isPrimary(distinct[i])
		close(c.done)
	})
	errs := make([]error, len(cands))
	for i, a := range cands {
		c := checks[a]
		// Started once the checks before it have (fanOut goes in order),
		// and those are waited for first: no wait here blocks forever.
		<-c.done
		if c.err == nil {
			return i, errs
		}
		errs[i] = c.err
	}
	return -1, errs
}

// sentinelAnswer is what one Sentinel says of the primary.
type sentinelAnswer struct {
	addr  string
	epoch int64
	// failingOver: the Sentinel leads a failover of it (flag
	// failover_in_progress), and may not name the promoted replica yet.
	failingOver bool
}

// ask returns one Sentinel's primary address and configuration epoch.
func (w *Watcher) ask(ctx context.Context, c *redis.SentinelClient) (sentinelAnswer, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*w.opt.DialTimeout)
	defer cancel()
	// The epoch only orders answers; a Sentinel that cannot give it
	// still counts, as the oldest. Asked before the address: the two are
	// two commands, and a switch between them paired the old primary with
	// the failover's new epoch, which made it the newest answer (found by
	// a probe, with candidates' equal-epoch rule). Asked in this order, a
	// switch between them pairs the new primary with the old epoch, which
	// at worst ranks it lower until the next check.
	//
	// Half the budget at most, so that a Sentinel slow to answer it still
	// gives its address (counted as the oldest), as when it was asked
	// second.
	a := sentinelAnswer{epoch: -1}
	mctx, mcancel := context.WithTimeout(ctx, w.opt.DialTimeout)
	defer mcancel()
	if m, err := c.Master(mctx, w.opt.MasterName).Result(); err == nil {
		if e, err := strconv.ParseInt(m["config-epoch"], 10, 64); err == nil {
			a.epoch = e
		}
		a.failingOver = slices.Contains(strings.Split(m["flags"], ","), "failover_in_progress")
	}
	hp, err := c.GetMasterAddrByName(ctx, w.opt.MasterName).Result()
	if err != nil {
		return sentinelAnswer{}, err
	}
	if len(hp) != 2 {
		return sentinelAnswer{}, fmt.Errorf("unexpected reply to SENTINEL GET-MASTER-ADDR-BY-NAME: %q", hp)
	}
	a.addr = net.JoinHostPort(hp[0], hp[1])
	return a, nil
}

// errNotPrimary: the server answered as a replica (or a Sentinel).
var errNotPrimary = errors.New("not a primary")

// errRoleRefused: the server answered the role check with an error, e.g.
// -NOPERM for a user denied ROLE (@admin, @dangerous) and HELLO.
var errRoleRefused = errors.New("role check refused")

func (w *Watcher) isPrimary(addr string) (bool, error) {
	r, err := w.opt.Role(addr)
	if err != nil {
		return false, err
	}
	role, mode, err := parseRole(r)
	switch {
	case err != nil:
		return false, err
	case mode == "sentinel":
		return false, fmt.Errorf("%w: a Sentinel", errNotPrimary)
	case role != "master":
		return false, fmt.Errorf("%w: role %q", errNotPrimary, role)
	}
	return true, nil
}

// parseRole reads the server's role and mode from its reply to ROLE or
// HELLO (resp.ServerRole). An error reply is returned as errRoleRefused
// with the server's text, so the log says why.
func parseRole(r []byte) (role, mode string, err error) {
	if resp.IsError(r) {
		return "", "", fmt.Errorf("%w: %s", errRoleRefused, bytes.TrimSpace(r[1:]))
	}
	role, mode, ok := resp.ServerRole(r)
	if !ok {
		return "", "", fmt.Errorf("%w: no role in reply %q", errNotPrimary, trim(r))
	}
	return role, mode, nil
}

func trim(r []byte) []byte {
	if len(r) > 100 {
		return r[:100]
	}
	return r
}

// Start begins following the group. current is the primary in use ("" if
// none was found yet): OnSwitch is called when a different one is found.
func (w *Watcher) Start(current string) {
	w.mu.Lock()
	w.inUse, w.known = current, current != ""
	w.mu.Unlock()
	for i := range w.opt.Sentinels {
		w.wg.Add(1)
		go w.subscribe(i)
	}
	w.wg.Add(1)
	go w.loop()
}

// Close stops the watcher and waits for its goroutines. It may be called
// again (Server.Shutdown may be): later calls only wait for the first.
func (w *Watcher) Close() { w.closeOnce.Do(w.close) }

func (w *Watcher) close() {
	close(w.stop)
	w.mu.Lock()
	subs := w.subs
	w.subs = nil
	w.mu.Unlock()
	for _, ps := range subs {
		_ = ps.Close() // unblocks its Receive
	}
	w.wg.Wait()
	for _, c := range w.clients {
		_ = c.Close()
	}
}

func (w *Watcher) stopped() bool {
	select {
	case <-w.stop:
		return true
	default:
		return false
	}
}

// loop checks the primary on every poll tick and every Recheck.
func (w *Watcher) loop() {
	defer w.wg.Done()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-w.recheck:
		case <-t.C:
		}
		known := w.check()
		next := w.opt.PollInterval
		if !known {
			next /= 4
		}
		t.Reset(next)
	}
}

// check runs one discovery and tells the data path if the primary moved.
// It reports whether a primary is known.
func (w *Watcher) check() bool {
	w.mu.Lock()
	current, currentEpoch, adopted := w.inUse, w.epoch, w.adopted
	w.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-w.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	f, err := w.discover(ctx, current, currentEpoch, adopted)
	addr, epoch := f.addr, f.epoch
	cancel()
	w.switchMu.Lock()
	defer w.switchMu.Unlock()
	if w.stopped() {
		return false
	}
	w.mu.Lock()
	if w.inUse != current || w.epoch != currentEpoch {
		// A promotion was adopted while the Sentinels were asked: their
		// answers are older, and may name the old primary, which can
		// still answer as one. Keep the promoted one.
		known := w.known
		w.mu.Unlock()
		return known
	}
	wasKnown := w.known
	w.known = err == nil
	if err == nil {
		w.newest = max(w.newest, epoch)
	}
	if f.named && !w.adopted.IsZero() {
		w.adopted = time.Time{}
		w.opt.Logger.Info("sentinel: the promoted primary is confirmed by the Sentinels", "master_name", w.opt.MasterName, "primary", current, "after", time.Since(adopted).Round(time.Millisecond))
	}
	w.mu.Unlock()
	if err != nil {
		if wasKnown {
			w.opt.Logger.Warn("sentinel: no primary known; clients get errors until one is", "master_name", w.opt.MasterName, "last", current, "err", err)
		}
		return false
	}
	if f.overruled {
		w.opt.Logger.Warn("sentinel: no Sentinel confirms the promoted primary, and most name another primary; going back to it (writes taken by the promoted one will be lost when the Sentinels demote it)",
			"master_name", w.opt.MasterName, "promoted", current, "primary", addr, "adopted", time.Since(adopted).Round(time.Millisecond))
	}
	w.switchTo(addr, epoch, !wasKnown, false)
	return true
}

// switchTo makes addr, chosen at epoch, the primary in use, telling the
// data path if it is a different server; adopted says it is a promotion
// no Sentinel named yet (adopt). The caller holds switchMu, so OnSwitch is
// called one at a time.
func (w *Watcher) switchTo(addr string, epoch int64, wasUnknown, adopted bool) {
	w.mu.Lock()
	current := w.inUse
	w.mu.Unlock()
	if addr != current {
		w.opt.Logger.Warn("sentinel: primary moved; switching the upstream", "master_name", w.opt.MasterName, "from", current, "to", addr, "epoch", epoch)
		if w.opt.OnSwitch != nil {
			w.opt.OnSwitch(addr)
		}
	} else if wasUnknown {
		w.opt.Logger.Info("sentinel: primary known", "master_name", w.opt.MasterName, "primary", addr)
	}
	w.mu.Lock()
	switch {
	case adopted:
		w.adopted = time.Now() // provisional until a Sentinel names it
	case addr != w.inUse:
		w.adopted = time.Time{} // chosen from the Sentinels' answers
	}
	w.inUse, w.epoch, w.known = addr, epoch, true
	w.mu.Unlock()
}

// adopt switches to the replica a failover promoted, which has just said
// it is a primary. Its epoch is taken as one past the newest seen: the
// failover raised it, though the Sentinels may not say so for a second yet.
// It is provisional until a Sentinel names it (discover): a failover
// whose leader dies before telling the others is abandoned, and the
// made-up epoch must not keep the proxy on it against every Sentinel.
func (w *Watcher) adopt(addr string) {
	w.switchMu.Lock()
	defer w.switchMu.Unlock()
	if w.stopped() {
		return
	}
	w.mu.Lock()
	epoch := max(w.newest, w.epoch) + 1
	w.newest = epoch
	w.mu.Unlock()
	w.switchTo(addr, epoch, false, true)
	// Checked again as soon as it may be given up, not at the next poll
	// after that (a Recheck after Close is dropped).
	time.AfterFunc(w.provisionalFor(), w.Recheck)
}

// watchPromotion polls the replica a failover is promoting (named by
// +selected-slave) and switches to it as soon as it answers as a primary,
// without waiting for a check in progress (adopt). The Sentinels only
// notice that at their next INFO (about a second later in a failover);
// meanwhile the old primary still takes writes that the new one will
// never have, so every moment saved is writes not lost. It gives up after
// maxPromotionWait.
func (w *Watcher) watchPromotion(addr string) {
	w.mu.Lock()
	if w.promoting == addr || w.inUse == addr {
		w.mu.Unlock()
		return
	}
	w.promoting = addr
	w.mu.Unlock()
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		defer func() {
			w.mu.Lock()
			if w.promoting == addr {
				w.promoting = ""
			}
			w.mu.Unlock()
		}()
		deadline := time.Now().Add(maxPromotionWait)
		for time.Now().Before(deadline) {
			if ok, _ := w.isPrimary(addr); ok {
				w.adopt(addr)
				return
			}
			select {
			case <-w.stop:
				return
			case <-time.After(promotionPoll):
			}
		}
	}()
}

const (
	maxPromotionWait = 10 * time.Second
	promotionPoll    = 10 * time.Millisecond
)

// events are the Sentinel events the watcher acts on. +switch-master
// ends a failover and +promoted-slave comes shortly before it: both make
// the watcher check at once. +selected-slave names the replica the
// failover leader is about to promote: from the moment it is a primary,
// the old primary's writes are lost (the new one no longer replicates from
// it), so the watcher polls it and switches the moment it says so
// (watchPromotion) rather than a second later when the Sentinels notice.
var events = []string{"+switch-master", "+promoted-slave", "+selected-slave"}

// eventMaster returns the primary's name an event is about:
// "<name> <old-ip> <old-port> <new-ip> <new-port>" for +switch-master,
// "<type> <name> <ip> <port> @ <master-name> <ip> <port>" for events
// about an instance.
func eventMaster(payload string) string {
	if _, about, ok := strings.Cut(payload, " @ "); ok {
		name, _, _ := strings.Cut(about, " ")
		return name
	}
	name, _, _ := strings.Cut(payload, " ")
	return name
}

// subscribe listens for events on Sentinel i for the watcher's
// life, resubscribing with backoff while it is down. Every (re)subscription
// triggers a check too: a failover may have happened while it was cut off.
func (w *Watcher) subscribe(i int) {
	defer w.wg.Done()
	addr := w.opt.Sentinels[i]
	c := redis.NewSentinelClient(w.clientOptions(addr))
	defer c.Close()
	backoff := 50 * time.Millisecond
	for !w.stopped() {
		ps := c.Subscribe(context.Background(), events...)
		w.mu.Lock()
		if w.stopped() {
			w.mu.Unlock()
			_ = ps.Close()
			return
		}
		w.subs = append(w.subs, ps)
		w.mu.Unlock()
		err := w.receive(ps)
		w.mu.Lock()
		w.subs = slices.DeleteFunc(w.subs, func(p *redis.PubSub) bool { return p == ps })
		w.mu.Unlock()
		_ = ps.Close()
		if w.stopped() {
			return
		}
		w.opt.Logger.Debug("sentinel: subscription lost; retrying", "sentinel", addr, "err", err, "in", backoff)
		select {
		case <-w.stop:
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, w.opt.ReconnectMax)
	}
}

// receive handles one subscription's messages until it fails. Silence is
// checked with a PING, so a Sentinel that vanished without closing the
// connection is noticed.
func (w *Watcher) receive(ps *redis.PubSub) error {
	ctx := context.Background()
	for {
		msg, err := ps.ReceiveTimeout(ctx, w.opt.PollInterval+w.opt.DialTimeout)
		if w.stopped() {
			return nil
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			if err := ps.Ping(ctx); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			w.Recheck()
		case *redis.Message:
			if eventMaster(m.Payload) != w.opt.MasterName {
				continue
			}
			w.opt.Logger.Info("sentinel: "+m.Channel, "payload", m.Payload)
			if m.Channel == "+selected-slave" {
				// "slave <ip>:<port> <ip> <port> @ ..."
				if f := strings.Fields(m.Payload); len(f) > 3 {
					w.watchPromotion(net.JoinHostPort(f[2], f[3]))
				}
				continue
			}
			w.Recheck()
		}
	}
}

// Replicas asks every Sentinel at once for the primary's replicas
// (SENTINEL REPLICAS) and returns, from the first that answers, the
// addresses of those it believes usable: not subjectively or objectively
// down, not disconnected, with their link to the primary up. The caller
// still checks each one itself before reading from it.
//
// They were asked one after another: a hung Sentinel listed before a live
// one held every refresh for its read timeout (3s with a 3s dial timeout
// in TestReplicasHungSentinel, where they answer in milliseconds now), and
// a caller with a shorter deadline got no list at all. The others' answers
// are not waited for once one has come.
func (w *Watcher) Replicas(ctx context.Context) ([]string, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // the Sentinels still asked stop waiting for a connection
	type reply struct {
		i    int
		list []map[string]string
		err  error
	}
	replies := make(chan reply, len(w.clients)) // late replies never block
	fanOut(ctx, len(w.clients), func(i int) {
		actx, cancel := context.WithTimeout(ctx, 2*w.opt.DialTimeout)
		defer cancel()
		list, err := w.clients[i].Replicas(actx, w.opt.MasterName).Result()
		replies <- reply{i, list, err}
	})
	var asked []error
	for range w.clients {
		var r reply
		select {
		case r = <-replies:
		case <-ctx.Done():
			return nil, errors.Join(append(asked, ctx.Err())...)
		}
		if r.err != nil {
			asked = append(asked, fmt.Errorf("%s: %w", w.opt.Sentinels[r.i], r.err))
			continue
		}
		var addrs []string
		for _, e := range r.list {
			if !usableReplica(e) {
				continue
			}
			addrs = append(addrs, net.JoinHostPort(e["ip"], e["port"]))
		}
		return addrs, nil
	}
	if len(asked) == 0 { // no Sentinels
		return nil, ctx.Err()
	}
	return nil, errors.Join(asked...)
}

// maxParallel bounds how many servers one call asks at the same time.
const maxParallel = 8

// fanOut runs f(0) ... f(n-1) on goroutines of their own, at most
// maxParallel at a time, started in that order, and returns at once.
// Those not started when ctx is done are skipped: a caller waiting for
// their results must stop waiting then too.
func fanOut(ctx context.Context, n int, f func(i int)) {
	if n <= maxParallel {
		for i := range n {
			go f(i)
		}
		return
	}
	sem := make(chan struct{}, maxParallel)
	go func() {
		for i := range n {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			go func() {
				defer func() { <-sem }()
				f(i)
			}()
		}
	}()
}

// usableReplica reads one entry of SENTINEL REPLICAS.
func usableReplica(r map[string]string) bool {
	if r["ip"] == "" || r["port"] == "" || r["master-link-status"] != "ok" {
		return false
	}
	for _, f := range strings.Split(r["flags"], ",") {
		switch f {
		case "s_down", "o_down", "disconnected":
			return false
		}
	}
	return true
}
