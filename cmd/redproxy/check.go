package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/redproxy/redproxy/internal/admin"
	"github.com/redproxy/redproxy/internal/auth"
	"github.com/redproxy/redproxy/internal/commands"
	"github.com/redproxy/redproxy/internal/config"
	"github.com/redproxy/redproxy/internal/policy"
)

// Exit codes of redproxy check, as nginx -t: a script can gate a deploy or
// a reload on them.
const (
	checkOK  = 0
	checkBad = 2 // usage error or invalid configuration
)

const checkUsage = `usage: redproxy check --config FILE [--listen ADDR] [--upstream ADDR] [--admin ADDR]
                      [--log-level LEVEL] [--policy-mode MODE] [--local-tier on|off]
                      [--allow-unauthenticated] [--admin-token-file FILE]

Validates FILE (and the given flags and REDPROXY_* variables, which
override it as they do when the proxy runs), and what the proxy would
refuse to start with (an exposed listener or admin port without
authentication), without starting anything, and prints the effective settings,
every default filled in, as TOML on stdout; upstream.password is shown as
"<redacted>". Nothing is dialled or bound: an address in use or an
unreachable Redis is not detected.

Exit status: 0 valid; 2 usage error or invalid configuration, with one
"file:line: key: reason" line per problem on stderr.

`

// runCheck implements "redproxy check".
func runCheck(argv []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("redproxy check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, checkUsage)
		fs.PrintDefaults()
	}
	configPath := fs.String("config", "", "TOML configuration file to check (required)")
	ov := overrideFlags(fs)
	// Checked as the proxy checks it (found by a probe: check passed
	// REDPROXY_POLICY_MODE=bogus, which the proxy then refused to start
	// with, and refused --policy-mode as an unknown flag).
	policyMode := policyModeFlag(fs)
	if err := fs.Parse(argv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0 // as redproxy --help
		}
		return checkBad
	}
	// The REDPROXY_* variables stand in for the flags here as when the
	// proxy runs (found by review: in the image, which sets
	// REDPROXY_LISTEN and REDPROXY_ADMIN, check printed addresses the
	// proxy did not use).
	fromEnv, err := applyEnv(fs, lookupEnv)
	if err != nil {
		fmt.Fprintf(stderr, "redproxy check: %v\n", err)
		return checkBad
	}
	ov.Sources = envSources(fromEnv)
	forced, err := parsePolicyMode(*policyMode, fromEnv)
	if err != nil {
		fmt.Fprintf(stderr, "redproxy check: %v\n", err)
		return checkBad
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "redproxy check: unexpected argument %q\n", fs.Arg(0))
		return checkBad
	}
	if *configPath == "" {
		fmt.Fprintln(stderr, "redproxy check: --config FILE is required")
		fs.Usage()
		return checkBad
	}
	cfg, err := config.Load(*configPath)
	if err == nil {
		cfg, err = cfg.Apply(*ov)
	}
	if err == nil {
		// Validate checks the section; compiling catches what only the
		// guard would notice at startup.
		_, err = policy.Compile(cfg.Policy)
	}
	if err == nil {
		// What the proxy refuses to start with (found by review: check
		// passed an exposed listener with no users, or an exposed admin
		// port with no token, which the proxy then refused).
		err = startRefusal(cfg, *configPath, ov)
	}
	if err != nil {
		fmt.Fprintf(stderr, "%v\nredproxy check: %s: configuration is invalid\n", err, *configPath)
		return checkBad
	}
	out, err := cfg.Effective()
	if err != nil {
		fmt.Fprintf(stderr, "redproxy check: %v\n", err)
		return checkBad
	}
	fmt.Fprintf(stdout, "# Effective configuration of %s, every default filled in.\n", *configPath)
	if forced != policy.Enforce {
		// The cap is no setting of the file's, so it is said here: the
		// output showed the file's mode alone, as if it were in force
		// (found by a probe).
		fmt.Fprintf(stdout, "# --policy-mode %s caps every policy rule below: %s.\n", forced, policyCapMeaning[forced])
	}
	stdout.Write(out)
	fmt.Fprintf(stderr, "redproxy check: %s: configuration is valid\n", *configPath)
	return checkOK
}

// overrideFlags registers the flags that override the file, shared by the
// proxy and check so both read a configuration the same way.
func overrideFlags(fs *flag.FlagSet) *config.Overrides {
	var ov config.Overrides
	fs.StringVar(&ov.Listen, "listen", "", "client address to listen on (default from config: 127.0.0.1:6380)")
	fs.StringVar(&ov.Upstream, "upstream", "", `Redis address host:port, or "embedded" for the in-process demo store (upstream.mode = "standalone" only)`)
	// A Func flag, because an explicitly empty --admin ("" turns the admin
	// server off) must differ from no --admin at all.
	fs.Func("admin", `admin HTTP address for /metrics, /healthz, /readyz (default 127.0.0.1:9121); "" turns it off`, func(s string) error {
		ov.Admin, ov.NoAdmin = s, s == ""
		return nil
	})
	fs.StringVar(&ov.LogLevel, "log-level", "", "debug, info, warn or error")
	fs.StringVar(&ov.LocalTier, "local-tier", "", "on or off: override localcache.enabled (the local tier of hot keys)")
	fs.Var(explicitBool{&ov.AllowUnauthenticated, &ov.NoAllowUnauthenticated}, "allow-unauthenticated",
		"let a listener that is not loopback start with no [[users]] and no upstream password (server.allow_unauthenticated); =false turns it off whatever the file says")
	fs.StringVar(&ov.AdminTokenFile, "admin-token-file", "", "file with the bearer token the admin endpoint requires (admin.token_file)")
	return &ov
}

