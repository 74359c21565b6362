// Package units holds the value types used in redproxy's TOML configuration.
//
// It is separate from package config so that packages owning a config
// section (policy, stampede, localcache) can use these types in their own
// section structs while config imports those packages, without an import
// cycle.
package units

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Duration is a time.Duration written in TOML as a string such as "500ms" or
// "2s". It is a struct, not a named int64, on purpose: the TOML decoder would
// store a bare integer (timeout = 5) straight into an integer type as 5ns; as a
// struct, integers reach UnmarshalText and are rejected for lacking a unit.
// (package config also catches that case before decoding, to report the line.)
type Duration struct{ time.Duration }

// UnmarshalText implements encoding.TextUnmarshaler. It reads what
// ParseDuration reads; a sign is kept for the range checks to refuse with
// their own message ("must not be negative").
func (d *Duration) UnmarshalText(text []byte) error {
	s, neg := strings.CutPrefix(string(text), "-")
	v, err := ParseDuration(s)
	if errors.Is(err, ErrDurationTooLong) {
		return fmt.Errorf("duration %q is too long: %w", text, err)
	}
	if err != nil {
		return fmt.Errorf("invalid duration %q (use e.g. \"500ms\", \"2s\")", text)
	}
	if neg {
		v = -v
	}
	d.Duration = v
	return nil
}

// MarshalText implements encoding.TextMarshaler so a Config can be written
// back out (e.g. to show the effective configuration), as an operator
// would write it (FormatDuration).
func (d Duration) MarshalText() ([]byte, error) { return []byte(FormatDuration(d.Duration)), nil }

// FormatDuration writes d as ParseDuration reads it and an operator would
// write it: whole days as "7d", and without Go's trailing zero units
// ("1h", "1h30m", not "1h0m0s", "1h30m0s"; "1d" read back printed as
// "24h0m0s": found by a user's trial).
func FormatDuration(d time.Duration) string {
	const day = 24 * time.Hour
	if d > 0 && d%day == 0 {
		return strconv.FormatInt(int64(d/day), 10) + "d"
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// ParseDuration reads an unsigned duration: Go's units ("500ms", "90s",
// "1h30m") plus "d" (24h) and "w" (7d), alone or combined ("1d12h"), or
// "0". Every duration in the configuration takes the same spellings (the
// policy's TTLs took "7d" while the upstream's timeouts refused "1d":
// found by a user's trial).
func ParseDuration(s string) (time.Duration, error) {
	bad := errors.New("invalid duration")
	// A well-formed duration past what a time.Duration holds is said to
	// be that, not "invalid" (a probe's "100000000d" was told to write it
	// like "500ms").
	tooLong := func(num, unit string) error {
		if _, err := strconv.ParseFloat(num, 64); err == nil && slices.Contains([]string{"d", "w", "h", "m", "s", "ms", "us", "µs", "ns"}, unit) {
			return ErrDurationTooLong
		}
		return bad
	}
	if s == "" || s[0] == '-' || s[0] == '+' {
		return 0, bad
	}
	if s == "0" {
		return 0, nil
	}
	var total time.Duration
	for s != "" {
		i := 0
		for i < len(s) && (s[i] >= '0' && s[i] <= '9' || s[i] == '.') {
			i++
		}
		j := i
		for j < len(s) && (s[j] < '0' || s[j] > '9') && s[j] != '.' {
			j++
		}
		if i == 0 || j == i {
			return 0, bad // a number without unit or a unit without number
		}
		num, unit := s[:i], s[i:j]
		s = s[j:]
		var part time.Duration
		switch unit {
		case "d", "w":
			n, err := strconv.ParseInt(num, 10, 64)
			mult := 24 * time.Hour
			if unit == "w" {
				mult *= 7
			}
			if errors.Is(err, strconv.ErrRange) {
				return 0, ErrDurationTooLong
			}
			if err != nil {
				return 0, bad
			}
			if n > int64(math.MaxInt64/mult) {
				return 0, ErrDurationTooLong
			}
			part = time.Duration(n) * mult
		default:
			v, err := time.ParseDuration(num + unit)
			if err != nil {
				return 0, tooLong(num, unit)
			}
			part = v
		}
		if total > math.MaxInt64-part {
			return 0, ErrDurationTooLong
		}
		total += part
	}
	return total, nil
}

// ErrDurationTooLong is ParseDuration's error for a duration longer than
// a time.Duration holds.
var ErrDurationTooLong = errors.New("the longest is about 106,751 days (292 years)")

// ByteSize is a size in bytes, written in TOML either as an integer (bytes)
// or as a string with a unit: "512", "100KB", "64MB", "1GiB".
//
// KB, MB, GB and TB are 1024-based, exactly like their KiB/MiB/GiB/TiB
// spellings, following Redis's own config file where "1mb" means 1048576;
// operators copy limits from redis.conf and must get the same numbers. Redis's
// bare "k"/"m"/"g" suffixes mean powers of 1000 there, so they are rejected
// here rather than silently given either meaning. Units are case-insensitive.
type ByteSize int64

// Common sizes, for defaults and range checks.
const (
	KB ByteSize = 1 << 10
	MB ByteSize = 1 << 20
	GB ByteSize = 1 << 30
)

var byteUnits = map[string]ByteSize{
	"": 1, "b": 1,
	"kb": KB, "kib": KB,
	"mb": MB, "mib": MB,
	"gb": GB, "gib": GB,
	"tb": 1 << 40, "tib": 1 << 40,
}

// UnmarshalText implements encoding.TextUnmarshaler; TOML integers bypass it
// and are taken as a plain byte count.
func (b *ByteSize) UnmarshalText(text []byte) error {
	bad := fmt.Errorf("invalid size %q (use e.g. 65536, \"64KB\", \"512MB\", \"1GiB\")", text)
	s := strings.TrimSpace(string(text))
	i := strings.IndexFunc(s, func(r rune) bool { return r < '0' || r > '9' })
	if i < 0 {
		i = len(s)
	}
	if i == 0 {
		return bad
	}
	n, err := strconv.ParseInt(s[:i], 10, 64)
	if err != nil {
		return bad
	}
	unit, ok := byteUnits[strings.ToLower(strings.TrimSpace(s[i:]))]
	if !ok {
		return bad
	}
	if n > math.MaxInt64/int64(unit) {
		return fmt.Errorf("size %q is too large", text)
	}
	*b = ByteSize(n) * unit
	return nil
}

// MarshalText implements encoding.TextMarshaler, writing the size as
// String does, which UnmarshalText reads back.
func (b ByteSize) MarshalText() ([]byte, error) { return []byte(b.String()), nil }

// String renders the size with the largest unit that divides it exactly, so
// that error messages echo what the operator would write.
func (b ByteSize) String() string {
	for _, u := range []struct {
		name string
		size ByteSize
	}{{"GB", GB}, {"MB", MB}, {"KB", KB}} {
		if b != 0 && b%u.size == 0 {
			return strconv.FormatInt(int64(b/u.size), 10) + u.name
		}
	}
	return strconv.FormatInt(int64(b), 10)
}
