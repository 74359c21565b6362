package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redproxy/redproxy/internal/audit"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/config/units"
	"github.com/redproxy/redproxy/internal/policy"
)

// Exit codes of redproxy audit, for scripts and CI.
const (
	auditClean      = 0 // no finding
	auditViolations = 1 // keys break a TTL or naming rule, or are big
	auditFailed     = 2 // bad usage, bad config, Redis unreachable, or the walk stopped early
)

const auditUsage = `usage: redproxy audit --upstream ADDR [--config FILE] [--db N] [--json]
                      [--count N] [--pause D] [--skip-memory] [--big-bytes N]

Walks a Redis keyspace with SCAN (never KEYS), a bounded COUNT per batch and a
pause between batches, and reports keys without a TTL, keys breaking the
[policy] rules of --config (a TTL rule requiring a TTL, a TTL above a rule's
max, the naming rules; the global rules, not a scope's) and big keys (MEMORY
USAGE above --big-bytes). Given a node of a Redis Cluster, it walks every
primary in turn, one report each (JSON: {"cluster": true, "nodes": [...]}).
SIGINT or SIGTERM stops the walk; the partial report is printed.

Exit status: 0 no findings; 1 findings (keys without TTL count only where a
TTL rule requires one); 2 usage, configuration or connection error, or the
walk stopped early (the partial report is still printed).

`

