package stampede

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/redproxy/redproxy/internal/config/units"
)

// Config is the [stampede] section of the redproxy configuration.
type Config struct {
	// Coalesce shares one upstream request among identical concurrent
	// reads. It keeps linearizability, so it is on by default.
	Coalesce bool `toml:"coalesce"`
	// MaxWaiters caps the reads that may join one fetch; the excess go
	// upstream alone.
	MaxWaiters int `toml:"max_waiters"`
	// Hold lists the key patterns whose misses are held ([[stampede.hold]]).
	Hold []HoldRule `toml:"hold"`
	// EarlyRefresh lists the key patterns refreshed early
	// ([[stampede.early_refresh]]).
	EarlyRefresh []RefreshRule `toml:"early_refresh"`
}

// HoldRule is one [[stampede.hold]] entry.
type HoldRule struct {
	Pattern string         `toml:"pattern"` // Redis glob (SCAN MATCH syntax), e.g. "cache:*"
	Timeout units.Duration `toml:"timeout"` // longest a held read waits
}

// RefreshRule is one [[stampede.early_refresh]] entry.
type RefreshRule struct {
	Pattern string  `toml:"pattern"`
	Beta    float64 `toml:"beta"` // XFetch's β; 0 (unset) means DefaultBeta
}

// DefaultBeta is XFetch's β when a rule does not set one; the paper shows 1
// is optimal for exponentially distributed request gaps.
const DefaultBeta = 1.0

// BetaInForce is the rule's β, DefaultBeta where it sets none: what the
// refresh uses and what redproxy check shows.
func (r RefreshRule) BetaInForce() float64 {
	if r.Beta == 0 {
		return DefaultBeta
	}
	return r.Beta
}

// MaxHoldTimeout bounds hold timeouts: a held client waits at most this long.
const MaxHoldTimeout = time.Minute

// DefaultConfig is coalescing on with 1000 waiters per fetch at most, and
// neither miss holds nor early refresh.
func DefaultConfig() Config {
	return Config{Coalesce: true, MaxWaiters: 1000, Hold: []HoldRule{}, EarlyRefresh: []RefreshRule{}}
}

// Clone returns a copy that shares no slices with c.
func (c Config) Clone() Config {
	n := c
	n.Hold = append([]HoldRule{}, c.Hold...)
	n.EarlyRefresh = append([]RefreshRule{}, c.EarlyRefresh...)
	return n
}

// Error is one invalid setting; Validate returns several joined with
// errors.Join. Key is the dotted path, e.g. "stampede.hold[1].timeout", so
// the config loader can point at the line.
type Error struct {
	Key string
	Msg string
}

func (e *Error) Error() string { return e.Key + ": " + e.Msg }

// Validate reports every invalid setting at once (errors.Join of *Error).
func (c Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, &Error{Key: key, Msg: fmt.Sprintf(format, args...)})
	}
	if c.MaxWaiters < 1 {
		bad("stampede.max_waiters", "must be > 0, got %d", c.MaxWaiters)
	}
	seen := map[string]int{}
	for i, r := range c.Hold {
		p := fmt.Sprintf("stampede.hold[%d]", i)
		if err := checkGlob(r.Pattern); err != nil {
			bad(p+".pattern", "%v", err)
		} else if j, dup := seen[r.Pattern]; dup {
			// The first match wins: accepted, its timeout never applied
			// (found by a probe).
			bad(p+".pattern", "%q is already stampede.hold[%d]; the first match wins, so this rule would never apply", r.Pattern, j)
		} else {
			seen[r.Pattern] = i
		}
		if r.Timeout.Duration <= 0 || r.Timeout.Duration > MaxHoldTimeout {
			bad(p+".timeout", "must be between 1ms and %v (e.g. \"2s\"), got %v", MaxHoldTimeout, r.Timeout.Duration)
		}
	}
	for i, r := range c.EarlyRefresh {
		p := fmt.Sprintf("stampede.early_refresh[%d]", i)
		if err := checkGlob(r.Pattern); err != nil {
			bad(p+".pattern", "%v", err)
		}
		if r.Beta < 0 || math.IsNaN(r.Beta) || math.IsInf(r.Beta, 0) {
			bad(p+".beta", "must be a positive number (1 is the usual choice; 0 or none means 1), got %v", r.Beta)
		}
	}
	return errors.Join(errs...)
}
