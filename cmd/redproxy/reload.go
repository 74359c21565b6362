package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/redproxy/redproxy/internal/admin"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/guard"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/proxy"
)

// errNoConfigFile: there is nothing to reload from.
var errNoConfigFile = errors.New("no --config file to reload from")

// reloader re-reads --config on SIGHUP and POST /reload and applies what
// can change at run time; see proxy.Server.Reload. The command-line
// overrides stay in force over the file, as at start.
type reloader struct {
	mu     sync.Mutex
	path   string // "" without --config
	ov     config.Overrides
	srv    *proxy.Server
	guard  *guard.Guard
	level  *slog.LevelVar
	log    *slog.Logger
	staged atomic.Pointer[policy.Config] // the policy a full reload hands the guard
	// adm is the admin server (nil while it is off or not yet up), token
	// the token it requires ("" for none): a reload reads
	// admin.token_file again, so that a token rewritten in place (leaked,
	// or rotated on a schedule) is replaced without a restart. Before, the
	// reload said "nothing changed" and the old token kept working (found
	// by the operations review).
	adm   *admin.Server
	token string

	// Outcomes of full reloads (SIGHUP, POST /reload), for alerting on a
	// configuration push that did not take: before, only the policy's own
	// reloads were counted (found by a probe).
	reloads        *prometheus.CounterVec // result: applied, refused
	lastSuccessful prometheus.Gauge       // 1 once the last one applied
	lastSuccessAt  prometheus.Gauge       // Unix time of the last applied (or the start)
}

// registerMetrics registers the reload metrics in reg.
func (r *reloader) registerMetrics(reg prometheus.Registerer) {
	r.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "redproxy_config_reloads_total",
		Help: "Full configuration reloads (SIGHUP, POST /reload) by result: applied, or refused with the configuration in force kept.",
	}, []string{"result"})
	r.lastSuccessful = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "redproxy_config_last_reload_successful",
		Help: "1 if the last full configuration reload was applied (or none was tried since the start), 0 if it was refused.",
	})
	r.lastSuccessAt = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "redproxy_config_last_reload_success_timestamp_seconds",
		Help: "Unix time of the last applied full configuration reload, or of the start.",
	})
	r.reloads.WithLabelValues("applied")
	r.reloads.WithLabelValues("refused")
	r.lastSuccessful.Set(1)
	r.lastSuccessAt.SetToCurrentTime()
	reg.MustRegister(r.reloads, r.lastSuccessful, r.lastSuccessAt)
}

// counted records a reload's outcome; nothing was tried without a file or
// while shutting down.
func (r *reloader) counted(err error) {
	if r.reloads == nil || errors.Is(err, errNoConfigFile) || errors.Is(err, proxy.ErrShuttingDown) {
		return
	}
	if err != nil {
		r.reloads.WithLabelValues("refused").Inc()
		r.lastSuccessful.Set(0)
		return
	}
	r.reloads.WithLabelValues("applied").Inc()
	r.lastSuccessful.Set(1)
	r.lastSuccessAt.SetToCurrentTime()
}

// setAdmin tells the reloader the admin server and the token it started
// with.
func (r *reloader) setAdmin(adm *admin.Server, token string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.adm, r.token = adm, token
}

// nextToken reads the admin token next's admin.token_file holds, when it
// is the file in force (another path, or another admin address, is a
// restart-only change Server.Reload refuses). A file that cannot be read
// or holds too short a token refuses the reload, as at start.
func (r *reloader) nextToken(next *config.Config) (string, error) {
	cur := r.srv.Config()
	if r.adm == nil || next.Admin.TokenFile != cur.Admin.TokenFile || next.Server.Admin != cur.Server.Admin {
		return r.token, nil
	}
	token, err := admin.Token(cur.Server.Admin, next.Admin.TokenFile, config.IsLoopback(cur.Server.Admin))
	if err != nil {
		// file:line: key: reason, as at start (found by a probe: the
		// reload's refusal said neither).
		e := tokenError(err)
		if r.path != "" {
			return "", config.Locate(e, r.path)
		}
		return "", e
	}
	return token, nil
}

// policySource is the guard's source: POST /policy/reload re-reads the
// file's [policy]; a full reload hands over the policy of the snapshot it
// applied, so both come from one read of the file.
func (r *reloader) policySource() (policy.Config, error) {
	if p := r.staged.Swap(nil); p != nil {
		return *p, nil
	}
	c, err := config.Load(r.path)
	if err != nil {
		return policy.Config{}, err
	}
	return c.Policy, nil
}

// reload reads the file and applies it. On any error the configuration in
// force stays whole: a bad file, a restart-only change and a bad policy
// are all refused before anything is applied.
func (r *reloader) reload() (changed []string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	defer func() { r.counted(err) }()
	if r.path == "" {
		return nil, errNoConfigFile
	}
	next, err := config.Load(r.path)
	if err == nil {
		next, err = next.Apply(r.ov)
	}
	var token string
	if err == nil {
		token, err = r.nextToken(next)
	}
	if err == nil {
		if changed, err = r.srv.Reload(next); err == nil {
			if token != r.token {
				r.adm.SetToken(token)
				r.token = token
				changed = append(changed, "admin.token_file (the token it holds)")
			}
			return r.applied(next, changed), nil
		}
	}
	// A full reload refused because of its [policy] is a failed policy
	// reload too: the report and redproxy_policy_reloads_total say so, as
	// after POST /policy/reload (the README promises it). Only the errors
	// about [policy] are recorded there; a reload refused for anything
	// else (a syntax error, another section, a restart-only change) is
	// not a policy error and leaves the report alone.
	if perr := policyErrors(err); perr != nil {
		r.guard.ReloadFailed(perr)
	}
	return nil, err
}

