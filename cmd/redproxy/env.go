package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
)

// envPrefix names the environment variables that stand in for flags:
// --upstream is REDPROXY_UPSTREAM, --log-level is REDPROXY_LOG_LEVEL. A
// container is configured through its environment; a flag given on the
// command line still wins over the variable.
const envPrefix = "REDPROXY_"

// envName is the variable that stands in for a flag.
func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// applyEnv sets every flag of fs that the command line left unset from its
// environment variable, if that is set; with only, just those flags. getenv
// is os.LookupEnv in the binary. It returns the names of the flags it set.
func applyEnv(fs *flag.FlagSet, getenv func(string) (string, bool), only ...string) (fromEnv map[string]bool, err error) {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	fromEnv = map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil || given[f.Name] || len(only) > 0 && !slices.Contains(only, f.Name) || notFromEnv[f.Name] {
			return
		}
		v, ok := getenv(envName(f.Name))
		if !ok {
			return
		}
		if serr := fs.Set(f.Name, v); serr != nil {
			err = fmt.Errorf("%s=%q (for --%s): %v", envName(f.Name), v, f.Name, serr)
			if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
				// flag's own error for a bool is a bare "parse error".
				err = fmt.Errorf("%s=%q (for --%s): want true or false (or 1 or 0)", envName(f.Name), v, f.Name)
			}
			return
		}
		fromEnv[f.Name] = true
	})
	return fromEnv, err
}

// notFromEnv are flags that ask for something other than running the
// proxy: REDPROXY_VERSION=1.4.2, a common convention in images, made the
// proxy exit 2, and REDPROXY_VERSION=true would print the version instead
// of running (found by review).
var notFromEnv = map[string]bool{"version": true, "help": true}

// lookupEnv is where applyEnv reads variables; tests replace it.
var lookupEnv = os.LookupEnv

// envSources is config.Overrides.Sources for the flags applyEnv set.
func envSources(fromEnv map[string]bool) map[string]string {
	m := make(map[string]string, len(fromEnv))
	for name := range fromEnv {
		m["--"+name] = envName(name)
	}
	return m
}
