// Package guard applies the policy (package policy) to the commands passing
// through the proxy, and keeps the record of what it found: a rate-limited
// structured log line per violation, the Prometheus counter
// redproxy_policy_violations_total{rule,action}, and the table behind the
// admin endpoint GET /policy/report.
//
// The compiled policy is an immutable snapshot behind an atomic pointer:
// every batch of commands loads it once, and a reload (SIGHUP or POST
// /policy/reload) swaps it without stopping traffic. An invalid file keeps
// the old policy.
//
// Log lines name the rule, action, outcome, command, the rule's pattern, the
// key's pattern (its variable segments as "*"), the client address and the
// user, and never a value or a whole key; the report keeps one example key
// per row for the operator.
package guard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/redproxy/redproxy/internal/policy"
)

// ErrNoSource is returned by Reload when the guard has no configuration
// file to re-read (the proxy was started without --config).
var ErrNoSource = errors.New("no configuration file to reload the policy from (start redproxy with --config)")

// Options tune a Guard; zero values mean the defaults.
type Options struct {
	Logger *slog.Logger
	// Registerer receives the guard's metrics; nil keeps them private.
	Registerer prometheus.Registerer
	// Source re-reads the [policy] section for Reload; nil disables reload.
	Source func() (policy.Config, error)
	// LogRate and LogBurst bound violation log lines (default 10 per second,
	// bursts of 20); fix-up failures have their own bucket of the same size.
	LogRate  float64
	LogBurst int
	// MaxRows bounds the report table (default 1000 rows).
	MaxRows int
	// Now is the clock, for tests.
	Now func() time.Time
	// Upstreams, with routes, names the upstreams by route index
	// (Upstreams[0] is [upstream]); the violation counter then carries
	// an "upstream" label, one series per name, as stampede protection's
	// and the local tier's counters do. UpstreamOf gives the index of a
	// key's upstream; a violation with no key (command and value rules)
	// counts under Upstreams[0]. Without routes, leave both unset: the
	// counter keeps no upstream label.
	Upstreams  []string
	UpstreamOf func(key []byte) int
}

// Guard holds the policy in force and records violations. It is safe for
// concurrent use.
type Guard struct {
	log    *slog.Logger
	now    func() time.Time
	cur    atomic.Pointer[policy.Policy] // what CheckBatch runs: the loaded policy capped by forced
	source func() (policy.Config, error)

	mu         sync.Mutex // serializes loads, reloads and forced-mode changes
	loaded     *policy.Policy
	loadedConf policy.Config // loaded's configuration
	forced     policy.Action
	loadedAt   time.Time
	lastErr    string
	violations map[counterKey]prometheus.Counter
	vec        *prometheus.CounterVec
	// refused counts the violations whose command was refused (the
	// client got an error), per rule (and upstream): violations_total's
	// action=enforce mixes them with those fixed and forwarded, so no
	// alert could say "clients refused by the policy" (found by the
	// operations review).
	refused      map[counterKey]prometheus.Counter
	refusedVec   *prometheus.CounterVec
	upstreams    []string
	upstreamOf   func(key []byte) int
	fixFails     prometheus.Counter
	unclassified prometheus.Counter
	reloads      *prometheus.CounterVec
	suppressed   prometheus.Counter

	logLimit *limiter
	fixLimit *limiter
	table    *table
}

// violationLabels are the violation counter's labels: rule and action,
// and the upstream with routes.
func violationLabels(upstreams []string) []string {
	if len(upstreams) > 0 {
		return []string{"rule", "action", "upstream"}
	}
	return []string{"rule", "action"}
}

// refusalLabels are the refusal counter's labels: rule, and the upstream
// with routes.
func refusalLabels(upstreams []string) []string {
	if len(upstreams) > 0 {
		return []string{"rule", "upstream"}
	}
	return []string{"rule"}
}

type counterKey struct {
	rule   string
	action policy.Action
	up     int // index in Options.Upstreams; 0 without routes
}

