// Command redproxy is a Redis-protocol caching proxy: clients point at it
// instead of Redis and nothing changes but the port.
//
//	redproxy [--config FILE] [--listen ADDR] [--upstream ADDR|embedded] [--admin ADDR] [--log-level LEVEL] [--policy-mode MODE] [--local-tier on|off] [--require-upstream]
//	redproxy audit --upstream ADDR [--config FILE] [--json] ...   (see audit.go)
//	redproxy healthcheck [--ready] [--admin ADDR] [--config FILE]  (see healthcheck.go)
//	redproxy check --config FILE [flags]   validate, print the effective settings (check.go)
//
// Every flag can also come from the environment as REDPROXY_ and the flag's
// name in capitals with '_' for '-' (REDPROXY_UPSTREAM, REDPROXY_CONFIG,
// REDPROXY_LISTEN, REDPROXY_ADMIN, ...); a flag on the command line wins.
//
// With neither an upstream nor a config file, the proxy uses a Redis on
// 127.0.0.1:6379 if one answers, else the embedded demo store; with
// --require-upstream (REDPROXY_REQUIRE_UPSTREAM=1, set in the container
// image) it refuses to start instead, so it never silently runs on the demo
// store. --upstream embedded still asks for the demo store explicitly.
//
// SIGHUP and POST /reload re-read --config and apply every setting that can
// change at run time (reload.go); an invalid file, or a change to a setting
// that needs a restart, keeps the configuration in force. POST
// /policy/reload re-reads only the [policy] section.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/admin"
	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/metrics"
	"github.com/redproxy/redproxy/internal/policy"
	"github.com/redproxy/redproxy/internal/proxy"
)

