package main

import (
	"os"
	"strings"
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

func TestReplySize(t *testing.T) {
	for _, tc := range []struct {
		in       string
		size     int
		complete bool
		bad      bool
	}{
		{"", 0, false, false},
		{"$3\r\nab", 0, false, false},
		{"$3\r\nabc\r\n", 9, true, false},
		{"$-1\r\n", 5, true, false},
		{"+OK\r\n", 5, true, false},
		{"-ERR max clients\r\n", 18, true, false},
		{":1\r\n", 4, true, false},
		{"$x\r\n", 0, false, true},
		{"*1\r\n", 0, false, true},
		{"\r\n", 0, false, true},
	} {
		size, complete, err := replySize([]byte(tc.in))
		if (err != nil) != tc.bad || size != tc.size || complete != tc.complete {
			t.Errorf("replySize(%q) = %d, %v, %v; want %d, %v, error %v", tc.in, size, complete, err, tc.size, tc.complete, tc.bad)
		}
	}
}

func TestParseVmRSS(t *testing.T) {
	const status = "Name:\tredproxy\nVmPeak:\t  900 kB\nVmRSS:\t   12345 kB\nThreads:\t5\n"
	got, err := parseVmRSS(strings.NewReader(status))
	if err != nil || got != 12345 {
		t.Fatalf("parseVmRSS = %d, %v; want 12345", got, err)
	}
	for _, bad := range []string{"Name:\tx\n", "VmRSS:\t12 MB\n", "VmRSS:\tlots kB\n"} {
		if _, err := parseVmRSS(strings.NewReader(bad)); err == nil {
			t.Errorf("parseVmRSS(%q): no error", bad)
		}
	}
	// The real file of this process has one.
	if kb, err := vmRSS(os.Getpid()); err != nil || kb <= 0 {
		t.Fatalf("vmRSS(self) = %d, %v", kb, err)
	}
}

func TestMixedRow(t *testing.T) {
	// GET ran 1,000 requests at 10,000/s (0.1 s), SET 1,000 at 5,000/s
	// (0.2 s): 2,000 requests in the slowest's 0.2 s, and the worse
	// latency of each column.
	rows := [][]string{
		{"GET", "10000.00", "0.500", "0.100", "0.400", "0.900", "1.200", "3.000"},
		{"SET", "5000.00", "0.700", "0.080", "0.600", "1.100", "1.000", "2.500"},
	}
	got, err := mixedRow("get+set", 1000, rows)
	if err != nil {
		t.Fatal(err)
	}
	want := "get+set,10000.00,0.700,0.100,0.600,1.100,1.200,3.000"
	if s := strings.Join(got, ","); s != want {
		t.Fatalf("mixedRow = %s, want %s", s, want)
	}
	if _, err := mixedRow("x", 10, [][]string{{"GET", "0", "1"}}); err == nil {
		t.Error("an rps of 0 accepted")
	}
	if a := setFlag([]string{"rb", "-c", "50", "-n", "9"}, "-c", 25); strings.Join(a, " ") != "rb -c 25 -n 9" {
		t.Errorf("setFlag: %v", a)
	}
	if v, err := flagValue([]string{"rb", "-n", "9"}, "-n"); v != 9 || err != nil {
		t.Errorf("flagValue: %d %v", v, err)
	}
}