// allRules are the policy's rule names, whose counters exist from the start
// so that rate() works from the first violation.
var allRules = []string{policy.RuleCommand, policy.RuleTTL, policy.RuleTTLMax, policy.RuleNamespaces,
	policy.RuleRegex, policy.RuleKeyLength, policy.RuleVersion, policy.RuleValueSize}

// New compiles c and builds a guard. Errors are c's validation errors, or a
// metrics registration conflict.
func New(c policy.Config, o Options) (*Guard, error) {
	p, err := policy.Compile(c)
	if err != nil {
		return nil, err
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.LogRate <= 0 {
		o.LogRate = 10
	}
	if o.LogBurst <= 0 {
		o.LogBurst = 20
	}
	if o.MaxRows <= 0 {
		o.MaxRows = 1000
	}
	now := o.Now()
	g := &Guard{
		log:        o.Logger,
		now:        o.Now,
		source:     o.Source,
		loaded:     p,
		loadedConf: c,
		forced:     policy.Enforce,
		loadedAt:   now,
		logLimit:   newLimiter(o.LogRate, o.LogBurst),
		fixLimit:   newLimiter(o.LogRate, o.LogBurst),
		table:      newTable(o.MaxRows, now),
		vec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "redproxy_policy_violations_total",
			Help: "Policy violations, by rule and by the action the rule had (enforce: refused or fixed; report: forwarded unchanged).",
		}, violationLabels(o.Upstreams)),
		refusedVec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "redproxy_policy_refusals_total",
			Help: "Commands the policy refused (the client got an error; nothing was forwarded), by rule: the violations of action enforce that could not be fixed.",
		}, refusalLabels(o.Upstreams)),
		refused:    map[counterKey]prometheus.Counter{},
		upstreams:  o.Upstreams,
		upstreamOf: o.UpstreamOf,
		fixFails: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "redproxy_policy_fixup_failures_total",
			Help: "TTL fix-ups (EXPIRE key ttl NX after a write, with SELECTs around it for a key in another database) that Redis answered with an error, when queued or when EXEC ran them, or never answered.",
		}),
		unclassified: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "redproxy_policy_unclassified_total",
			Help: "Commands whose effect on keys the policy could not fully work out (unknown to the command table, or writes with incomplete key specifications), so TTL and naming rules may not have been checked; /policy/report lists them under rule \"unclassified\".",
		}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "redproxy_policy_reloads_total",
			Help: "Policy reloads (SIGHUP, POST /policy/reload), by result: ok, or error (the old policy stayed).",
		}, []string{"result"}),
		suppressed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "redproxy_policy_log_lines_suppressed_total",
			Help: "Violation and fix-up log lines dropped by the log rate limit (the violations are still counted).",
		}),
		violations: map[counterKey]prometheus.Counter{},
	}
	for _, r := range allRules {
		for _, a := range []policy.Action{policy.Enforce, policy.Report} {
			if len(g.upstreams) == 0 {
				g.violations[counterKey{r, a, 0}] = g.vec.WithLabelValues(r, a.String())
				continue
			}
			for i, up := range g.upstreams {
				g.violations[counterKey{r, a, i}] = g.vec.WithLabelValues(r, a.String(), up)
			}
		}
	}
	for _, r := range allRules {
		if len(g.upstreams) == 0 {
			g.refused[counterKey{r, policy.Enforce, 0}] = g.refusedVec.WithLabelValues(r)
			continue
		}
		for i, up := range g.upstreams {
			g.refused[counterKey{r, policy.Enforce, i}] = g.refusedVec.WithLabelValues(r, up)
		}
	}
	g.reloads.WithLabelValues("ok")
	g.reloads.WithLabelValues("error")
	g.cur.Store(p)
	if o.Registerer != nil {
		for _, c := range []prometheus.Collector{g.vec, g.refusedVec, g.fixFails, g.unclassified, g.reloads, g.suppressed} {
			if err := o.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("guard: registering metrics: %w", err)
			}
		}
	}
	return g, nil
}

// Policy is the policy in force, with --policy-mode applied. Callers load
// it once per batch, so a batch is decided by one policy even during a
// reload.
func (g *Guard) Policy() *policy.Policy { return g.cur.Load() }