// runAudit implements "redproxy audit". The report goes to stdout; progress
// goes to stderr only when it is a terminal, so piped output stays clean.
func runAudit(argv []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("redproxy audit", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, auditUsage)
		fs.PrintDefaults()
	}
	upstream := fs.String("upstream", "", "Redis address host:port (default: upstream.address of --config, in standalone mode)")
	configPath := fs.String("config", "", "redproxy TOML configuration: its [policy] rules and upstream credentials")
	db := fs.Int("db", 0, "database to audit")
	asJSON := fs.Bool("json", false, "print the report as JSON instead of a table")
	count := fs.Int("count", audit.DefaultCount, "SCAN COUNT hint per batch; smaller batches hold Redis for less time")
	pause := fs.Duration("pause", audit.DefaultPause, "pause between batches (0 for none)")
	skipMemory := fs.Bool("skip-memory", false, "skip MEMORY USAGE (no big-key detection), e.g. when an ACL forbids it")
	var bigBytes units.ByteSize
	fs.Func("big-bytes", `big-key threshold, bytes or with a unit ("100KB"); default (or 0): the policy's max_value_bytes, else 100KB`,
		func(s string) error { return bigBytes.UnmarshalText([]byte(s)) })
	if err := fs.Parse(argv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return auditClean
		}
		return auditFailed
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "redproxy audit: unexpected argument %q\n", fs.Arg(0))
		return auditFailed
	}
	if *count <= 0 || *count > maxAuditCount || *pause < 0 || bigBytes < 0 || *db < 0 {
		// COUNT is bounded: SCAN COUNT 100000000 held Redis for 2 s in one
		// call, and each batch is a pipeline of two commands a key (found
		// by a probe).
		fmt.Fprintf(stderr, "redproxy audit: --count must be 1..%d, --pause, --big-bytes and --db must not be negative\n", maxAuditCount)
		return auditFailed
	}

	cfg := config.Default()
	if *configPath != "" {
		var err error
		if cfg, err = config.Load(*configPath); err != nil {
			fmt.Fprintf(stderr, "redproxy audit: bad configuration:\n%v\n", err)
			return auditFailed
		}
	}
	addr := *upstream
	if addr == "" && *configPath != "" {
		if m := cfg.Upstream.Mode; m != config.ModeStandalone {
			// upstream.address is not used in these modes: the audit
			// walked whatever it said, or the default 127.0.0.1:6379,
			// not the Redis the proxy serves (found by review).
			fmt.Fprintf(stderr, "redproxy audit: %s has upstream.mode = %q, which names no single Redis: give --upstream ADDR (the primary, or any node of a cluster: every primary is walked)\n", *configPath, m)
			return auditFailed
		}
		addr = cfg.Upstream.Address
	}
	if addr == "" || addr == config.EmbeddedAddress {
		fmt.Fprintln(stderr, "redproxy audit: --upstream ADDR is required (the Redis to audit)")
		return auditFailed
	}
	p, err := policy.Compile(cfg.Policy)
	if err != nil {
		fmt.Fprintf(stderr, "redproxy audit: bad policy:\n%v\n", err)
		return auditFailed
	}
	if p.Mode() == policy.Off {
		// Every rule is off: nothing judges the keys (found by a probe:
		// a clean report, exit 0, for 50,000 keys its rules would flag).
		fmt.Fprintf(stderr, "redproxy audit: [policy] mode is \"off\" in %s: no TTL or naming rule is checked; only keys without a TTL and big keys are reported\n", *configPath)
	}

	// go-redis logs dial retries itself; the audit reports the error once.
	redis.SetLogger(quietLogger{})
	client := func(addr string) *redis.Client {
		return redis.NewClient(&redis.Options{
			Addr: addr, Username: cfg.Upstream.Username, Password: cfg.Upstream.Password, DB: *db,
			TLSConfig:   upstreamTLS(cfg),
			DialTimeout: cfg.Upstream.DialTimeout.Duration, ReadTimeout: 30 * time.Second,
			MaxRetries: 2, PoolSize: 1, Protocol: 2, DisableIdentity: true,
		})
	}
	rdb := client(addr)
	defer rdb.Close()
	// SIGTERM too: what timeout(1), Kubernetes and CI runners send; the
	// partial report was lost to it (found by a probe).
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	pingCtx, cancel := context.WithTimeout(ctx, cfg.Upstream.DialTimeout.Duration+time.Second)
	err = rdb.Ping(pingCtx).Err()
	cancel()
	if err != nil {
		var refused redis.Error
		if errors.As(err, &refused) {
			// Reached, and refused: a database out of range, a password
			// (it said "cannot reach" for --db 99, found by a probe).
			fmt.Fprintf(stderr, "redproxy audit: Redis at %s refused the connection: %v\n", addr, err)
		} else {
			fmt.Fprintf(stderr, "redproxy audit: cannot reach Redis at %s: %v\n", addr, err)
		}
		return auditFailed
	}

	opts := audit.Options{Count: *count, Pause: *pause, SkipMemory: *skipMemory, BigKeyBytes: int64(bigBytes)}
	if opts.Pause == 0 {
		opts.Pause = -1 // audit.Options: negative means no pause, zero the default
	}
	var progress io.Writer
	if isTerminal(stderr) {
		progress = stderr
	}
	// A cluster node holds only its slots' keys: every primary is walked,
	// one report each (found by a probe: one node of three audited, and
	// the report said complete).
	primaries, err := clusterPrimaries(ctx, rdb, addr)
	switch {
	case errors.Is(err, errInfoRefused):
		fmt.Fprintf(stderr, "redproxy audit: INFO is refused at %s, so whether it is a cluster node is unknown: only its own keys are walked\n", addr)
	case err != nil:
		fmt.Fprintf(stderr, "redproxy audit: Redis at %s is a cluster node, and its primaries could not be listed: %v\n", addr, err)
		return auditFailed
	}
	type nodeReport struct {
		Address string        `json:"address"`
		Report  *audit.Report `json:"report"`
	}
	var reports []nodeReport
	var walkErr error
	if primaries == nil {
		rep, err := audit.Run(ctx, rdb, p, opts, progress)
		reports, walkErr = []nodeReport{{addr, rep}}, err
	} else {
		for _, node := range primaries {
			nc := client(node)
			rep, err := audit.Run(ctx, nc, p, opts, progress)
			nc.Close()
			reports = append(reports, nodeReport{node, rep})
			if err != nil {
				walkErr = fmt.Errorf("primary %s: %w", node, err)
				break
			}
		}
	}
	var out bytes.Buffer
	switch {
	case *asJSON && primaries == nil:
		b, err := reports[0].Report.JSON()
		if err != nil {
			fmt.Fprintf(stderr, "redproxy audit: %v\n", err)
			return auditFailed
		}
		out.Write(append(b, '\n'))
	case *asJSON:
		b, err := json.MarshalIndent(struct {
			Cluster bool         `json:"cluster"`
			Nodes   []nodeReport `json:"nodes"`
		}{true, reports}, "", "  ")
		if err != nil {
			fmt.Fprintf(stderr, "redproxy audit: %v\n", err)
			return auditFailed
		}
		out.Write(append(b, '\n'))
	default:
		for i, r := range reports {
			if primaries != nil {
				fmt.Fprintf(&out, "== cluster primary %s (%d of %d primaries)\n", r.Address, i+1, len(primaries))
			}
			r.Report.WriteText(&out)
		}
	}
	if _, err := stdout.Write(out.Bytes()); err != nil {
		// A report that could not be written is no clean run (found by
		// a probe: > /dev/full exited 0).
		fmt.Fprintf(stderr, "redproxy audit: writing the report: %v\n", err)
		return auditFailed
	}
	if walkErr != nil {
		fmt.Fprintf(stderr, "redproxy audit: the walk stopped early: %v\n", walkErr)
		return auditFailed
	}
	for _, r := range reports {
		if hasFindings(r.Report) {
			return auditViolations
		}
	}
	return auditClean
}

