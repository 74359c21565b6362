package mirror

import (
	"errors"
	"fmt"

	"github.com/redproxy/redproxy/internal/config/units"
)

// Config is the [mirror] section of the redproxy configuration.
type Config struct {
	// Upstream names the [upstreams.NAME] entry commands are mirrored to;
	// "" turns mirroring off (the default).
	Upstream string `toml:"upstream"`
	// Writes mirrors every write the primary ran (commands flagged write,
	// scripts and functions, SCRIPT LOAD).
	Writes bool `toml:"writes"`
	// ReadsSample is the share of reads (0 to 1) that are also sent to the
	// mirror; 0 sends none.
	ReadsSample float64 `toml:"reads_sample"`
	// Compare compares each sampled read's reply from the mirror with the
	// primary's, byte for byte, and counts the mismatches by key pattern.
	Compare bool `toml:"compare"`
	// Queue caps the commands waiting for, or in flight to, the mirror;
	// QueueBytes caps their bytes (requests, and the primary's replies kept
	// for comparison). Past either, commands are dropped and counted.
	Queue      int            `toml:"queue"`
	QueueBytes units.ByteSize `toml:"queue_bytes"`
}

// DefaultConfig is mirroring off; once an upstream is named, writes are
// mirrored, no reads, through a queue of 10000 commands or 64MB.
func DefaultConfig() Config {
	return Config{Writes: true, Queue: 10000, QueueBytes: 64 * units.MB}
}

// Enabled reports whether commands are mirrored at all.
func (c Config) Enabled() bool { return c.Upstream != "" && (c.Writes || c.ReadsSample > 0) }

// MaxQueue bounds mirror.queue: a queued command costs a few dozen bytes of
// bookkeeping besides its own, and the queue exists to absorb bursts, not
// to hold minutes of traffic.
const MaxQueue = 10_000_000

// Error is one invalid setting; Validate returns several joined with
// errors.Join.
type Error struct {
	Key string // dotted, e.g. "mirror.reads_sample"
	Msg string
}

func (e *Error) Error() string { return e.Key + ": " + e.Msg }

// Validate checks the section's own settings. Whether the upstream it names
// exists, and is one the mirror can use, is checked with the rest of the
// configuration (package config).
func (c Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, &Error{Key: key, Msg: fmt.Sprintf(format, args...)})
	}
	if c.ReadsSample < 0 || c.ReadsSample > 1 || c.ReadsSample != c.ReadsSample {
		bad("mirror.reads_sample", "must be between 0 and 1 (a share of reads, e.g. 0.01), got %v", c.ReadsSample)
	}
	if c.Compare && c.ReadsSample == 0 && c.Upstream != "" {
		bad("mirror.compare", "compares sampled reads, but mirror.reads_sample is 0: set a sample (e.g. 0.01)")
	}
	if c.Queue < 1 || c.Queue > MaxQueue {
		bad("mirror.queue", "must be between 1 and %d commands, got %d", MaxQueue, c.Queue)
	}
	if c.QueueBytes < units.KB || c.QueueBytes > 4*units.GB {
		bad("mirror.queue_bytes", "must be between 1KB and 4GB, got %v", c.QueueBytes)
	}
	return errors.Join(errs...)
}