// SetForcedMode caps every rule at a (--policy-mode): Report turns every
// enforce into report, Off checks nothing, Enforce leaves the configured
// actions alone. It applies to reloaded policies too.
func (g *Guard) SetForcedMode(a policy.Action) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.forced = a
	g.cur.Store(g.loaded.ForcedMode(a))
}

// CapNote is what a reload's answer adds while --policy-mode caps the
// rules: a file switched to enforce and reloaded stays capped until a
// restart without the flag, which nothing said (a user's trial). "" when
// nothing is capped.
func (g *Guard) CapNote() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.forced == policy.Enforce {
		return ""
	}
	return "note: --policy-mode=" + g.forced.String() + " caps every policy rule until redproxy restarts without it"
}

// SetSource sets where Reload reads the policy from.
func (g *Guard) SetSource(src func() (policy.Config, error)) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.source = src
}

// Reload re-reads the policy from the source and puts it in force. When the
// source fails (a missing or invalid file) the current policy stays, and
// the error says why; it is also logged and shown in the report.
func (g *Guard) Reload() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.source == nil {
		return ErrNoSource
	}
	c, err := g.source()
	var p *policy.Policy
	if err == nil {
		p, err = policy.Compile(c)
	}
	if err = g.swapLocked(p, err); err != nil {
		return err
	}
	// Every full reload (SIGHUP) reloads the policy too: a line for each
	// said "policy loaded" whether or not anything in it changed (a
	// user's trial read it as a change).
	if reflect.DeepEqual(c, g.loadedConf) {
		g.log.Debug("policy reloaded, unchanged")
	} else {
		// The mode in force, as INFO reports it: the loaded policy's,
		// capped by --policy-mode. The cap alone was logged, so a switch to
		// report or off read "enforce" (found by review).
		attrs := []any{"policy_mode", g.cur.Load().Mode().String()}
		if g.forced != policy.Enforce {
			attrs = append(attrs, "forced_mode", g.forced.String())
		}
		g.log.Info("policy loaded", attrs...)
	}
	g.loadedConf = c
	return nil
}

// LoadedConfig is the configuration of the policy in force (before any
// --policy-mode cap): the one the guard started with or last reloaded.
func (g *Guard) LoadedConfig() policy.Config {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.loadedConf
}

// ReloadFailed records a policy reload that failed outside Reload: a full
// reload (SIGHUP, POST /reload) refused because the file's [policy] is
// invalid. Like a failed Reload, it shows in the report as the last reload
// error and counts in redproxy_policy_reloads_total{result="error"}; the
// policy in force stays.
func (g *Guard) ReloadFailed(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.swapLocked(nil, err)
}

func (g *Guard) swapLocked(p *policy.Policy, err error) error {
	if err != nil {
		g.lastErr = oneLine(err.Error())
		g.reloads.WithLabelValues("error").Inc()
		g.log.Error("policy not reloaded; the previous policy stays in force", "err", g.lastErr)
		return err
	}
	g.loaded, g.loadedAt, g.lastErr = p, g.now(), ""
	g.cur.Store(p.ForcedMode(g.forced))
	g.reloads.WithLabelValues("ok").Inc()
	return nil
}

// oneLine joins a multi-line error (errors.Join) for a log attribute.
func oneLine(s string) string { return strings.ReplaceAll(s, "\n", "; ") }