const mainUsage = `usage: redproxy [flags]              run the proxy
       redproxy check --config FILE  check a configuration, print it with defaults filled in
       redproxy healthcheck          ask a running proxy's /healthz (--ready: /readyz), for a container
       redproxy audit --upstream ADDR   scan a Redis for keys the policy would flag

Each subcommand takes --help. Every flag below but --version can also be set in the environment as
REDPROXY_<FLAG> (REDPROXY_UPSTREAM, REDPROXY_LOG_LEVEL, ...); a flag on the command
line wins. Without --config or --upstream the proxy tries 127.0.0.1:6379, then the
in-process demo store.

flags:
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is main without os.Exit, so tests can drive it.
func run(argv []string, stdout, stderr io.Writer) int {
	if len(argv) > 0 {
		switch argv[0] {
		case "audit":
			return runAudit(argv[1:], stdout, stderr)
		case "check":
			return runCheck(argv[1:], stdout, stderr)
		case "healthcheck":
			return runHealthcheck(argv[1:], stdout, stderr)
		case "help":
			// What people type first, as with go or git (a probe's
			// "redproxy help" got "unexpected argument"); "help check"
			// is "check --help".
			if len(argv) > 1 && argv[1] != "help" {
				return run([]string{argv[1], "--help"}, stdout, stderr)
			}
			return run([]string{"--help"}, stdout, stderr)
		case "version":
			return run([]string{"--version"}, stdout, stderr)
		}
	}
	// Registered first: a SIGHUP's default action is to exit, and a
	// config manager may send one as soon as the process exists (found by
	// a probe: a SIGHUP within 20 ms of the start, before this was
	// registered after the upstream probe, killed the proxy). One sent
	// before the proxy serves waits in the channel and reloads once it
	// does, which picks up a file rewritten meanwhile.
	hups := make(chan os.Signal, 1)
	signal.Notify(hups, syscall.SIGHUP)
	defer signal.Stop(hups)
	// SIGINT and SIGTERM too: registered once the listeners served, a
	// SIGTERM sent as soon as the port answered killed the process
	// outright instead of shutting it down (found by a test in CI). One
	// sent while starting shuts the proxy down once it serves.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)

	fs := flag.NewFlagSet("redproxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "TOML configuration file (see config.example.toml)")
	ovp := overrideFlags(fs)
	policyMode := policyModeFlag(fs)
	requireUpstream := fs.Bool("require-upstream", false, `refuse to start without --upstream or --config instead of trying 127.0.0.1:6379 and then the embedded store`)
	version := fs.Bool("version", false, "print the version and exit")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), mainUsage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(argv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *version {
		fmt.Fprintf(stdout, "redproxy %s (%s)\n", proxy.BuildVersion(), runtime.Version())
		return 0
	}
	fromEnv, err := applyEnv(fs, lookupEnv)
	if err != nil {
		fmt.Fprintf(stderr, "redproxy: %v\n", err)
		return 2
	}
	forced, err := parsePolicyMode(*policyMode, fromEnv)
	if err != nil {
		fmt.Fprintf(stderr, "redproxy: %v\n", err)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "redproxy: unexpected argument %q\n", fs.Arg(0))
		return 2
	}

	cfg := config.Default()
	if *configPath != "" {
		if cfg, err = config.Load(*configPath); err != nil {
			fmt.Fprintf(stderr, "redproxy: bad configuration:\n%v\n", err)
			return 2
		}
	}
	ov := *ovp
	ov.Sources = envSources(fromEnv)
	cfg, err = cfg.Apply(ov)
	if err != nil {
		fmt.Fprintf(stderr, "redproxy: bad configuration:\n%v\n", err)
		return 2
	}
	// Refused before anything is dialled, with the file and line: the
	// upstream's warnings came first and buried the reason, which named
	// no line (found by a probe).
	adminToken, err := exposureRefusal(cfg, *configPath, &ov)
	if err != nil {
		fmt.Fprintf(stderr, "redproxy: refusing to start: %v\n", err)
		return 2
	}
	// The users' upstream password files, read again by the server: a
	// missing one refused the start only after the upstream was dialled,
	// its warnings first, and without the file's line (found by a probe).
	// (Only those: the ACLs are checked against the upstream's command
	// table, which may know commands the built-in one does not.)
	var ae *auth.Error
	if _, err := auth.New(cfg.Users, commands.Builtin()); errors.As(err, &ae) && strings.HasSuffix(ae.Key, ".upstream_password_file") {
		fmt.Fprintf(stderr, "redproxy: refusing to start: %v\n", usersError(err, *configPath))
		return 2
	}
	level := new(slog.LevelVar)
	level.Set(logLevel(cfg.Server.LogLevel))
	log := newLogger(cfg, level, stderr)
	slog.SetDefault(log)
	// go-redis (the control plane: command table, Sentinel, tracking,
	// scans) logs its own retries with the standard logger, which would
	// put unstructured lines among the JSON ones.
	redis.SetLogger(goRedisLogger{log.With("component", "go-redis")})

	// With neither a config file nor --upstream, the quick start should just
	// work: use a local Redis if one answers, else the embedded store. An
	// address the operator chose is never silently replaced. Where that
	// guess is wrong (a container, where 127.0.0.1 is the container itself),
	// --require-upstream makes a missing upstream an error.
	upstreamAddr := cfg.Upstream.Address
	seedAnswered := false // a cluster seed answered the PING below
	if cfg.Upstream.Mode == config.ModeCluster {
		// The command table and version come from a seed node: the first
		// to answer a PING, so that a first seed down or hung does not
		// leave the proxy on the built-in table (and hold the start back
		// by COMMAND's timeout) while the others could tell. The PING goes
		// in plaintext: behind TLS the first seed is asked.
		upstreamAddr = cfg.Upstream.Seeds[0]
		if cfg.Upstream.TLS == nil {
			if a := answering(cfg.Upstream.Seeds, 500*time.Millisecond); a != "" {
				upstreamAddr, seedAnswered = a, true
			}
		}
	}
	if *configPath == "" && ov.Upstream == "" {
		if *requireUpstream {
			fmt.Fprintf(stderr, "redproxy: no upstream given (--require-upstream): set --upstream or %s to your Redis as host:port, "+
				"or to %q for the in-process demo store, or give a file with --config or %s\n",
				envName("upstream"), config.EmbeddedAddress, envName("config"))
			return 2
		}
		if !redisAnswers(upstreamAddr) {
			log.Warn("no Redis answers at the default address; using the embedded store", "address", upstreamAddr)
			upstreamAddr = config.EmbeddedAddress
		}
	}
	embedded := upstreamAddr == config.EmbeddedAddress
	if embedded {
		mr, err := startEmbedded()
		if err != nil {
			fmt.Fprintf(stderr, "redproxy: cannot start the embedded store: %v\n", err)
			return 1
		}
		defer mr.Close()
		upstreamAddr = mr.Addr()
		log.Warn("EMBEDDED UPSTREAM: an in-process store for trying redproxy out; data is lost on exit and it is not Redis. Set --upstream to a real Redis for anything else.", "address", upstreamAddr)
		if cfg.LocalCache.Enabled {
			// The tier is kept coherent by CLIENT TRACKING, which the
			// embedded store lacks; without it the tier would never serve
			// and its connections would retry forever.
			log.Warn("local tier disabled: the embedded store has no CLIENT TRACKING")
			ov.LocalTier = "off" // and so on every reload
			if cfg, err = cfg.Apply(config.Overrides{LocalTier: "off"}); err != nil {
				fmt.Fprintf(stderr, "redproxy: %v\n", err)
				return 2
			}
		}
	}

	var sentinels *proxy.SentinelStart
	if cfg.Upstream.Mode == config.ModeSentinel {
		// The command table and version are read from the primary; if
		// none is known yet, the proxy starts not ready and follows the
		// Sentinels from there, with the watcher that asked them now.
		sentinels = proxy.FindSentinelPrimary(cfg, log)
		upstreamAddr = sentinels.Primary
	}

	reg := metrics.New()
	// The embedded store's COMMAND reply is its own approximation; the
	// built-in table describes the Redis it stands in for.
	table, answered, standIn := commands.Builtin(), false, false
	if !embedded && upstreamAddr != "" {
		table, answered, standIn = loadCommandTable(cfg, upstreamAddr, log)
	}
	// A Redis that did not answer COMMAND, and does not answer a PING
	// within silentPingWait either (refused, or accepted and stayed
	// silent), is not waited for again by the pools: the proxy listens
	// and is not ready until Redis answers. One that answers PING was only
	// slow with COMMAND's 200 KB (a slow link) or busy for a while (a
	// fork, a long command at start: DEBUG SLEEP 4 was taken for silence
	// with a 500 ms PING, found by review): its pools are waited for as
	// usual, or the first clients would be told it is unavailable. PING
	// goes in plaintext, so behind TLS the pools are always waited for.
	// In cluster mode every seed is asked (at once), unless one answered
	// the PING that chose the seed: one that answers gives the router its
	// slot map, which is then waited for as usual.
	probed := []string{upstreamAddr}
	if cfg.Upstream.Mode == config.ModeCluster {
		probed = cfg.Upstream.Seeds
	}
	silent := upstreamAddr != "" && !embedded && !answered && cfg.Upstream.TLS == nil && !seedAnswered &&
		!anyAnswersWithin(probed, min(cfg.Upstream.DialTimeout.Duration, silentPingWait))
	// A Redis that did not answer COMMAND (down, silent, too slow) or
	// refused it for a while (BUSY with a script, LOADING) has its table
	// read once a dial reaches it; one that refused it otherwise (an ACL
	// without COMMAND) would answer the same again. Before, the built-in
	// table was taken for its own for good: a proxy started before its
	// Redis (a container started first) never read the table.
	srv, err := proxy.NewServer(proxy.Options{Config: cfg, Table: table, TableStandIn: standIn, Logger: log, Metrics: reg,
		UpstreamAddr: upstreamAddr, UpstreamSilent: silent, Sentinel: sentinels})
	if err != nil {
		fmt.Fprintf(stderr, "redproxy: %v\n", usersError(err, *configPath))
		return 2
	}
	// A Redis that did not answer COMMAND is not asked its version: that
	// would hold the listener back by another dial timeout. Otherwise
	// (started before Redis) the pools' first dials that reach it tell
	// the version (proxy.Server.mainBackendOptions), as they do after a
	// reload or failover; until then HELLO and INFO say the built-in
	// table's.
	if upstreamAddr != "" && (answered || embedded) {
		if v := upstreamVersion(cfg, upstreamAddr); v != "" {
			srv.SetUpstreamVersion(v)
		}
	}
	g := srv.Guard()
	g.SetForcedMode(forced)
	rl := &reloader{path: *configPath, ov: ov, srv: srv, guard: g, level: level, log: log}
	rl.registerMetrics(reg.Registry)
	if *configPath != "" {
		g.SetSource(rl.policySource)
	}
	if forced != policy.Enforce {
		log.Warn("--policy-mode caps every policy rule", "policy_mode", forced.String())
	}
	// Every client listener: server.listen ("plain"), server.tls.listen
	// ("tls") and [[server.listeners]]; config.Validate makes sure there is
	// at least one.
	type boundListener struct {
		cfg config.Listener
		ln  net.Listener
	}
	var bound []boundListener
	for _, lc := range cfg.ClientListeners() {
		ln, err := net.Listen("tcp", lc.Listen)
		if err != nil {
			for _, b := range bound {
				b.ln.Close()
			}
			fmt.Fprintf(stderr, "redproxy: cannot listen on %s (listener %q): %v\n", lc.Listen, lc.Name, err)
			return 1
		}
		bound = append(bound, boundListener{lc, ln})
	}
	var adm *admin.Server
	if cfg.Server.Admin != "" {
		aln, err := net.Listen("tcp", cfg.Server.Admin)
		if err != nil {
			fmt.Fprintf(stderr, "redproxy: cannot listen on %s (server.admin): %v\n", cfg.Server.Admin, err)
			return 1
		}
		adm = newAdmin(srv, reg, rl.handler(), log)
		adm.SetToken(adminToken)
		rl.setAdmin(adm, adminToken)
		go adm.Serve(aln)
		log.Info("admin listening", "addr", aln.Addr().String())
	}
	served := make(chan error, len(bound))
	for _, b := range bound {
		attrs := []any{"listener", b.cfg.Name, "addr", b.ln.Addr().String(), "tls", b.cfg.TLS, "upstream", upstreamAddr, "upstream_tls", cfg.Upstream.TLS != nil}
		if b.cfg.TLS {
			attrs = append(attrs, "mutual_tls", b.cfg.ClientCAFile != "", "min_version", cfg.Server.TLS.MinVersion)
		}
		if b.cfg.UsesProxyProtocol() {
			attrs = append(attrs, "proxy_protocol", true)
		}
		msg := "redproxy listening"
		if b.cfg.TLS {
			msg = "redproxy listening for TLS clients"
		}
		log.Info(msg, append(attrs, "commands", table.Len())...)
		go func() { served <- srv.ServeListener(b.cfg.Name, b.ln) }()
	}

wait:
	for {
		select {
		case <-hups:
			rl.reloadAndLog()
		case sig := <-sigs:
			cfg = srv.Config() // shutdown_timeout may have been reloaded
			// As text: JSON logs showed a Duration in nanoseconds.
			log.Info("shutting down", "signal", sig.String(), "timeout", cfg.Server.ShutdownTimeout.Duration)
			break wait
		case err := <-served:
			log.Error("listener failed", "err", err)
			return 1
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Server.ShutdownTimeout.Duration)
	defer cancel()
	// The Redis side first: its listeners close at once and its clients
	// get the whole shutdown_timeout. The admin endpoint keeps serving
	// meanwhile (/readyz answers 503 from now on, /healthz ok), then is
	// closed hard: admin requests are no reason to wait. It used to be shut
	// down gracefully first, so a CPU profile in flight (30s) kept the
	// client listener accepting until the timeout, which then left the
	// clients no time at all (found by review).
	// A SIGHUP while clients drain is refused (Server.Reload answers
	// ErrShuttingDown) and logged so, as README "Reloading" says, rather
	// than left unread (found by review).
	stopHups := make(chan struct{})
	hupsDone := make(chan struct{})
	go func() {
		defer close(hupsDone)
		for {
			select {
			case <-hups:
				rl.reloadAndLog()
			case <-stopHups:
				return
			}
		}
	}()
	if err := srv.Shutdown(ctx); err != nil {
		log.Warn("clients still busy at the shutdown timeout were closed", "shutdown_timeout", cfg.Server.ShutdownTimeout.Duration)
	}
	close(stopHups)
	<-hupsDone
	if adm != nil {
		adm.Close()
	}
	log.Info("stopped")
	return 0
}

// newAdmin builds the admin HTTP server with every endpoint the proxy has.
// reload serves POST /reload (every setting a reload may change).
func newAdmin(srv *proxy.Server, reg *metrics.Metrics, reload http.Handler, log *slog.Logger) *admin.Server {
	g := srv.Guard()
	adm := admin.New(reg.Registry, srv.Ready, log)
	adm.Handle("GET /policy/report", g.ReportHandler())
	adm.Handle("DELETE /policy/report", g.ReportHandler())
	adm.Handle("POST /policy/reload", g.ReloadHandler())
	adm.Handle("POST /reload", reload)
	adm.Handle("GET /debug/hotkeys", srv.HotKeysHandler())
	adm.Handle("GET /debug/mirror", srv.MirrorHandler())
	slow := srv.SlowlogHandler()
	adm.Handle("GET /debug/slowlog", slow)
	adm.Handle("DELETE /debug/slowlog", slow)
	return adm
}

// newLogger builds the logger; level is shared so a reload can change
// server.log_level (the format needs a restart).
func newLogger(cfg *config.Config, level *slog.LevelVar, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if cfg.Server.LogFormat == "json" {
		opts.ReplaceAttr = durationAsText
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// durationAsText writes a duration as the text format does ("1.5s"): the
// JSON handler's own form is an integer of nanoseconds, which a reader of
// "down_for": 1500000000 has to know, and which lines that logged a
// duration's text already did not use.
func durationAsText(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	return a
}

// goRedisLogger passes go-redis's messages to the proxy's log. They are
// retries and pool events the proxy reports itself when they matter (an
// upstream it cannot dial, a Sentinel that does not answer), so they are
// logged at debug.
type goRedisLogger struct{ log *slog.Logger }

func (l goRedisLogger) Printf(ctx context.Context, format string, v ...any) {
	if l.log.Enabled(ctx, slog.LevelDebug) {
		l.log.DebugContext(ctx, strings.TrimSpace(fmt.Sprintf(format, v...)))
	}
}

func logLevel(name string) slog.Level {
	switch strings.ToLower(name) {
	case "debug":
		return slog.LevelDebug
	case "warn":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	}
	return slog.LevelInfo
}

func controlClient(cfg *config.Config, addr string) *redis.Client {
	return proxy.ControlClient(cfg, addr, upstreamTLS(cfg))
}

// upstreamTLS is [upstream.tls] for the go-redis clients main and audit
// open to Redis (the proxy's own connections get it in proxy.NewServer).
// The files were read when the configuration was validated; if one became
// unreadable since, the client gets a configuration that trusts no one, so
// its dials fail instead of falling back to plaintext (and sending the
// password in clear).
func upstreamTLS(cfg *config.Config) *tls.Config {
	c, err := cfg.Upstream.ClientTLS()
	if err != nil {
		slog.Warn("upstream TLS files unreadable", "err", err)
		return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: x509.NewCertPool()}
	}
	return c
}

// probeReplyTimeout bounds the wait for a reply to the start's probes
// (COMMAND, INFO).
const probeReplyTimeout = proxy.ControlReplyTimeout

// silentPingWait bounds the PING that tells a silent Redis from a busy one
// after COMMAND timed out (or dial_timeout, if shorter): with it a silent
// Redis holds the listener back about 5 s, and a Redis busy for less than
// that at start is waited for.
const silentPingWait = 2 * time.Second

func redisAnswers(addr string) bool { return redisAnswersWithin(addr, 500*time.Millisecond) }

// redisAnswersWithin is redisAnswers giving the reply wait time.
func redisAnswersWithin(addr string, wait time.Duration) bool {
	nc, err := net.DialTimeout("tcp", addr, 300*time.Millisecond)
	if err != nil {
		return false
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(wait))
	if _, err := nc.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		return false
	}
	buf := make([]byte, 64)
	n, _ := nc.Read(buf)
	// Any RESP reply (even -NOAUTH) means a Redis is there.
	return n > 0 && (buf[0] == '+' || buf[0] == '-')
}

// anyAnswersWithin is redisAnswersWithin asking every address at once,
// true when one answers.
func anyAnswersWithin(addrs []string, wait time.Duration) bool {
	return answering(addrs, wait) != ""
}

// answering asks every address at once and returns the first to answer,
// "" when none does within wait.
func answering(addrs []string, wait time.Duration) string {
	answers := make(chan string, len(addrs))
	for _, a := range addrs {
		go func() {
			if !redisAnswersWithin(a, wait) {
				a = ""
			}
			answers <- a
		}()
	}
	for range addrs {
		if a := <-answers; a != "" {
			return a
		}
	}
	return ""
}

// loadCommandTable asks the upstream for its command table, so commands of
// a newer Redis or of modules are classified correctly, and falls back to
// the built-in table when that fails (answered false).
//
// standIn says the built-in table stands in for one Redis would give later
// (proxy.Options.TableStandIn): no answer, or a refusal that may pass
// (BUSY, LOADING: proxy.TableErrorPasses).
func loadCommandTable(cfg *config.Config, addr string, log *slog.Logger) (t *commands.Table, answered, standIn bool) {
	c := controlClient(cfg, addr)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*cfg.Upstream.DialTimeout.Duration)
	defer cancel()
	t, err := commands.Load(ctx, c)
	if err != nil {
		log.Warn("using the built-in command table", "reason", err, "builtin_version", commands.BuiltinRedisVersion)
		// An error reply (an ACL without COMMAND) or one the table could
		// not be read from is an answer.
		var reply redis.Error
		return commands.Builtin(), errors.As(err, &reply) || errors.Is(err, commands.ErrBadReply), proxy.TableErrorPasses(err)
	}
	return t, true, false
}

func upstreamVersion(cfg *config.Config, addr string) string {
	c := controlClient(cfg, addr)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Upstream.DialTimeout.Duration)
	defer cancel()
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			return v
		}
	}
	return ""
}
