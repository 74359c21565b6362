package localcache

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/redproxy/redproxy/internal/config/units"
)

// Config is the [localcache] section of the redproxy configuration.
type Config struct {
	// Enabled turns the tier on. Off by default: an operator opts in, and
	// --local-tier=on|off overrides the file.
	Enabled bool `toml:"enabled"`
	// MaxBytes bounds everything the tier holds: values, the command bytes
	// they are keyed by, and a fixed overhead per entry and per key (C5).
	MaxBytes units.ByteSize `toml:"max_bytes"`
	// Staleness is S of contract C2/C4: no hit is served unless a heartbeat
	// sent on the fill connection within the last S has been answered.
	Staleness units.Duration `toml:"staleness"`
	// MaxTTL bounds how long an entry lives without being re-read from
	// Redis, even if Redis never invalidates it.
	MaxTTL units.Duration `toml:"max_ttl"`
	// AdmitMinReads: a key is cached once its estimated reads within the
	// admission window exceed this (0 admits every key on its first read).
	AdmitMinReads int `toml:"admit_min_reads"`
	// AdmitWindow is the period after which the frequency counters are
	// halved, so estimates follow what is hot now.
	AdmitWindow units.Duration `toml:"admit_window"`
	// WriteRatio keeps out keys written more than this fraction of the
	// times they are read (0.1: more than one write per ten reads). Writes
	// are counted from a key's first read in an admission window on.
	WriteRatio float64 `toml:"write_ratio"`
	// Include, if not empty, limits the tier to keys matching one of these
	// patterns (Redis SCAN MATCH syntax); Exclude wins over Include.
	Include []string `toml:"include"`
	Exclude []string `toml:"exclude"`
	// NegativeCaching also caches replies for keys that do not exist (a nil
	// GET, EXISTS 0, an empty LRANGE).
	NegativeCaching bool `toml:"negative_caching"`
	// StaleIfError rules, first match wins.
	StaleIfError []StaleRule `toml:"stale_if_error"`
	// TouchInterval: a key served from the tier is sent to Redis as a
	// TOUCH at most this often, so that Redis's LRU and LFU see it used;
	// 0 turns that off.
	TouchInterval units.Duration `toml:"touch_interval"`
}

// StaleRule lets reads of matching keys be answered from the last value the
// tier held when Redis cannot be reached, for up to MaxAge after the
// connection was lost. This deliberately relaxes C4 for those keys.
type StaleRule struct {
	Pattern string         `toml:"pattern"`
	MaxAge  units.Duration `toml:"max_age"`
}

// Defaults. The tier is off unless enabled.
const (
	DefaultMaxBytes      = 64 * units.MB
	DefaultStaleness     = time.Second
	DefaultMaxTTL        = 5 * time.Minute
	DefaultAdmitMinReads = 8
	DefaultAdmitWindow   = time.Second
	DefaultWriteRatio    = 0.1
	// Redis's LRU clock ticks once a second (LRU_CLOCK_RESOLUTION): a key
	// touched as often looks as recently used as any.
	DefaultTouchInterval = time.Second
)

// maxAdmitMinReads stays below what the sketch's 8-bit counters can count.
const maxAdmitMinReads = 200

// DefaultConfig returns the built-in settings.
func DefaultConfig() Config {
	return Config{
		MaxBytes:      DefaultMaxBytes,
		Staleness:     units.Duration{Duration: DefaultStaleness},
		MaxTTL:        units.Duration{Duration: DefaultMaxTTL},
		AdmitMinReads: DefaultAdmitMinReads,
		AdmitWindow:   units.Duration{Duration: DefaultAdmitWindow},
		WriteRatio:    DefaultWriteRatio,
		TouchInterval: units.Duration{Duration: DefaultTouchInterval},
		Include:       []string{},
		Exclude:       []string{},
	}
}

// Error is one invalid setting; Validate returns several joined with
// errors.Join. Key is the dotted path ("localcache.stale_if_error[1].pattern")
// so the config loader can point at the line.
type Error struct {
	Key string
	Msg string
}

func (e *Error) Error() string { return e.Key + ": " + e.Msg }

// Validate reports every invalid setting at once (errors.Join of *Error).
// Settings are checked even when the tier is disabled, so turning it on with
// --local-tier cannot reveal a broken section only in production.
func (c Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, &Error{Key: "localcache." + key, Msg: fmt.Sprintf(format, args...)})
	}
	if c.MaxBytes < 64*units.KB {
		bad("max_bytes", "must be at least 64KB, got %v", c.MaxBytes)
	}
	if s := c.Staleness.Duration; s < 10*time.Millisecond || s > time.Minute {
		bad("staleness", "must be between 10ms and 1m, got %v", c.Staleness)
	}
	if c.MaxTTL.Duration <= 0 {
		bad("max_ttl", "must be > 0, got %v", c.MaxTTL)
	}
	if c.AdmitMinReads < 0 || c.AdmitMinReads > maxAdmitMinReads {
		bad("admit_min_reads", "must be between 0 and %d, got %d", maxAdmitMinReads, c.AdmitMinReads)
	}
	if c.AdmitWindow.Duration < 10*time.Millisecond {
		bad("admit_window", "must be at least 10ms, got %v", c.AdmitWindow)
	}
	if c.WriteRatio < 0 || math.IsNaN(c.WriteRatio) {
		// NaN compared false with every ratio, silently turning the
		// write-heavy exclusion off (found by review).
		bad("write_ratio", "must be a number ≥ 0, got %v", c.WriteRatio)
	}
	if d := c.TouchInterval.Duration; d != 0 && (d < 100*time.Millisecond || d > time.Hour) {
		bad("touch_interval", "must be 0 (off) or between 100ms and 1h, got %v", c.TouchInterval)
	}
	for i, p := range c.Include {
		if err := checkGlob(p); err != nil {
			bad(fmt.Sprintf("include[%d]", i), "%q: %v", p, err)
		}
	}
	for i, p := range c.Exclude {
		if err := checkGlob(p); err != nil {
			bad(fmt.Sprintf("exclude[%d]", i), "%q: %v", p, err)
		}
	}
	for i, r := range c.StaleIfError {
		key := fmt.Sprintf("stale_if_error[%d]", i)
		if r.Pattern == "" {
			bad(key+".pattern", "must not be empty")
		} else if err := checkGlob(r.Pattern); err != nil {
			bad(key+".pattern", "%q: %v", r.Pattern, err)
		}
		if r.MaxAge.Duration <= 0 {
			bad(key+".max_age", "must be > 0, got %v", r.MaxAge)
		}
	}
	return errors.Join(errs...)
}
