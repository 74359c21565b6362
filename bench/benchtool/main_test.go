package main

import (
	"os"
	"testing"
	"time"
)

func TestParseProcStat(t *testing.T) {
	// A command name with spaces and parentheses must not shift the fields.
	const line = "4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 500 0 0 0 " +
		"1234 567 0 0 20 0 5 0 100 1000000 200 18446744073709551615\n"
	got, err := parseProcStat(line)
	if err != nil {
		t.Fatal(err)
	}
	if want := (1234 + 567) * 10 * time.Millisecond; got != want {
		t.Fatalf("parseProcStat = %v, want %v", got, want)
	}
	for _, bad := range []string{"", "1 (x) S 1 2 3", "1 (x) S 1 2 3 4 5 6 7 8 9 10 u s 0"} {
		if _, err := parseProcStat(bad); err == nil {
			t.Errorf("parseProcStat(%q): no error", bad)
		}
	}
}

func TestParseMachineBusy(t *testing.T) {
	// user nice system idle iowait irq softirq steal: irq, softirq, idle and
	// iowait are not busy time of tasks.
	const stat = "cpu  100 2 30 9999 7 11 13 5 0 0\ncpu0 50 1 15 5000 3 5 6 2 0 0\n"
	got, err := parseMachineBusy(stat)
	if err != nil {
		t.Fatal(err)
	}
	if want := (100 + 2 + 30 + 5) * 10 * time.Millisecond; got != want {
		t.Fatalf("parseMachineBusy = %v, want %v", got, want)
	}
	if _, err := parseMachineBusy("cpu0 1 2 3 4 5 6 7 8\n"); err == nil {
		t.Error("per-CPU first line accepted")
	}
}

func TestProcCPUOfSelf(t *testing.T) {
	// The real file for this process parses (guards the field offsets
	// against the running kernel's format).
	if _, err := procCPU(os.Getpid()); err != nil {
		t.Fatal(err)
	}
	if _, err := machineBusy(); err != nil {
		t.Fatal(err)
	}
}