// maxAuditCount bounds --count.
const maxAuditCount = 10000

// clusterPrimaries lists the addresses of the primaries of the cluster rdb
// (at addr) is a node of, nil when it is not a cluster node. Every primary
// that holds slots is listed, whatever else its flags say (nofailover,
// fail?): one that cannot be walked fails the audit rather than leaving
// its keys out of a report that looks complete (found by review: "fail"
// matched nofailover). Redis prints an IPv6 node without brackets, and a
// node that has met no peer without its host (rdb's is used then).
func clusterPrimaries(ctx context.Context, rdb *redis.Client, addr string) ([]string, error) {
	info, err := rdb.Info(ctx, "cluster").Result()
	if err != nil {
		return nil, errInfoRefused
	}
	if !strings.Contains(info, "cluster_enabled:1") {
		return nil, nil
	}
	nodes, err := rdb.ClusterNodes(ctx).Result()
	if err != nil {
		return nil, err
	}
	ownHost, _, _ := net.SplitHostPort(addr)
	return primariesIn(nodes, ownHost)
}

// primariesIn is clusterPrimaries's reading of a CLUSTER NODES reply.
func primariesIn(nodes, ownHost string) ([]string, error) {
	var out []string
	for _, line := range strings.Split(nodes, "\n") {
		f := strings.Fields(line)
		if len(f) < 9 || !slices.Contains(strings.Split(f[2], ","), "master") {
			continue // a replica, or a primary without slots: no keys of its own
		}
		a := f[1]
		if i := strings.IndexAny(a, "@,"); i >= 0 {
			a = a[:i]
		}
		i := strings.LastIndexByte(a, ':')
		if i < 0 {
			return nil, fmt.Errorf("CLUSTER NODES lists a primary at %q", f[1])
		}
		host, port := strings.Trim(a[:i], "[]"), a[i+1:]
		if host == "" {
			host = ownHost
		}
		out = append(out, net.JoinHostPort(host, port))
	}
	if len(out) == 0 {
		return nil, errors.New("CLUSTER NODES lists no primary with slots")
	}
	slices.Sort(out)
	return out, nil
}

// errInfoRefused: INFO cluster was refused (the audit user's ACL), so
// whether the node is one of a cluster is unknown.
var errInfoRefused = errors.New("INFO cluster refused")

// hasFindings: keys without any TTL alone are not findings, because
// without a rule nothing says they need one (streams, for example).
func hasFindings(r *audit.Report) bool {
	for _, f := range r.TTL {
		if f.Count > 0 {
			return true
		}
	}
	for _, f := range r.Names {
		if f.Count > 0 {
			return true
		}
	}
	return r.BigKeys.Count > 0
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}
