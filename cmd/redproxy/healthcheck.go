package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/redproxy/redproxy/internal/config"
)

// runHealthcheck implements "redproxy healthcheck": it asks the admin
// server of a running proxy whether it is alive (/healthz) or, with --ready,
// whether it reaches Redis (/readyz), and exits 0 for yes and 1 for no, as
// a container HEALTHCHECK expects. The image has no shell or HTTP client,
// so the binary checks itself.
//
// The admin address is --admin, else REDPROXY_ADMIN, else server.admin of
// --config (or REDPROXY_CONFIG), else the default. A wildcard host
// (0.0.0.0, ::) is reached on loopback.
func runHealthcheck(argv []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("redproxy healthcheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	adminAddr := fs.String("admin", "", "admin address of the proxy to check (default: its --config's server.admin, else "+config.Default().Server.Admin+")")
	configPath := fs.String("config", "", "the proxy's configuration file, to find its admin address")
	ready := fs.Bool("ready", false, "check /readyz (the proxy reaches Redis) instead of /healthz (the proxy runs)")
	timeout := fs.Duration("timeout", 2*time.Second, "give up after this long")
	// Usage errors exit 1 too: a container HEALTHCHECK reserves 2 (found
	// by a probe).
	if err := fs.Parse(argv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0 // as redproxy --help
		}
		return 1
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "redproxy healthcheck: unexpected argument %q\n", fs.Arg(0))
		return 1
	}
	if *timeout <= 0 {
		fmt.Fprintf(stderr, "redproxy healthcheck: --timeout must be > 0, got %v\n", *timeout)
		return 1
	}
	if _, err := applyEnv(fs, lookupEnv, "admin", "config"); err != nil {
		fmt.Fprintf(stderr, "redproxy healthcheck: %v\n", err)
		return 1
	}
	addr := *adminAddr
	explicit := false
	fs.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "admin" })
	if addr == "" && explicit {
		// --admin "" (REDPROXY_ADMIN=) is how the proxy's admin server is
		// turned off; it asked the default address instead, and failed
		// with "connection refused" (found by the operations review).
		fmt.Fprintln(stderr, "redproxy healthcheck: the admin server is off (--admin \"\"); nothing to ask")
		return 1
	}
	if addr == "" {
		cfg := config.Default()
		if *configPath != "" {
			var err error
			if cfg, err = config.Load(*configPath); err != nil {
				fmt.Fprintf(stderr, "redproxy healthcheck: %v\n", err)
				return 1
			}
		}
		addr = cfg.Server.Admin
		if addr == "" {
			fmt.Fprintln(stderr, "redproxy healthcheck: the admin server is off (server.admin = \"\"); nothing to ask")
			return 1
		}
	}
	path := "/healthz"
	if *ready {
		path = "/readyz"
	}
	url := "http://" + dialable(addr) + path
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		fmt.Fprintf(stderr, "redproxy healthcheck: %v\n", err)
		return 1
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Fprintf(stderr, "redproxy healthcheck: %v\n", err)
		return 1
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(res.Body, 512))
	if res.StatusCode != http.StatusOK {
		fmt.Fprintf(stderr, "redproxy healthcheck: %s: %s: %s", url, res.Status, body)
		return 1
	}
	fmt.Fprintf(stdout, "%s: %s", url, body)
	return 0
}

// dialable turns a listen address into one to connect to: a wildcard or
// missing host becomes loopback.
func dialable(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::", "[::]":
		host = "::1"
	}
	return net.JoinHostPort(host, port)
}
