package units

import (
	"strings"
	"testing"
	"time"
)

func TestByteSizeText(t *testing.T) {
	good := map[string]ByteSize{
		"512": 512, "0": 0, "10B": 10, "100KB": 100 << 10, "100kib": 100 << 10,
		"64MB": 64 << 20, "64 MB": 64 << 20, "1GiB": 1 << 30, "1gb": 1 << 30, "2TB": 2 << 40,
	}
	for in, want := range good {
		var b ByteSize
		if err := b.UnmarshalText([]byte(in)); err != nil || b != want {
			t.Errorf("%q -> %d, %v; want %d", in, b, err, want)
		}
	}
	for _, in := range []string{"", "KB", "-1KB", "1.5GB", "64k", "64m", "1 0KB", "9999999999TB", "99999999999999999999"} {
		var b ByteSize
		if err := b.UnmarshalText([]byte(in)); err == nil {
			t.Errorf("%q accepted as %d", in, b)
		}
	}
	for b, want := range map[ByteSize]string{0: "0", 512: "512", 1536: "1536", 64 << 10: "64KB", 512 << 20: "512MB", 4 << 30: "4GB"} {
		if b.String() != want {
			t.Errorf("ByteSize(%d).String() = %q, want %q", int64(b), b.String(), want)
		}
	}
}

func TestDurationText(t *testing.T) {
	var d Duration
	if err := d.UnmarshalText([]byte("1m30s")); err != nil || d.Duration != 90*time.Second {
		t.Fatalf("1m30s -> %v, %v", d, err)
	}
	for _, in := range []string{"", "5", "2x", "1.5"} {
		if err := d.UnmarshalText([]byte(in)); err == nil {
			t.Errorf("%q accepted as %v", in, d)
		}
	}
	if b, _ := (Duration{Duration: 1500 * time.Millisecond}).MarshalText(); string(b) != "1.5s" {
		t.Fatalf("MarshalText = %q", b)
	}
}

// Every duration in the configuration takes days and weeks, as the
// policy's TTLs do; a sign is kept for the range checks, which refuse it
// with their own message.
func TestDurationDaysWeeksAndSigns(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"1d": 24 * time.Hour, "1w": 7 * 24 * time.Hour, "1d12h": 36 * time.Hour,
		"2w3d": 17 * 24 * time.Hour, "1.5h": 90 * time.Minute, "0": 0, "-1s": -time.Second, "-1d": -24 * time.Hour,
	} {
		var d Duration
		if err := d.UnmarshalText([]byte(in)); err != nil || d.Duration != want {
			t.Errorf("%q -> %v, %v; want %v", in, d.Duration, err, want)
		}
	}
	for _, in := range []string{"+1s", "--1s", "d", "1.5d", "1x", "99999999999w", "106751d106751d", "1d-1h"} {
		var d Duration
		if err := d.UnmarshalText([]byte(in)); err == nil {
			t.Errorf("%q accepted as %v", in, d.Duration)
		}
	}
}

// A well-formed duration too long for a time.Duration says so; a malformed
// one stays "invalid".
func TestDurationTooLong(t *testing.T) {
	for _, in := range []string{"100000000d", "99999999999w", "106751d106751d", "9999999999999h", "99999999999999999999d"} {
		var d Duration
		err := d.UnmarshalText([]byte(in))
		if err == nil || !strings.Contains(err.Error(), "too long") {
			t.Errorf("%q: %v, want \"too long\"", in, err)
		}
	}
	for _, in := range []string{"1.5d", "1x", "d", "9999999999999x"} {
		var d Duration
		if err := d.UnmarshalText([]byte(in)); err == nil || strings.Contains(err.Error(), "too long") {
			t.Errorf("%q: %v, want \"invalid duration\"", in, err)
		}
	}
}

// Durations are written back as an operator writes them, and read back
// as the same value.
func TestFormatDurationRoundTrips(t *testing.T) {
	for d, want := range map[time.Duration]string{
		24 * time.Hour: "1d", 7 * 24 * time.Hour: "7d", time.Hour: "1h", 90 * time.Minute: "1h30m",
		2 * time.Minute: "2m", 90 * time.Second: "1m30s", 1500 * time.Millisecond: "1.5s", 500 * time.Millisecond: "500ms",
		0: "0s", 25 * time.Hour: "25h", time.Hour + time.Second: "1h0m1s", 60500 * time.Millisecond: "1m0.5s", -time.Hour: "-1h",
	} {
		got := FormatDuration(d)
		if got != want {
			t.Errorf("FormatDuration(%v) = %q, want %q", time.Duration(d), got, want)
		}
		var back Duration
		if err := back.UnmarshalText([]byte(got)); err != nil || back.Duration != d {
			t.Errorf("%q read back as %v, %v; want %v", got, back.Duration, err, time.Duration(d))
		}
	}
}