// Record counts one violation, adds it to the report and logs it, subject
// to the log rate limit. client and user identify who sent the command. An
// "unclassified" finding (policy.RuleUnclassified) is counted apart, in
// redproxy_policy_unclassified_total, since no rule was broken.
func (g *Guard) Record(v *policy.Violation, client net.Addr, user string) {
	msg := "policy violation"
	if v.Rule == policy.RuleUnclassified {
		// Not a violation: the rules could not be applied.
		g.unclassified.Inc()
		msg = "policy cannot classify command"
	} else {
		up := 0
		if g.upstreamOf != nil && v.Key != nil {
			if i := g.upstreamOf(v.Key); i >= 0 && i < len(g.upstreams) {
				up = i
			}
		}
		c := g.violations[counterKey{v.Rule, v.Action, up}]
		if c == nil {
			labels := []string{v.Rule, v.Action.String()}
			if len(g.upstreams) > 0 {
				labels = append(labels, g.upstreams[up])
			}
			c = g.vec.WithLabelValues(labels...)
		}
		c.Inc()
		if v.Outcome == policy.Refused {
			r := g.refused[counterKey{v.Rule, policy.Enforce, up}]
			if r == nil {
				labels := []string{v.Rule}
				if len(g.upstreams) > 0 {
					labels = append(labels, g.upstreams[up])
				}
				r = g.refusedVec.WithLabelValues(labels...)
			}
			r.Inc()
		}
	}
	now := g.now()
	g.table.add(v, now)
	ok, suppressed := g.logLimit.allow(now)
	if !ok {
		g.suppressed.Inc()
		return
	}
	level := slog.LevelInfo
	if v.Outcome == policy.Refused {
		level = slog.LevelWarn
	}
	attrs := []slog.Attr{
		slog.String("rule", v.Rule),
		slog.String("action", v.Action.String()),
		slog.String("outcome", v.Outcome.String()),
		slog.String("command", v.Command),
	}
	if v.Outcome == policy.Reported && (v.UnderEnforce == policy.Refused || v.UnderEnforce == policy.Fixed) {
		// Staging's question (report mode, or --policy-mode=report over an
		// enforcing file): what turning enforce on does to this command.
		// The report showed it; the log line, which is what most read,
		// did not (found by review).
		attrs = append(attrs, slog.String("under_enforce", v.UnderEnforce.String()))
	}
	if v.Pattern != "" {
		attrs = append(attrs, slog.String("pattern", v.Pattern))
	}
	if v.Key != nil {
		attrs = append(attrs, slog.String("key_pattern", string(appendKeyPattern(nil, v.Key))))
	}
	if v.Scope != "" {
		attrs = append(attrs, slog.String("scope", v.Scope))
	}
	attrs = append(attrs, slog.String("client", addrString(client)), slog.String("user", user))
	if suppressed > 0 {
		attrs = append(attrs, slog.Int64("suppressed", suppressed))
	}
	g.log.LogAttrs(context.Background(), level, msg, attrs...)
}

// FixupFailed records a TTL fix-up that failed: Redis answered it with an
// error (reply) or the connection failed before it did (err). The key may
// then have been left without its TTL, which the keyspace audit will find.
func (g *Guard) FixupFailed(reply []byte, err error, client net.Addr) {
	g.fixFails.Inc()
	g.table.fixupFailed()
	ok, suppressed := g.fixLimit.allow(g.now())
	if !ok {
		g.suppressed.Inc()
		return
	}
	reason := ""
	if err != nil {
		reason = err.Error()
	} else {
		// An error reply: "-ERR ...\r\n". Error replies carry no values.
		reason = strings.TrimSpace(strings.TrimPrefix(string(reply[:min(len(reply), 200)]), "-"))
	}
	attrs := []slog.Attr{slog.String("reason", reason), slog.String("client", addrString(client))}
	if suppressed > 0 {
		attrs = append(attrs, slog.Int64("suppressed", suppressed))
	}
	g.log.LogAttrs(context.Background(), slog.LevelWarn, "policy TTL fix-up failed; the key may have no TTL", attrs...)
}

func addrString(a net.Addr) string {
	if a == nil {
		return ""
	}
	return a.String()
}

// ResetReport empties the report: the staging workflow (fix, reload,
// check again) needs a report of what came after the fix, not since the
// start (found by a user's trial). The metrics' counters are not reset.
func (g *Guard) ResetReport() { g.table.reset(g.now()) }

// Report returns the violations recorded since start, most frequent first.
func (g *Guard) Report() Report {
	r := g.table.snapshot()
	g.mu.Lock()
	// loaded is the policy before the --policy-mode cap: its own mode.
	r.Policy = PolicyInfo{Mode: g.loaded.Mode().String(), ForcedMode: g.forced.String(), LoadedAt: g.loadedAt, LastReloadError: g.lastErr}
	g.mu.Unlock()
	return r
}