// applied finishes a reload that Server.Reload accepted.
func (r *reloader) applied(next *config.Config, changed []string) []string {
	// The file's policy goes to the guard on every reload, changed or
	// not: POST /policy/reload may have put another in force since the
	// snapshot Changed compared with, and a full reload of a file that
	// had reverted it left the guard on the other (found by review: KEYS
	// stayed allowed after the file denied it again and /reload said OK).
	p := next.Policy
	inForce := r.guard.LoadedConfig()
	r.staged.Store(&p)
	if err := r.guard.Reload(); err != nil {
		// Compiled by Reload already; only a file changed under us gets
		// here, and the guard kept its policy.
		r.log.Warn("policy not reloaded", "err", err)
	} else if !reflect.DeepEqual(inForce, p) && !policyChanged(changed) {
		// Changed compares with the last full reload's snapshot; a POST
		// /policy/reload since may have put another policy in force, which
		// this reload replaced: say so (found by review: the reply said
		// "nothing changed" while the naming rules went back to report).
		changed = append(changed, "policy (in force since POST /policy/reload)")
	}
	r.level.Set(logLevel(next.Server.LogLevel))
	return changed
}

// reloadAndLog is SIGHUP's action.
func (r *reloader) reloadAndLog() {
	changed, err := r.reload()
	switch {
	case errors.Is(err, errNoConfigFile), errors.Is(err, proxy.ErrShuttingDown):
		r.log.Warn("SIGHUP ignored: " + err.Error())
	case err != nil:
		r.logRefused(err)
	default:
		r.logApplied(changed, "SIGHUP")
		if note := r.guard.CapNote(); note != "" && policyChanged(changed) {
			r.log.Warn(note)
		}
	}
}

// logApplied logs an accepted reload, whichever way it came and whether or
// not it changed anything: an operator who reloaded and finds no line
// cannot tell a reload that changed nothing from one that never arrived
// (found by review: POST /reload logged only changes, SIGHUP changed="").
func (r *reloader) logApplied(changed []string, via string) {
	what := strings.Join(changed, ",")
	if what == "" {
		what = "nothing"
	}
	r.log.Info("configuration reloaded", "file", r.path, "via", via, "changed", what)
}

// policyChanged reports whether a reload's changed settings include the
// policy's.
func policyChanged(changed []string) bool {
	return slices.ContainsFunc(changed, func(c string) bool { return strings.HasPrefix(c, "policy") })
}

// handler serves POST /reload: 200 with the changed settings; 409 without
// a configuration file; 503 once the proxy is shutting down; 422 with the reasons when the file is invalid or
// changes a setting that needs a restart (nothing is applied then).
func (r *reloader) handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		changed, err := r.reload()
		switch {
		case errors.Is(err, errNoConfigFile):
			http.Error(w, err.Error(), http.StatusConflict)
		case errors.Is(err, proxy.ErrShuttingDown):
			http.Error(w, "configuration not reloaded: "+err.Error(), http.StatusServiceUnavailable)
		case err != nil:
			r.logRefused(err)
			http.Error(w, "configuration not reloaded; the configuration in force stays:\n"+err.Error(), http.StatusUnprocessableEntity)
		case len(changed) == 0 && usesTLS(r.srv.Config()):
			r.logApplied(changed, "POST /reload")
			fmt.Fprintln(w, "configuration reloaded: no setting changed; TLS certificate files were read again")
		case len(changed) == 0:
			r.logApplied(changed, "POST /reload")
			fmt.Fprintln(w, "configuration reloaded: nothing changed")
		default:
			r.logApplied(changed, "POST /reload")
			fmt.Fprintf(w, "configuration reloaded; changed:\n%s\n", strings.Join(changed, "\n"))
			if note := r.guard.CapNote(); note != "" && policyChanged(changed) {
				fmt.Fprintln(w, note)
			}
		}
	})
}

// logRefused logs a reload that was refused, a line per problem: the
// problems of a file come joined by newlines, which a log handler escapes
// into one long line (found by a user's trial).
func (r *reloader) logRefused(err error) {
	problems := strings.Split(strings.TrimSpace(err.Error()), "\n")
	attrs := []any{"file", r.path}
	if len(problems) > 1 && strings.HasSuffix(problems[0], ":") {
		// A heading ("settings that need a restart changed ...:") goes
		// with each problem under it, not in a line of its own as
		// problem 1 (a user's trial).
		attrs = append(attrs, "reason", strings.TrimSuffix(problems[0], ":"))
		problems = problems[1:]
	}
	for i, p := range problems {
		r.log.Error("configuration not reloaded; the configuration in force stays",
			append(attrs, "problem", p, "problem_no", i+1, "problems", len(problems))...)
	}
}

func usesTLS(c *config.Config) bool { return c.Server.TLS.Enabled() || c.Upstream.TLS != nil }

// policyErrors returns the errors in err's tree about the [policy]
// section (config.Error keys under "policy", or a policy.Error from
// compiling it), joined, or nil if there is none.
func policyErrors(err error) error {
	var out []error
	var walk func(error)
	walk = func(e error) {
		switch x := e.(type) {
		case nil:
		case *config.Error:
			if x.Key == "policy" || strings.HasPrefix(x.Key, "policy.") || strings.HasPrefix(x.Key, "policy[") {
				out = append(out, x)
			}
		case *policy.Error:
			out = append(out, x)
		case interface{ Unwrap() []error }:
			for _, c := range x.Unwrap() {
				walk(c)
			}
		case interface{ Unwrap() error }:
			walk(x.Unwrap())
		}
	}
	walk(err)
	return errors.Join(out...)
}
