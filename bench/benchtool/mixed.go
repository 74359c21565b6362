package main

import (
	"bytes"
	"encoding/csv"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
)

// mixed runs one redis-benchmark per test of -tests at the same time, each
// with its share of the clients (-c) and requests (-n), so that reads and
// writes share the proxy's upstream connections as an application's do;
// redis-benchmark alone runs one command kind at a time. It prints
// redis-benchmark's CSV: each child's row, then a row named by the tests
// joined with "+" whose rps is all requests over the slowest child's time
// and whose latency columns are the worst child's (percentiles of two runs
// cannot be merged from their summaries; the worse one bounds the mix).
//
//	benchtool mixed -tests get,set -- redis-benchmark -p PORT -c 50 -n N --csv ...
//
// The arguments after -- must hold -c and -n, and --csv; -t is added.
func mixed(args []string) error {
	fs := flag.NewFlagSet("mixed", flag.ContinueOnError)
	tests := fs.String("tests", "get,set", "comma-separated redis-benchmark tests to run concurrently")
	if err := fs.Parse(args); err != nil {
		return err
	}
	base := fs.Args()
	names := strings.Split(*tests, ",")
	if len(base) == 0 || len(names) < 2 {
		return errors.New("mixed: want -tests with two or more tests and a redis-benchmark command after --")
	}
	clients, err := flagValue(base, "-c")
	if err != nil {
		return err
	}
	requests, err := flagValue(base, "-n")
	if err != nil {
		return err
	}
	k := len(names)
	if clients < k || requests < k {
		return fmt.Errorf("mixed: -c %d and -n %d must be at least the number of tests (%d)", clients, requests, k)
	}
	outs := make([]bytes.Buffer, k)
	errs := make([]error, k)
	var wg sync.WaitGroup
	for i, name := range names {
		argv := setFlag(setFlag(base, "-c", clients/k), "-n", requests/k)
		argv = append(argv, "-t", name)
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Stdout, cmd.Stderr = &outs[i], os.Stderr
		if err := cmd.Start(); err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = cmd.Wait()
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	var header []string
	var rows [][]string
	for i := range names {
		recs, err := csv.NewReader(&outs[i]).ReadAll()
		if err != nil || len(recs) < 2 {
			return fmt.Errorf("mixed: %s: no CSV result (%v)", names[i], err)
		}
		header = recs[0]
		rows = append(rows, recs[len(recs)-1])
	}
	row, err := mixedRow(strings.Join(names, "+"), requests/k, rows)
	if err != nil {
		return err
	}
	w := csv.NewWriter(os.Stdout)
	w.UseCRLF = false
	w.Write(header)
	w.WriteAll(append(rows, row))
	return w.Error()
}

// mixedRow combines redis-benchmark CSV rows ("test", "rps", then latency
// columns in ms) of concurrent runs of n requests each.
func mixedRow(name string, n int, rows [][]string) ([]string, error) {
	out := []string{name}
	slowest := 0.0
	for _, r := range rows {
		rps, err := strconv.ParseFloat(r[1], 64)
		if err != nil || rps <= 0 {
			return nil, fmt.Errorf("mixed: bad rps %q", r[1])
		}
		slowest = max(slowest, float64(n)/rps)
	}
	out = append(out, strconv.FormatFloat(float64(n*len(rows))/slowest, 'f', 2, 64))
	for col := 2; col < len(rows[0]); col++ {
		worst := 0.0
		for _, r := range rows {
			v, err := strconv.ParseFloat(r[col], 64)
			if err != nil {
				return nil, fmt.Errorf("mixed: bad latency %q", r[col])
			}
			worst = max(worst, v)
		}
		out = append(out, strconv.FormatFloat(worst, 'f', 3, 64))
	}
	return out, nil
}

// flagValue is the integer after flag in argv.
func flagValue(argv []string, flag string) (int, error) {
	for i := 0; i+1 < len(argv); i++ {
		if argv[i] == flag {
			v, err := strconv.Atoi(argv[i+1])
			if err != nil {
				return 0, fmt.Errorf("mixed: %s %q: %w", flag, argv[i+1], err)
			}
			return v, nil
		}
	}
	return 0, fmt.Errorf("mixed: no %s in the command", flag)
}

// setFlag returns a copy of argv with flag's value replaced by v.
func setFlag(argv []string, flag string, v int) []string {
	out := append([]string(nil), argv...)
	for i := 0; i+1 < len(out); i++ {
		if out[i] == flag {
			out[i+1] = strconv.Itoa(v)
		}
	}
	return out
}