// policyCapMeaning says what a --policy-mode below enforce does.
var policyCapMeaning = map[policy.Action]string{
	policy.Report: "violations are logged and counted, nothing is refused or fixed",
	policy.Off:    "no rule acts",
}

// policyModeFlag registers --policy-mode, for the proxy and for check.
func policyModeFlag(fs *flag.FlagSet) *string {
	return fs.String("policy-mode", "enforce", "cap every policy rule: enforce (rules act as configured), report (log and count, refuse nothing) or off")
}

// parsePolicyMode reads --policy-mode's value; an error names the flag or
// the variable, as the operator set it (a user's trial set the variable
// and was told of a flag it never gave).
func parsePolicyMode(mode string, fromEnv map[string]bool) (policy.Action, error) {
	forced, err := policy.ParseAction(mode)
	if err != nil {
		what := "--policy-mode"
		if fromEnv["policy-mode"] {
			what = envName("policy-mode")
		}
		return forced, fmt.Errorf("%s: %w", what, err)
	}
	return forced, nil
}

// startRefusal is why the proxy would refuse to start with cfg, nil if it
// would start: a client listener exposed without authentication, an admin
// endpoint exposed without its token (read from admin.token_file, as at
// start).
func startRefusal(cfg *config.Config, path string, ov *config.Overrides) error {
	if _, err := exposureRefusal(cfg, path, ov); err != nil {
		return fmt.Errorf("%w (the proxy would refuse to start)", err)
	}
	// The users' upstream password files are read at start (found by
	// review: check passed a file that did not exist).
	if _, err := auth.New(cfg.Users, commands.Builtin()); err != nil {
		return fmt.Errorf("%w (the proxy would refuse to start)", usersError(err, path))
	}
	return nil
}

// exposureRefusal is why cfg, read from path ("" for flags alone) with
// the overrides ov, must not start for what it exposes: a client listener
// without authentication, an admin endpoint without its token. It reads
// file:line: key: reason, as every other problem does, or names the flag
// that set the key (a file line would point at a value not in force).
// Otherwise it returns the admin endpoint's token, read from
// admin.token_file ("" for none).
func exposureRefusal(cfg *config.Config, path string, ov *config.Overrides) (adminToken string, err error) {
	locate := func(e *config.Error) error {
		if f := ov.FlagFor(e.Key); f != "" {
			flagged := *e
			flagged.Key += " (" + f + ")"
			return &flagged
		}
		if path == "" {
			return e
		}
		return config.Locate(e, path)
	}
	if err := config.ExposureError(cfg); err != nil {
		var e *config.Error
		if errors.As(err, &e) {
			return "", locate(e)
		}
		return "", err
	}
	if cfg.Server.Admin != "" {
		token, err := admin.Token(cfg.Server.Admin, cfg.Admin.TokenFile, config.IsLoopback(cfg.Server.Admin))
		if err != nil {
			return "", locate(tokenError(err))
		}
		return token, nil
	}
	return "", nil
}

// tokenError is admin.Token's error as a configuration error, for
// file:line: key: reason.
func tokenError(err error) *config.Error {
	key, msg := "admin.token_file", err.Error()
	if errors.Is(err, admin.ErrTokenRequired) {
		key = "server.admin"
	} else if m, ok := strings.CutPrefix(msg, key+": "); ok {
		msg = m
	} else {
		msg = strings.TrimPrefix(msg, key+" ")
	}
	return &config.Error{Key: key, Msg: msg}
}

// usersError is auth.New's error located in path, as file:line: key:
// reason; other errors as they are.
func usersError(err error, path string) error {
	var ae *auth.Error
	if errors.As(err, &ae) && path != "" {
		return config.Locate(&config.Error{Key: ae.Key, Msg: ae.Msg}, path)
	}
	return err
}

// explicitBool is a boolean flag that records an explicit false apart from
// its absence: --allow-unauthenticated=false must override the file's true.
type explicitBool struct{ on, off *bool }

func (b explicitBool) IsBoolFlag() bool { return true }

func (b explicitBool) String() string {
	if b.on != nil && *b.on {
		return "true"
	}
	return "false"
}

func (b explicitBool) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return err
	}
	*b.on, *b.off = v, !v
	return nil
}
